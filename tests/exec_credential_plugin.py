"""A kubectl exec credential plugin for tests (``client.authentication.k8s.io/v1``).

Usage (as a kubeconfig ``users[].user.exec``): ``python exec_credential_plugin.py STATE_DIR``.

- ``STATE_DIR/plan.json``: a list of ``{"token": "...", "expires_in": seconds}`` (negative: already
  expired), or ``{"cert": PEM path, "key": PEM path, "expires_in": ...}`` for a client certificate;
  invocation ``n`` (from 0) prints ``plan[min(n, len(plan) - 1)]`` as an ExecCredential whose
  ``status.expirationTimestamp`` is now + ``expires_in``.
- ``STATE_DIR/calls``: one line per invocation, the ``apiVersion`` and ``kind`` of the
  ``KUBERNETES_EXEC_INFO`` it was given (the client's side of the protocol).
- ``STATE_DIR/fail``: when present, exit 1 with its text on stderr, as a plugin whose login expired.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

API_VERSION = "client.authentication.k8s.io/v1"


def main(state: Path) -> int:
    info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")
    calls = state / "calls"
    with calls.open("a") as fh:
        fh.write(f"{info.get('apiVersion')} {info.get('kind')}\n")
    if (state / "fail").exists():
        sys.stderr.write((state / "fail").read_text())
        return 1
    n = len(calls.read_text().splitlines()) - 1
    plan = json.loads((state / "plan.json").read_text())
    step = plan[min(n, len(plan) - 1)]
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=float(step["expires_in"]))
    status: dict[str, str] = {"expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if "cert" in step:
        status["clientCertificateData"] = Path(step["cert"]).read_text()
        status["clientKeyData"] = Path(step["key"]).read_text()
    else:
        status["token"] = step["token"]
    credential = {"apiVersion": API_VERSION, "kind": "ExecCredential", "status": status}
    json.dump(credential, sys.stdout)
    return 0


def calls(state: Path) -> int:
    """How many times the plugin ran."""
    path = state / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def exec_kubeconfig(path: Path, *, server: str, ca_file: str, state: Path, **cluster_extra: str) -> Path:
    """A kubeconfig whose only credential is this plugin (``cluster_extra``: tls-server-name, proxy-url, ...)."""
    import yaml

    state.mkdir(parents=True, exist_ok=True)
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca_file, **cluster_extra}}],
        "users": [
            {
                "name": "exec-user",
                "user": {
                    "exec": {
                        "apiVersion": API_VERSION,
                        "command": sys.executable,
                        "args": [str(Path(__file__).resolve()), str(state)],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "exec", "context": {"cluster": "c", "user": "exec-user"}}],
        "current-context": "exec",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_plan(state: Path, *steps: tuple[str, float]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "plan.json").write_text(json.dumps([{"token": t, "expires_in": e} for t, e in steps]))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
