"""Kueue's plain-pod groups are gangs: label kueue.x-k8s.io/pod-group-name names the gang (namespace/group),
annotation kueue.x-k8s.io/pod-group-total-count its size; kube-icl's own gang annotation wins."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduler.podspec import PodSpecError, pod_info
from tests.support.extender import pod_obj

R = "kube-icl.io/accelerator"
GANG = {"kube-icl.io/gang": "job", "kube-icl.io/gang-size": "4"}


def kueue_pod(annotations: dict[str, str]) -> Any:
    return pod_obj("p", 4, "ring", labels={"kueue.x-k8s.io/pod-group-name": "train"}, annotations=annotations)


def test_a_kueue_pod_group_is_a_gang_of_its_total_count() -> None:
    gang = pod_info(kueue_pod({"kueue.x-k8s.io/pod-group-total-count": "3"}), R).gang
    assert gang is not None
    assert (gang.key, gang.size, gang.source) == ("default/train", 3, "label kueue.x-k8s.io/pod-group-name")


def test_kube_icls_gang_annotation_wins_over_a_kueue_pod_group() -> None:
    pod = kueue_pod({"kueue.x-k8s.io/pod-group-total-count": "3", **GANG})
    gang = pod_info(pod, R).gang
    assert gang is not None and (gang.key, gang.size, gang.source) == ("default/job", 4, "annotation")


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({}, "gang 'train' (label kueue.x-k8s.io/pod-group-name) needs annotation kueue.x-k8s.io/pod-group-total"),
        ({"kueue.x-k8s.io/pod-group-total-count": "x"}, "pod-group-total-count: 'x' is not a whole number"),
        ({"kueue.x-k8s.io/pod-group-total-count": "0"}, "pod-group-total-count: 0 is outside 1..4096"),
    ],
)
def test_a_kueue_pod_group_without_a_positive_count_is_refused(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(PodSpecError, match=re.escape(message)):
        pod_info(kueue_pod(annotations), R)
