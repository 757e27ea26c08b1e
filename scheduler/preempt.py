"""The extender's preempt verb: which pods to evict so the pod's shape fits, per node.

kube-scheduler proposes victims per node for its own filters (CPU, memory, device count)
(``callExtenders`` in ``pkg/scheduler/framework/preemption``). The answer may leave nodes
out, but every node it names needs a non-empty list of pods on that node: kube-scheduler
fails the whole preemption on an empty one. Its proposed victims are all kept; device
holders of lower priority are added only where the shape still does not fit; fair share
and elastic gangs' minimums limit who may be taken, and a pod younger than its queue's
``minRuntime`` is no victim. A node where no allowed set of victims frees the shape is left out. A
member of a gang that still misses members is answered by whole-gang preemption
(:mod:`scheduler.gangpreempt`): victims for all the missing members at once, in one domain of the
lowest tier that can hold them, or nobody.

Under informer lag (kube-scheduler's cache sees a victim gone before the extender's does) the
victims this replica named are remembered (:class:`NamedVictims`) and, before an answer or a
filter that depends on them, read again from the API server (``confirm``): a preemptor whose
earlier victims are still leaving preempts nobody else, as kube-scheduler's own rule.

Another replica may have named them: the previous leader, before a failover. What they are is
derived again from what kube-scheduler wrote, in every request, the way kube-scheduler's own
``PodEligibleToPreemptOthers`` finds them after a restart: the preemptor's
``status.nominatedNodeName`` (in the pod kube-scheduler sends), and the pods of lower priority
terminating on that node (:meth:`NamedVictims.nominated`). A preempt request also reads again every
lower-priority holder of that node: one gone or leaving, where the shape then fits, means no new
victims. Nothing is written for this, and it holds from a standby's first answer, before its lease.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler import fairshare
from scheduler.cache import ClusterCache, share_free
from scheduler.config import ExtenderConfig
from scheduler.framework import CycleState, PodKind
from scheduler.gang import GangManager
from scheduler.gangpreempt import GangPreemption, runs_too_briefly
from scheduler.host import Host
from scheduler.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims
from topology import Placer, Shape
from topology.contract import MILLI_PER_DEVICE

__all__ = ["NamedVictims", "Preemption", "fewest_victims", "lower_holders", "nomination"]

_MAX_VICTIM_SETS = 4096

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Named:
    preemptor: str  # uid of the pod that preempts
    node: str
    until: float  # forgotten then, seen gone or not (cache clock)
    checked: float  # last read from the API server (cache clock)


class NamedVictims:
    """Victims this replica named in its preempt answers, until the cache sees them go (``ttl_s`` at most).

    kube-scheduler deletes the victims of the one node it picks; the others stay. Informers lag each
    other: kube-scheduler may see a victim gone before the extender's cache does, and then ask again
    (filter refuses the freed node, preemption repeats). What these victims really are is read with a
    GET (:meth:`due` says which, at most once per ``every_s`` each, except in a preemption).
    """

    def __init__(self, cache: ClusterCache, ttl_s: float = 30.0, every_s: float = 1.0) -> None:
        self.cache = cache
        self.ttl_s = ttl_s
        self.every_s = every_s
        self._named: dict[str, _Named] = {}

    def __len__(self) -> int:
        return len(self._named)

    def remember(self, preemptor: str, answer: Mapping[str, MetaVictims]) -> None:
        now = self.cache.clock()
        with self.cache.lock:
            for node, victims in answer.items():
                for p in victims.pods:
                    self._named[p.uid] = _Named(preemptor, node, now + self.ttl_s, float("-inf"))
            if len(self._named) > 100_000:
                self._named.clear()

    def due(
        self, nodes: Collection[str] | None = None, *, force: bool = False, preemptor: str | None = None
    ) -> list[str]:
        """Named victims (on ``nodes``, or anywhere; and wherever they are, those named for ``preemptor``)
        that the cache still shows and that are to be read again now; forgets those the cache saw go and
        those past their time."""
        if not self._named:
            return []
        now = self.cache.clock()
        out = []
        with self.cache.lock:
            for uid, n in list(self._named.items()):
                if now >= n.until or self.cache.pods.pod(uid) is None:
                    del self._named[uid]
                elif (nodes is None or n.node in nodes or n.preemptor == preemptor) and (
                    force or now >= n.checked + self.every_s
                ):
                    n.checked = now
                    out.append(uid)
        return out

    def nominated(self, pod: Mapping[str, Any], nodes: Collection[str] | None = None) -> None:
        """Remember as ``pod``'s victims the pods of lower priority that the cache shows terminating on its
        ``status.nominatedNodeName`` (when that node is in ``nodes``, or always without ``nodes``): the
        earlier victims kube-scheduler deleted for it, whichever replica named them (those it has already
        remembered keep their time)."""
        uid, node, priority = nomination(pod)
        if not uid or not node or (nodes is not None and node not in nodes):
            return
        now = self.cache.clock()
        with self.cache.lock:
            for victim in lower_holders(self.cache, node, priority):
                info = self.cache.pods.pod(victim)
                if victim not in self._named and info is not None and info.deleting:
                    self._named[victim] = _Named(uid, node, now + self.ttl_s, float("-inf"))

    def of(self, preemptor: str) -> list[str]:
        """The victims named for ``preemptor`` that are still remembered."""
        with self.cache.lock:
            return [u for u, n in self._named.items() if n.preemptor == preemptor]


def nomination(pod: Mapping[str, Any]) -> tuple[str, str, int]:
    """(uid, nominated node, priority) of a pod object as kube-scheduler sends it; the node is "" when none
    is nominated, or when the pod is bound already or being deleted (no preemptor then)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    node = str((pod.get("status") or {}).get("nominatedNodeName") or "")
    if spec.get("nodeName") or meta.get("deletionTimestamp"):
        node = ""
    priority = spec.get("priority")
    if not isinstance(priority, int) or isinstance(priority, bool):
        priority = 0
    return str(meta.get("uid") or ""), node, priority


