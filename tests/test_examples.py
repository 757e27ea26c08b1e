"""The example workloads ask for what the extender and the plugin understand.

Each pod template is read by the extender's own pod parser (``scheduler.podspec.pod_info``)
and its shape by ``topology.parse_shape``, so an example that the extender would refuse or
misread fails here; the environment the examples read is the plugin's (``deviceplugin.allocation``).
The API server's verdict on them (server-side dry-run) is in tests/e2e/test_chart.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin import allocation
from scheduler.config import DEFAULT_RESOURCE
from scheduler.podspec import pod_info
from topology import parse_shape

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))
PLUGIN_ENV = {
    allocation.ENV_VISIBLE,
    allocation.ENV_INDICES,
    allocation.ENV_WORLD,
    allocation.ENV_SHAPE,
    allocation.ENV_COORDS,
    allocation.ENV_RING,
}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _jobs(path: Path) -> list[dict[str, Any]]:
    return [d for d in _documents(path) if d["kind"] == "Job"]


def test_there_are_the_three_examples() -> None:
    assert {p.name for p in FILES} >= {"ring-job.yaml", "gang-indexed-job.yaml", "pytorch-ddp.yaml"}


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_pod_is_read_by_the_extender_as_the_example_says(path: Path) -> None:
    jobs = _jobs(path)
    assert jobs, "every example runs a Job"
    for job in jobs:
        template = job["spec"]["template"]
        pod = {"metadata": {**template["metadata"], "namespace": "demo", "name": "p"}, "spec": template["spec"]}
        assert pod["spec"]["schedulerName"] == "kube-icl"
        info = pod_info(pod, DEFAULT_RESOURCE)
        assert info.count > 0
        shape = parse_shape(info.shape, count=info.count)  # raises on a shape that does not fit the count
        assert shape.size == info.count
        if info.gang is not None:
            members = job["spec"]["completions"]
            assert job["spec"]["completionMode"] == "Indexed"
            assert info.gang.size == members == job["spec"]["parallelism"], "the gang is the whole Job, at once"
        tolerated = {t.get("key") for t in pod["spec"].get("tolerations", [])}
        assert "kube-icl.io/accelerator" in tolerated, "the chart's accelerator nodes are tainted"


def test_a_gang_example_and_a_plain_one() -> None:
    def gangs(name: str) -> list[Any]:
        job = _jobs(EXAMPLES / name)[0]
        meta = {**job["spec"]["template"]["metadata"], "namespace": "demo", "name": "p"}
        return [pod_info({"metadata": meta, "spec": job["spec"]["template"]["spec"]}, DEFAULT_RESOURCE).gang]

    assert gangs("ring-job.yaml") == [None]
    assert all(g is not None and g.size > 1 for n in ("gang-indexed-job.yaml", "pytorch-ddp.yaml") for g in gangs(n))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_the_environment_the_examples_read_is_the_plugins(path: Path) -> None:
    used = set(re.findall(r"\bICL_[A-Z_]+\b", path.read_text()))
    assert used, "each example shows what the plugin hands the container"
    assert used <= PLUGIN_ENV, f"not set by the plugin: {sorted(used - PLUGIN_ENV)}"


def test_the_ddp_script_is_python_and_torchrun_gets_one_process_per_device() -> None:
    docs = _documents(EXAMPLES / "pytorch-ddp.yaml")
    script = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["train.py"]
    tree = ast.parse(script)  # a syntax error fails here, not on the cluster
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {allocation.ENV_VISIBLE, allocation.ENV_RING, "LOCAL_RANK"} <= names
    job = _jobs(EXAMPLES / "pytorch-ddp.yaml")[0]
    command = " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])
    assert f'--nproc-per-node="${allocation.ENV_WORLD}"' in command
    assert f"--nnodes={job['spec']['completions']}" in command
    service = next(d for d in docs if d["kind"] == "Service")
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert f"--master-addr={job['metadata']['name']}-0.{service['metadata']['name']}" in command
