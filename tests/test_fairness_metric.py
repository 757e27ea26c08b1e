"""The extender's fairness gauges: the last 10-minute window's error and each queue's devices achieved
against its weighted max-min fair share, computed from the cache's running and pending pods."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, QueueConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj

FULL = {"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _extender(cfg: ExtenderConfig) -> tuple[Extender, ClusterCache, Clock]:
    api = MemoryKubeAPI()
    for name in ("a", "b"):
        api.nodes[name] = node_obj(name, "ring:8")
    clock = Clock()
    cache = ClusterCache("kube-icl.io/accelerator", clock=clock)
    Informer(api, cache).sync_once()
    return Extender(cfg, cache, api), cache, clock


def _samples(ext: Extender) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(ext.metrics.render().decode()):
        for s in family.samples:
            if s.name.startswith(("kube_icl_fairness", "kube_icl_queue_fair_share")):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_gauges_show_the_last_closed_window_of_held_against_fair_devices() -> None:
    """alpha holds all 16 devices while beta waits for 2: the fair split is 14 : 2, so 2 of 16 devices
    went to the wrong queue (12.5 % of the cluster) until the window closes; nothing before it does."""
    ext, cache, clock = _extender(ExtenderConfig(queues={"beta": QueueConfig("beta", weight=1.0)}))
    cache.upsert_pod(pod_obj("alpha-a", 8, "ring", namespace="alpha", node="a", annotations=FULL))
    cache.upsert_pod(pod_obj("alpha-b", 8, "ring", namespace="alpha", node="b", annotations=FULL))
    cache.upsert_pod(pod_obj("beta-wait", 2, "ring", namespace="beta"))
    ext.sweep()
    assert _samples(ext) == {}
    families = {f.name for f in text_string_to_metric_families(ext.metrics.render().decode())}
    # offered before the first window closes, so dashboards and alerts find them on a fresh extender
    assert {"kube_icl_fairness_error_percent", "kube_icl_queue_fair_share_devices"} <= families
    clock.now += 600.0
    ext.sweep()
    got = _samples(ext)
    assert got[("kube_icl_fairness_error_percent", ())] == 12.5
    assert got[("kube_icl_queue_fair_share_devices", (("kind", "achieved"), ("queue", "alpha")))] == 16.0
    assert got[("kube_icl_queue_fair_share_devices", (("kind", "ideal"), ("queue", "alpha")))] == 14.0
    assert got[("kube_icl_queue_fair_share_devices", (("kind", "achieved"), ("queue", "beta")))] == 0.0
    assert got[("kube_icl_queue_fair_share_devices", (("kind", "ideal"), ("queue", "beta")))] == 2.0


def test_pods_behind_kube_icls_gate_are_demand_and_pods_behind_another_gate_are_not() -> None:
    """With ``queueHolds: gate`` a pod behind kube-icl's gate waits for its queue: demand. A pod behind
    another controller's gate waits for that controller: not demand, and not a reason for any error."""
    ext, cache, clock = _extender(ExtenderConfig(queue_holds="gate"))
    cache.upsert_pod(pod_obj("alpha-a", 8, "ring", namespace="alpha", node="a", annotations=FULL))
    cache.upsert_pod(pod_obj("alpha-b", 8, "ring", namespace="alpha", node="b", annotations=FULL))
    cache.upsert_pod(pod_obj("beta-ours", 4, "ring", namespace="beta", gates=("kube-icl.io/queue",)))
    cache.upsert_pod(pod_obj("gamma-theirs", 4, "ring", namespace="gamma", gates=("example.com/admission",)))
    ext.sweep()
    clock.now += 600.0
    ext.sweep()
    got = _samples(ext)
    assert got[("kube_icl_queue_fair_share_devices", (("kind", "ideal"), ("queue", "beta")))] == 4.0
    assert ("kube_icl_queue_fair_share_devices", (("kind", "ideal"), ("queue", "gamma"))) not in got
    assert got[("kube_icl_fairness_error_percent", ())] == 25.0
