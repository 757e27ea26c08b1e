"""Each pod is classified once when it is read (``scheduler.framework.PodKind``), and the extender runs
that kind's cycle: a table of pods, their kinds, and the steps each kind's filter runs."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.framework import PodKind
from tests.support.extender import pod_obj
from topology.contract import DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE

GANG = {"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "2"}
ELASTIC = {"kube-icl.io/gang": "e", "kube-icl.io/gang-min": "2", "kube-icl.io/gang-max": "4"}

CASES: list[tuple[str, dict[str, Any], dict[str, Any], PodKind]] = [
    ("a bad shape", pod_obj("p", 2, "mesh:3"), {}, PodKind.INVALID),
    (
        "a bad gang size",
        pod_obj("p", 2, annotations={"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "x"}),
        {},
        PodKind.INVALID,
    ),
    ("no device", pod_obj("p", 0), {}, PodKind.NOT_OURS),
    ("no device, decideCpuPods", pod_obj("p", 0), {"decide_cpu_pods": True}, PodKind.CPU_ONLY),
    ("a share", pod_obj("p", 300, resource=DEFAULT_SHARED_RESOURCE), {}, PodKind.SHARE),
    ("whole devices, no shape", pod_obj("p", 2), {}, PodKind.UNSHAPED),
    ("whole devices, shape any", pod_obj("p", 2, "any"), {}, PodKind.UNSHAPED),
    ("no shape, icl-binpack", pod_obj("p", 2), {"policy": "icl-binpack"}, PodKind.SHAPED),
    ("a ring", pod_obj("p", 4, "ring"), {}, PodKind.SHAPED),
    ("a gang member", pod_obj("p", 2, annotations=GANG), {}, PodKind.GANG),
    ("an elastic gang member", pod_obj("p", 2, "ring", annotations=ELASTIC), {}, PodKind.ELASTIC_GANG),
]


@pytest.mark.parametrize(("pod", "cfg", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_pod_is_classified_once_when_it_is_read(pod: dict[str, Any], cfg: dict[str, Any], kind: PodKind) -> None:
    ext = Extender(ExtenderConfig(**cfg), ClusterCache(DEFAULT_RESOURCE))
    assert ext._read.state(pod, ["n1"]).kind is kind


def _steps(ext: Extender, kind: PodKind) -> list[str]:
    cycle = ext.cycle.of(kind)
    return [s.name for s in cycle.pre_filter] + ([cycle.filter_step.name] if cycle.filter_step else [])


def test_each_kind_runs_only_its_own_steps() -> None:
    ext = Extender(ExtenderConfig(decide_cpu_pods=True), ClusterCache(DEFAULT_RESOURCE))
    assert _steps(ext, PodKind.INVALID) == ["ReadPod"]
    assert _steps(ext, PodKind.NOT_OURS) == ["HeldDevices", "NotOurs"]
    assert _steps(ext, PodKind.CPU_ONLY) == ["HeldDevices", "CpuPods"]
    assert _steps(ext, PodKind.SHARE) == ["HeldDevices", "Shares"]
    assert _steps(ext, PodKind.UNSHAPED) == ["HeldDevices", "FairShare", "UnlinkedFit"]
    assert _steps(ext, PodKind.SHAPED) == ["HeldDevices", "FairShare", "NodeFit"]
    gang = ["HeldDevices", "GangAdmission", "FairShare", "GangSize", "GangLease", "Gang", "NodeFit"]
    assert _steps(ext, PodKind.GANG) == _steps(ext, PodKind.ELASTIC_GANG) == gang
    reserve = {kind: [s.name for s in ext.cycle.of(kind).reserve_steps] for kind in PodKind}
    assert reserve[PodKind.NOT_OURS] == reserve[PodKind.CPU_ONLY] == []
    assert reserve[PodKind.SHARE] == reserve[PodKind.SHAPED] == reserve[PodKind.UNSHAPED] == ["Devices"]
    assert reserve[PodKind.GANG] == reserve[PodKind.ELASTIC_GANG] == ["GangRecord", "Devices"]
