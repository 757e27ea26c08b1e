"""The policy registry: one name per policy, one meaning per name, for every part that decides.

A policy answers "which node, which devices" for one request and one state; it
is stateless and pure. Every part that decides calls it:

- the scheduler extender: filter and prioritize call :meth:`LinkedPolicy.evaluate`
  per node, bind calls :meth:`LinkedPolicy.devices` on the node kube-scheduler chose;
- the device plugin, for a container no scheduler annotated: :meth:`LinkedPolicy.devices`;
- the simulator's time mode on node topologies: :meth:`LinkedPolicy.evaluate` on every
  node, :func:`best_nodes`, then :meth:`LinkedPolicy.devices`: the extender's own answers;
- the simulator's fill mode and time mode on shared (fractional) devices:
  :func:`topology.policies.make_policy` (the share form of the same name).

Names (:class:`PolicyName`); each has a linked form (whole devices on a node
topology, shapes), a share form (fractions of unlinked devices), or both:

========== ====== ===== ====================================================================
name       linked share what it does
========== ====== ===== ====================================================================
icl        yes    yes   kube-icl: fragmentation-aware device choice, nodes by fragmentation,
                        packing and the stranding of devices CPU/memory can no longer feed
icl-binpack yes   no    as ``icl`` with devices tucked against busy ones (``DeviceRank.BINPACK``)
kubelet    yes    no    a stock kubelet: lowest free ids, links ignored (baseline)
random     no     yes   any feasible node and device (baseline)
spread     no     yes   stock kube-scheduler ``LeastAllocated`` (baseline)
bestfit    no     yes   the FGD paper's best fit (baseline)
fgd        no     yes   fragmentation gradient descent, as the FGD authors' simulator (baseline)
========== ====== ===== ====================================================================

Former names are still read: ``fragmentation`` is ``icl``, ``binpack`` is
``icl-binpack`` (the extender's and the plugin's ``policy:``), ``share:NAME`` is
``NAME`` (time mode).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum

from topology.model import NodeTopology
from topology.placement import DEFAULT_MIX, Placement, Placer
from topology.scoring import DeviceRank, binpack_node_score, stranded_units
from topology.shapes import Shape

__all__ = [
    "LEGACY_NAMES",
    "LINKED",
    "MAX_SCORE",
    "SHARE",
    "Ask",
    "Balance",
    "LinkedPolicy",
    "NodeInput",
    "PolicyName",
    "Verdict",
    "Weights",
    "best_nodes",
    "linked_policy",
    "policy_name",
]

MAX_SCORE = 10
"""Node scores run 0..MAX_SCORE (kube-scheduler's extender priority range)."""

_MIX_TOTAL = sum(w for _, w in DEFAULT_MIX) or 1.0


class PolicyName(StrEnum):
    """Every policy kube-icl knows, by the one name each part and each command line uses."""

    ICL = "icl"
    ICL_BINPACK = "icl-binpack"
    KUBELET = "kubelet"
    RANDOM = "random"
    SPREAD = "spread"
    BESTFIT = "bestfit"
    FGD = "fgd"


LINKED: tuple[PolicyName, ...] = (PolicyName.KUBELET, PolicyName.ICL, PolicyName.ICL_BINPACK)
"""Names with a linked form (whole devices, shapes on a node topology), baseline first."""
SHARE: tuple[PolicyName, ...] = (
    PolicyName.RANDOM,
    PolicyName.SPREAD,
    PolicyName.BESTFIT,
    PolicyName.FGD,
    PolicyName.ICL,
)
"""Names with a share form (fractions of devices, ``topology.policies``), baselines first."""
LEGACY_NAMES: dict[str, PolicyName] = {"fragmentation": PolicyName.ICL, "binpack": PolicyName.ICL_BINPACK}
"""Former names, still read so that configs written with them keep working, and the name each stands for."""


def policy_name(text: str, field: str = "policy", allowed: Collection[PolicyName] | None = None) -> PolicyName:
    """The policy a name (or a former name) means; ``ValueError`` naming ``field``, the value and the
    allowed names otherwise.

    >>> policy_name("fragmentation")
    <PolicyName.ICL: 'icl'>
    >>> policy_name("share:fgd")
    <PolicyName.FGD: 'fgd'>
    >>> policy_name("fgd", allowed=LINKED)
    Traceback (most recent call last):
    ...
    ValueError: policy: 'fgd' is not one of the policies that apply here; allowed: kubelet, icl, icl-binpack
    """
    key = text.strip().lower()
    key = key.removeprefix("share:")
    which = LEGACY_NAMES.get(key)
    if which is None:
        try:
            which = PolicyName(key)
        except ValueError:
            which = None
    names = list(PolicyName) if allowed is None else list(allowed)
    allowed_text = ", ".join(p.value for p in names)
    if which is None:
        raise ValueError(f"{field}: unknown name {text!r}; allowed: {allowed_text}")
    if which not in names:
        raise ValueError(f"{field}: {text!r} is not one of the policies that apply here; allowed: {allowed_text}")
    return which


@dataclass(frozen=True, slots=True)
class Weights:
    """How much each node term counts in the 0..MAX_SCORE node score (any non-negative values)."""

    fragmentation: float = 1.0
    binpack: float = 1.0
    stranding: float = 1.0


@dataclass(frozen=True, slots=True)
class Balance:
    """CPU (milli) and memory (MiB) the device pods ask per whole device: the stranding term's ratios.

    Callers derive it from the device pods they know (:meth:`of_pods`); rounded to three significant
    digits so that a decision memoised on it is not invalidated by every small change.

    >>> Balance.of_pods([(2, 8000, 0), (1, 2000, 1024)])
    Balance(cpu_per_device=3330.0, mem_per_device=341.0)
    """

    cpu_per_device: float = 0.0
    mem_per_device: float = 0.0

    @classmethod
    def of_pods(cls, pods: Iterable[tuple[int, int, int]]) -> Balance:
        """From (devices, CPU milli, memory MiB) per device pod."""
        devices = cpu = mem = 0
        for d, c, m in pods:
            if d > 0:
                devices, cpu, mem = devices + d, cpu + c, mem + m
        if devices <= 0:
            return cls()
        return cls(_round3(cpu / devices), _round3(mem / devices))


def _round3(x: float) -> float:
    return float(f"{x:.3g}") if x > 0 else 0.0


@dataclass(frozen=True, slots=True)
class NodeInput:
    """One node as a policy sees it: its topology, free healthy devices and free CPU/memory.

    ``unattributed``: devices held by pods whose exact devices are unknown (counted, not placed).
    ``admits``: devices the kubelet's allocatable still admits, or -1 when not reported.
    ``cpu_free`` (milli) and ``mem_free`` (MiB): allocatable minus the requests of the pods bound
    there, or -1 when unknown (no stranding term then).
    """

    topology: NodeTopology
    free: frozenset[str]
    unattributed: int = 0
    admits: int = -1
    cpu_free: int = -1
    mem_free: int = -1


@dataclass(frozen=True, slots=True)
class Ask:
    """One pod's request: its shape (whole devices) and its CPU (milli) and memory (MiB) requests."""

    shape: Shape
    cpu_milli: int = 0
    mem_mib: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer for one request: fits or why not, and its 0..MAX_SCORE score."""

    ok: bool
    reason: str
    score: int
    unresolvable: bool = False


@dataclass(frozen=True, slots=True)
class LinkedPolicy:
    """A policy's linked form: which nodes fit a shape and how good each is, and which devices.

    Node score (``icl``, ``icl-binpack``), each term in 0..1, weighted (:class:`Weights`):

    - fragmentation: 1 minus the weighted share of placeable capacity (the expected mix of
      shapes, ``DEFAULT_MIX``) that the node's best placement destroys;
    - binpack: the node's fraction of devices in use after placement (fuller is better);
    - stranding: 1 minus the growth, over the node's devices, of the free devices that the node's
      free CPU and memory could no longer feed at the device pods' usual ratios
      (:class:`Balance`); left out (its weight too) when the node's CPU/memory is unknown or the
      ratios are zero.

    ``kubelet`` scores every fitting node by how many devices stay free (a spread, as the stock
    scheduler's ``LeastAllocated``) and counts devices only: links are ignored.
    """

    name: PolicyName
    rank: DeviceRank
    weights: Weights = Weights()

    def devices(
        self, topo: NodeTopology, free: Collection[str], shape: Shape, must_include: Collection[str] = ()
    ) -> Placement | None:
        """The devices this policy takes for ``shape`` on ``free`` (``must_include`` among them), or None."""
        return Placer.for_topology(topo).place(shape, free, self.rank, must_include=must_include)

    def evaluate(self, node: NodeInput, ask: Ask, balance: Balance = Balance(), *, resource: str = "") -> Verdict:
        """Whether ``ask`` fits ``node``, why not (``resource``: the extended resource's name, for the
        reason), and the node's score (higher is better)."""
        shape = ask.shape
        topo = node.topology
        placer = Placer.for_topology(topo)
        healthy = len(topo.healthy_ids)
        if shape.size > healthy:
            return Verdict(False, placer.explain(shape, node.free), 0, unresolvable=True)
        if 0 <= node.admits < shape.size:
            return Verdict(
                False,
                f"{shape.describe()} needs {shape.size} devices; the node's allocatable "
                f"{resource or 'devices'} admits {node.admits} more",
                0,
            )
        usable = len(node.free) - node.unattributed
        if usable < shape.size:
            held = f" ({node.unattributed} more held by pods without a device list)" if node.unattributed else ""
            return Verdict(False, f"{shape.describe()} needs {shape.size} free devices; {usable} are free{held}", 0)
        if self.rank is DeviceRank.KUBELET:
            return Verdict(True, "", round(MAX_SCORE * (usable - shape.size) / max(1, healthy)))
        best = placer.place(shape, node.free, DeviceRank.FRAGMENTATION)
        if best is None:
            return Verdict(False, placer.explain(shape, node.free) or f"{shape.describe()} does not fit", 0)
        loss = min(1.0, max(0.0, best.score / _MIX_TOTAL))
        pack = binpack_node_score(healthy, usable, shape.size)
        w = self.weights
        num = w.fragmentation * (1.0 - loss) + w.binpack * pack
        total = w.fragmentation + w.binpack
        growth = self._strand_growth(node, ask, usable, healthy, balance)
        if growth is not None:  # known CPU/memory and non-zero ratios: the stranding term counts
            num += w.stranding * (1.0 - min(1.0, max(0.0, growth)))
            total += w.stranding
        raw = num / total if total > 0 else 0.0
        return Verdict(True, "", max(0, min(MAX_SCORE, round(raw * MAX_SCORE))))

    @staticmethod
    def _strand_growth(node: NodeInput, ask: Ask, usable: int, healthy: int, balance: Balance) -> float | None:
        """The growth of stranded devices over the node's devices, or None when it cannot be known."""
        cpu, mem = balance.cpu_per_device, balance.mem_per_device
        if (
            healthy <= 0
            or (cpu <= 0 and mem <= 0)
            or (cpu > 0 and node.cpu_free < 0)
            or (mem > 0 and node.mem_free < 0)
        ):
            return None
        before = stranded_units(usable, node.cpu_free, node.mem_free, cpu, mem)
        after = stranded_units(
            usable - ask.shape.size,
            max(0, node.cpu_free - ask.cpu_milli),
            max(0, node.mem_free - ask.mem_mib),
            cpu,
            mem,
        )
        return (after - before) / healthy


def linked_policy(name: str | PolicyName, weights: Weights = Weights()) -> LinkedPolicy:
    """The linked form of a policy name (or former name); ``ValueError`` for a name without one."""
    which = policy_name(str(name), allowed=LINKED)
    rank = {
        PolicyName.ICL: DeviceRank.FRAGMENTATION,
        PolicyName.ICL_BINPACK: DeviceRank.BINPACK,
        PolicyName.KUBELET: DeviceRank.KUBELET,
    }[which]
    return LinkedPolicy(which, rank, weights)


def best_nodes(verdicts: Iterable[tuple[str, Verdict]]) -> list[str]:
    """The fitting nodes with the highest score, in the order given (kube-scheduler picks one of
    them at random; the simulator takes the first of its own order)."""
    top = -1
    out: list[str] = []
    for name, v in verdicts:
        if not v.ok or v.score < top:
            continue
        if v.score > top:
            top, out = v.score, []
        out.append(name)
    return out
