"""kube-icl deviceplugin."""
