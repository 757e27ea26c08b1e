"""Time mode's ``icl`` and ``icl-binpack`` are the extender itself, built by the factory ``icl extender`` uses.

``scheduler.factory.build_extender`` builds the extender from a configuration and a cache; time mode
builds it over a cache it feeds in process and asks its verbs for every pod, so a replay is the
product's decision. tests/test_sim_extender_parity.py checks a whole trace decision by decision
against an extender of its own; here, that time mode's cluster is built so and places through it.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.factory import build_extender
from simulator import timesim
from simulator.clusterspec import builtin_cluster
from simulator.jobs import Job
from simulator.model_extender import ExtenderModel
from topology.policy import PolicyName

SPEC = builtin_cluster()


@pytest.mark.parametrize("policy", ["icl", "icl-binpack"])
def test_time_mode_builds_its_extender_with_the_factory(policy: str) -> None:
    built: list[tuple[str, Any, Any]] = []

    def recording(cfg: ExtenderConfig, cache: ClusterCache, api: Any = None, **kw: Any) -> Extender:
        built.append((cfg.policy, cache, api))
        return build_extender(cfg, cache, api, **kw)

    with mock.patch("simulator.model_extender.build_extender", recording):
        res = timesim.run_time(SPEC, [Job("j", 0.0, 10.0, 4, "ring")], policy)
    assert res.records[0].end == 10.0
    ((name, cache, api),) = built
    assert name == policy and isinstance(cache, ClusterCache) and api is not None
    # every node of the spec reached its cache, as node objects
    assert sorted(cache.nodes.ready_views()) == sorted(n.name for n in SPEC.nodes)


def test_every_placement_is_the_extenders_bind_in_its_cache() -> None:
    c = ExtenderModel(SPEC, PolicyName.ICL, None, None, record=True)
    jobs = [
        Job(f"j{i}", 0.0, 10.0, count, shape)
        for i, (count, shape) in enumerate([(4, "ring"), (2, "any"), (8, "ring"), (4, "mesh:2x2")])
    ]
    jobs.append(Job("g", 0.0, 10.0, 8, "ring", gang=2))
    for job in jobs:
        c.queued(job)
        placed = c.place(job)
        assert placed is not None
        c.start(job, placed[0])
        # each member is a pod the extender bound: its cache holds the devices time mode records
        for member, where in enumerate(placed[0].members):
            uid = c.uid_of[(job.id, member)]
            assert c.cache.pods.held(uid) == where
    tries = [e for e in c.log if e[0] == "try"]
    assert [e[1] for e in tries] == ["j0-0", "j1-0", "j2-0", "j3-0", "g-0", "g-1"]
    # the gang's members went where the extender's gang manager reserved them: adjacent nodes of one domain
    g0, g1 = (e[4][0] for e in tries[-2:])
    assert SPEC.view.crossing([g0, g1]) <= 1
