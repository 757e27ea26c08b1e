"""The extender's cycle driver (scheduler/cycle.py) over steps whose outcomes the test sets.

The steps here are the driver's real peers in shape (they implement the step protocols of
scheduler/framework.py) and record what the driver asked of them; the extender's own steps
are covered through its verbs by the wire, gang, fair-share and preemption tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from scheduler.cycle import Cycle, Profiles
from scheduler.framework import OK, Code, CycleState, NodeAnswer, Outcome, PodKind, StateKey, Status
from scheduler.podspec import PodInfo, pod_info
from tests.support.extender import pod_obj

NAMES = ["n1", "n2", "n3"]


def _outcomes(status: Status) -> Mapping[Code, Outcome]:
    """A double's outcomes: the label and event the test gives its status (the driver derives them)."""
    return {status.code: Outcome(status.label, status.event)}


def _state() -> CycleState:
    info: PodInfo = pod_info(pod_obj("p", 2), "kube-icl.io/accelerator")
    return CycleState(pod_obj("p", 2), info, names=list(NAMES))


@dataclass
class Log:
    calls: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def on_failure(self, state: CycleState, status: Status) -> None:
        self.events.append((status.plugin, status.event, status.reason))


class Pre:
    """A pre-filter step answering ``status``; with ``nodes``, it decides the nodes itself."""

    def __init__(self, name: str, log: Log, status: Status, nodes: list[str] | None = None) -> None:
        self.name, self.log, self.status, self.nodes = name, log, status, nodes
        self.outcomes = _outcomes(status)

    def pre_filter(self, state: CycleState) -> Status:
        self.log.calls.append(f"pre:{self.name}")
        if self.nodes is not None:
            state.answer = NodeAnswer(list(self.nodes), {n: "elsewhere" for n in state.names if n not in self.nodes})
        return self.status


class PerNode:
    """The filter step: passes the nodes in ``fit``."""

    name = "PerNode"
    outcomes: Mapping[Code, Outcome] = {Code.UNSCHEDULABLE: Outcome("unschedulable", "FailedPlacement")}

    def __init__(self, log: Log, fit: set[str]) -> None:
        self.log, self.fit = log, fit

    def filter(self, state: CycleState, names: list[str]) -> Status:
        self.log.calls.append("filter")
        passed = [n for n in names if n in self.fit]
        state.answer = NodeAnswer(passed, {n: "too full" for n in names if n not in self.fit})
        if not passed:
            return Status(Code.UNSCHEDULABLE, "fits nowhere")
        return OK


class Scorer:
    outcomes: Mapping[Code, Outcome] = {}

    def __init__(self, name: str, log: Log, scores: list[int] | None) -> None:
        self.name, self.log, self.scores = name, log, scores

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        self.log.calls.append(f"score:{self.name}")
        return self.scores


class Gate:
    name = "Gate"

    def __init__(self, log: Log, status: Status) -> None:
        self.log, self.status = log, status
        self.outcomes = _outcomes(status)

    def pre_bind(self, state: CycleState) -> Status:
        self.log.calls.append("pre_bind")
        return self.status


class Take:
    """A reserve step that takes something (or fails to) and gives it back on unreserve."""

    outcomes: Mapping[Code, Outcome] = {Code.ERROR: Outcome("error", "FailedBinding")}

    def __init__(self, name: str, log: Log, ok: bool) -> None:
        self.name, self.log, self.ok = name, log, ok

    def reserve(self, state: CycleState) -> Status:
        self.log.calls.append(f"reserve:{self.name}")
        return OK if self.ok else Status(Code.ERROR, f"{self.name} is gone")

    def unreserve(self, state: CycleState) -> None:
        self.log.calls.append(f"unreserve:{self.name}")


class Post:
    name = "Post"

    def __init__(self, log: Log, status: Status) -> None:
        self.log, self.status = log, status
        self.outcomes = _outcomes(status)

    def bind(self, state: CycleState) -> Status:
        self.log.calls.append("bind")
        return self.status


