"""Reading the cluster for ``kubectl icl``: the user's own kubeconfig and RBAC, through :mod:`kubeauth`.

Only GET and LIST requests to the API server, never the extender's debug endpoint: nodes (with a label
selector), pods, the gang reservation Leases, the extender's ConfigMap (for queue weights, quotas,
tiers and the resource name), and the PriorityClasses (``whatif``: the priority of the pods it is
given). Lists are decoded as plain JSON (no client models), which is what the readers in
:mod:`kubectlicl.views` take.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from kubeauth import KubeSession, resolve
from scheduler.config import ConfigError, ExtenderConfig, parse_config
from scheduler.wire import RECORD_LABEL, USAGE_LABEL

__all__ = ["ClusterError", "ExtenderSettings", "Reader", "extender_settings"]

EXTENDER_SELECTOR = "app.kubernetes.io/part-of=kube-icl,app.kubernetes.io/component=extender"
EXTENDER_KEY = "extender.yaml"
TIMEOUT_S = 30
PAGE_SIZE = 500  # items per page of a list request


class ClusterError(Exception):
    """A request failed; the message is one line naming what was asked and why it failed. ``status`` is
    the API server's HTTP answer (None: no answer, the server could not be reached or refused the
    credentials)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ExtenderSettings:
    config: ExtenderConfig
    source: str  # where it came from: "configmap NS/NAME", or "flags" when none could be read
    warnings: tuple[str, ...] = field(default=())
    raw: Mapping[str, Any] = field(default_factory=dict)  # the config as its YAML (extender.yaml) says it


def _reason(exc: BaseException) -> str:
    """The innermost cause of a connection failure, on one line (urllib3 wraps it in MaxRetryError)."""
    inner = getattr(exc, "reason", None)
    text = str(inner if isinstance(inner, BaseException) else exc)
    return " ".join(text.split()) or type(exc).__name__


def _api_error(exc: Any, what: str) -> ClusterError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", "") or ""
    body = getattr(exc, "body", "") or ""
    message = ""
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError, TypeError):
        message = ""
    if status == 403:
        return ClusterError(f"{what}: forbidden: {message or reason}", 403)
    if status == 404:
        return ClusterError(f"{what}: not found{': ' + message if message else ''}", 404)
    return ClusterError(f"{what}: {status} {reason}{': ' + message if message else ''}", status)


def _page(token: str | None, **query: Any) -> dict[str, Any]:
    """The arguments of one page of a list request: ``query`` (its selectors), the page's size and continue
    token, the body left as raw JSON (decoded by :meth:`Reader._request`) and the timeout."""
    return {**query, "limit": PAGE_SIZE, "_continue": token, "_preload_content": False, "_request_timeout": TIMEOUT_S}


def _scoped(
    namespace: str, namespaced: Callable[..., Any], everywhere: Callable[..., Any], kw: Mapping[str, Any]
) -> Any:
    """A list request in ``namespace`` (``namespaced``), or in every namespace (``everywhere``) when it is ""."""
    return namespaced(namespace, **kw) if namespace else everywhere(**kw)


