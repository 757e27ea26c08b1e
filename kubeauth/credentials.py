"""Where the API server is and who we are to it, loaded by the ``kubernetes`` package's own config loader.

Every part of kube-icl that talks to the API server starts from a :class:`Credentials`:

- :func:`resolve` picks the source the way kubectl does: an explicit kubeconfig path,
  else ``$KUBECONFIG``, else the pod's service account (in-cluster), else ``~/.kube/config``;
- :func:`from_kubeconfig` runs ``kubernetes.config.load_kube_config`` (exec credential plugins,
  OIDC and gcp auth-providers with their refresh, token and tokenFile, client certificates as
  files or data, ``certificate-authority[-data]``, ``tls-server-name``, ``proxy-url``,
  ``insecure-skip-tls-verify``);
- :func:`in_cluster` runs the library's ``InClusterConfigLoader`` (the projected token file is
  re-read as the kubelet rotates it);
- :func:`from_server` is an explicit URL with an optional token file and CA (tests, odd setups).

The result is a ``kubernetes.client.Configuration``. :meth:`Credentials.snapshot` turns it into
the plain values a transport needs (:class:`Snapshot`: server, the ``Authorization`` header, CA,
client certificate, TLS server name, proxy), running the library's refresh hook first so an exec
credential past its ``expirationTimestamp`` is fetched again before it is used. The hook is run at
most once per ``refresh_every`` seconds (cheap requests stay cheap). :meth:`Credentials.reload`
loads everything anew (the exec plugin runs again, the OIDC token is refreshed, token files and
certificates are re-read); transports call it once on a 401 and then report
:meth:`Credentials.unauthorized`, a one-line message naming the auth method and what to check.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SA_DIR",
    "AuthMethod",
    "Credentials",
    "KubeAuthError",
    "Snapshot",
    "from_kubeconfig",
    "from_server",
    "in_cluster",
    "resolve",
]

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_KUBECONFIG = "~/.kube/config"
TOKEN_FILE_REFRESH_S = 60.0  # as the library does for the in-cluster token


class KubeAuthError(Exception):
    """No usable API configuration, or the API server refused it; the message is one line."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a transport needs for one request, as of now."""

    server: str  # scheme://host[:port][/base-path]
    authorization: str | None  # the Authorization header value, scheme included
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None  # http://[user:pass@]host:port, only when this server goes through it
    generation: int = 0  # bumped by every reload

    @property
    def tls(self) -> tuple[str | None, str | None, str | None, bool, str | None]:
        """The values a TLS context depends on: connections made with others are not reused."""
        return (self.ca_file, self.cert_file, self.key_file, self.verify, self.tls_server_name)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file and self.key_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True, slots=True)
class AuthMethod:
    """The auth method a source uses, said for people: ``name`` and what to check after a 401."""

    name: str
    hint: str
    exec_command: str = ""
    unsupported: str = ""  # non-empty: this method cannot work with the library; why


Loader = Callable[[], Any]  # () -> kubernetes.client.Configuration


