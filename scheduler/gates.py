"""Queue holds as scheduling gates (``queueHolds: gate``): the lease holder lets queued pods go.

With ``queueHolds: gate`` the chart's admission policy creates every pod the extender manages behind
the scheduling gate :data:`scheduler.podspec.GATE_QUEUE`. kube-scheduler does not try a gated pod, so
a pod its queue holds back is never marked ``PodScheduled=False, reason=Unschedulable`` (the mark
cluster autoscalers buy nodes for). :class:`QueueGates` removes the gate of each pod its queue admits
now, in weighted dominant-resource order, by the fair share step's own rule
(:meth:`scheduler.steps.FairShare.hold_back`, which calls :func:`scheduler.fairshare.admit`, or for the
queues of ``queueTree`` the tree's rules in :mod:`scheduler.queuetree`): there is one fair-share rule,
applied at the gate instead of at the filter.

:meth:`QueueGates.choose` decides over one state of the cache: the queue with the smallest dominant share goes
first (:meth:`scheduler.steps.FairShare.order_key`; the tree's leaves by its weighted DRF at every level; with
a usage half-life, shares judged on the effective usage: the devices held plus the decayed device-time,
:meth:`scheduler.steps.FairShare.effective`); its first unit (a pod, or a gang's gated members together) is
admitted when the rule lets it go, and its devices are then counted on its queue before the next choice. A
unit its quota has no room for is passed over (a smaller one behind it may fit); a queue held back for fair
share waits for this round. Pods already let go but not bound yet (no gate, no node) count on their queue as
held, so a quota is never handed out twice while bindings are in flight (their pool is not known before they
bind: they count on the largest pool), and hold nobody back (they wait for a node, not for their queue). A
gated pod that asks for no whole device (a share, a gang member asking none) and a member of a gang that holds
a reservation go at once: no queue decides them.

Only the extender Lease's holder removes gates (a replica without leader election always does); a
replica with gated pods to let go takes the Lease when it is free, as a bind does. It
runs on its own thread when the cache changes (a pod added, bound, ended or deleted, a node
changed; polled every ``poll_s``) and every ``interval_s`` anyway. The filter then judges only the
quota (:meth:`scheduler.steps.FairShare.over_quota`): a pod the loop let go is not held back for
fair share again; a quota filled meanwhile by another pod still stops it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.gang import GangManager
from scheduler.kube import KubeAPI, KubeError
from scheduler.loop import Loop
from scheduler.podspec import PodInfo
from scheduler.steps import FairShare

__all__ = ["QueueGates"]

log = logging.getLogger(__name__)


class QueueGates(Loop):
    """The gate loop: :meth:`choose` the pods to let go, :meth:`run_once` removes their gates."""

    thread_name = "queue-gates"

    def __init__(
        self,
        cache: ClusterCache,
        cfg: ExtenderConfig,
        fair: FairShare,
        gangs: GangManager,
        api: KubeAPI | None,
        lead: Callable[[float], str],
        *,
        interval_s: float = 5.0,
        poll_s: float = 0.2,
    ) -> None:
        super().__init__()
        self.cache = cache
        self.cfg = cfg
        self.fair = fair
        self.gangs = gangs
        self.api = api
        self.lead = lead
        self.interval_s = interval_s
        self.poll_s = poll_s
        self._sent: dict[str, PodInfo] = {}  # uid -> pods whose gate was removed, until the cache shows it

    # ------------------------------------------------------------------ the decision

    def choose(self) -> list[PodInfo]:
        """The gated pods to let go now, in the order they are admitted."""
        pods = self.cache.pods
        with pods.lock:
            for uid in [u for u in self._sent if not ((p := pods.pod(u)) is not None and p.gated)]:
                del self._sent[uid]  # the cache shows it without the gate (or gone)
            gated = [p for p in pods.gated() if p.uid not in self._sent]
            pending = pods.pending()
            used = {q: dict(pools) for q, pools in pods.used_by_queue().items()}
            capacity = self.cache.nodes.capacity()
        out = [p for p in gated if p.count == 0 or (p.gang is not None and self.gangs.admitted(p))]
        chosen = {p.uid for p in out}
        # a pod let go holds no device yet, so its pool is unknown until it binds: it is charged to the
        # largest pool meanwhile, which counts it against its queue without knowing where it will land
        pool = max(capacity, key=lambda k: (capacity[k], k)) if capacity else ""
        admitted = set(chosen)  # let go (now or before) and not bound yet: they wait for a node, not their queue
        for p in pending:
            if p.uid in self._sent or not p.gated:
                admitted.add(p.uid)
                _charge(used, p.queue, pool, p.count)  # their devices are their queue's already
        units: dict[str, list[list[PodInfo]]] = {}
        gangs: dict[str, list[PodInfo]] = {}
        for p in sorted(gated, key=lambda p: -p.priority):  # stable: otherwise in the order the cache saw them
            if p.uid in chosen:
                continue
            if p.gang is None:
                units.setdefault(p.queue, []).append([p])
                continue
            members = gangs.get(p.gang.key)
            if members is None:
                members = gangs[p.gang.key] = []
                units.setdefault(p.queue, []).append(members)
            members.append(p)
        waiting = set(units)
        while waiting:
            queue = min(waiting, key=lambda q: self.fair.order_key(q, used, capacity))
            unit = units[queue].pop(0)
            if not units[queue]:
                waiting.discard(queue)
            ask = dataclasses.replace(unit[0], count=sum(p.count for p in unit))
            if self.fair.over_quota(ask, used) is not None:
                continue  # its quota (or its tree's limits) has no room for this unit; a smaller one may fit
            if self.fair.hold_back(ask, used, admitted) is not None:
                waiting.discard(queue)  # held back for fair share: so are its later units this round
                continue
            out.extend(unit)
            admitted.update(p.uid for p in unit)
            _charge(used, queue, pool, ask.count)
        return out

    # ------------------------------------------------------------------ the writes

    def run_once(self) -> int | None:
        """Remove the gate of every pod :meth:`choose` lets go; how many, or ``None`` when this replica
        does not hold the lease (it decides nothing then). With pods to let go it takes the lease when
        it is free (``lead``), as a bind does: gated pods never reach kube-scheduler's verbs, so waiting
        for a verb to take it would hold them forever."""
        api = self.api
        if api is None:
            return None
        chosen = self.choose()
        if not chosen:
            return 0
        if self.lead(0.0):
            return None
        done = 0
        for p in chosen:
            try:
                api.ungate_pod(p.namespace, p.name, p.uid, p.gates)
            except KubeError as exc:
                if exc.status not in (404, 409, 422):  # gone, replaced, or its gates changed meanwhile
                    log.warning("queue %r: cannot remove the gate of %s: %s", p.queue, p.key, exc)
                continue
            log.info("queue %r admits %s: scheduling gate removed", p.queue, p.key)
            self._sent[p.uid] = p
            done += 1
        return done

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        seen, last = -1, 0.0
        while not self._stop.wait(self.poll_s):
            generation, now = self.cache.generation, time.monotonic()
            if generation == seen and now - last < self.interval_s:
                continue
            try:
                if self.run_once() is not None:
                    seen, last = generation, now
            except Exception:
                log.exception("queue gates")


def _charge(used: dict[str, dict[str, int]], queue: str, pool: str, count: int) -> None:
    pools = used.setdefault(queue, {})
    pools[pool] = pools.get(pool, 0) + count
