"""Step 4 on a GPU machine: NCCL all-reduce on the GPUs ``Allocate`` gave, in its rank order, vs other pairs.

    python3 hw/allreduce.py TRANSCRIPT.json NVML_FIXTURE.json OUT.json

Reads the plugin transcript (hw/plugin_transcript.py): the first 2-GPU admission's
``ICL_VISIBLE_DEVICES`` (GPU UUIDs in rank order) and the 4-GPU one. For that pair,
for every other pair of GPUs, and for the 4-GPU allocation, it launches one process
per GPU (torch.distributed, NCCL) with ``CUDA_VISIBLE_DEVICES`` = those UUIDs in
that order, so rank r runs on the r-th device the plugin listed; checks the sum, and
times all-reduce of float32 buffers. Bus bandwidth = bytes / time * 2(n-1)/n (the
nccl-tests convention). NVLink multicast stays off: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set for every worker.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SIZES = (8 << 20, 64 << 20, 256 << 20, 1 << 30)
WARMUP, ITERS = 5, 20


def worker() -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for k, v in MULTICAST_OFF.items():
        assert os.environ.get(k) == v, f"{k} must be {v}"
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    expected = world * (world + 1) / 2
    rows = []
    correct = True
    for nbytes in SIZES:
        x = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        correct &= bool(torch.all(x == expected).item())
        for _ in range(WARMUP):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        seconds = torch.tensor([start.elapsed_time(end) / 1000.0 / ITERS], device=dev)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        t = float(seconds.item())
        algbw = nbytes / t / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "time_us": round(t * 1e6, 2),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 2),
            }
        )
    ok = torch.tensor([1 if correct else 0], device=dev)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        props = torch.cuda.get_device_properties(dev)
        print(
            "RESULT "
            + json.dumps(
                {
                    "correct": bool(ok.item()),
                    "rows": rows,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                    "torch": torch.__version__,
                    "rank0_device": props.name,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(uuids: list[str], timeout: float = 120.0, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    port = free_port()
    procs = []
    for rank in range(len(uuids)):
        env = dict(
            os.environ,
            **MULTICAST_OFF,
            CUDA_VISIBLE_DEVICES=",".join(uuids),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(len(uuids)),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            NCCL_DEBUG="INFO",
            NCCL_DEBUG_SUBSYS="INIT",
            **(extra_env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    t0 = time.monotonic()
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append((p.returncode, out))
    result: dict[str, Any] = {"exit_codes": [c for c, _ in outputs]}
    lines = outputs[0][1].splitlines()
    for line in lines:
        if line.startswith("RESULT "):
            result.update(json.loads(line[7:]))
    result["nccl_transport"] = [ln.split("NCCL INFO ", 1)[-1] for ln in lines if " via " in ln][:6]
    result["nccl_notes"] = [
        ln.split("NCCL INFO ", 1)[-1] for ln in lines if "NVLS" in ln or "P2P" in ln or "nvlink" in ln.lower()
    ][:6]
    if "rows" not in result:
        result["log_tail"] = [o[-3000:] for _, o in outputs]
    return result


def main() -> int:
    transcript = json.loads(Path(sys.argv[1]).read_text())
    fixture = json.loads(Path(sys.argv[2]).read_text())
    uuids = [d["uuid"] for d in fixture["devices"]]
    admitted = [e for e in transcript["events"] if e["event"] == "admitted"]
    pair = next((e for e in admitted if e["envs"]["ICL_WORLD_SIZE"] == "2"), None)
    if pair is None:  # the plugin run failed: say so, and measure the first two GPUs instead
        print("no 2-GPU admission in the transcript: using GPUs 0,1 (label says fallback)")
        pair = {"envs": {"ICL_VISIBLE_DEVICES": ",".join(uuids[:2])}, "fallback": True}
    quad = next((e for e in admitted if e["envs"]["ICL_WORLD_SIZE"] == "4"), None)
    runs: list[dict[str, Any]] = []

    def relation(a: str, b: str) -> str:
        i, j = uuids.index(a), uuids.index(b)
        rel = fixture["extra"]["nvidia_smi_topo_m"] if "extra" in fixture else ""
        from probe import parse_smi_topo

        try:
            return parse_smi_topo(rel).relation[i][j]
        except (ValueError, IndexError):
            return f"level {fixture['topology_level'][i][j]}"

    chosen = pair["envs"]["ICL_VISIBLE_DEVICES"].split(",")
    first = "fallback pair 0,1 (no Allocate)" if pair.get("fallback") else "allocated pair (Allocate's rank order)"
    plan = [(first, chosen)]
    for a, b in itertools.combinations(uuids, 2):
        if {a, b} != set(chosen):
            plan.append(("other pair", [a, b]))
    if quad is not None:
        plan.append(("allocated 4 (Allocate's rank order)", quad["envs"]["ICL_VISIBLE_DEVICES"].split(",")))
    # What a pair without a direct link gets: the same two GPUs with NCCL's peer-to-peer path off
    # (NCCL_P2P_DISABLE=1: data goes through host shared memory). Labelled as such, not a real pair.
    plan.append(("allocated pair, NCCL_P2P_DISABLE=1 (host path)", chosen))
    dry = "--dry-run" in sys.argv
    for label, devs in plan:
        if dry:
            print(label, [uuids.index(u) for u in devs], relation(devs[0], devs[1]) if len(devs) == 2 else "")
            continue
        r = launch(devs, extra_env={"NCCL_P2P_DISABLE": "1"} if "P2P_DISABLE" in label else None)
        r.update(
            label=label,
            uuids=devs,
            indices=[uuids.index(u) for u in devs],
            relation=relation(devs[0], devs[1]) if len(devs) == 2 else "",
        )
        runs.append(r)
        big = r.get("rows", [{}])[-1]
        print(
            f"{label:40} GPUs {r['indices']} {r['relation']:6} correct={r.get('correct')} "
            f"busbw(1 GiB)={big.get('busbw_gbps')} GB/s  {r['nccl_transport'][:1]}",
            flush=True,
        )
    out = {"env": MULTICAST_OFF, "sizes": list(SIZES), "warmup": WARMUP, "iters": ITERS, "runs": runs}
    if not dry:
        Path(sys.argv[3]).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r.get("correct") for r in runs) else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        sys.exit(main())
