"""How fair a run was: each queue's device-time against its weighted max-min fair share, per window.

Pure: no I/O, no clock. The simulator (time mode) and the extender (a Prometheus gauge) both measure
through here, so the figure means the same thing in a report and on a dashboard.

The ideal at one instant is the weighted max-min fair allocation (water-filling) of the cluster's
healthy devices ``C`` among the queues, each capped by its demand ``d_q`` (the devices it holds plus
the devices its waiting pods ask): a level ``L`` such that queue ``q`` gets ``min(d_q, L * w_q)`` and
the allocations sum to ``min(C, sum d_q)``. A queue with nothing held or waiting gets nothing; what it
would have had goes to the others in proportion to their weights.

Per window ``[a, b)`` (10 minutes by default), over the step function of samples:

- achieved ``A_q`` = the integral of the devices ``q`` holds, device-seconds;
- ideal ``I_q`` = the integral of ``q``'s instantaneous ideal, device-seconds;
- error = ``100 * sum_q |A_q - I_q| / 2 / integral(C)``, in percent of the cluster's device-time in the
  window: the share of the cluster that went to the wrong queue, or stood idle while some queue waited
  (half of it: the ideal would have handed it out, nobody held it).

>>> water_fill(32, {"a": 100, "b": 100}, {"a": 3, "b": 1})
{'a': 24.0, 'b': 8.0}
>>> water_fill(32, {"a": 100, "b": 4}, {"a": 3, "b": 1})
{'a': 28.0, 'b': 4.0}
>>> water_fill(32, {"a": 0, "b": 10}, {"a": 3, "b": 1})
{'a': 0.0, 'b': 10.0}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_WINDOW_S",
    "FairTree",
    "QueueSample",
    "Window",
    "WindowMeter",
    "fairness_windows",
    "summary",
    "tree_fill",
    "water_fill",
]

DEFAULT_WINDOW_S = 600.0
"""The default window: 10 minutes of simulated or real time."""


def water_fill(capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]) -> dict[str, float]:
    """The weighted max-min fair allocation of ``capacity`` among the queues of ``demand``, each capped by its
    demand; a queue's weight is ``weight[q]`` (1 when absent; must be > 0). Every queue of ``demand`` has an
    entry; the entries sum to ``min(capacity, sum(demand))``."""
    out = dict.fromkeys(demand, 0.0)
    left = max(0.0, float(capacity))
    live = [q for q, d in demand.items() if d > 0]
    for q in live:
        if not weight.get(q, 1.0) > 0:
            raise ValueError(f"weight of queue {q!r}: must be > 0, got {weight.get(q)}")
    # fill the queues in the order their demand is met, the smallest demand per weight first
    live.sort(key=lambda q: (demand[q] / weight.get(q, 1.0), q))
    wsum = sum(weight.get(q, 1.0) for q in live)
    for k, q in enumerate(live):
        w = weight.get(q, 1.0)
        level = left / wsum if wsum > 0 else 0.0
        if demand[q] <= level * w:
            out[q] = float(demand[q])  # capped by its demand: what it leaves goes to the rest
        else:
            for r in live[k:]:  # nobody left is capped: all share the rest by weight
                out[r] = level * weight.get(r, 1.0)
            return out
        left -= out[q]
        wsum -= w
    return out


@dataclass(frozen=True, slots=True)
class FairTree:
    """A tree of queues as the ideal needs it: the roots, each queue's children, weight and guarantee (every
    nominal quota of its subtree, devices). Leaves are the queues that hold devices."""

    roots: tuple[str, ...]
    children: Mapping[str, tuple[str, ...]]
    weight: Mapping[str, float]
    guarantee: Mapping[str, float]

    def leaves(self, name: str) -> list[str]:
        kids = self.children.get(name, ())
        return [name] if not kids else [leaf for c in kids for leaf in self.leaves(c)]


def tree_fill(capacity: float, demand: Mapping[str, float], tree: FairTree) -> dict[str, float]:
    """The hierarchical fair allocation of ``capacity`` among the leaves of ``tree`` with ``demand``: the
    roots share ``capacity`` by weighted max-min (:func:`water_fill`), and each queue shares what it gets
    among its children, each first up to its guarantee (by weighted max-min over the guarantees, when
    they do not all fit), the rest by weighted max-min over what they ask beyond it: weighted
    dominant-resource fairness at every level, as the queue tree ranks queues (a queue within its
    guarantee first, borrowers by what they borrow per weight). Queues of ``demand`` outside the tree get
    nothing. Limits on lending and borrowing are not modelled.

    Below, org's 32 devices: a and b get their guarantees (8 each), the 16 left go 3 : 1 (a 20, b 12); a's
    20: a1 its 8, the 12 left 1 : 1.

    >>> t = FairTree(("org",), {"org": ("a", "b"), "a": ("a1", "a2")}, {"a": 3}, {"a": 8, "a1": 8, "b": 8})
    >>> tree_fill(32, {"a1": 30, "a2": 30, "b": 30}, t)
    {'a1': 14.0, 'a2': 6.0, 'b': 12.0}
    """
    out = {q: 0.0 for q in demand}

    def asks(name: str) -> float:
        return sum(demand.get(leaf, 0.0) for leaf in tree.leaves(name))

    def share(name: str, amount: float) -> None:
        kids = tree.children.get(name, ())
        if not kids:
            if name in out:
                out[name] = amount
            return
        want = {c: asks(c) for c in kids}
        weight = {c: tree.weight.get(c, 1.0) for c in kids}
        first = {c: min(want[c], tree.guarantee.get(c, 0.0)) for c in kids}
        base = water_fill(amount, first, weight)
        rest = water_fill(amount - sum(base.values()), {c: want[c] - base[c] for c in kids}, weight)
        for c in kids:
            share(c, base[c] + rest[c])

    tops = water_fill(capacity, {r: asks(r) for r in tree.roots}, {r: tree.weight.get(r, 1.0) for r in tree.roots})
    for root, amount in tops.items():
        share(root, amount)
    return out


@dataclass(frozen=True, slots=True)
class QueueSample:
    """The cluster from ``t`` until the next sample: healthy devices, devices held and devices asked by
    waiting pods per queue."""

    t: float
    capacity: float
    held: Mapping[str, float]
    waiting: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Window:
    """One window's measure: device-seconds achieved and ideal per queue, and the error in percent."""

    start: float
    end: float
    capacity: float  # the cluster's device-seconds in the window
    achieved: Mapping[str, float]
    ideal: Mapping[str, float]

    @property
    def error_pct(self) -> float:
        """``100 * sum |achieved - ideal| / 2 / capacity`` (0 for a window with no capacity)."""
        if self.capacity <= 0:
            return 0.0
        queues = set(self.achieved) | set(self.ideal)
        off = sum(abs(self.achieved.get(q, 0.0) - self.ideal.get(q, 0.0)) for q in queues)
        return 100.0 * off / 2.0 / self.capacity


