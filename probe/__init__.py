"""``icl probe``: measure a node's link graph instead of trusting it.

A benchmark tool for GPU nodes, apart from the device plugin: the plugin discovers links (nvml backend) and
never needs to measure them to run, so it does not import this package (an import-linter contract in
``pyproject.toml`` keeps it so). One module per responsibility, so that everything but the copies themselves
is tested offline:

- :mod:`probe.result`: :class:`ProbeResult`, what was measured (bandwidth and latency per ordered pair, and
  whether the runtime offered direct peer access), and its JSON form.
- :mod:`probe.measuring`: :func:`measure` times the copies through a :class:`CopyEngine`
  (:class:`TorchEngine` or :class:`CupyEngine` on a GPU machine, a fake in tests).
- :mod:`probe.analysis` (pure): :func:`measured_topology` and :func:`compare`, the measured link graph
  against a declared or discovered one (missing, extra and slow links).
- :mod:`probe.report` and :mod:`probe.png`: the terminal tables and a heat map PNG (its own small encoder,
  no plotting library on a GPU node).
- :mod:`probe.smi`: readers of ``nvidia-smi topo -m`` and ``nvidia-smi nvlink -s`` that the hardware tests
  check the nvml backend against.
- :mod:`probe.cli`: the ``icl probe`` subcommand.
"""

from probe.analysis import Comparison, LinkCheck, LinkStatus, Reference, align, compare, measured_topology
from probe.measuring import (
    CopyEngine,
    CupyEngine,
    EngineUnavailable,
    TorchEngine,
    cuda_driver_uuid,
    load_engine,
    measure,
)
from probe.png import encode_png, heatmap_png
from probe.report import format_report
from probe.result import PROBE_FORMAT, PairSample, ProbedDevice, ProbeResult
from probe.smi import SmiNvlink, SmiTopo, parse_smi_nvlink, parse_smi_topo, smi_topology_check

__all__ = [
    "PROBE_FORMAT",
    "Comparison",
    "CopyEngine",
    "CupyEngine",
    "EngineUnavailable",
    "LinkCheck",
    "LinkStatus",
    "PairSample",
    "ProbeResult",
    "ProbedDevice",
    "Reference",
    "SmiNvlink",
    "SmiTopo",
    "TorchEngine",
    "align",
    "compare",
    "cuda_driver_uuid",
    "encode_png",
    "format_report",
    "heatmap_png",
    "load_engine",
    "measure",
    "measured_topology",
    "parse_smi_nvlink",
    "parse_smi_topo",
    "smi_topology_check",
]
