"""A real Kubernetes control plane for the e2e tests.

:class:`ControlPlane` starts etcd, kube-apiserver, kube-scheduler and kwok from
the binaries that ``tests/e2e/build.py`` built, on free loopback ports, with
freshly generated certificates, and stops every process it started. Nodes are
fake: kwok manages every Node that carries the annotation
``kwok.x-k8s.io/node: fake`` (see :meth:`ControlPlane.create_node`) and plays
the kubelet for the pods bound to them.

There is no kube-controller-manager: nothing creates ``default`` service
accounts (so the ServiceAccount admission plugin is off), no controller turns
Deployments into pods, and a deleted namespace stays ``Terminating``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from . import build

__all__ = [
    "KWOK_ANNOTATION",
    "KWOK_TAINT",
    "KWOK_TOLERATIONS",
    "Binaries",
    "Component",
    "ComponentError",
    "ControlPlane",
    "e2e_required",
    "find_binaries",
    "refusal",
    "require_binaries",
    "scheduler_config",
    "wait_until_drained",
]

T = TypeVar("T")

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT: dict[str, str] = {"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATIONS: list[dict[str, str]] = [
    {"key": KWOK_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"},
]
DEFAULT_ALLOCATABLE: dict[str, str] = {"cpu": "32", "memory": "256Gi", "pods": "110"}
SCHEDULER_API = "kubescheduler.config.k8s.io/v1"
LOG_TAIL_LINES = 40
START_TIMEOUT_S = 90.0
NOT_BUILT = "e2e control plane not built"


class ComponentError(RuntimeError):
    """A component did not start or stop; the message names it and shows its log tail."""


# --------------------------------------------------------------------------- binaries


@dataclass(frozen=True, slots=True)
class Binaries:
    """Paths of the built binaries."""

    directory: Path

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)


def find_binaries() -> tuple[Binaries | None, str]:
    """The binaries, or None and a one-line reason saying how to get them."""
    directory = build.bin_dir()
    missing = build.missing_binaries(directory)
    if not missing:
        return Binaries(directory), ""
    how = "run `make e2e-bins` to enable the e2e tests (needs Go >= 1.26; about 10 minutes the first time)"
    return None, f"{NOT_BUILT}: {', '.join(missing)} missing in {directory}; {how}"


def e2e_required() -> bool:
    """True when ``ICL_E2E_REQUIRED`` is set (CI): missing binaries fail instead of skip."""
    return os.environ.get("ICL_E2E_REQUIRED", "").strip().lower() not in ("", "0", "false", "no")


def require_binaries() -> Binaries:
    """The binaries; else skip the test with one line (fail it under ICL_E2E_REQUIRED=1)."""
    binaries, reason = find_binaries()
    if binaries is not None:
        return binaries
    if e2e_required():
        pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(
    condition: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 60.0,
    interval: float = 0.2,
    watch: Sequence[Component] = (),
) -> T:
    """Poll ``condition`` until it returns a truthy value, or fail with a readable error.

    Exceptions raised by ``condition`` count as "not yet" (the last one is
    reported). If a component in ``watch`` exits meanwhile, fail at once with
    its log tail.
    """
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        for component in watch:
            if not component.running:
                raise ComponentError(
                    f"{component.name} exited with code {component.returncode} "
                    f"while waiting for {what}\n{component.log_tail()}"
                )
        try:
            result = condition()
        except Exception as error:
            last_error = f"{type(error).__name__}: {error}".strip()
            result = None
        if result:
            return result
        if time.monotonic() >= deadline:
            tails = "".join("\n" + c.log_tail() for c in watch)
            because = f"; last error: {last_error[:500]}" if last_error else ""
            raise ComponentError(f"timed out after {timeout:.0f}s waiting for {what}{because}{tails}")
        time.sleep(interval)


def wait_until_drained(
    remaining: Callable[[], int],
    *,
    what: str,
    stall: float = 120.0,
    interval: float = 0.5,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Poll ``remaining`` (a count of things still to go) until it returns 0.

    Gives up with :class:`ComponentError` only when the count has not fallen for
    ``stall`` seconds: cleanup runs at the machine's speed, and a loaded machine
    deleting thousands of pods is slow but moving, so a fixed deadline would turn
    a finished measurement into a failure. Exceptions raised by ``remaining``
    count as no progress (the last one is reported). ``progress``, when given,
    gets a line whenever the count falls, at most every 10 s.
    """
    if stall <= 0:
        raise ValueError(f"stall: expected seconds > 0, got {stall}")
    lowest: int | None = None
    last_fall = time.monotonic()
    last_said = 0.0
    last_error = ""
    while True:
        try:
            count = remaining()
        except Exception as error:
            last_error = f"{type(error).__name__}: {error}".strip()
        else:
            if count <= 0:
                return
            now = time.monotonic()
            if lowest is None or count < lowest:
                lowest, last_fall = count, now
                if progress is not None and now - last_said >= 10.0:
                    progress(f"{what}: {count} left")
                    last_said = now
        if time.monotonic() - last_fall >= stall:
            left = "unknown" if lowest is None else str(lowest)
            because = f"; last error: {last_error[:500]}" if last_error else ""
            raise ComponentError(f"no progress for {stall:.0f}s waiting for {what} ({left} left){because}")
        time.sleep(interval)


