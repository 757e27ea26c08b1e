"""kube-icl device plugin: the kubelet Device Plugin API v1beta1 for linked accelerators.

- :mod:`deviceplugin.server` — the gRPC service, registration and lifecycle;
- :mod:`deviceplugin.allocation` — GetPreferredAllocation and rank-order decisions (pure);
- :mod:`deviceplugin.backends` — ``sim``, ``udev`` and ``nvml`` hardware backends;
- :mod:`deviceplugin.pods` — where the scheduler's ``kube-icl.io/devices`` choice is read;
- :mod:`deviceplugin.publisher` — the node's ``kube-icl.io/topology`` annotation;
- :mod:`deviceplugin.metrics` — Prometheus metrics and ``/healthz``;
- :mod:`deviceplugin.v1beta1` — generated stubs (``python -m deviceplugin.protogen``).

See docs/deviceplugin.md.
"""
