"""kube-icl as a Dynamic Resource Allocation driver (resource.k8s.io/v1): see docs/dra.md.

- :mod:`deviceplugin.dra.pool`: the ResourceSlices of a node's pool (chips, shape devices, counters), pure.
- :mod:`deviceplugin.dra.publish`: writes them through the API server, re-ordered as claims are allocated.
- :mod:`deviceplugin.dra.kubelet`: the kubelet DRA plugin (NodePrepareResources, CDI specs, checkpoint).
"""