class Told:
    name = "Told"
    outcomes: Mapping[Code, Outcome] = {}

    def __init__(self, log: Log) -> None:
        self.log = log

    def post_bind(self, state: CycleState) -> None:
        self.log.calls.append("post_bind")


# ---------------------------------------------------------------------------- filter


def test_a_pre_filter_failure_stops_the_cycle_with_its_reason_on_every_node() -> None:
    log = Log()
    held = Status(Code.UNRESOLVABLE, "queue a is over its share", label="held", event="QueueHeldBack")
    cycle = Cycle(
        pre_filter=[Pre("Read", log, OK), Pre("Fair", log, held), Pre("Gang", log, OK)],
        filter=PerNode(log, set(NAMES)),
        on_failure=log.on_failure,
    )
    state = _state()
    status = cycle.filter(state)
    assert (status.code, status.reason, status.plugin, status.label) == (Code.UNRESOLVABLE, held.reason, "Fair", "held")
    assert log.calls == ["pre:Read", "pre:Fair"]  # neither the gang step nor the per-node filter ran
    assert state.answer == NodeAnswer([], {}, dict.fromkeys(NAMES, held.reason))
    assert log.events == [("Fair", "QueueHeldBack", held.reason)]


def test_an_unschedulable_status_fails_nodes_as_retryable_and_records_no_event_without_one() -> None:
    log = Log()
    lease = Status(Code.UNSCHEDULABLE, "another replica holds the lease", label="held")
    state = _state()
    Cycle(pre_filter=[Pre("Lease", log, lease)], on_failure=log.on_failure).filter(state)
    assert state.answer == NodeAnswer([], dict.fromkeys(NAMES, lease.reason), {})
    assert log.events == []


def test_skip_passes_every_node_and_ends_the_phase() -> None:
    log = Log()
    cycle = Cycle(
        pre_filter=[Pre("NotOurs", log, Status(Code.SKIP, label="ignored")), Pre("Fair", log, OK)],
        filter=PerNode(log, set()),
    )
    state = _state()
    assert cycle.filter(state).label == "ignored"
    assert state.answer == NodeAnswer(NAMES)
    assert log.calls == ["pre:NotOurs"]


def test_a_pre_filter_that_decides_the_nodes_ends_the_phase() -> None:
    log = Log()
    cycle = Cycle(
        pre_filter=[Pre("Gang", log, Status(label="gang"), nodes=["n2"]), Pre("Later", log, OK)],
        filter=PerNode(log, set(NAMES)),
    )
    state = _state()
    assert cycle.filter(state).label == "gang"
    assert state.answer == NodeAnswer(["n2"], {"n1": "elsewhere", "n3": "elsewhere"})
    assert log.calls == ["pre:Gang"]


def test_the_per_node_filter_runs_after_every_pre_filter_and_its_failure_is_recorded_once() -> None:
    log = Log()
    cycle = Cycle(
        pre_filter=[Pre("Read", log, OK), Pre("Fair", log, OK)], filter=PerNode(log, set()), on_failure=log.on_failure
    )
    state = _state()
    status = cycle.filter(state)
    assert (status.code, status.plugin) == (Code.UNSCHEDULABLE, "PerNode")
    assert log.calls == ["pre:Read", "pre:Fair", "filter"]
    assert state.answer == NodeAnswer([], dict.fromkeys(NAMES, "too full"))
    assert log.events == [("PerNode", "FailedPlacement", "fits nowhere")]


def test_the_first_score_step_with_a_say_scores_every_node() -> None:
    log = Log()
    cycle = Cycle(score=[Scorer("Shares", log, None), Scorer("Gang", log, [10, 0, 10]), Scorer("Fit", log, [1, 2, 3])])
    assert cycle.score(_state()) == [10, 0, 10]
    assert log.calls == ["score:Shares", "score:Gang"]
    assert Cycle(score=[Scorer("None", log, None)]).score(_state()) == [0, 0, 0]


