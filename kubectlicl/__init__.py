"""``kubectl icl``: kube-icl's view of a cluster for operators, as a kubectl plugin (``kubectl-icl``).

Beside the product, as ``topocli`` is: it reads the API server with the user's own credentials through
:mod:`kubeauth` and computes what it shows with the pure readers the extender uses (``topology``,
``scheduler.podspec``, ``scheduler.config``, ``scheduler.fairshare``); it never imports the extender's
server or cache, and no product part imports it.

- :mod:`kubectlicl.views`: pure views of nodes (chips busy, reserved, unhealthy, free), gangs, queues.
- :mod:`kubectlicl.render`: tables, chip strips and drawings, JSON/YAML documents.
- :mod:`kubectlicl.html`: ``kubectl icl nodes --html FILE``, one self-contained page of every node's chips.
- :mod:`kubectlicl.cluster`: the API requests (lists only).
- :mod:`kubectlicl.cli`: the command.
"""
