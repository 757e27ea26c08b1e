"""Kubernetes API credentials shared by the extender, the device plugin and ``icl topo show node/NAME``.

Loaded with the ``kubernetes`` package's config loader (exec plugins, OIDC/gcp auth-providers,
tokens and token files, client certificates, ``tls-server-name``, ``proxy-url``, in-cluster
service-account token rotation). ``scheduler/`` and ``deviceplugin/`` are independent of each
other and ``topology/`` is pure, so the one module both need lives here, on its own: it imports
only the standard library and ``kubernetes``.
"""

from kubeauth.credentials import (
    SA_DIR,
    AuthMethod,
    Credentials,
    KubeAuthError,
    Snapshot,
    from_kubeconfig,
    from_server,
    in_cluster,
    resolve,
)
from kubeauth.session import KubeSession

__all__ = [
    "SA_DIR",
    "AuthMethod",
    "Credentials",
    "KubeAuthError",
    "KubeSession",
    "Snapshot",
    "from_kubeconfig",
    "from_server",
    "in_cluster",
    "resolve",
]