def test_the_driver_names_the_step_and_takes_its_label_and_event_from_the_steps_outcomes() -> None:
    log = Log()

    class Fair:
        name = "Fair"
        outcomes: Mapping[Code, Outcome] = {Code.UNRESOLVABLE: Outcome("held", "QueueHeldBack")}

        def pre_filter(self, state: CycleState) -> Status:
            return Status(Code.UNRESOLVABLE, "queue a waits")  # a code and a reason, nothing else

    status = Cycle(pre_filter=[Fair()], on_failure=log.on_failure).filter(_state())
    assert (status.plugin, status.label, status.event) == ("Fair", "held", "QueueHeldBack")
    assert log.events == [("Fair", "QueueHeldBack", "queue a waits")]

    class Plain:
        name = "Plain"
        outcomes: Mapping[Code, Outcome] = {}

        def pre_filter(self, state: CycleState) -> Status:
            return Status(Code.SKIP)

    # a code the step does not list: the default outcome, and no event
    status = Cycle(pre_filter=[Plain()], filter=PerNode(log, set())).filter(_state())
    assert (status.plugin, status.label, status.event) == ("Plain", "ignored", "")


def test_profiles_run_the_cycle_of_the_pods_kind_and_steps_hand_values_on_by_typed_keys() -> None:
    log = Log()
    seen: StateKey[int] = StateKey("Count.seen")

    class Count:
        name = "Count"
        outcomes: Mapping[Code, Outcome] = {}

        def pre_filter(self, state: CycleState) -> Status:
            state.write(seen, len(state.names))
            return OK

    class Read:
        name = "Read"
        outcomes: Mapping[Code, Outcome] = {}

        def pre_filter(self, state: CycleState) -> Status:
            log.calls.append(f"read:{state.read(seen)}")
            return OK

    profiles = Profiles(
        {
            PodKind.SHAPED: Cycle(pre_filter=[Count(), Read()], filter=PerNode(log, {"n1"})),
            PodKind.NOT_OURS: Cycle(pre_filter=[Pre("NotOurs", log, Status(Code.SKIP))]),
        }
    )
    state = _state()
    state.kind = PodKind.SHAPED
    assert profiles.filter(state).ok and log.calls == ["read:3", "filter"]
    assert state.read(seen) == 3
    log.calls.clear()
    other = _state()
    other.kind = PodKind.NOT_OURS
    assert profiles.filter(other).code is Code.SKIP and log.calls == ["pre:NotOurs"]
    assert other.read(seen) is None  # the other kind's step never ran
    assert profiles.score(other) == [0, 0, 0]  # a kind without score steps scores 0


# ---------------------------------------------------------------------------- bind


def test_unreserve_runs_last_first_when_the_binding_fails() -> None:
    log = Log()
    cycle = Cycle(
        pre_bind=[Gate(log, OK)],
        reserve=[Take("record", log, True), Take("devices", log, True)],
        bind=Post(log, Status(Code.ERROR, "binding p to n1 failed: 403", event="FailedBinding")),
        post_bind=[Told(log)],
        on_failure=log.on_failure,
    )
    status = cycle.bind(_state())
    assert (status.code, status.reason, status.plugin) == (Code.ERROR, "binding p to n1 failed: 403", "Post")
    assert log.calls == [
        "pre_bind",
        "reserve:record",
        "reserve:devices",
        "bind",
        "unreserve:devices",
        "unreserve:record",
    ]
    assert log.events == [("Post", "FailedBinding", "binding p to n1 failed: 403")]


def test_a_failed_reserve_undoes_only_the_steps_before_it() -> None:
    log = Log()
    cycle = Cycle(
        reserve=[Take("record", log, True), Take("devices", log, False), Take("never", log, True)],
        bind=Post(log, OK),
    )
    status = cycle.bind(_state())
    assert (status.code, status.plugin) == (Code.ERROR, "devices")
    assert log.calls == ["reserve:record", "reserve:devices", "unreserve:record"]


def test_an_unknown_binding_outcome_keeps_the_reservations() -> None:
    log = Log()
    cycle = Cycle(reserve=[Take("devices", log, True)], bind=Post(log, Status(Code.PENDING, "outcome unknown")))
    assert cycle.bind(_state()).code is Code.PENDING
    assert log.calls == ["reserve:devices", "bind"]


