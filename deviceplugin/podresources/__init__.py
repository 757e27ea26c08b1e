"""The kubelet's PodResources API v1 (``PodResourcesLister``): which devices each container really got.

The stubs in :mod:`deviceplugin.podresources.v1` are generated from ``proto/deviceplugin/podresources/v1/api.proto``
(:mod:`deviceplugin.podresources.protogen`); :mod:`deviceplugin.audit` reads the kubelet's answer through them.
"""
