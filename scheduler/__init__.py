"""kube-icl's kube-scheduler extender: topology-aware filter, prioritize, bind and preempt.

Run it with ``icl extender --config FILE``; see ``docs/scheduler.md``. The
decisions come from :mod:`topology`; this package adds the wire format
(:mod:`scheduler.wire`), the cluster cache (:mod:`scheduler.cache`), gangs,
fair share, the API client and the HTTP server.
"""