class Reader:
    """Lists what ``kubectl icl`` shows; each method is one request (paged) and returns JSON items."""

    def __init__(self, kubeconfig: str | None, context: str | None = None) -> None:
        from kubeauth import KubeAuthError

        try:
            self.session = KubeSession(resolve(kubeconfig, context=context))
        except KubeAuthError as exc:
            raise ClusterError(str(exc)) from None

    def close(self) -> None:
        self.session.close()

    def _request(self, what: str, call: Callable[[Any], Any]) -> dict[str, Any]:
        """``call(api_client)`` (a request made with ``_preload_content=False``), its body as JSON."""
        from kubernetes.client import ApiException
        from urllib3.exceptions import HTTPError

        from kubeauth import KubeAuthError

        try:
            response = self.session.call(call, what)
        except ApiException as exc:
            raise _api_error(exc, what) from None
        except KubeAuthError as exc:
            raise ClusterError(str(exc)) from None
        except (OSError, HTTPError) as exc:  # unreachable: refused, reset, timed out, a TLS failure
            host = getattr(self.session.api_client.configuration, "host", "")
            raise ClusterError(f"cannot reach the API server {host} ({what}): {_reason(exc)}") from None
        doc: dict[str, Any] = json.loads(response.data)
        return doc

    def _list(self, what: str, call: Callable[[Any, str | None], Any]) -> list[dict[str, Any]]:
        """Every page of a list request (``limit`` and ``continue``)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = token

            def one(api: Any, page: str | None = page) -> Any:
                return call(api, page)

            doc = self._request(what, one)
            items.extend(doc.get("items") or [])
            token = (doc.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    def nodes(self, selector: str = "") -> list[dict[str, Any]]:
        from kubernetes import client

        def call(api: Any, token: str | None) -> Any:
            return client.CoreV1Api(api).list_node(**_page(token, label_selector=selector or None))

        return self._list("list nodes", call)

    def pods(self, namespace: str = "") -> list[dict[str, Any]]:
        """Pods that have not ended (their devices are held, or they wait for some)."""
        from kubernetes import client

        selector = "status.phase!=Succeeded,status.phase!=Failed"

        def call(api: Any, token: str | None) -> Any:
            core = client.CoreV1Api(api)
            kw = _page(token, field_selector=selector)
            return _scoped(namespace, core.list_namespaced_pod, core.list_pod_for_all_namespaces, kw)

        return self._list(f"list pods{' in ' + namespace if namespace else ''}", call)

    def reservation_leases(self, namespace: str = "") -> list[dict[str, Any]]:
        """The extender's gang reservation records, in ``namespace`` or in every namespace."""
        from kubernetes import client

        def call(api: Any, token: str | None) -> Any:
            coord = client.CoordinationV1Api(api)
            kw = _page(token, label_selector=RECORD_LABEL)
            return _scoped(namespace, coord.list_namespaced_lease, coord.list_lease_for_all_namespaces, kw)

        where = f" in {namespace}" if namespace else ""
        return self._list(f"list leases -l {RECORD_LABEL}{where}", call)

    def usage_leases(self, namespace: str) -> list[dict[str, Any]]:
        """The extender's usage records (fair share's decayed usage) in ``namespace``."""
        from kubernetes import client

        def call(api: Any, token: str | None) -> Any:
            return client.CoordinationV1Api(api).list_namespaced_lease(
                namespace,
                label_selector=USAGE_LABEL,
                limit=500,
                _continue=token,
                _preload_content=False,
                _request_timeout=TIMEOUT_S,
            )

        return self._list(f"list leases -l {USAGE_LABEL} in {namespace}", call)

    def priority_classes(self) -> list[dict[str, Any]]:
        """The PriorityClasses: the priority the API server gives a pod that names one (or none, the
        global default's)."""
        from kubernetes import client

        def call(api: Any, token: str | None) -> Any:
            return client.SchedulingV1Api(api).list_priority_class(**_page(token))

        return self._list("list priorityclasses", call)

    def extender_configmaps(self, namespace: str = "") -> list[dict[str, Any]]:
        from kubernetes import client

        def call(api: Any, token: str | None) -> Any:
            core = client.CoreV1Api(api)
            kw = _page(token, label_selector=EXTENDER_SELECTOR)
            return _scoped(namespace, core.list_namespaced_config_map, core.list_config_map_for_all_namespaces, kw)

        return self._list(f"list configmaps -l {EXTENDER_SELECTOR}", call)

    def configmap(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes import client

        def call(api: Any) -> Any:
            return client.CoreV1Api(api).read_namespaced_config_map(
                name, namespace, _preload_content=False, _request_timeout=TIMEOUT_S
            )

        return self._request(f"get configmap {namespace}/{name}", call)


def _config_of(cm: dict[str, Any]) -> tuple[ExtenderConfig, dict[str, Any]]:
    """The config a ConfigMap holds: parsed, and as its YAML says it."""
    meta = cm.get("metadata") or {}
    text = (cm.get("data") or {}).get(EXTENDER_KEY)
    where = f"configmap {meta.get('namespace')}/{meta.get('name')}"
    if text is None:
        raise ClusterError(f"{where}: no key {EXTENDER_KEY}")
    try:
        raw = yaml.safe_load(text) or {}
        return parse_config(raw), raw
    except (ConfigError, yaml.YAMLError) as exc:
        raise ClusterError(f"{where}: {EXTENDER_KEY}: {str(exc).splitlines()[0]}") from None


def extender_settings(reader: Reader, name: str, fallback: Mapping[str, Any]) -> ExtenderSettings:
    """The extender's config: from ``name`` (``NAMESPACE/NAME``) when given (an error if unreadable),
    else the one ConfigMap the chart labels as the extender's, else ``fallback`` (the flags, written as
    the config's YAML keys) with a warning saying why."""
    if name:
        namespace, _, cm_name = name.partition("/")
        if not cm_name:
            raise ClusterError(f"--extender-config {name!r}: expected NAMESPACE/NAME")
        config, raw = _config_of(reader.configmap(namespace, cm_name))
        return ExtenderSettings(config, f"configmap {name}", raw=raw)
    flags = parse_config(dict(fallback))
    try:
        found = reader.extender_configmaps()
    except ClusterError as exc:
        if exc.status is None:
            raise  # no answer at all: every other request would fail the same way
        why = f"extender config not read ({exc}); using flags"
        return ExtenderSettings(flags, "flags", (why,), dict(fallback))
    if not found:
        why = f"extender config not found (no ConfigMap labelled {EXTENDER_SELECTOR}); using flags"
        return ExtenderSettings(flags, "flags", (why,), dict(fallback))
    found.sort(key=lambda cm: (str(cm["metadata"].get("namespace")), str(cm["metadata"].get("name"))))
    cm = found[0]
    where = f"{cm['metadata'].get('namespace')}/{cm['metadata'].get('name')}"
    warnings: tuple[str, ...] = ()
    if len(found) > 1:
        others = ", ".join(f"{c['metadata'].get('namespace')}/{c['metadata'].get('name')}" for c in found[1:])
        warnings = (f"several extender ConfigMaps; using {where} (others: {others}; pick with --extender-config)",)
    config, raw = _config_of(cm)
    return ExtenderSettings(config, f"configmap {where}", warnings, raw)
