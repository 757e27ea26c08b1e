"""``icl probe``: measure the GPU link graph (copy bandwidth and latency per pair) and check it."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["EXIT_BAD_INPUT", "EXIT_MISMATCH", "EXIT_NO_GPU", "register", "run"]

EXIT_NO_GPU = 1
EXIT_BAD_INPUT = 2
EXIT_MISMATCH = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "probe",
        parents=[common],
        help="measure device-to-device copy bandwidth/latency and compare with the declared link graph",
        description=(
            "Time device-to-device copies for every ordered pair of GPUs (PyTorch or CuPy), build the measured "
            "link graph, and compare it with a declared one: a topology file or preset, 'nvml' (what the nvml "
            "backend discovers on this machine) or 'nvml:FIXTURE.json' (a recorded NVML answer). Reports links "
            "that are missing, extra, or slower than expected by more than --margin. With --from-json it "
            "analyses an earlier measurement instead of measuring. Exit 0: as declared (or nothing to compare); "
            "3: mismatch; 2: bad input; 1: no GPU library or GPU."
        ),
    )
    p.add_argument("--against", metavar="SPEC", help="declared graph: topology file, preset, nvml or nvml:FILE")
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="analyse this recorded measurement (what --json writes) instead of measuring",
    )
    p.add_argument("--engine", default="auto", choices=["auto", "torch", "cupy"], help="GPU library to copy with")
    p.add_argument("--size-mib", type=float, default=256.0, help="bytes per bandwidth copy, MiB (default: 256)")
    p.add_argument("--iters", type=int, default=20, help="timed copies per pair (default: 20)")
    p.add_argument("--latency-iters", type=int, default=100, help="timed small copies per pair (default: 100)")
    p.add_argument(
        "--margin", type=float, default=0.25, help="slow = below expected by more than this fraction (default: 0.25)"
    )
    p.add_argument(
        "--min-link-gbps",
        type=float,
        default=1.0,
        help="a pair with peer access counts as linked at this many GB/s both ways (default: 1)",
    )
    p.add_argument(
        "--reference",
        default="auto",
        choices=["auto", "declared", "peers"],
        help="expected bandwidth: the declared figure, the median of like links, or declared-else-peers",
    )
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write measurement + comparison as JSON")
    p.add_argument("--png", metavar="FILE", help="write the bandwidth matrix as a heat map PNG")
    p.set_defaults(func=run)


def _declared(spec: str) -> Any:
    from deviceplugin.backends.nvml import FixtureNvml, NvmlApi, NvmlBackend, PynvmlApi
    from topology import load_topology

    if spec == "nvml" or spec.startswith("nvml:"):
        api: NvmlApi = FixtureNvml.load(spec[5:]) if spec.startswith("nvml:") else PynvmlApi()
        try:
            return NvmlBackend(api).snapshot()
        finally:
            api.close()
    return load_topology(spec)


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import sys
    from pathlib import Path

    from deviceplugin.backends.nvml import NvmlUnavailable
    from probe.analysis import compare
    from probe.measuring import EngineUnavailable, load_engine, measure
    from probe.png import heatmap_png
    from probe.report import format_report
    from probe.result import ProbeResult
    from topology import TopologyError

    def fail(code: int, message: str) -> int:
        print(f"icl probe: {message}", file=sys.stderr)
        return code

    declared = None
    if args.against:
        try:
            declared = _declared(args.against)
        except NvmlUnavailable as e:
            return fail(EXIT_NO_GPU, str(e))
        except (TopologyError, ValueError, OSError) as e:
            return fail(EXIT_BAD_INPUT, f"--against {args.against}: {e}")
    if args.from_json:
        try:
            doc = json.loads(Path(args.from_json).read_text())
            if isinstance(doc, dict) and "measurement" in doc:  # what --json writes
                doc = doc["measurement"]
            result = ProbeResult.from_json(doc)
        except (OSError, ValueError) as e:
            return fail(EXIT_BAD_INPUT, f"--from-json {args.from_json}: {e}")
    else:
        if args.size_mib <= 0 or args.iters < 1 or args.latency_iters < 1:
            return fail(EXIT_BAD_INPUT, "--size-mib must be > 0, --iters and --latency-iters >= 1")
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA indices = NVML indices
        try:
            engine = load_engine(args.engine)
            result = measure(
                engine,
                size_bytes=max(1, int(args.size_mib * (1 << 20))),
                iters=args.iters,
                latency_iters=args.latency_iters,
            )
        except EngineUnavailable as e:
            return fail(EXIT_NO_GPU, str(e))
    comparison = None
    if declared is not None:
        try:
            comparison = compare(
                declared,
                result,
                margin=args.margin,
                min_link_gbps=args.min_link_gbps,
                reference=args.reference,
            )
        except ValueError as e:
            return fail(EXIT_BAD_INPUT, str(e))
    sys.stdout.write(format_report(result, comparison))
    if args.json_out:
        out: dict[str, Any] = {"measurement": result.to_json()}
        if comparison is not None:
            out["comparison"] = comparison.to_json()
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    if args.png and result.devices:
        Path(args.png).write_bytes(heatmap_png(result.matrix("gbps")))
    return EXIT_MISMATCH if comparison is not None and not comparison.ok else 0
