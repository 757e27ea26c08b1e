"""A real torchrun elastic job (c10d rendezvous, gloo) on the environment kube-icl gives an elastic gang.

    .venv/bin/python hw/torchrun_elastic.py prepare DIR     # here: the extender and the plugin decide
    python3 hw/torchrun_elastic.py run DIR                  # where torch is: the job runs, loses a member, grows back

``prepare`` runs the extender's verbs (in memory, fake clock) on four ``ring:4`` nodes in a line
link domain for an elastic gang (kube-icl.io/gang-min 2, gang-max 3, a ring of 4 per member):
w0 and w1 start at the minimum, w2 grows next to them; then w2 fails (the gang shrinks, layouts
rewritten) and its replacement w2b is placed next to the survivors. For each pod it writes the
environment the device plugin's Allocate gives its container (``container_env`` for its devices
plus ``gang_env`` of its ``kube-icl.io/gang-layout`` annotation) and the layout annotation after
each step (what the downward API file would hold), and ``train.py`` from
``examples/pytorch-elastic.yaml``.

``run`` (stdlib only; torch for the workers) starts the c10d store as its own process (as the
example's Deployment does), one ``torchrun --nnodes=2:3 --nproc-per-node=$ICL_WORLD_SIZE`` agent per
pod with that pod's environment (workers on CPU with gloo), and checks: three agents form a world of
12; SIGKILL of w2's agent, the two survivors re-form a world of 8 without being restarted; w2b's
agent joins and the world is 12 again. It prints every worker's "world N" line and exits 0 only
if all three happened.

Status (one run on an H100 machine with torch 2.11, CPU workers): the three agents formed the world of
12 with kube-icl's environment (each pod's ICL_GANG_RANK, node position from the layout, hierarchical
all-reduce); the shrink step failed in that run: the first version killed only the agent's process
group, w2's workers lived on in their own sessions, and the survivors' next rendezvous round waited
for three participants until it timed out. ``kill_tree`` (every descendant) is the fix, not yet run
on a machine with torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def prepare(out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    import yaml

    from deviceplugin.allocation import container_env, rank_layout
    from deviceplugin.gangenv import gang_env
    from scheduler.cache import ClusterCache
    from scheduler.config import ExtenderConfig
    from scheduler.extender import Extender
    from scheduler.informer import Informer
    from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
    from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj

    api = MemoryKubeAPI()
    nodes = [f"n{i}" for i in range(4)]
    for i, n in enumerate(nodes):
        labels = {
            "kube-icl.io/link-domain": "rack",
            "kube-icl.io/link-coords": str(i),
            "kube-icl.io/link-domain-kind": "mesh",
        }
        api.nodes[n] = node_obj(n, "ring:4", labels=labels)
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
        pod = pod_obj(name, 4, "ring", annotations=dict(ann))
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
        pod = api.pods[("default", name)]
        node = pod["spec"]["nodeName"]
        topo = cache.nodes[node].topology
        assert topo is not None
        a = pod["metadata"]["annotations"]
        env = container_env(topo, rank_layout(topo, a["kube-icl.io/devices"].split(","), "ring", ()))
        env.update(gang_env(a["kube-icl.io/gang-layout"]))
        return env

    def layout(name: str) -> Any:
        return json.loads(api.pods[("default", name)]["metadata"]["annotations"]["kube-icl.io/gang-layout"])

    steps: list[dict[str, Any]] = []
    placed = {n: schedule(n) for n in ("w0", "w1")}
    ext.sweep()
    placed["w2"] = schedule("w2")
    envs = {n: env_of(n) for n in placed}
    steps.append({"what": "started at the minimum (w0, w1), grew (w2)", "placed": dict(placed), "layout": layout("w0")})
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


WORLD = re.compile(r"pod (\S+): .* world (\d+): hierarchical all-reduce ok")


def run(out: Path) -> int:
    demo = json.loads((out / "demo.json").read_text())
    envs: dict[str, dict[str, str]] = demo["envs"]
    layout_file = out / "gang-layout.json"
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("ICL_")}
    base.update({"CUDA_VISIBLE_DEVICES": "", "GANG_LAYOUT_FILE": str(layout_file), "TRAIN_STEPS": "100000"})
    port = 29477
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

    def start(pod: str) -> None:
        env = {**base, **envs[pod], "POD_NAME": pod}
        cmd = [
            "torchrun",
            "--nnodes=2:3",
            f"--nproc-per-node={env['ICL_WORLD_SIZE']}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=elastic-demo",
            "--rdzv-conf=is_host=false,last_call_timeout=3,join_timeout=120",
            "--max-restarts=20",
            "--monitor-interval=1",
            str(out / "train.py"),
        ]
        log = (logs / f"{pod}.log").open("ab")
        agents[pod] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def worlds() -> list[tuple[float, str, int]]:
        seen = []
        for f in sorted(logs.glob("*.log")):
            for line in f.read_text(errors="replace").splitlines():
                m = WORLD.search(line)
                if m:
                    seen.append((f.stat().st_mtime, m.group(1), int(m.group(2))))
        return seen

    def wait_world(world: int, pods: set[str], after: int, timeout: float = 150.0) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            lines = worlds()[after:]
            if {p for _, p, w in lines if w == world} >= pods:
                return True
            time.sleep(1.0)
        return False

    ok = []
    t0 = time.time()
    try:
        layout_file.write_text(json.dumps(demo["steps"][0]["layout"]))
        for pod in ("w0", "w1", "w2"):
            start(pod)
        ok.append(("three members form a world of 12", wait_world(12, {"w0", "w1", "w2"}, 0)))
        mark = len(worlds())
        kill_tree(agents["w2"].pid)  # w2 "fails" as a pod does: the agent and every worker at once
        layout_file.write_text(json.dumps(demo["steps"][1]["layout"]))
        ok.append(("w2 killed: w0, w1 re-form a world of 8", wait_world(8, {"w0", "w1"}, mark)))
        survivors_alive = all(agents[p].poll() is None for p in ("w0", "w1"))
        ok.append(("the survivors' agents kept running", survivors_alive))
        mark = len(worlds())
        layout_file.write_text(json.dumps(demo["steps"][2]["layout"]))
        start("w2b")
        ok.append(("w2b joins: a world of 12 again", wait_world(12, {"w0", "w1", "w2b"}, mark)))
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        os.killpg(store.pid, signal.SIGTERM)
        time.sleep(2)
        for p in [*agents.values(), store]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for t, pod, world in worlds():
        print(f"+{t - t0:6.1f}s  {pod}: world {world}")
    for what, good in ok:
        print(f"{'PASS' if good else 'FAIL'}  {what}")
    print(f"{time.time() - t0:.0f}s")
    return 0 if len(ok) == 4 and all(g for _, g in ok) else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "run"):
        raise SystemExit(__doc__)
    directory = Path(sys.argv[2])
    if sys.argv[1] == "prepare":
        prepare(directory)
    else:
        raise SystemExit(run(directory))
