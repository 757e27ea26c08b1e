"""The extender's profiles: each pod kind's steps, in order, built outside the verbs that run them.

kube-scheduler builds one framework per profile from its configuration before its loop starts, and
the loop only runs them; here :func:`build_profiles` builds one :class:`scheduler.cycle.Cycle` per
:class:`scheduler.framework.PodKind` (docs/scheduler.md, "One request, one cycle of small steps"),
and :class:`scheduler.extender.Extender` runs the one of the kind each pod is read as. Every kind's
filter first reads again the victims of earlier preemptions (:class:`scheduler.steps.ReadVictims`).
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.binding import (
    Announce,
    Binding,
    GangDevices,
    GangRecord,
    Lease,
    LinkedDevices,
    Request,
    ShareDevices,
    UnlinkedDevices,
    Unsure,
)
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.cycle import Cycle, Profiles
from scheduler.decision import Decision
from scheduler.framework import CycleState, PodKind, Status
from scheduler.gang import GangManager
from scheduler.host import Host
from scheduler.sharing import LiveShareRanker
from scheduler.steps import (
    CpuPods,
    FairShare,
    Gang,
    GangAdmission,
    GangLease,
    GangSize,
    HeldDevices,
    NotOurs,
    ReadPod,
    ReadVictims,
    Shares,
    VictimMemory,
)

__all__ = ["build_profiles"]


def build_profiles(
    cfg: ExtenderConfig,
    cache: ClusterCache,
    host: Host,
    *,
    decision: Decision,
    share_ranker: LiveShareRanker,
    gangs: GangManager,
    read: ReadPod,
    fair: FairShare,
    gang_size: GangSize,
    victims: VictimMemory,
    binding: Binding | None,
    unsure: Mapping[str, Unsure],
    lease_wait_s: float,
    record: GangRecord,
) -> Profiles:
    """Each pod kind's cycle over ``cache``, with the configuration's options.

    ``host``: the extender as its steps see it (the lease, Events, reading victims again); ``decision``:
    the whole-device kinds' per-node steps and ranker; ``share_ranker``: the ranker of shares and CPU-only
    pods; ``read``, ``fair``, ``gang_size``: the steps the extender's verbs use too (reading the pod, fair
    share's hold-back before a preemption, the gang sizes read from group objects); ``victims``: the
    victims preemption named; ``binding``: the Binding step (``None``: no API server, no bind);
    ``unsure``: the Bindings whose outcome is unknown, by pod uid; ``lease_wait_s``: how long a bind or a
    gang's first filter waits for the lease; ``record``: writes a gang reservation's record before its first
    member binds (shared with Kueue's admission checks, which record a reservation when they make it)."""

    def fail(state: CycleState, status: Status) -> None:
        host.event(state.info, status.event, status.reason)

    held = HeldDevices(cache)
    lease = Lease(host, lease_wait_s)
    announce = Announce(cfg, host)
    ranker, fit = decision.ranker, decision.fit
    share_step = Shares(share_ranker, decision.fits)
    cpu_pods = CpuPods(share_ranker, decision.fits, cfg.keep_best_nodes)
    not_ours = NotOurs()
    gang = Gang(gangs)
    gang_pre = (held, GangAdmission(gangs), fair, gang_size, GangLease(host, lease_wait_s), gang)
    cycles = {
        PodKind.INVALID: Cycle(pre_filter=(read,), score=(not_ours,), pre_bind=(lease, Request()), on_failure=fail),
        PodKind.NOT_OURS: Cycle(
            pre_filter=(held, not_ours),
            score=(not_ours,),
            pre_bind=(lease,),
            bind=binding,
            post_bind=(announce,),
            on_failure=fail,
        ),
        PodKind.CPU_ONLY: Cycle(
            pre_filter=(held, cpu_pods),
            score=(cpu_pods,),
            pre_bind=(lease,),
            bind=binding,
            post_bind=(announce,),
            on_failure=fail,
        ),
        PodKind.SHARE: Cycle(
            pre_filter=(held, share_step),
            score=(share_step,),
            pre_bind=(lease,),
            reserve=(ShareDevices(cache, share_ranker),),
            bind=binding,
            post_bind=(announce,),
            on_failure=fail,
        ),
        PodKind.SHAPED: Cycle(
            pre_filter=(held, fair),
            filter=fit,
            score=(fit,),
            pre_bind=(lease,),
            reserve=(LinkedDevices(cache, unsure, ranker),),
            bind=binding,
            post_bind=(announce,),
            on_failure=fail,
        ),
        PodKind.GANG: Cycle(
            pre_filter=gang_pre,
            filter=fit,
            score=(gang, fit),
            pre_bind=(lease,),
            reserve=(record, GangDevices(cache, unsure, ranker, gangs.book, elastic=False)),
            bind=binding,
            post_bind=(announce,),
            on_failure=fail,
        ),
        PodKind.ELASTIC_GANG: Cycle(
            pre_filter=gang_pre,
            filter=fit,
            score=(gang, fit),
            pre_bind=(lease,),
            reserve=(record, GangDevices(cache, unsure, ranker, gangs.book, elastic=True)),
            bind=binding,
            post_bind=(Announce(cfg, host, layouts=True),),
            on_failure=fail,
        ),
    }
    # with icl: the share ranker decides unshaped pods on nodes without links
    if decision.share_ranker is not None and decision.unlinked is not None:
        cycles[PodKind.UNSHAPED] = Cycle(
            pre_filter=(held, fair),
            filter=decision.unlinked,
            score=(decision.unlinked,),
            pre_bind=(lease,),
            reserve=(UnlinkedDevices(cache, unsure, ranker, decision.share_ranker),),
            bind=binding,
            post_bind=(announce,),
            on_failure=fail,
        )
    return Profiles(cycles, pre_filter=(ReadVictims(victims, host),))