@dataclass(slots=True)
class Credentials:
    """A loaded API configuration that refreshes itself; safe to share between threads."""

    source: str  # "kubeconfig /path (context ctx)", "in-cluster service account", "--server URL"
    method: AuthMethod
    _load: Loader = field(repr=False)
    refresh_every: float = 1.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _config: Any = field(default=None, repr=False)
    _snap: Snapshot | None = field(default=None, repr=False)
    _next_check: float = field(default=0.0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    reloads: int = 0

    def __post_init__(self) -> None:
        self._config = self._load()
        self._snap = _snapshot(self._config, 0)
        self._next_check = self.clock() + self.refresh_every

    # ---- reading

    @property
    def configuration(self) -> Any:
        """The current ``kubernetes.client.Configuration`` (replaced, not changed, by :meth:`reload`)."""
        return self._config

    @property
    def server(self) -> str:
        snap = self._snap
        assert snap is not None
        return snap.server

    def snapshot(self) -> Snapshot:
        """The current values; the library's refresh hook runs first, at most once per ``refresh_every``."""
        snap = self._snap
        assert snap is not None
        if self.clock() < self._next_check:
            return snap
        if not self._lock.acquire(blocking=False):
            # Another thread is refreshing (an exec plugin may take seconds): the current values are still
            # good for a while (the library renews a credential 5 minutes before its expiry).
            return snap
        try:
            current = self._snap
            assert current is not None
            if self.clock() >= self._next_check:
                current = self._snap = _snapshot(self._config, current.generation)
                self._next_check = self.clock() + self.refresh_every
            return current
        finally:
            self._lock.release()

    def reload(self, stale: Snapshot | None = None) -> Snapshot:
        """Load everything anew (exec plugins run again, files are re-read) and return the new values.

        With ``stale``, a reload that another thread already did since that snapshot is not repeated.
        """
        with self._lock:
            current = self._snap
            assert current is not None
            if stale is not None and current.generation != stale.generation:
                return current
            config = self._load()
            self._config = config
            self._snap = _snapshot(config, current.generation + 1)
            self._next_check = self.clock() + self.refresh_every
            self.reloads += 1
            return self._snap

    # ---- explaining

    def unauthorized(self, what: str, detail: str = "") -> str:
        """The one-line message for a 401 that persisted after one reload."""
        said = f" ({detail})" if detail else ""
        return (
            f"{what}: 401 Unauthorized{said} from {self.server} with {self.method.name} from {self.source}, "
            f"also after reloading the credentials once; {self.method.hint}"
        )

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` on the current configuration (its token refreshes itself)."""
        from kubernetes import client

        return client.ApiClient(configuration=self._config)


# ------------------------------------------------------------------ Configuration -> Snapshot


def _bypass(host: str, no_proxy: str) -> bool:
    try:
        from kubernetes.client.rest import should_bypass_proxies
    except ImportError:  # older client: no NO_PROXY support there either
        return False
    return bool(should_bypass_proxies(host, no_proxy))


def _snapshot(config: Any, generation: int) -> Snapshot:
    auth = config.get_api_key_with_prefix("BearerToken", alias="authorization")  # runs the refresh hook
    if not auth and (config.username or config.password):
        auth = config.get_basic_auth_token()
    proxy = getattr(config, "proxy", None) or None
    if proxy and _bypass(config.host, getattr(config, "no_proxy", None) or ""):
        proxy = None
    return Snapshot(
        server=str(config.host),
        authorization=str(auth) if auth else None,
        ca_file=config.ssl_ca_cert or None,
        cert_file=config.cert_file or None,
        key_file=config.key_file or None,
        verify=bool(config.verify_ssl),
        tls_server_name=getattr(config, "tls_server_name", None) or None,
        proxy=proxy,
        generation=generation,
    )


# ------------------------------------------------------------------ describing a kubeconfig user


def _describe_user(user: Mapping[str, Any]) -> AuthMethod:
    if not user:
        return AuthMethod(
            "no credentials (anonymous)",
            "the kubeconfig's user has no token, client certificate, exec plugin or auth-provider; "
            "add one (most clusters refuse anonymous requests)",
        )
    if user.get("auth-provider"):
        provider = user["auth-provider"] or {}
        name = str(provider.get("name") or "")
        if name == "oidc":
            return AuthMethod(
                "the oidc auth-provider",
                "the id-token is refreshed from idp-issuer-url with refresh-token when it has expired; check "
                "that refresh-token, client-id and client-secret are current (log in again with your OIDC helper) "
                "and that the API server trusts this issuer and client id (--oidc-issuer-url, --oidc-client-id)",
            )
        if name == "gcp":
            return AuthMethod(
                "the gcp auth-provider",
                "the access token comes from Google application-default credentials or cmd-path; check "
                "`gcloud auth application-default login` (or move to the gke-gcloud-auth-plugin exec plugin)",
            )
        return AuthMethod(
            f"the {name or 'unnamed'} auth-provider",
            "the kubernetes Python client supports only the oidc and gcp auth-providers",
            unsupported=(
                f"auth-provider {name!r} is not supported by the kubernetes Python client (only oidc and gcp); "
                "use the provider's exec credential plugin instead (azure: kubelogin; gke: gke-gcloud-auth-plugin)"
            ),
        )
    if user.get("token") or user.get("tokenFile"):
        if user.get("tokenFile") and not user.get("token"):
            return AuthMethod(
                f"the token in tokenFile {user['tokenFile']}",
                "the file is re-read on reload; check that it holds a current token for this cluster",
            )
        return AuthMethod(
            "a bearer token",
            "check that the kubeconfig's token is current for this cluster "
            "(tokens from `kubectl create token` expire; service-account token Secrets go when the account does)",
        )
    if user.get("exec"):
        spec = user["exec"] or {}
        command = " ".join(str(p) for p in [spec.get("command") or "", *(spec.get("args") or [])]).strip()
        return AuthMethod(
            f"the exec credential plugin `{command}`",
            f"the plugin was run again; run `{command}` by hand and check that it prints an ExecCredential "
            f"({spec.get('apiVersion', 'client.authentication.k8s.io/v1')}) with a token or client certificate "
            "that this cluster accepts (logged in? right account, cluster and region? its env and args?)",
            exec_command=command,
        )
    if user.get("client-certificate") or user.get("client-certificate-data"):
        return AuthMethod(
            "a client certificate",
            "check that the client certificate is signed by the API server's client CA (--client-ca-file), "
            "has not expired, and matches its key",
        )
    if user.get("username"):
        return AuthMethod(
            "basic auth (username/password)",
            "Kubernetes removed basic auth in 1.19: use a token, a client certificate or an exec plugin",
        )
    return AuthMethod(
        "no credentials (anonymous)",
        "the kubeconfig's user has no token, client certificate, exec plugin or auth-provider; add one",
    )


# ------------------------------------------------------------------ loaders


class _LibraryErrors(logging.Filter):
    """Catch what the library only logs (a failing exec plugin) so the error can say it."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.module in ("kube_config", "exec_provider"):
            self.messages.append(record.getMessage().strip().replace("\n", " "))
            return False
        return True


@contextlib.contextmanager
def _library_errors() -> Iterator[_LibraryErrors]:
    catcher = _LibraryErrors()
    root = logging.getLogger()
    root.addFilter(catcher)
    try:
        yield catcher
    finally:
        root.removeFilter(catcher)


def _kubeconfig_user(path: str, context: str | None) -> tuple[str, Mapping[str, Any]]:
    """The context's name and its user entry, as the library merges ``path`` (``a:b`` lists too)."""
    from kubernetes.config.kube_config import KubeConfigMerger

    merged = KubeConfigMerger(path).config  # type: ignore[no-untyped-call]
    if merged is None:
        raise KubeAuthError(f"kubeconfig {path}: no configuration found")
    doc = merged.value if hasattr(merged, "value") else merged

    def _plain(item: Any) -> Mapping[str, Any]:
        value = item.value if hasattr(item, "value") else item
        return value if isinstance(value, Mapping) else {}

    name = context or str(doc.get("current-context") or "")
    if not name:
        raise KubeAuthError(f"kubeconfig {path}: current-context: not set (and no context given)")
    contexts = {str(_plain(c).get("name")): _plain(c).get("context") or {} for c in doc.get("contexts") or []}
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise KubeAuthError(f"kubeconfig {path}: context {name!r} not found (known: {known})")
    user_name = str(contexts[name].get("user") or "")
    users = {str(_plain(u).get("name")): _plain(u).get("user") or {} for u in doc.get("users") or []}
    return name, users.get(user_name, {})


def from_kubeconfig(
    path: str,
    *,
    context: str | None = None,
    insecure: bool = False,
    refresh_every: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Credentials:
    """Credentials from a kubeconfig file (or a ``:``-separated list, merged as kubectl does)."""
    from kubernetes import client
    from kubernetes.config import ConfigException, load_kube_config

    files = [p for p in path.split(os.pathsep) if p]
    if not files:
        raise KubeAuthError("kubeconfig: empty path")
    missing = [p for p in files if not os.path.exists(os.path.expanduser(p))]
    if len(missing) == len(files):
        raise KubeAuthError(f"kubeconfig {path}: no such file")
    try:
        ctx, user = _kubeconfig_user(path, context)
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
        raise KubeAuthError(f"kubeconfig {path}: {_one_line(exc)}") from None
    method = _describe_user(user)
    if method.unsupported:
        raise KubeAuthError(f"kubeconfig {path} (context {ctx}): {method.unsupported}")

    def load() -> Any:
        config = client.Configuration()
        with _library_errors() as caught:
            try:
                load_kube_config(config_file=path, context=ctx, client_configuration=config)  # type: ignore[no-untyped-call]
            except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
                raise KubeAuthError(f"kubeconfig {path} (context {ctx}): {_one_line(exc)}") from None
        if method.exec_command and not config.api_key and not config.cert_file:
            why = "; ".join(caught.messages) or "no token or client certificate in its output"
            raise KubeAuthError(
                f"kubeconfig {path} (context {ctx}): the exec credential plugin `{method.exec_command}` "
                f"gave no credential: {why}"
            )
        if insecure:
            config.verify_ssl = False
        return config

    return Credentials(f"kubeconfig {path} (context {ctx})", method, load, refresh_every=refresh_every, clock=clock)


def in_cluster(
    *,
    sa_dir: str = SA_DIR,
    environ: Mapping[str, str] | None = None,
    refresh_every: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Credentials:
    """The pod's service account (``KUBERNETES_SERVICE_HOST``/``_PORT``, token and CA under ``sa_dir``)."""
    from kubernetes import client
    from kubernetes.config import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    env = dict(os.environ if environ is None else environ)
    token_file = os.path.join(sa_dir, "token")

    def load() -> Any:
        config = client.Configuration()
        loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=token_file, cert_filename=os.path.join(sa_dir, "ca.crt"), environ=env
        )
        try:
            loader.load_and_set(config)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as exc:
            raise KubeAuthError(f"in-cluster config: {_one_line(exc)} (service account files in {sa_dir})") from None
        return config

    method = AuthMethod(
        f"the service account token {token_file}",
        "the token file was re-read; check the pod's serviceAccountName, that the account exists, that "
        "automountServiceAccountToken is not false, and the account's RBAC",
    )
    return Credentials("in-cluster service account", method, load, refresh_every=refresh_every, clock=clock)


def from_server(
    server: str,
    *,
    token: str | None = None,
    token_file: str | None = None,
    ca_file: str | None = None,
    insecure: bool = False,
    refresh_every: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Credentials:
    """An explicit API server URL; ``token_file`` is re-read every minute (and on reload)."""
    from kubernetes import client

    url = urllib.parse.urlsplit(server)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise KubeAuthError(f"API server URL {server!r} must be http(s)://host[:port]")

    def read_token() -> str:
        assert token_file is not None
        try:
            with open(token_file) as fh:
                text = fh.read().strip()
        except OSError as exc:
            raise KubeAuthError(f"tokenFile {token_file}: {exc.strerror or exc}") from None
        if not text:
            raise KubeAuthError(f"tokenFile {token_file}: empty")
        return text

    def load() -> Any:
        config = client.Configuration(host=server.rstrip("/"))
        if ca_file:
            config.ssl_ca_cert = ca_file
        config.verify_ssl = not insecure
        if token_file:
            state = {"at": dt.datetime.now()}
            config.api_key["BearerToken"] = f"Bearer {read_token()}"

            def refresh(cfg: Any) -> None:
                if dt.datetime.now() - state["at"] >= dt.timedelta(seconds=TOKEN_FILE_REFRESH_S):
                    with contextlib.suppress(KubeAuthError):  # keep the last token; a 401 reloads and says why
                        cfg.api_key["BearerToken"] = f"Bearer {read_token()}"
                    state["at"] = dt.datetime.now()

            config.refresh_api_key_hook = refresh  # type: ignore[assignment]
        elif token:
            config.api_key["BearerToken"] = f"Bearer {token}"
        return config

    if token_file:
        method = AuthMethod(f"the token in {token_file}", "the file was re-read; check that it holds a current token")
    elif token:
        method = AuthMethod("a bearer token", "check that the token is current for this cluster")
    else:
        method = AuthMethod("no credentials (anonymous)", "give a token file or a kubeconfig")
    return Credentials(f"server {server}", method, load, refresh_every=refresh_every, clock=clock)


def resolve(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    insecure: bool = False,
    environ: Mapping[str, str] | None = None,
    sa_dir: str = SA_DIR,
) -> Credentials:
    """Credentials from, in order: ``kubeconfig``, ``$KUBECONFIG``, the pod's service account, ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return from_kubeconfig(kubeconfig, context=context, insecure=insecure)
    if env.get("KUBECONFIG"):
        return from_kubeconfig(env["KUBECONFIG"], context=context, insecure=insecure)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(sa_dir=sa_dir, environ=env)
    default = os.path.expanduser(DEFAULT_KUBECONFIG)
    if os.path.exists(default):
        return from_kubeconfig(default, context=context, insecure=insecure)
    raise KubeAuthError(
        "no Kubernetes API configuration: not in a cluster (KUBERNETES_SERVICE_HOST is unset) and no kubeconfig "
        f"(pass --kubeconfig FILE or set KUBECONFIG; {DEFAULT_KUBECONFIG} does not exist)"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return text or type(exc).__name__
