"""``icl extender``: the real command, as a process, against the loopback API server."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from icl.cli import build_parser
from scheduler.config import ConfigError, ExtenderConfig, load_config, parse_config
from tests.support.extender import FakeAPIServer, node_obj, pod_obj, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_help_lists_the_command() -> None:
    parser = build_parser()
    args = parser.parse_args(["extender", "--config", "x.yaml", "--port", "9999"])
    assert args.command == "extender" and args.port == 9999
    out = subprocess.run(
        [sys.executable, "-m", "icl", "extender", "--help"], capture_output=True, text=True, check=True
    )
    assert "--config FILE" in out.stdout and "/debug/state" in out.stdout


def test_runs_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    with FakeAPIServer() as fake:
        fake.put_node(node_obj("n1", "mesh:4x4"))
        cfg = tmp_path / "extender.yaml"
        cfg.write_text(f"listen: {{host: 127.0.0.1, port: {port}}}\nkube: {{server: '{fake.url}'}}\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "icl", "extender", "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:

            def ready() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                        return bool(r.status == 200)
                except (urllib.error.URLError, OSError):
                    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                    return False

            wait_for(ready, timeout_s=30, what="icl extender /readyz")
            body = json.dumps({"Pod": pod_obj("p", 4, "mesh:2x2"), "NodeNames": ["n1"]}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/filter", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                assert json.loads(r.read())["NodeNames"] == ["n1"]
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        assert code == 0


def test_bad_config_exits_2_with_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("weights: {fragmentation: -1}\n")
    out = subprocess.run(
        [sys.executable, "-m", "icl", "extender", "--config", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "weights.fragmentation" in out.stderr


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"listen": {"port": 70000}}, "listen.port"),
        ({"queues": {"a": {"weight": 0}}}, "queues.a.weight"),
        ({"queues": {"a": {"quota": "lots"}}}, "queues.a.quota"),
        ({"policy": "kubelet"}, "policy"),
        ({"resourceName": "nodomain"}, "resourceName"),
        ({"sharedResourceName": "nodomain"}, "^sharedResourceName: an extended resource needs a domain prefix"),
        ({"weights": {"stranding": "x"}}, "weights.stranding"),
        ({"tls": {"cert": "c"}}, "tls"),
        ({"colour": "blue"}, "unknown key 'colour'"),
        ({"kube": {"insecure": "yes"}}, "kube.insecure"),
        ({"keepBestNodes": -1}, "keepBestNodes"),
        ({"keepBestNodes": 2.5}, "keepBestNodes"),
        ({"events": {"onBind": 1}}, "events.onBind"),
        (
            {"queues": {"a": {"minRuntime": "10m"}}},
            r"^queues\.a\.minRuntime: expected a number of seconds >= 0 \(like 600\), got '10m'$",
        ),
        ({"queues": {"a": {"minRuntime": -1}}}, r"^queues\.a\.minRuntime: .* got -1$"),
        ({"queues": {"a": {"minRuntime": True}}}, "queues.a.minRuntime"),
    ],
)
def test_config_errors_name_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def test_config_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: {host: 127.0.0.1, port: 9000, pathPrefix: /icl}\n"
        "weights: {fragmentation: 3, binpack: 1}\n"
        "queues: {research: {weight: 2}, batch: {quota: 64, minRuntime: 600}}\n"
        "gangTimeoutSeconds: 30\n"
        "keepBestNodes: 16\n"
        "events: {onBind: true}\n"
    )
    cfg = load_config(path)
    assert (cfg.keep_best_nodes, cfg.events_on_bind, cfg.events) == (16, True, True)
    assert (ExtenderConfig().keep_best_nodes, ExtenderConfig().events_on_bind) == (0, False)
    assert (cfg.host, cfg.port, cfg.path_prefix) == ("127.0.0.1", 9000, "/icl")
    assert (cfg.fragmentation_weight, cfg.binpack_weight, cfg.gang_timeout_s) == (3.0, 1.0, 30.0)
    assert cfg.queue("research").weight == 2.0 and cfg.queue("batch").quota == 64
    assert cfg.queue("other").weight == 1.0 and cfg.queue("other").quota is None
    assert (cfg.queue("batch").min_runtime_s, cfg.queue("research").min_runtime_s) == (600.0, 0.0)
