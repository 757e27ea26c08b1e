"""Generated stubs of the kubelet Device Plugin API v1beta1 (see ``deviceplugin.protogen``)."""