def lower_holders(cache: ClusterCache, node: str, priority: int) -> list[str]:
    """The pods the cache shows holding devices on ``node`` (whole, or which ones unknown) at a priority
    below ``priority``, in uid order."""
    with cache.lock:
        here = cache.nodes.holders(node)
        if here is None:
            return []
        return sorted(
            u
            for u in {*here.owners, *here.unattributed}
            if (p := cache.pods.pod(u)) is not None and p.priority < priority
        )


def _victims(uids: tuple[str, ...], pdb: int) -> MetaVictims:
    return MetaVictims(tuple(MetaPod(u) for u in uids), pdb)


def fewest_victims(
    candidates: list[str],
    held: Mapping[str, tuple[str, ...]],
    fits: Callable[[frozenset[str]], bool],
    priority: Mapping[str, int],
    allowed: Callable[[tuple[str, ...]], bool] = lambda combo: True,
) -> tuple[str, ...] | None:
    """The smallest set of ``candidates`` whose devices make the shape fit.

    Ties: the lowest highest priority among the victims, then fewest devices freed, then the
    lowest sum of priorities, then the first in candidate order.
    """
    tried = 0
    for k in range(1, len(candidates) + 1):
        best: tuple[tuple[int, int, int], tuple[str, ...]] | None = None
        for combo in itertools.combinations(candidates, k):
            tried += 1
            if tried > _MAX_VICTIM_SETS:
                return best[1] if best else None
            freed = frozenset(d for u in combo for d in held[u])
            if not fits(freed) or not allowed(combo):
                continue
            prios = [priority.get(u, 0) for u in combo]
            cost = (max(prios), len(freed), sum(prios))
            if best is None or cost < best[0]:
                best = (cost, combo)
        if best is not None:
            return best[1]
    return None


def _held(used: fairshare.Usage) -> fairshare.Usage:
    return used