def test_a_pre_bind_failure_reserves_nothing() -> None:
    log = Log()
    cycle = Cycle(
        pre_bind=[Gate(log, Status(Code.ERROR, "not the lease holder"))],
        reserve=[Take("d", log, True)],
        bind=Post(log, OK),
    )
    assert cycle.bind(_state()).reason == "not the lease holder"
    assert log.calls == ["pre_bind"]


# ---------------------------------------------------------------------------- any outcomes

PRE = st.sampled_from(["ok", "decide", "skip", "unschedulable", "unresolvable"])
_PRE_STATUS = {
    "ok": OK,
    "decide": Status(label="decided"),
    "skip": Status(Code.SKIP, label="ignored"),
    "unschedulable": Status(Code.UNSCHEDULABLE, "not now", event="E"),
    "unresolvable": Status(Code.UNRESOLVABLE, "never", event="E"),
}


@given(pre=st.lists(PRE, max_size=6), fit=st.sets(st.sampled_from(NAMES)))
def test_filter_over_any_step_outcomes(pre: list[str], fit: set[str]) -> None:
    log = Log()
    steps = [
        Pre(f"s{i}", log, _PRE_STATUS[kind], nodes=["n1"] if kind == "decide" else None) for i, kind in enumerate(pre)
    ]
    state = _state()
    status = Cycle(pre_filter=steps, filter=PerNode(log, fit), on_failure=log.on_failure).filter(state)
    stop = next((i for i, kind in enumerate(pre) if kind != "ok"), None)
    if stop is None:  # every pre-filter passed: the per-node filter decided
        assert log.calls == [f"pre:s{i}" for i in range(len(pre))] + ["filter"]
        assert state.answer is not None and state.answer.passed == [n for n in NAMES if n in fit]
        assert status.ok == bool(fit)
        assert len(log.events) == (0 if fit else 1)
        return
    kind = pre[stop]
    assert log.calls == [f"pre:s{i}" for i in range(stop + 1)]  # nothing after the deciding step ran
    assert status.plugin == f"s{stop}"
    answer = state.answer
    assert answer is not None
    if kind == "decide":
        assert answer.passed == ["n1"]
    elif kind == "skip":
        assert answer == NodeAnswer(NAMES)
    else:
        bucket = answer.failed if kind == "unschedulable" else answer.unresolvable
        assert answer.passed == [] and bucket == dict.fromkeys(NAMES, _PRE_STATUS[kind].reason)
    assert log.events == (
        [(f"s{stop}", "E", _PRE_STATUS[kind].reason)] if kind in ("unschedulable", "unresolvable") else []
    )


@given(
    reserves=st.lists(st.booleans(), max_size=5),
    bound=st.sampled_from([Code.SUCCESS, Code.ERROR, Code.PENDING]),
)
def test_bind_over_any_step_outcomes(reserves: list[bool], bound: Code) -> None:
    log = Log()
    steps = [Take(f"r{i}", log, ok) for i, ok in enumerate(reserves)]
    status = Cycle(reserve=steps, bind=Post(log, Status(bound, "b")), post_bind=[Told(log)]).bind(_state())
    first_bad = next((i for i, ok in enumerate(reserves) if not ok), None)
    taken = [f"r{i}" for i in range(first_bad if first_bad is not None else len(reserves))]
    reserved = [f"reserve:{n}" for n in taken]
    undone = [f"unreserve:{n}" for n in reversed(taken)]
    if first_bad is not None:
        assert log.calls == [*reserved, f"reserve:r{first_bad}", *undone]
        assert (status.code, status.plugin) == (Code.ERROR, f"r{first_bad}")
    elif bound is Code.SUCCESS:
        assert log.calls == [*reserved, "bind", "post_bind"] and status.ok
    elif bound is Code.PENDING:
        assert log.calls == [*reserved, "bind"] and status.code is Code.PENDING  # reservations kept
    else:
        assert log.calls == [*reserved, "bind", *undone] and status.code is Code.ERROR
    # every reservation is either kept by a success / unknown outcome, or given back exactly once
    assert sum(c.startswith("unreserve:") for c in log.calls) in (0, len(taken))
