"""A real torchrun elastic job (c10d rendezvous, gloo) on the environment kube-icl gives an elastic gang.

    .venv/bin/python hw/torchrun_elastic.py prepare DIR                       # the extender and the plugin decide
    ~/.cache/kube-icl/torch-venv/bin/python hw/torchrun_elastic.py run DIR    # the job runs, shrinks, grows back

``prepare`` runs the extender's verbs (in memory, fake clock) on four ``ring:2`` nodes in a line
link domain for an elastic gang (kube-icl.io/gang-min 2, gang-max 3, a ring of 2 per member):
w0 and w1 start at the minimum, w2 grows next to them; then w2 fails (the gang shrinks, layouts
rewritten, nothing evicted) and its replacement w2b is placed next to the survivors. For each pod
it writes the environment the device plugin's Allocate gives its container at its start
(the real plugin, sim backend, on the pod's node, admitted over gRPC by the kubelet emulator of
``tests/support``; its devices' variables plus those of its ``kube-icl.io/gang-layout``), the
layout annotation after each step (what the downward API file would hold), and ``train.py`` from
``examples/pytorch-elastic.yaml``.

``run`` (torch for the store and the workers) starts the c10d store as its own process (as the
example's Deployment does) and one ``torchrun --nnodes=2:3 --nproc-per-node=$ICL_WORLD_SIZE`` agent
per pod with that pod's environment (workers on CPU with gloo, each pod's checkpoint in its own
directory), and checks: w0 and w1 form a world of 4 from step 0; w2 joins, a world of 6; SIGKILL of
w2's agent and all its workers, the two survivors' agents (not restarted) re-form a world of 4; w2b
joins, a world of 6 again; each new world resumes at the step the job had reached. It prints each
phase (world, time to form, steps) and writes ``result.json``; exit 0 only if every check held.
``tests/e2e/test_torchrun_elastic.py`` runs both; ``docs/scheduler.md`` has the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESOURCE = "kube-icl.io/accelerator"
PER_POD = 2  # devices (and torchrun workers) per member: 3 members x 2 fit a 2-core machine


def prepare(out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    import yaml

    from deviceplugin.backends.sim import SimBackend
    from deviceplugin.pods import FilePodSource
    from scheduler.cache import ClusterCache
    from scheduler.config import ExtenderConfig
    from scheduler.extender import Extender
    from scheduler.informer import Informer
    from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
    from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
    from tests.support.plugin import running_plugin, short_tmpdir
    from topology import build_preset

    api = MemoryKubeAPI()
    nodes = [f"n{i}" for i in range(4)]
    for i, n in enumerate(nodes):
        labels = {
            "kube-icl.io/link-domain": "rack",
            "kube-icl.io/link-coords": str(i),
            "kube-icl.io/link-domain-kind": "mesh",
        }
        api.nodes[n] = node_obj(n, f"ring:{PER_POD}", labels=labels)
    now = [1000.0]
    cache = ClusterCache("kube-icl.io/accelerator", clock=lambda: now[0])
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(fair_share=False), cache, api)
    ext.start()
    ann = {"kube-icl.io/gang": "demo", "kube-icl.io/gang-min": "2", "kube-icl.io/gang-max": "3"}

    def sync() -> None:
        for pod in list(api.pods.values()):
            cache.upsert_pod(pod)
        ext.flush()  # the background writes (layout rewrites, evictions) are done

    def schedule(name: str) -> str:
        pod = pod_obj(name, PER_POD, "ring", annotations=dict(ann))
        api.pods[("default", name)] = pod
        cache.upsert_pod(pod)
        passed = ext.filter(ExtenderArgs(pod=pod, node_names=nodes)).node_names or []
        assert passed, f"{name}: no node"
        scores = ext.prioritize(ExtenderArgs(pod=pod, node_names=passed))
        node = max(scores, key=lambda s: s.score).host
        meta = pod["metadata"]
        err = ext.bind(ExtenderBindingArgs(name, "default", meta["uid"], node)).error
        assert not err, err
        sync()
        return node

    def env_of(name: str) -> dict[str, str]:
        """What the device plugin's Allocate returns for the pod's container: the real plugin on the
        pod's node (sim backend), admitted over gRPC on a unix socket by the kubelet emulator."""
        pod = api.pods[("default", name)]
        node = pod["spec"]["nodeName"]

        async def admit() -> dict[str, str]:
            with short_tmpdir() as plugin_dir, short_tmpdir() as files:
                pods = Path(files) / "pods.json"
                pods.write_text(json.dumps({"kind": "PodList", "items": [pod]}))
                backend = SimBackend(build_preset(f"ring:{PER_POD}"), recover_after=2, probe_interval=0.05)
                async with running_plugin(
                    plugin_dir, backend, FilePodSource(pods), topology=f"ring:{PER_POD}", node_name=node
                ) as h:
                    got = await h.kubelet.admit(pod["metadata"]["uid"], "trainer", RESOURCE, PER_POD)
                    return dict(got.envs)

        env = asyncio.run(admit())
        a = pod["metadata"]["annotations"]
        assert env["ICL_VISIBLE_DEVICES"] == a["kube-icl.io/devices"], (env, a)
        assert env["ICL_GANG_RANK"] == str(json.loads(a["kube-icl.io/gang-layout"])["rank"]), env
        return env

    def layout(name: str) -> Any:
        return json.loads(api.pods[("default", name)]["metadata"]["annotations"]["kube-icl.io/gang-layout"])

    steps: list[dict[str, Any]] = []
    placed = {n: schedule(n) for n in ("w0", "w1")}
    envs = {n: env_of(n) for n in placed}  # what Allocate gave them at their start
    steps.append({"what": "started at the minimum (w0, w1)", "placed": dict(placed), "layout": layout("w0")})
    ext.sweep()
    placed["w2"] = schedule("w2")
    envs["w2"] = env_of("w2")
    steps.append({"what": "grew (w2)", "placed": dict(placed), "layout": layout("w0")})
    api.pods[("default", "w2")]["status"]["phase"] = "Failed"
    sync()
    steps.append(
        {
            "what": "w2 failed: the gang shrank",
            "evicted": [c for c in api.calls if c[0] == "evict"],
            "layout": layout("w0"),
        }
    )
    placed["w2b"] = schedule("w2b")
    envs["w2b"] = env_of("w2b")
    steps.append(
        {"what": "replacement w2b placed next to the survivors", "placed": dict(placed), "layout": layout("w0")}
    )
    ext.stop()
    docs = list(yaml.safe_load_all((ROOT / "examples" / "pytorch-elastic.yaml").read_text()))
    train = next(d for d in docs if d and d["kind"] == "ConfigMap")["data"]["train.py"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.py").write_text(train)
    (out / "demo.json").write_text(json.dumps({"envs": envs, "steps": steps}, indent=1))
    print(json.dumps(steps, indent=1))


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (torchrun's workers run in sessions of their own, so the
    agent's process group is not enough; a pod's failure kills every process of its container)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


START = re.compile(r"pod (\S+): gang rank .* world (\d+): hierarchical all-reduce ok, resumed at step (\d+) t=([\d.]+)")
STEP = re.compile(r"pod (\S+): world (\d+) step (\d+) t=([\d.]+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(out: Path) -> int:
    """Start at the minimum, grow, lose a member (its whole process tree), grow back; print the
    worlds, steps and times, write ``result.json``; 0 only if every check held."""
    demo = json.loads((out / "demo.json").read_text())
    envs: dict[str, dict[str, str]] = demo["envs"]
    layout_file = out / "gang-layout.json"
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("ICL_")}
    base.update(
        {
            "CUDA_VISIBLE_DEVICES": "",
            "GANG_LAYOUT_FILE": str(layout_file),
            "TRAIN_STEPS": "100000",
            "OMP_NUM_THREADS": "1",
            # torch 2.15: with the agents' shared TCPStore (the default) a node joining a running job waits
            # forever for the new round's MASTER_ADDR, which the round's rank 0, already bootstrapped, never
            # writes; without sharing every round publishes it afresh.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
    )
    port = free_port()
    store = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time, torch.distributed as d; "
            f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False); time.sleep(10**9)",
        ],
        start_new_session=True,
    )
    agents: dict[str, subprocess.Popen[bytes]] = {}

    def start(pod: str) -> float:
        env = {**base, **envs[pod], "POD_NAME": pod, "CHECKPOINT_DIR": str(out / "state" / pod)}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2:3",
            f"--nproc-per-node={env['ICL_WORLD_SIZE']}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=elastic-demo",
            "--rdzv-conf=is_host=false,last_call_timeout=3,join_timeout=300",
            "--max-restarts=20",
            "--monitor-interval=1",
            str(out / "train.py"),
        ]
        log = (logs / f"{pod}.log").open("ab")
        agents[pod] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return time.time()

    def lines() -> tuple[list[tuple[float, str, int, int]], list[tuple[float, str, int, int]]]:
        """(world starts: t, pod, world, resumed step), (progress: t, pod, world, step), by time."""
        starts, progress = [], []
        for f in sorted(logs.glob("*.log")):
            for line in f.read_text(errors="replace").splitlines():
                if m := START.search(line):
                    starts.append((float(m[4]), m[1], int(m[2]), int(m[3])))
                elif m := STEP.search(line):
                    progress.append((float(m[4]), m[1], int(m[2]), int(m[3])))
        return sorted(starts), sorted(progress)

    def wait_world(
        world: int, pods: set[str], since: float, timeout: float = 300.0
    ) -> list[tuple[float, str, int, int]]:
        """The first start line of each of ``pods`` in a world of ``world`` after ``since`` ([] on timeout)."""
        end = time.time() + timeout
        while time.time() < end:
            found = {}
            for t, pod, w, resumed in lines()[0]:
                if t >= since and w == world and pod in pods and pod not in found:
                    found[pod] = (t, pod, w, resumed)
            if set(found) == pods:
                return sorted(found.values())
            if any(a.poll() is not None for p, a in agents.items() if p in pods):
                return []
            time.sleep(1.0)
        return []

    def last_step(world: int, since: float) -> int:
        return max((s for t, _, w, s in lines()[1] if t >= since and w == world), default=0)

    def run_steps(world: int, since: float, steps: int = 10, timeout: float = 120.0) -> int:
        """Let the world train ``steps`` more steps; its last step seen."""
        first = last_step(world, since)
        end = time.time() + timeout
        while time.time() < end and last_step(world, since) < first + steps:
            time.sleep(1.0)
        return last_step(world, since)

    ok: list[tuple[str, bool]] = []
    phases: list[dict[str, Any]] = []
    t0 = time.time()

    def phase(what: str, began: float, formed: list[tuple[float, str, int, int]], before: int, world: int) -> int:
        resumed = min((r for *_, r in formed), default=-1)
        if formed:  # the last step the job had reported when the new world formed
            before = max((s for t, _, _, s in lines()[1] if t < formed[0][0]), default=0)
        after = run_steps(world, began) if formed else 0
        phases.append(
            {
                "what": what,
                "world": world,
                "pods": [p for _, p, _, _ in formed],
                "formed_s": round(max(t for t, *_ in formed) - began, 1) if formed else None,
                "at_s": round(began - t0, 1),
                "last_step_before": before,
                "resumed_at_step": resumed,
                "last_step_seen": after,
            }
        )
        return after

    try:
        layout_file.write_text(json.dumps(demo["steps"][0]["layout"]))
        began = min(start("w0"), start("w1"))
        formed = wait_world(2 * PER_POD, {"w0", "w1"}, began)
        ok.append(("w0, w1 start at the minimum: a world of 4 from step 0", bool(formed) and formed[0][3] == 0))
        step = phase("start at the minimum (w0, w1)", began, formed, 0, 2 * PER_POD)

        layout_file.write_text(json.dumps(demo["steps"][1]["layout"]))
        began = start("w2")
        formed = wait_world(3 * PER_POD, {"w0", "w1", "w2"}, began)
        ok.append(("w2 joins: a world of 6, training goes on", bool(formed) and 0 < step <= formed[0][3]))
        step = phase("grow (w2 joins)", began, formed, step, 3 * PER_POD)

        survivors = {p: agents[p].pid for p in ("w0", "w1")}
        killed = time.time()
        kill_tree(agents["w2"].pid)  # w2 "fails" as a pod does: the agent and every worker at once
        layout_file.write_text(json.dumps(demo["steps"][2]["layout"]))
        formed = wait_world(2 * PER_POD, {"w0", "w1"}, killed)
        ok.append(
            ("w2 killed: w0, w1 re-form a world of 4, training goes on", bool(formed) and 0 < step <= formed[0][3])
        )
        step = phase("shrink (w2 killed with its workers)", killed, formed, step, 2 * PER_POD)
        alive = all(agents[p].poll() is None and agents[p].pid == pid for p, pid in survivors.items())
        ok.append(("the survivors' agents kept running (not restarted)", alive))

        layout_file.write_text(json.dumps(demo["steps"][3]["layout"]))
        began = start("w2b")
        formed = wait_world(3 * PER_POD, {"w0", "w1", "w2b"}, began)
        ok.append(("w2b joins: a world of 6 again, training goes on", bool(formed) and 0 < step <= formed[0][3]))
        phase("grow back (w2b joins)", began, formed, step, 3 * PER_POD)
    finally:
        for p in agents.values():
            if p.poll() is None:
                kill_tree(p.pid)
        kill_tree(store.pid)
        for p in [*agents.values(), store]:
            p.wait()
    for ph in phases:
        print(
            f"+{ph['at_s']:6.1f}s  {ph['what']}: world {ph['world']} ({', '.join(ph['pods'])}) formed in "
            f"{ph['formed_s']}s; last step before {ph['last_step_before']}, resumed at {ph['resumed_at_step']}, "
            f"trained to {ph['last_step_seen']}"
        )
    for what, good in ok:
        print(f"{'PASS' if good else 'FAIL'}  {what}")
    print(f"{time.time() - t0:.0f}s")
    passed = len(ok) == 5 and all(g for _, g in ok)
    (out / "result.json").write_text(json.dumps({"passed": passed, "checks": ok, "phases": phases}, indent=1))
    return 0 if passed else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "run"):
        raise SystemExit(__doc__)
    directory = Path(sys.argv[2])
    if sys.argv[1] == "prepare":
        prepare(directory)
    else:
        raise SystemExit(run(directory))
