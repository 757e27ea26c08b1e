"""Generated stubs of the kubelet DRA plugin API v1 (see ``deviceplugin.dra.protogen``)."""
