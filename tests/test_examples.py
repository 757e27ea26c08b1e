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

from deviceplugin import allocation, gangenv
from scheduler.config import DEFAULT_RESOURCE
from scheduler.podspec import pod_info
from topology import parse_shape
from topology.contract import ENV_DEVICE_FRACTION, ENV_DEVICE_MILLI, MILLI_PER_DEVICE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))
PLUGIN_ENV = {
    allocation.ENV_VISIBLE,
    allocation.ENV_INDICES,
    allocation.ENV_WORLD,
    allocation.ENV_SHAPE,
    allocation.ENV_COORDS,
    allocation.ENV_RING,
    ENV_DEVICE_FRACTION,  # shared devices (deviceplugin.sharing.share_env)
    ENV_DEVICE_MILLI,
    *gangenv.gang_env(
        '{"v":1,"gang":"ns/g","generation":1,"rank":0,"size":1,"min":1,"max":1,'
        '"members":[{"pod":"p","node":"n","domain":"","coords":"","devices":["0"]}]}'
    ),
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
        assert info.count > 0 or 0 < info.milli < MILLI_PER_DEVICE
        if info.count:
            shape = parse_shape(info.shape, count=info.count)  # raises on a shape that does not fit the count
            assert shape.size == info.count
        if info.gang is not None:
            if info.gang.elastic:
                assert "completions" not in job["spec"], "an elastic gang's Job ends when its workers do"
                assert info.gang.size < job["spec"]["parallelism"] == info.gang.maximum, "as many pods as the max"
            else:
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


def test_the_elastic_example_runs_torchrun_between_the_gangs_minimum_and_maximum() -> None:
    docs = _documents(EXAMPLES / "pytorch-elastic.yaml")
    script = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["train.py"]
    tree = ast.parse(script)
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {allocation.ENV_VISIBLE, allocation.ENV_RING, "ICL_GANG_RANK", "POD_NAME", "LOCAL_RANK"} <= names
    job = _jobs(EXAMPLES / "pytorch-elastic.yaml")[0]
    template = job["spec"]["template"]
    gang = pod_info(
        {"metadata": {**template["metadata"], "namespace": "demo", "name": "p"}, "spec": template["spec"]},
        DEFAULT_RESOURCE,
    ).gang
    assert gang is not None and gang.elastic
    container = template["spec"]["containers"][0]
    command = " ".join(container["command"])
    assert f"--nnodes={gang.size}:{gang.maximum}" in command
    assert "--rdzv-backend=c10d" in command and f'--nproc-per-node="${allocation.ENV_WORLD}"' in command
    store = next(d for d in docs if d["kind"] == "Service")["metadata"]["name"]
    assert f"--rdzv-endpoint={store}:29400" in command, "the store outlives any worker"
    # The layout the extender rewrites reaches the worker through the downward API, where train.py reads it.
    volume = next(v for v in template["spec"]["volumes"] if "downwardAPI" in v)
    item = volume["downwardAPI"]["items"][0]
    assert item["fieldRef"]["fieldPath"] == "metadata.annotations['kube-icl.io/gang-layout']"
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert f"{mount['mountPath']}/{item['path']}" in names
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