def pods_left(core: k8s.CoreV1Api, namespace: str) -> int:
    """How many pods ``namespace`` still holds, from one list of limit 1 (the server counts the rest)."""
    listed = core.list_namespaced_pod(namespace, limit=1)
    return len(listed.items) + (listed.metadata.remaining_item_count or 0)


def _set_parent_death_signal() -> None:
    """In the child: die with the test process (Linux), even if it is killed."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@dataclass(slots=True)
class Component:
    """One process of the control plane, in its own process group, logging to a file."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> Component:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log.flush()
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Only from the main thread: the signal fires when the *thread* that forked exits.
                preexec_fn=_set_parent_death_signal if _in_main_thread() else None,
            )
        except OSError as error:
            self._log.close()
            raise ComponentError(f"{self.name} could not be started: {error}") from error
        return self

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        """Started and not exited (checked without reaping, so the group stays addressable)."""
        if self.process is None or self.process.returncode is not None:
            return False
        try:
            info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return False
        return info is None

    @property
    def returncode(self) -> int | None:
        if self.process is None:
            return None
        if self.running:
            return None
        return self.process.wait()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, wait up to ``grace``, then SIGKILL it; reap."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.running and time.monotonic() < deadline:
                time.sleep(0.05)
            # The leader is exited but not reaped: its group id is still ours.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        body = "\n".join(text[-lines:]) or "(empty)"
        return f"--- {self.name}: last {lines} lines of {self.log_path} ---\n{body}"


# --------------------------------------------------------------------------- certificates


def _leaf(
    common_name: str,
    org: str | None,
    server: bool,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey],
    now: dt.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf certificate and its key, for a day: a client's, or a server's for the API server's names."""
    ca_name, ca_key = issuer
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        names: list[x509.GeneralName] = [
            x509.DNSName(dns)
            for dns in (
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            )
        ]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1", "10.96.0.1")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


