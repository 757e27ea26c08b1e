"""Credentials through the ``kubernetes`` package's loader, used by both transports, against real loopback peers.

The peers: an HTTPS endpoint that checks bearer tokens and records the TLS server name each connection
asked for (``kube_peer.TokenAPIServer``), an HTTP CONNECT proxy (``kube_peer.ConnectProxy``), and an exec
credential plugin run as a real subprocess (``exec_credential_plugin.py``). Both transports are checked
where they differ: the extender's keep-alive client (:class:`scheduler.kube.RestKubeAPI`) and the
library's own client through :class:`kubeauth.KubeSession` (device plugin, ``icl topo show node/NAME``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from exec_credential_plugin import calls, exec_kubeconfig, write_plan
from kube_peer import ConnectProxy, TokenAPIServer, issue_ca_and_server

import kubeauth
from kubeauth import KubeAuthError, KubeSession
from scheduler.kube import KubeError, RestKubeAPI

HOUR = 3600.0
EXPIRED = -60.0


@pytest.fixture(autouse=True)
def _no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[TokenAPIServer]:
    with TokenAPIServer(tmp_path) as server:
        yield server


def token_kubeconfig(path: Path, server: str, ca_file: str, token: str, **cluster: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca_file, **cluster}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def list_nodes(session: KubeSession) -> list[Any]:
    from kubernetes import client

    return list(session.call(lambda api: client.CoreV1Api(api).list_node(_request_timeout=5).items, "list nodes"))


# ------------------------------------------------------------------ exec credential plugins


def test_an_expired_exec_credential_is_fetched_again_before_it_is_sent(peer: TokenAPIServer, tmp_path: Path) -> None:
    state = tmp_path / "exec"
    write_plan(state, ("stale", EXPIRED), ("good", HOUR))
    peer.accepted = {"good"}
    config = exec_kubeconfig(tmp_path / "kubeconfig", server=peer.url, ca_file=str(peer.ca_file), state=state)
    api = RestKubeAPI.from_kubeconfig(str(config))
    assert calls(state) == 2, "loaded (expired credential), then run again by the library's refresh hook"
    assert api.list("nodes") == ([], "7")
    for _ in range(5):
        api.list("pods")
    assert calls(state) == 2, "a valid credential is not fetched again per request"
    assert peer.unauthorized() == 0, "the expired token was never sent"
    assert {s.authorization for s in peer.seen} == {"Bearer good"}
    assert (state / "calls").read_text().splitlines()[0] == "client.authentication.k8s.io/v1 ExecCredential"


def test_a_401_runs_the_exec_plugin_again_once_then_names_it(peer: TokenAPIServer, tmp_path: Path) -> None:
    state = tmp_path / "exec"
    write_plan(state, ("revoked", HOUR), ("good", HOUR))
    peer.accepted = {"good"}
    config = exec_kubeconfig(tmp_path / "kubeconfig", server=peer.url, ca_file=str(peer.ca_file), state=state)
    api = RestKubeAPI.from_kubeconfig(str(config))
    assert api.list("nodes") == ([], "7")
    assert (calls(state), peer.unauthorized()) == (2, 1), "one 401, one reload, then the good token"
    peer.accepted = set()  # the cluster now refuses whatever the plugin prints
    with pytest.raises(KubeError) as err:
        api.list("nodes")
    assert err.value.status == 401
    assert calls(state) == 3, "exactly one reload per 401"
    message = str(err.value)
    assert "\n" not in message
    assert f"exec credential plugin `{sys.executable}" in message
    assert "by hand" in message and "ExecCredential" in message
    assert f"kubeconfig {config} (context exec)" in message


def test_the_watch_reloads_credentials_on_a_401_too(peer: TokenAPIServer, tmp_path: Path) -> None:
    state = tmp_path / "exec"
    write_plan(state, ("revoked", HOUR), ("good", HOUR))
    peer.accepted = {"good"}
    config = exec_kubeconfig(tmp_path / "kubeconfig", server=peer.url, ca_file=str(peer.ca_file), state=state)
    api = RestKubeAPI.from_kubeconfig(str(config))
    peer.nodes["n1"] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    assert [(kind, obj["metadata"]["name"]) for kind, obj in api.watch("nodes", "7", timeout_s=1)] == [("ADDED", "n1")]
    assert (calls(state), peer.unauthorized()) == (2, 1)


def test_the_library_client_reloads_once_on_a_401_then_names_the_method(peer: TokenAPIServer, tmp_path: Path) -> None:
    state = tmp_path / "exec"
    write_plan(state, ("revoked", HOUR), ("good", HOUR))
    peer.accepted = {"good"}
    config = exec_kubeconfig(tmp_path / "kubeconfig", server=peer.url, ca_file=str(peer.ca_file), state=state)
    session = KubeSession(kubeauth.from_kubeconfig(str(config)))
    assert list_nodes(session) == []
    assert (calls(state), peer.unauthorized()) == (2, 1)
    peer.accepted = set()
    with pytest.raises(KubeAuthError) as err:
        list_nodes(session)
    assert calls(state) == 3
    assert "list nodes: 401 Unauthorized" in str(err.value) and "exec credential plugin" in str(err.value)


def test_a_failing_exec_plugin_is_one_line_with_its_stderr(peer: TokenAPIServer, tmp_path: Path) -> None:
    state = tmp_path / "exec"
    write_plan(state, ("good", HOUR))
    (state / "fail").write_text("error: your SSO session has expired, run `corp-login`\n")
    config = exec_kubeconfig(tmp_path / "kubeconfig", server=peer.url, ca_file=str(peer.ca_file), state=state)
    with pytest.raises(KubeAuthError) as err:
        kubeauth.from_kubeconfig(str(config))
    message = str(err.value)
    assert "\n" not in message
    assert "gave no credential" in message and "your SSO session has expired" in message
    assert "process returned 1" in message


# ------------------------------------------------------------------ tls-server-name, proxy-url


def test_tls_server_name_is_the_name_sent_and_checked(tmp_path: Path) -> None:
    with TokenAPIServer(tmp_path, names=["api.internal"]) as peer:  # no IP in the certificate
        peer.accepted = {"t"}
        plain = token_kubeconfig(tmp_path / "plain", peer.url, str(peer.ca_file), "t")
        with pytest.raises(KubeError, match="certificate verify failed"):
            RestKubeAPI.from_kubeconfig(str(plain)).list("nodes")
        named = token_kubeconfig(
            tmp_path / "named", peer.url, str(peer.ca_file), "t", **{"tls-server-name": "api.internal"}
        )
        assert RestKubeAPI.from_kubeconfig(str(named)).list("nodes") == ([], "7")
        assert list_nodes(KubeSession(kubeauth.from_kubeconfig(str(named)))) == []
        assert [n for n in peer.server_names if n] == ["api.internal", "api.internal"]


def test_proxy_url_tunnels_both_transports(peer: TokenAPIServer, tmp_path: Path) -> None:
    peer.accepted = {"t"}
    with ConnectProxy() as proxy:
        with_auth = proxy.url.replace("http://", "http://ops:s%40fe@")
        config = token_kubeconfig(tmp_path / "k", peer.url, str(peer.ca_file), "t", **{"proxy-url": with_auth})
        assert RestKubeAPI.from_kubeconfig(str(config)).list("nodes") == ([], "7")
        line, headers = proxy.requests[0]
        assert line == f"CONNECT 127.0.0.1:{peer.port}"
        assert headers["Proxy-Authorization"] == "Basic b3BzOnNAZmU="  # ops:s@fe
        config = token_kubeconfig(tmp_path / "k2", peer.url, str(peer.ca_file), "t", **{"proxy-url": proxy.url})
        assert list_nodes(KubeSession(kubeauth.from_kubeconfig(str(config)))) == []
        assert [r[0] for r in proxy.requests] == [f"CONNECT 127.0.0.1:{peer.port}"] * 2
    assert len(peer.seen) == 2


def test_a_socks_proxy_is_refused_by_the_extender_transport_in_one_line(peer: TokenAPIServer, tmp_path: Path) -> None:
    config = token_kubeconfig(tmp_path / "k", peer.url, str(peer.ca_file), "t", **{"proxy-url": "socks5://127.0.0.1:1"})
    with pytest.raises(KubeError, match=r"proxy-url 'socks5://127.0.0.1:1': .* http://host:port proxies only"):
        RestKubeAPI.from_kubeconfig(str(config)).list("nodes")
    assert peer.seen == []


# ------------------------------------------------------------------ token rotation


def test_in_cluster_token_rotation_is_picked_up(peer: TokenAPIServer, tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(peer.ca_file.read_bytes())
    (sa / "token").write_text("first")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(peer.port)}
    peer.accepted = {"first"}
    creds = kubeauth.in_cluster(sa_dir=str(sa), environ=env)
    api = RestKubeAPI(creds)
    session = KubeSession(creds)
    assert api.list("nodes") == ([], "7") and list_nodes(session) == []
    (sa / "token").write_text("second")  # the kubelet rotated the projected token
    peer.accepted = {"second"}
    assert api.list("nodes") == ([], "7")
    assert list_nodes(session) == []
    assert peer.seen[-1].authorization.lower() == "bearer second"
    assert peer.unauthorized() == 2, "one refused request per client, then the re-read token"
    peer.accepted = set()
    with pytest.raises(KubeError) as err:
        api.list("nodes")
    assert "service account token" in str(err.value) and "serviceAccountName" in str(err.value)


def test_in_cluster_config_is_read_by_the_library_with_a_refresh_hook(peer: TokenAPIServer, tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(peer.ca_file.read_bytes())
    (sa / "token").write_text("tok")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(peer.port)}
    creds = kubeauth.in_cluster(sa_dir=str(sa), environ=env)
    assert creds.configuration.refresh_api_key_hook is not None, "the library re-reads the token file as it rotates"
    snap = creds.snapshot()
    assert (snap.server, snap.authorization, snap.ca_file) == (peer.url, "bearer tok", str(sa / "ca.crt"))
    with pytest.raises(KubeAuthError, match="in-cluster config: Service token file does not exist"):
        kubeauth.in_cluster(sa_dir=str(tmp_path / "nowhere"), environ=env)


def test_a_token_file_given_with_server_is_re_read_after_a_401(peer: TokenAPIServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    peer.accepted = {"one"}
    api = RestKubeAPI.from_url(peer.url, token_file=str(token), ca_file=str(peer.ca_file))
    assert api.list("nodes") == ([], "7")
    token.write_text("two\n")
    peer.accepted = {"two"}
    assert api.list("nodes") == ([], "7")
    assert peer.unauthorized() == 1


# ------------------------------------------------------------------ choosing the source, errors


def test_resolve_order_and_the_error_when_there_is_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeAuthError) as err:
        kubeauth.resolve(None, environ={})
    assert "no Kubernetes API configuration" in str(err.value) and "--kubeconfig" in str(err.value)
    (tmp_path / "pki").mkdir()
    ca = str(issue_ca_and_server(tmp_path / "pki", ["x"])[0])  # any CA file: nothing is dialled
    one = token_kubeconfig(tmp_path / "one", "https://127.0.0.1:1", ca, "t1")
    two = token_kubeconfig(tmp_path / "two", "https://127.0.0.1:2", ca, "t2")
    in_cluster_env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "3"}
    assert kubeauth.resolve(str(one), environ={"KUBECONFIG": str(two)}).server == "https://127.0.0.1:1"
    assert kubeauth.resolve(None, environ={"KUBECONFIG": str(two), **in_cluster_env}).server == "https://127.0.0.1:2"
    (tmp_path / ".kube").mkdir()
    token_kubeconfig(tmp_path / ".kube" / "config", "https://127.0.0.1:4", ca, "t4")
    assert kubeauth.resolve(None, environ={}).server == "https://127.0.0.1:4"
    with pytest.raises(KubeAuthError, match="in-cluster config"):
        kubeauth.resolve(None, environ=in_cluster_env, sa_dir=str(tmp_path / "no-sa"))


@pytest.mark.parametrize(
    ("user", "context", "expected"),
    [
        ({"auth-provider": {"name": "azure", "config": {}}}, None, "auth-provider 'azure' is not supported"),
        ({"token": "t"}, "other", "context 'other' not found (known: ctx)"),
    ],
    ids=["azure-auth-provider", "unknown-context"],
)
def test_kubeconfig_errors_are_one_line(
    tmp_path: Path, user: dict[str, Any], context: str | None, expected: str
) -> None:
    path = tmp_path / "k"
    doc = {
        "apiVersion": "v1",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeAuthError) as err:
        kubeauth.from_kubeconfig(str(path), context=context)
    assert expected in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(KubeAuthError, match=f"kubeconfig {tmp_path}/missing: no such file"):
        kubeauth.from_kubeconfig(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("user", "method"),
    [
        ({"token": "t"}, "a bearer token"),
        ({"tokenFile": "/t"}, "the token in tokenFile /t"),
        ({"client-certificate": "/c", "client-key": "/k"}, "a client certificate"),
        ({"exec": {"command": "aws", "args": ["eks", "get-token"]}}, "the exec credential plugin `aws eks get-token`"),
        ({"auth-provider": {"name": "oidc"}}, "the oidc auth-provider"),
        ({}, "no credentials (anonymous)"),
    ],
)
def test_the_auth_method_is_named_for_people(user: dict[str, Any], method: str) -> None:
    from kubeauth.credentials import _describe_user

    assert _describe_user(user).name == method


# ------------------------------------------------------------------ the commands


def _icl(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "icl", *args], capture_output=True, text=True, env=env, timeout=60)


def test_icl_plugin_outside_a_cluster_says_so_in_one_line(tmp_path: Path) -> None:
    base = [
        "plugin",
        "--topology",
        "ring:4",
        "--pods",
        "kubernetes",
        "--node-name",
        "n1",
        "--plugin-dir",
        str(tmp_path),
    ]
    out = _icl(*base, home=tmp_path)
    text = (out.stdout + out.stderr).strip()
    assert out.returncode == 2, text
    assert text == (
        "icl plugin: no Kubernetes API configuration: not in a cluster (KUBERNETES_SERVICE_HOST is unset) and no "
        "kubeconfig (pass --kubeconfig FILE or set KUBECONFIG; ~/.kube/config does not exist)"
    )
    out = _icl(*base, "--kubeconfig", str(tmp_path / "nope"), home=tmp_path)
    assert (out.returncode, (out.stdout + out.stderr).strip()) == (
        2,
        f"icl plugin: kubeconfig {tmp_path}/nope: no such file",
    )


def test_the_publisher_names_a_missing_kubeconfig(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "deviceplugin.publisher",
            "--node",
            "n",
            "--topology",
            "ring:4",
            "--kubeconfig",
            str(tmp_path / "k"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert (out.stdout + out.stderr).strip() == f"error: kubeconfig {tmp_path}/k: no such file"


def test_icl_extender_with_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    out = _icl("extender", "--kubeconfig", str(tmp_path / "k"), "--port", "0", home=tmp_path)
    assert out.returncode == 2
    assert (
        out.stderr.strip().splitlines()[-1]
        == f"icl extender: cannot reach the API server: kubeconfig {tmp_path}/k: no such file"
    )


def test_the_refresh_hook_runs_at_most_once_per_interval() -> None:
    from kubernetes import client

    from kubeauth.credentials import AuthMethod, Credentials, Snapshot

    runs: list[int] = []
    now = [100.0]

    def load() -> Any:
        config = client.Configuration(host="https://127.0.0.1:1")
        config.api_key["BearerToken"] = "Bearer t0"

        def hook(cfg: Any) -> None:
            runs.append(1)
            cfg.api_key["BearerToken"] = f"Bearer t{len(runs)}"

        config.refresh_api_key_hook = hook
        return config

    creds = Credentials("test", AuthMethod("a token", ""), load, refresh_every=1.0, clock=lambda: now[0])
    assert creds.snapshot().authorization == "Bearer t1" and len(runs) == 1  # read once at load
    now[0] += 0.5
    assert creds.snapshot().authorization == "Bearer t1" and len(runs) == 1
    now[0] += 0.5
    assert creds.snapshot().authorization == "Bearer t2" and len(runs) == 2
    assert creds.reload().generation == 1 and creds.reloads == 1
    stale = Snapshot(server="https://127.0.0.1:1", authorization="Bearer t0", generation=0)
    assert creds.reload(stale=stale).generation == 1 and creds.reloads == 1, "another thread already reloaded"


def _jwt(exp: float) -> str:
    import base64
    import json

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part({'iss': 'test', 'exp': int(exp)})}.c2ln"


def test_an_expired_oidc_id_token_is_refreshed_at_the_identity_provider(peer: TokenAPIServer, tmp_path: Path) -> None:
    import base64
    import time

    old, new = _jwt(time.time() - 60), _jwt(time.time() + HOUR)
    peer.accepted = {new}
    peer.oidc_next_id_token = new
    path = tmp_path / "kubeconfig"
    oidc = {
        "client-id": "kube",
        "client-secret": "s3cret",
        "id-token": old,
        "refresh-token": "refresh-1",
        "idp-issuer-url": f"{peer.url}/oidc",
        "idp-certificate-authority-data": base64.b64encode(peer.ca_file.read_bytes()).decode(),
    }
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": peer.url, "certificate-authority": str(peer.ca_file)}}],
        "users": [{"name": "u", "user": {"auth-provider": {"name": "oidc", "config": oidc}}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    api = RestKubeAPI.from_kubeconfig(str(path))
    assert api.list("nodes") == ([], "7")
    assert peer.unauthorized() == 0, "the expired id-token was never sent"
    assert len(peer.oidc_refreshes) == 1
    grant = peer.oidc_refreshes[0]
    assert (grant["grant_type"], grant["refresh_token"]) == ("refresh_token", "refresh-1")
    saved = yaml.safe_load(path.read_text())["users"][0]["user"]["auth-provider"]["config"]
    assert (saved["id-token"], saved["refresh-token"]) == (new, "refresh-2"), "written back, as kubectl does"
    assert api.credentials.method.name == "the oidc auth-provider"