class Preemption:
    """Victims per node for one preemption request (the pod already read into a :class:`CycleState`)."""

    def __init__(
        self,
        cache: ClusterCache,
        cfg: ExtenderConfig,
        gangs: GangManager,
        host: Host,
        named: NamedVictims | None = None,
        effective: Callable[[fairshare.Usage], fairshare.Usage] | None = None,
    ) -> None:
        """``host``: whether fair share holds a pod back, and reads of cached pods again from the API server
        (:meth:`scheduler.host.Host.confirm`); ``effective``: the usage fair share judges shares on, from the
        devices held (:meth:`scheduler.steps.FairShare.effective`; default: the devices held)."""
        self.cache = cache
        self.cfg = cfg
        self.gangs = gangs
        self.host = host
        self.named = named if named is not None else NamedVictims(cache)
        self.effective = effective if effective is not None else _held
        self.whole_gang = GangPreemption(cache, cfg, gangs, host, self.effective)

    def victims(self, state: CycleState, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        proposed = {n: (tuple(dict.fromkeys(u)), pdb) for n, (u, pdb) in args.victim_uids().items() if u}
        if state.kind is PodKind.INVALID:
            return ExtenderPreemptionResult({})
        preemptor = state.uid or state.info.uid
        # Victims an earlier round named for this pod, maybe on another replica: terminating on its node.
        self.named.nominated(args.pod)
        # This pod's own earlier victims wherever they are, and any named victim on a proposed node:
        # not every victim remembered for every preemptor (a GET each).
        check = self.named.due(set(proposed), force=True, preemptor=preemptor) if len(self.named) else []
        whole = state.shape is not None and not state.info.milli
        if whole:
            check += self._gang_survivors(state, proposed)
            _uid, nominated, priority = nomination(args.pod)
            if nominated:
                # Every lower-priority holder of its nominated node, read again: one gone (the cache never
                # saw it go, nor its deletion start) frees that node, whoever named it.
                check += [u for u in lower_holders(self.cache, nominated, priority) if u not in check]
        with self.cache.lock:
            where = {u: held[0] for u in check if (held := self.cache.pods.held(u)) is not None}
        leaving = self.host.confirm(dict.fromkeys(check)) if check else set()
        with self.cache.lock:
            earlier = [
                u for u in self.named.of(preemptor) if u in leaving or ((p := self.cache.pods.pod(u)) and p.deleting)
            ]
        if preemptor and earlier:
            # kube-scheduler's rule (PodEligibleToPreemptOthers): no new victims while those of an
            # earlier round on the chosen node are leaving; their devices are the pod's once they are gone.
            log.info("preempt %s: waits for its earlier victims to go (%s)", state.info.key, ", ".join(sorted(earlier)))
            return ExtenderPreemptionResult({})
        freed = sorted({where[u] for u in leaving if u in where})
        if whole and state.shape is not None and any(self._fits_leaving(n, state.shape) for n in freed):
            # A pod the cache still showed is gone or leaving, and the shape fits once it is: no new victims.
            log.info("preempt %s: fits on %s once pods already leaving are gone", state.info.key, ",".join(freed))
            return ExtenderPreemptionResult({})
        out = self._victims(state, proposed)
        self.named.remember(preemptor, out)
        return ExtenderPreemptionResult(out)

    def _victims(self, state: CycleState, proposed: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, MetaVictims]:
        if state.info.milli:
            return self._share_victims(state.info.milli, proposed)
        if state.shape is None:
            return {n: _victims(uids, pdb) for n, (uids, pdb) in proposed.items()}
        info, shape = state.info, state.shape
        if self.host.held_back(state):
            return {}  # a held-back pod never preempts
        whole = self.whole_gang.answer(state, proposed)
        if whole is not None:
            return whole  # a gang that misses members: victims for all of them, or nobody
        now = self.gangs.book.wall()
        held = self.cache.pods.used_by_queue()  # limits and guarantees count the devices held
        used = self.effective(held)  # shares: with a usage half-life, the decayed usage added
        capacity = self.cache.nodes.capacity()
        out: dict[str, MetaVictims] = {}
        for node, (uids, pdb) in sorted(proposed.items()):
            with self.cache.lock:
                here = self.cache.nodes.holders(node)
                if here is None:
                    continue
                view = here.view
                # The proposed victims' devices on this node are freed whatever the extender says.
                taken = {u: where[1] for u in uids if (where := self.cache.pods.held(u)) and where[0] == node}
                freed = {d for devs in taken.values() for d in devs}
                extra: dict[str, tuple[str, ...]] = {}
                pods = {u: p for u in (*here.owners, *taken) if (p := self.cache.pods.pod(u)) is not None}
                for u, devs in here.owners.items():
                    p = pods.get(u)
                    if p is None or u in taken:
                        continue
                    if p.deleting:
                        freed.update(devs)  # an earlier round's victim, still terminating: leaving anyway
                    elif p.priority < info.priority or (
                        p.priority == info.priority
                        and fairshare.reclaims(info.queue, shape.size, p.queue, len(devs), held, self.cfg)
                    ):
                        extra[u] = devs  # lower priority; or equal, taking back what the victim's queue borrowed
                # Victims the scheduler proposed must be allowed by fair share too, since none is dropped.
                judged = [u for u in taken if (p := pods.get(u)) is not None and not p.deleting] + sorted(extra)
                queues = {u: pods[u].queue if u in pods else "" for u in judged}
                priority = {u: pods[u].priority if u in pods else 0 for u in extra}
                spare = view.unattributed - sum(here.unattributed.get(u, 0) for u in uids)
            pool = view.topology.fingerprint
            placer = Placer.for_topology(view.topology)
            base = view.free | freed

            def fits(
                more: frozenset[str],
                spare: int = spare,
                base: frozenset[str] = base,
                placer: Placer = placer,
            ) -> bool:
                free = base | more
                return len(free) - spare >= shape.size and placer.fits(shape, free)

            allowed = {
                u
                for u in judged
                if not queues[u]
                or fairshare.victim_allowed(
                    info.queue,
                    {pool: shape.size},
                    queues[u],
                    {pool: len(taken.get(u) or extra[u])},
                    used,
                    capacity,
                    self.cfg,
                    held,
                )
            }
            allowed -= {u for u in judged if u in pods and runs_too_briefly(pods[u], self.cfg, now)}
            if any(u not in allowed for u in taken if u in queues):
                continue  # a victim the scheduler needs may not be taken: this node cannot be freed
            if self.elastic_victims(uids) is None:
                continue  # the scheduler's victims would take an elastic gang below its minimum

            # each judged victim's queue and the devices taking it frees
            freeing = {u: (queues[u], len(taken.get(u) or extra[u])) for u in judged}

            def keeps(
                combo: tuple[str, ...], uids: tuple[str, ...] = uids, freeing: dict[str, tuple[str, int]] = freeing
            ) -> bool:
                """No elastic gang below its minimum, no queue of the tree below its guarantees."""
                victims = (*uids, *combo)
                if self.elastic_victims(victims) is None:
                    return False
                losses: dict[str, int] = {}
                for u in victims:
                    if u in freeing:
                        q, n = freeing[u]
                        losses[q] = losses.get(q, 0) + n
                return fairshare.victims_keep_guarantees(info.queue, shape.size, losses, held, self.cfg)

            if fits(frozenset()):
                if keeps(()):
                    out[node] = _victims(uids, pdb)
                continue

            pool_of = [u for u in sorted(extra) if u in allowed]
            surplus = [u for u in pool_of if self.elastic_victims((u,)) is True]
            chosen = fewest_victims(surplus, extra, fits, priority, keeps) if surplus else None
            if chosen is None:
                chosen = fewest_victims(pool_of, extra, fits, priority, keeps)
            if chosen is None:
                continue
            out[node] = _victims((*uids, *chosen), pdb)
        # Surplus members of elastic gangs go first: when some node is freed by taking only those,
        # the nodes whose victims include anybody else are left out.
        spare_only = {n for n, v in out.items() if self.elastic_victims(tuple(p.uid for p in v.pods)) is True}
        if spare_only:
            out = {n: v for n, v in out.items() if n in spare_only}
        return out

    def _gang_survivors(self, state: CycleState, proposed: Mapping[str, tuple[tuple[str, ...], int]]) -> list[str]:
        """The running members of the elastic gangs that a victim here may belong to: whether one is
        surplus depends on all of them (read again before the answer, so a member gone already is no
        survivor)."""
        keys: set[str] = set()
        with self.cache.lock:
            for node, (uids, _pdb) in proposed.items():
                here = self.cache.nodes.holders(node)
                for u in (*uids, *(here.owners if here is not None else ())):
                    p = self.cache.pods.pod(u)
                    gang = p.gang if p is not None and p.priority < state.info.priority else None
                    if gang is not None and self.gangs.is_elastic(gang):
                        keys.add(gang.key)
            return [p.uid for key in sorted(keys) for p in self.gangs.survivors(key)]

    def _fits_leaving(self, node: str, shape: Shape) -> bool:
        """The shape fits on ``node`` with its free devices and those of the pods terminating there."""
        with self.cache.lock:
            here = self.cache.nodes.holders(node)
            if here is None:
                return False
            view = here.view
            free = set(view.free)
            for u, devs in here.owners.items():
                if (p := self.cache.pods.pod(u)) is not None and p.deleting:
                    free.update(devs)
        placer = Placer.for_topology(view.topology)
        return len(free) - view.unattributed >= shape.size and placer.fits(shape, frozenset(free))

    def _share_victims(self, milli: int, proposed: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, MetaVictims]:
        """A share's preemption: kube-scheduler's victims on the nodes where, once they are gone, one
        device has room for the share (their shares and whole devices freed); other nodes are left
        out, so no pod is evicted for a share that would still not fit. Device holders are never added."""
        out: dict[str, MetaVictims] = {}
        with self.cache.lock:
            for node, (uids, pdb) in sorted(proposed.items()):
                here = self.cache.nodes.holders(node)
                if here is None:
                    continue
                room = dict(share_free(here.view))
                for uid in uids:
                    share = self.cache.pods.held_share(uid)
                    if share is not None and share[0] == node and share[1] in room:
                        room[share[1]] += share[2]
                    held = self.cache.pods.held(uid)
                    if held is not None and held[0] == node:
                        for dev in held[1]:
                            if dev in room and dev not in here.shared_devices:
                                room[dev] = MILLI_PER_DEVICE
                if max(room.values(), default=0) >= milli:
                    out[node] = _victims(uids, pdb)
        return out

    def elastic_victims(self, uids: tuple[str, ...]) -> bool | None:
        """None when these victims would take some elastic gang below its minimum; True when every one
        is a member above its elastic gang's minimum (surplus), False otherwise."""
        per_gang: dict[str, int] = {}
        only_surplus = bool(uids)
        for u in dict.fromkeys(uids):
            p = self.cache.pods.pod(u)
            if p is None or p.gang is None or not self.gangs.is_elastic(p.gang):
                only_surplus = False
                continue
            per_gang[p.gang.key] = per_gang.get(p.gang.key, 0) + 1
        for key, n in per_gang.items():
            if n > self.gangs.spare(key):
                return None
        return only_surplus