@dataclass(frozen=True, slots=True)
class Pki:
    """Files of the cluster's certificates and keys."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    def issue(self, name: str, common_name: str, org: str | None = None, *, server: bool = False) -> tuple[Path, Path]:
        """A certificate (client, or serving for the loopback names) signed by the cluster's CA, written as
        ``name.crt`` and ``name.key`` beside the others; their paths."""
        ca_cert = x509.load_pem_x509_certificate(self.path("ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key(self.path("ca.key").read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        self._write(name, *_leaf(common_name, org, server, (ca_cert.subject, ca_key), dt.datetime.now(dt.UTC)))
        self.path(f"{name}.key").chmod(0o600)
        return self.path(f"{name}.crt"), self.path(f"{name}.key")

    @classmethod
    def generate(cls, directory: Path) -> Pki:
        """A CA, the API server's serving cert, client certs, the service-account key pair."""
        directory.mkdir(parents=True, exist_ok=True)
        pki = cls(directory)
        now = dt.datetime.now(dt.UTC)

        def authority(name: str, common_name: str) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
            key = ec.generate_private_key(ec.SECP256R1())
            subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
            cert = (
                x509.CertificateBuilder()
                .subject_name(subject)
                .issuer_name(subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(
                    x509.KeyUsage(
                        digital_signature=True,
                        content_commitment=False,
                        key_encipherment=False,
                        data_encipherment=False,
                        key_agreement=False,
                        key_cert_sign=True,
                        crl_sign=True,
                        encipher_only=False,
                        decipher_only=False,
                    ),
                    critical=True,
                )
                .sign(key, hashes.SHA256())
            )
            pki._write(name, cert, key)
            return subject, key

        def leaf(
            name: str,
            common_name: str,
            org: str | None,
            server: bool,
            issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey],
        ) -> None:
            pki._write(name, *_leaf(common_name, org, server, issuer, now))

        ca = authority("ca", "kube-icl-e2e-ca")
        leaf("apiserver", "kube-apiserver", None, server=True, issuer=ca)
        leaf("admin", "kube-icl-e2e-admin", "system:masters", server=False, issuer=ca)
        leaf("scheduler", "system:kube-scheduler", None, server=False, issuer=ca)
        leaf("kwok", "kube-icl-e2e-kwok", "system:masters", server=False, issuer=ca)
        front_proxy = authority("front-proxy-ca", "kube-icl-e2e-front-proxy-ca")
        leaf("front-proxy-client", "front-proxy-client", None, server=False, issuer=front_proxy)

        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pki.path("sa.key").write_bytes(
            sa_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        pki.path("sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return pki

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.path(f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path = self.path(f"{name}.key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)


def write_kubeconfig(path: Path, *, server: str, pki: Pki, user: str) -> Path:
    """A kubeconfig for ``server`` authenticating with the client cert ``pki/<user>.crt``."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kube-icl-e2e",
                "cluster": {"server": server, "certificate-authority": str(pki.path("ca.crt"))},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki.path(f"{user}.crt")),
                    "client-key": str(pki.path(f"{user}.key")),
                },
            }
        ],
        "contexts": [{"name": "kube-icl-e2e", "context": {"cluster": "kube-icl-e2e", "user": user}}],
        "current-context": "kube-icl-e2e",
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# --------------------------------------------------------------------------- scheduler config


def scheduler_config(
    *,
    extender_url: str | None = None,
    filter_verb: str | None = "filter",
    prioritize_verb: str | None = "prioritize",
    bind_verb: str | None = "bind",
    weight: int = 1,
    managed_resources: Sequence[str] = ("kube-icl.io/accelerator",),
    node_cache_capable: bool = False,
    ignorable: bool = False,
    http_timeout: str = "10s",
) -> dict[str, Any]:
    """A ``KubeSchedulerConfiguration`` (v1) for the default profile, with an extender if asked.

    ``extender_url`` is the extender's ``urlPrefix`` (e.g. ``http://127.0.0.1:8888``);
    a verb set to None is not delegated. Managed resources are marked
    ``ignoredByScheduler``: the extender, not the scheduler, accounts for them.
    The harness fills in ``clientConnection`` and ``leaderElection``.
    """
    config: dict[str, Any] = {
        "apiVersion": SCHEDULER_API,
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "default-scheduler"}],
    }
    if extender_url is not None:
        extender: dict[str, Any] = {
            "urlPrefix": extender_url,
            "weight": weight,
            "enableHTTPS": extender_url.startswith("https://"),
            "nodeCacheCapable": node_cache_capable,
            "ignorable": ignorable,
            "httpTimeout": http_timeout,
            "managedResources": [{"name": name, "ignoredByScheduler": True} for name in managed_resources],
        }
        for key, verb in (
            ("filterVerb", filter_verb),
            ("prioritizeVerb", prioritize_verb),
            ("bindVerb", bind_verb),
        ):
            if verb is not None:
                extender[key] = verb
        config["extenders"] = [extender]
    return config


def _load_scheduler_config(config: Mapping[str, Any] | Path | str | None) -> dict[str, Any]:
    if config is None:
        return scheduler_config()
    if isinstance(config, Mapping):
        copied: dict[str, Any] = json.loads(json.dumps(config))  # a deep copy we may fill in
        return copied
    loaded = yaml.safe_load(Path(config).read_text())
    if not isinstance(loaded, dict) or loaded.get("kind") != "KubeSchedulerConfiguration":
        raise ValueError(f"{config}: not a KubeSchedulerConfiguration document")
    return loaded


# --------------------------------------------------------------------------- the control plane


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kwok, on loopback, under ``workdir``.

    Attributes available after :meth:`start`: ``server`` (the API server URL),
    ``kubeconfig`` (an admin kubeconfig, group ``system:masters``),
    ``api_client`` (a ``kubernetes.client.ApiClient``), ``core`` (``CoreV1Api``).
    """

    def __init__(self, workdir: Path, binaries: Binaries, *, apiserver_flags: Sequence[str] = ()) -> None:
        """``apiserver_flags`` are added to kube-apiserver's command line (e.g. ``--feature-gates=...``,
        ``--runtime-config=...``)."""
        self.workdir = workdir
        self.binaries = binaries
        self.apiserver_flags = list(apiserver_flags)
        self.logs = workdir / "logs"
        self.pki: Pki | None = None
        self.etcd: Component | None = None
        self.apiserver: Component | None = None
        self.kwok: Component | None = None
        self.scheduler: Component | None = None
        self.scheduler_config_path: Path | None = None
        self.server = ""
        self.kubeconfig = workdir / "admin.kubeconfig"
        self._scheduler_kubeconfig = workdir / "scheduler.kubeconfig"
        self._kwok_kubeconfig = workdir / "kwok.kubeconfig"
        self._api_client: k8s.ApiClient | None = None
        self._scheduler_starts = 0
        self._scheduler_source: Mapping[str, Any] | Path | str | None = None
        self._scheduler_flags: tuple[str, ...] = ()

    # ----------------------------------------------------------- lifecycle

    @property
    def components(self) -> list[Component]:
        """The started components, in start order."""
        found = [self.etcd, self.apiserver, self.kwok, self.scheduler]
        return [c for c in found if c is not None]

    def pids(self) -> dict[str, int]:
        return {c.name: c.pid for c in self.components if c.pid is not None}

    def start(self, *, scheduler: Mapping[str, Any] | Path | str | None = None) -> ControlPlane:
        """Start everything and wait until each part is ready; on failure stop what started.

        Ports are picked free just before use; if another process takes one
        meanwhile ("address already in use"), the whole start is retried once.
        """
        for attempt in range(2):
            try:
                self.pki = Pki.generate(self.workdir / "pki")
                self._start_etcd()
                self._start_apiserver()
                self._start_kwok()
                self.start_scheduler(scheduler)
            except ComponentError as error:
                self.stop()
                self.etcd = self.apiserver = self.kwok = self.scheduler = None
                if attempt == 0 and "address already in use" in str(error):
                    shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
                    continue
                raise
            except BaseException:
                self.stop()
                raise
            break
        return self

    def stop(self) -> list[str]:
        """Stop every component (newest first); returns 'name pid' of any that survived."""
        if self._api_client is not None:
            self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
        survivors: list[str] = []
        errors: list[str] = []
        for component in reversed(self.components):
            try:
                component.stop()
            except Exception as error:
                errors.append(f"{component.name}: {error}")
            if component.pid is not None and _process_exists(component.pid):
                survivors.append(f"{component.name} {component.pid}")
        if errors:
            raise ComponentError("stopping the control plane failed: " + "; ".join(errors))
        return survivors

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> dict[str, str]:
        return {c.name: c.log_tail(lines) for c in self.components}

    def _component(self, name: str, argv: list[str]) -> Component:
        return Component(name, argv, self.logs / f"{name}.log").start()

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.etcd = self._component(
            "etcd",
            [
                self.binaries["etcd"],
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",  # bench/scale.py stores 150,000 pods (default quota: 2 GiB)
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                return bool(json.load(response).get("health") == "true")

        wait_for(healthy, what="etcd /health", timeout=START_TIMEOUT_S, watch=[self.etcd])

    def _start_apiserver(self) -> None:
        assert self.pki is not None and self.etcd is not None
        pki = self.pki
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self.apiserver = self._component(
            "kube-apiserver",
            [
                self.binaries["kube-apiserver"],
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.path('apiserver.crt')}",
                f"--tls-private-key-file={pki.path('apiserver.key')}",
                f"--client-ca-file={pki.path('ca.crt')}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.path('sa.pub')}",
                f"--service-account-signing-key-file={pki.path('sa.key')}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                # No controller-manager: nothing creates the `default` service accounts,
                # nor lifts the not-ready taint that TaintNodesByCondition puts on new nodes.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                f"--requestheader-client-ca-file={pki.path('front-proxy-ca.crt')}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.path('front-proxy-client.crt')}",
                f"--proxy-client-key-file={pki.path('front-proxy-client.key')}",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.apiserver_flags,
            ],
        )
        write_kubeconfig(self.kubeconfig, server=self.server, pki=pki, user="admin")
        write_kubeconfig(self._scheduler_kubeconfig, server=self.server, pki=pki, user="scheduler")
        write_kubeconfig(self._kwok_kubeconfig, server=self.server, pki=pki, user="kwok")
        context = ssl.create_default_context(cafile=str(pki.path("ca.crt")))
        context.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=5, context=context) as response:
                return bool(response.status == 200)

        wait_for(ready, what="kube-apiserver /readyz", timeout=START_TIMEOUT_S, watch=[self.apiserver])
        wait_for(
            lambda: self.core.read_namespace("default"),
            what="the default namespace",
            timeout=START_TIMEOUT_S,
            watch=[self.apiserver],
        )

    def _start_kwok(self) -> None:
        port = free_port()
        self.kwok = self._component(
            "kwok",
            [
                self.binaries["kwok"],
                f"--kubeconfig={self._kwok_kubeconfig}",
                f"--config={self.binaries.directory / build.KWOK_STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{port}",
                "--cidr=10.0.0.1/16",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                return bool(response.status == 200)

        wait_for(healthy, what="kwok /healthz", timeout=START_TIMEOUT_S, watch=[self.kwok])

    # ----------------------------------------------------------- scheduler

    def start_scheduler(
        self, config: Mapping[str, Any] | Path | str | None = None, *, flags: Sequence[str] = ()
    ) -> Component:
        """(Re)start kube-scheduler with ``config`` and wait until it is ready.

        ``config`` is a ``KubeSchedulerConfiguration`` as a dict (see
        :func:`scheduler_config`, e.g. ``scheduler_config(extender_url=...)``)
        or a YAML file; None means a plain default scheduler. Its
        ``clientConnection.kubeconfig`` is replaced by the test cluster's and
        leader election is turned off. ``flags`` are added to its command line (e.g.
        ``--feature-gates=...``).
        """
        assert self.pki is not None
        self.stop_scheduler()
        self._scheduler_source, self._scheduler_flags = config, tuple(flags)
        path, port, argv = self._scheduler_run(config, {"leaderElect": False}, "", flags)
        self.scheduler_config_path = path
        self.scheduler = self._component("kube-scheduler", argv)
        self._wait_scheduler(port, "readyz", "kube-scheduler", self.scheduler)
        return self.scheduler

    def start_scheduler_replica(
        self, config: Mapping[str, Any], name: str, *, leader_election: Mapping[str, Any]
    ) -> Component:
        """Start one more kube-scheduler (an HA replica) with ``config`` and ``leader_election`` (the
        ``leaderElection`` section, e.g. ``{"leaderElect": True}``), beside the harness's own; wait until
        its /healthz answers (a standby is healthy, not leading). The caller stops it."""
        assert self.pki is not None
        _path, port, argv = self._scheduler_run(config, leader_election, name)
        component = Component(name, argv, self.logs / f"{name}-{self._scheduler_starts}.log").start()
        self._wait_scheduler(port, "healthz", name, component)
        return component

    def _scheduler_run(
        self,
        config: Mapping[str, Any] | Path | str | None,
        leader_election: Mapping[str, Any],
        name: str,
        flags: Sequence[str] = (),
    ) -> tuple[Path, int, list[str]]:
        """Write ``config`` for this cluster (its kubeconfig, ``leader_election``); the file, a free secure
        port and kube-scheduler's command line (``name`` tells a replica's files apart)."""
        document = _load_scheduler_config(config)
        document.setdefault("clientConnection", {})["kubeconfig"] = str(self._scheduler_kubeconfig)
        document["leaderElection"] = dict(leader_election)
        self._scheduler_starts += 1
        tag = f"{name}-" if name else ""
        path = self.workdir / f"scheduler-config-{tag}{self._scheduler_starts}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        port = free_port()
        argv = [
            self.binaries["kube-scheduler"],
            f"--config={path}",
            f"--authentication-kubeconfig={self._scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self._scheduler_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / ('scheduler-certs' + (f'-{name}' if name else ''))}",
            "--v=2",
            *flags,
        ]
        return path, port, argv

    @staticmethod
    def _wait_scheduler(port: int, endpoint: str, what: str, component: Component) -> None:
        """Until kube-scheduler's ``/<endpoint>`` on ``port`` answers 200 (its serving cert is self-signed)."""
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def answered() -> bool:
            url = f"https://127.0.0.1:{port}/{endpoint}"
            with urllib.request.urlopen(url, timeout=5, context=insecure) as response:
                return bool(response.status == 200)

        wait_for(answered, what=f"{what} /{endpoint}", timeout=START_TIMEOUT_S, watch=[component])

    def check_scheduler_config(self, path: Path | str) -> Path:
        """Have the real kube-scheduler load and validate a ``KubeSchedulerConfiguration`` file.

        Strict decoding: unknown fields and invalid values are rejected. The
        file's ``clientConnection.kubeconfig`` is replaced by this cluster's.
        Returns the defaulted configuration kube-scheduler wrote out.
        """
        document = _load_scheduler_config(Path(path))
        document.setdefault("clientConnection", {})["kubeconfig"] = str(self._scheduler_kubeconfig)
        self._scheduler_starts += 1
        checked = self.workdir / f"scheduler-config-check-{self._scheduler_starts}.yaml"
        checked.write_text(yaml.safe_dump(document, sort_keys=False))
        written = checked.with_suffix(".defaulted.yaml")
        command = [self.binaries["kube-scheduler"], f"--config={checked}", f"--write-config-to={written}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0 or not written.exists():
            errors = [line for line in result.stderr.splitlines() if line.startswith("E")] or [result.stderr]
            raise ComponentError(f"kube-scheduler rejects {path}: {' '.join(errors)[-2000:]}")
        return written

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None

    @contextlib.contextmanager
    def use_scheduler(self, config: Mapping[str, Any] | Path | str | None) -> Iterator[Component]:
        """Run kube-scheduler with ``config`` inside the block, and the previous config after it."""
        previous, flags = self._scheduler_source, self._scheduler_flags
        try:
            yield self.start_scheduler(config)
        finally:
            self.start_scheduler(previous, flags=flags)

    # ----------------------------------------------------------- API

    @property
    def api_client(self) -> k8s.ApiClient:
        """A ``kubernetes`` ApiClient logged in as the admin (``system:masters``)."""
        if self._api_client is None:
            self._api_client = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(self.kubeconfig)
            )
        return self._api_client

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api_client)

    def core_as_service_account(self, user: str, node: str | None = None) -> k8s.CoreV1Api:
        """A CoreV1Api impersonating the service account ``user`` (``system:serviceaccount:NS:NAME``),
        with a token bound to ``node`` when given (what a DaemonSet pod's projected token carries)."""
        api = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        api.set_default_header("Impersonate-User", user)
        api.set_default_header("Impersonate-Group", "system:serviceaccounts")
        if node:
            api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2Fnode-name", node)
        return k8s.CoreV1Api(api)

    def ensure_namespace(self, name: str) -> None:
        try:
            self.core.create_namespace(
                k8s.V1Namespace(api_version="v1", kind="Namespace", metadata=k8s.V1ObjectMeta(name=name))
            )
        except k8s.ApiException as error:
            if error.status != 409:
                raise

    @contextlib.contextmanager
    def scratch_namespace(self, prefix: str, hex_digits: int = 8) -> Iterator[str]:
        """A fresh namespace ``PREFIX-<random hex>``, created; its pods are force-deleted on leaving."""
        name = f"{prefix}-{uuid.uuid4().hex[:hex_digits]}"
        self.ensure_namespace(name)
        try:
            yield name
        finally:
            self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)

    def create_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (KWOK_TAINT,),
        wait_ready: bool = True,
    ) -> k8s.V1Node:
        """Create a fake Node that kwok manages; by default wait until it is Ready.

        ``allocatable`` is merged over :data:`DEFAULT_ALLOCATABLE` (cpu, memory,
        pods); ``capacity`` defaults to the same values. The node carries the
        kwok taint unless ``taints`` says otherwise: pods need
        :data:`KWOK_TOLERATIONS`.
        """
        resources = {**DEFAULT_ALLOCATABLE, **(allocatable or {})}
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **(labels or {}),
                },
                "annotations": {
                    KWOK_ANNOTATION: "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                    **(annotations or {}),
                },
            },
            "spec": {"taints": [dict(t) for t in taints]},
            "status": {
                "allocatable": resources,
                "capacity": {**resources, **(capacity or {})},
            },
        }
        self.core.create_node(body)
        if wait_ready:
            return self.wait_node_ready(name)
        node: k8s.V1Node = self.core.read_node(name)
        return node

    def wait_node_ready(self, name: str, timeout: float = 60.0) -> k8s.V1Node:
        def ready() -> k8s.V1Node | None:
            node: k8s.V1Node = self.core.read_node(name)
            conditions = (node.status and node.status.conditions) or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                return node
            return None

        return wait_for(ready, what=f"node {name} Ready", timeout=timeout, watch=self._watched())

    def wait_pod(
        self,
        namespace: str,
        name: str,
        condition: Callable[[k8s.V1Pod], bool],
        *,
        what: str,
        timeout: float = 60.0,
    ) -> k8s.V1Pod:
        """Poll the pod until ``condition(pod)`` holds."""

        def check() -> k8s.V1Pod | None:
            pod: k8s.V1Pod = self.core.read_namespaced_pod(name, namespace)
            return pod if condition(pod) else None

        return wait_for(check, what=f"pod {namespace}/{name} {what}", timeout=timeout, watch=self._watched())

    def wait_pod_phase(self, namespace: str, name: str, phase: str, timeout: float = 60.0) -> k8s.V1Pod:
        return self.wait_pod(
            namespace,
            name,
            lambda pod: pod.status is not None and pod.status.phase == phase,
            what=f"phase {phase}",
            timeout=timeout,
        )

    def _watched(self) -> list[Component]:
        return self.components

    # ----------------------------------------------------------- kubectl

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster as the admin."""
        command = [self.binaries["kubectl"], f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise ComponentError(
                f"`kubectl {' '.join(args)}` failed with code {result.returncode}:\n"
                f"{result.stderr.strip()}\n{result.stdout.strip()}".rstrip()
            )
        return result

    def server_dry_run_apply(
        self, path: Path | str, *, create_namespaces: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply --dry-run=server`` a file, or a kustomization directory (``-k``).

        The API server validates and admits every object without storing it.
        A server-side dry run cannot see a Namespace created in the same
        apply, so by default the namespaces the objects live in are created
        for real first. Raises :class:`ComponentError` with kubectl's output
        when the server rejects anything.
        """
        path = Path(path)
        kustomize = path.is_dir()
        if create_namespaces:
            rendered = self.kubectl("kustomize", str(path)).stdout if kustomize else path.read_text()
            for document in yaml.safe_load_all(rendered):
                if isinstance(document, dict):
                    namespace = (document.get("metadata") or {}).get("namespace")
                    if namespace:
                        self.ensure_namespace(str(namespace))
        flag = "-k" if kustomize else "-f"
        return self.kubectl("apply", "--dry-run=server", flag, str(path))


def _process_exists(pid: int) -> bool:
    """True if a process with this pid exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def refusal(call: Callable[[], object]) -> str:
    """The API server's refusal (403, or 422 from an admission policy) of ``call``, or "" when it went through."""
    try:
        call()
    except k8s.ApiException as e:
        if e.status in (403, 422):
            return str(e.body)
        raise
    return ""


def wait_http(url: str, *, timeout: float = 30.0) -> None:
    """Wait until ``url`` answers 2xx (for test-side servers such as an extender)."""

    def answered() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(200 <= response.status < 300)
        except urllib.error.HTTPError:
            return False

    wait_for(answered, what=url, timeout=timeout)
