"""Generated stubs of the kubelet plugin-registration API v1 (see ``deviceplugin.dra.protogen``)."""
