"""Fair share's usage history in the API server, so that it survives a restart and a failover.

The extender Lease's holder writes each queue's decayed device-time (:class:`topology.decay.DecayedUsage`)
every ``fairShare.usageWriteSeconds`` as a ``coordination.k8s.io/v1`` Lease named after the extender's own
(:func:`scheduler.wire.usage_record_name`), in the form :func:`scheduler.wire.usage_lease` gives it. A replica
reads it back when it starts, when it takes the extender Lease over, and, while it does not hold the Lease,
every ``usageWriteSeconds``: it adopts each newer record (:meth:`scheduler.usagehistory.UsageHistory.adopt`),
so every replica's usage is the holder's as of its last write, plus what the replica's own cache saw held
since. Two replicas therefore judge the same shares, and a standby that takes over goes on from the old
holder's last write.
"""

from __future__ import annotations

import logging

from scheduler.kube import KubeAPI, KubeError
from scheduler.wire import WireError, read_usage, usage_lease
from topology.decay import DecayedUsage

__all__ = ["UsageRecord"]

log = logging.getLogger(__name__)


class UsageRecord:
    """The usage record ``namespace/name``: write it, read it back."""

    def __init__(self, api: KubeAPI, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    def write(self, usage: DecayedUsage, holder: str) -> str:
        """Create or replace the record with ``usage``, written by ``holder``: "" when written, else why not."""
        body = usage_lease(usage, self.namespace, self.name, holder)
        try:
            old = self.api.get_lease(self.namespace, self.name)
            if old is None:
                self.api.create_lease(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = (old.get("metadata") or {}).get("resourceVersion")
                self.api.replace_lease(self.namespace, self.name, body)
        except KubeError as exc:
            return f"cannot write the usage record {self.namespace}/{self.name}: {exc}"
        return ""

    def read(self) -> DecayedUsage | None:
        """The recorded usage; ``None`` when there is none or it cannot be read (logged: the next write
        replaces it). :class:`scheduler.kube.KubeError` when the API server does not answer."""
        lease = self.api.get_lease(self.namespace, self.name)
        if lease is None:
            return None
        try:
            return read_usage(lease)
        except WireError as exc:
            log.warning(
                "usage record %s/%s is unreadable (%s); the next write replaces it", self.namespace, self.name, exc
            )
            return None