@dataclass
class WindowMeter:
    """Windows of one run, fed samples in time order (:meth:`observe`); each window is closed and kept in
    :attr:`windows` once a sample at or after its end arrives. The extender feeds it live."""

    weights: Mapping[str, float]
    window_s: float = DEFAULT_WINDOW_S
    windows: list[Window] = field(default_factory=list)
    # with a tree of queues, the ideal is :func:`tree_fill` over the tree's queues and :func:`water_fill`
    # over the others, which share what the tree's queues do not ask (flat and tree queues never hold
    # each other back)
    tree: FairTree | None = None
    _last: QueueSample | None = None
    _start: float = 0.0
    _cap: float = 0.0
    _achieved: dict[str, float] = field(default_factory=dict)
    _ideal: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"window_s: must be > 0, got {self.window_s}")

    @property
    def at(self) -> float | None:
        """The time of the last sample observed (``None``: none yet)."""
        return self._last.t if self._last is not None else None

    def observe(self, sample: QueueSample) -> None:
        """The state from ``sample.t`` on; the previous state is counted up to ``sample.t``."""
        last = self._last
        if last is None:
            self._start = sample.t
        elif sample.t < last.t:
            raise ValueError(f"samples out of order: {sample.t} after {last.t}")
        else:
            self._account(last, sample.t)
        self._last = sample

    def _account(self, s: QueueSample, until: float) -> None:
        demand = {q: s.held.get(q, 0.0) + s.waiting.get(q, 0.0) for q in set(s.held) | set(s.waiting)}
        ideal = self.ideal(s.capacity, demand)
        t = s.t
        while t < until:
            end = min(until, self._start + self.window_s)
            dt = end - t
            self._cap += s.capacity * dt
            for q, n in s.held.items():
                self._achieved[q] = self._achieved.get(q, 0.0) + n * dt
            for q, n in ideal.items():
                self._ideal[q] = self._ideal.get(q, 0.0) + n * dt
            t = end
            if end >= self._start + self.window_s:
                self._close(end)

    def _close(self, end: float) -> None:
        self.windows.append(Window(self._start, end, self._cap, dict(self._achieved), dict(self._ideal)))
        self._start, self._cap = end, 0.0
        self._achieved, self._ideal = {}, {}

    def ideal(self, capacity: float, demand: Mapping[str, float]) -> dict[str, float]:
        """The instantaneous ideal of every queue of ``demand``."""
        if self.tree is None:
            return water_fill(capacity, demand, self.weights)
        inside = {leaf for root in self.tree.roots for leaf in self.tree.leaves(root)}
        tree = tree_fill(capacity, {q: d for q, d in demand.items() if q in inside}, self.tree)
        flat = water_fill(
            capacity - sum(tree.values()), {q: d for q, d in demand.items() if q not in inside}, self.weights
        )
        return {**flat, **tree}

    def finish(self, end: float) -> None:
        """Count the last state up to ``end`` and close the partial window it leaves (if any time is in it)."""
        if self._last is None:
            return
        self._account(self._last, end)
        self._last = QueueSample(end, self._last.capacity, self._last.held, self._last.waiting)
        if end > self._start:
            self._close(end)


def fairness_windows(
    samples: Iterable[QueueSample],
    weights: Mapping[str, float],
    window_s: float = DEFAULT_WINDOW_S,
    end: float = 0.0,
    tree: FairTree | None = None,
) -> list[Window]:
    """The windows of a whole run: ``samples`` in time order, each holding until the next; the last
    holds until ``end`` (when later than it), where the last, partial window closes.

    >>> s = [QueueSample(0, 4, {"a": 4}, {"b": 2}), QueueSample(600, 4, {"a": 2, "b": 2}, {})]
    >>> [round(w.error_pct, 1) for w in fairness_windows(s, {"a": 1, "b": 1}, 600, 1200)]
    [50.0, 0.0]
    """
    meter = WindowMeter(weights, window_s, tree=tree)
    last = None
    for s in samples:
        meter.observe(s)
        last = s
    if last is not None:
        meter.finish(max(end, last.t))
    return meter.windows


def summary(windows: Sequence[Window]) -> tuple[float, float]:
    """(mean, max) error over ``windows``, the mean weighted by each window's device-time."""
    cap = sum(w.capacity for w in windows)
    if cap <= 0:
        return 0.0, 0.0
    mean = sum(w.error_pct * w.capacity for w in windows) / cap
    return mean, max(w.error_pct for w in windows)
