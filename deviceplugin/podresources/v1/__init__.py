"""Generated stubs of the kubelet PodResources API v1 (see ``deviceplugin.podresources.protogen``)."""
