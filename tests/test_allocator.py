"""A hypothesis state machine over allocate / reserve / unreserve / release: no device is ever held twice."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from topology import AllocationError, HoldKind, NodeAllocator, build_preset

TOPO = build_preset("torus:2x4")
OWNERS = st.sampled_from(["pod-a", "pod-b", "pod-c", "gang-x"])
DEVICE_SETS = st.sets(st.sampled_from(TOPO.ids), min_size=1, max_size=4)


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = NodeAllocator(TOPO)
        self.model: dict[str, tuple[str, HoldKind]] = {}

    def _expect_change(self, owner: str, devices: set[str], kind: HoldKind, own_reservation_ok: bool) -> None:
        before = self.alloc.holds()
        conflict = any(
            d in self.model and not (own_reservation_ok and self.model[d] == (owner, HoldKind.RESERVED))
            for d in devices
        )
        call = self.alloc.allocate if kind is HoldKind.ALLOCATED else self.alloc.reserve
        if conflict:
            with pytest.raises(AllocationError, match="already"):
                call(owner, devices)
            assert self.alloc.holds() == before, "a rejected request changes nothing"
        else:
            call(owner, devices)
            for d in devices:
                self.model[d] = (owner, kind)

    @rule(owner=OWNERS, devices=DEVICE_SETS)
    def allocate(self, owner: str, devices: set[str]) -> None:
        self._expect_change(owner, devices, HoldKind.ALLOCATED, own_reservation_ok=True)

    @rule(owner=OWNERS, devices=DEVICE_SETS)
    def reserve(self, owner: str, devices: set[str]) -> None:
        self._expect_change(owner, devices, HoldKind.RESERVED, own_reservation_ok=False)

    @rule(owner=OWNERS)
    def unreserve(self, owner: str) -> None:
        freed = self.alloc.unreserve(owner)
        expected = {d for d, (o, k) in self.model.items() if o == owner and k is HoldKind.RESERVED}
        assert freed == expected
        for d in expected:
            del self.model[d]
        assert self.alloc.unreserve(owner) == frozenset(), "safe to call twice"

    @rule(owner=OWNERS)
    def release(self, owner: str) -> None:
        freed = self.alloc.release(owner)
        expected = {d for d, (o, _) in self.model.items() if o == owner}
        assert freed == expected
        for d in expected:
            del self.model[d]

    @precondition(lambda self: True)
    @rule(devices=st.lists(st.sampled_from([*TOPO.ids, "nope"]), min_size=0, max_size=3))
    def bad_requests_change_nothing(self, devices: list[str]) -> None:
        before = self.alloc.holds()
        if not devices or "nope" in devices or len(set(devices)) != len(devices):
            with pytest.raises(AllocationError):
                self.alloc.allocate("pod-z", devices)
            assert self.alloc.holds() == before

    @invariant()
    def state_matches_model_and_no_double_holds(self) -> None:
        holds = self.alloc.holds()
        assert {d: (h.owner, h.kind) for d, h in holds.items()} == self.model
        assert self.alloc.free_ids() == frozenset(TOPO.ids) - set(self.model)


TestAllocator = AllocatorMachine.TestCase
