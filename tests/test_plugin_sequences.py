"""Random sequences of admissions, releases, faults and kubelet restarts against a live plugin.

Invariants after every step: no device is held by two containers; every container's
rank order is a permutation of exactly its devices; a container never gets a device
that was unhealthy when it was admitted; a kubelet restart loses no allocation.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.backends.sim import SimBackend
from simulator.kubelet import AdmissionError
from tests.support.plugin import running_plugin, short_tmpdir
from topology import build_preset

R = "kube-icl.io/accelerator"
TOPO = build_preset("torus:4x4")

ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(1, 6)),
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("fault"), st.sampled_from(TOPO.ids)),
        st.tuples(st.just("heal"), st.just(0)),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


async def run(steps: list[tuple[str, Any]]) -> None:
    with short_tmpdir() as d:
        backend = SimBackend(TOPO, recover_after=1, probe_interval=0.02)
        async with running_plugin(d, backend, topology="torus:4x4") as h:
            k = h.kubelet
            faulty: set[str] = set()
            pods = 0
            for op, arg in steps:
                if op == "admit":
                    await h.wait_devices(lambda dev: {i for i, s in dev.items() if s == "Unhealthy"} == faulty)
                    free = set(k.healthy(R)) - k.in_use(R)
                    try:
                        a = await k.admit(f"p{pods}", "main", R, arg)
                    except AdmissionError:
                        assert len(free) < arg
                    else:
                        assert set(a.devices) <= free and len(a.devices) == arg
                        order = a.envs["ICL_VISIBLE_DEVICES"].split(",")
                        assert sorted(order) == sorted(a.devices)
                    pods += 1
                elif op == "release":
                    k.release(f"p{arg}")
                elif op == "fault":
                    faulty.add(arg)
                    backend.set_faults(devices=sorted(faulty))
                elif op == "heal":
                    faulty.clear()
                    backend.set_faults()
                else:
                    before = {key: a.devices for key, a in k.allocations.items()}
                    await k.restart()
                    assert {key: a.devices for key, a in k.allocations.items()} == before
                    await k.wait_for(lambda kk: R in kk.endpoints and kk.endpoints[R].updates > 0)
                held = [d for a in k.allocations.values() for d in a.devices]
                assert len(held) == len(set(held))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_operation_sequences_keep_the_invariants(steps: list[tuple[str, Any]]) -> None:
    asyncio.run(asyncio.wait_for(run(steps), 60))
