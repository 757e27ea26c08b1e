"""``kubectl icl``: kube-icl's view of a cluster for operators, as a kubectl plugin (``kubectl-icl``).

Beside the product, as ``topocli`` is: it reads the API server with the user's own credentials through
:mod:`kubeauth`, feeds what it lists into the extender's own cache and gang book in its process (built by
the extender's factory, with no API client: it writes nothing) and shows their answers; it never imports the
extender's server, informer or API client, and no product part imports it.

- :mod:`kubectlicl.state`: the nodes, pods and gang records listed, fed into the extender's cache and gang book.
- :mod:`kubectlicl.views`: views of nodes (chips busy, reserved, unhealthy, free), gangs, queues, read from there.
- :mod:`kubectlicl.why`: ``kubectl icl why POD``, the extender's filter for one pod, and what frees its shape.
- :mod:`kubectlicl.snapshot`: ``kubectl icl snapshot``, the state as one file (:mod:`scheduler.snapshot`), and back.
- :mod:`kubectlicl.render`: tables, chip strips and drawings, JSON/YAML documents.
- :mod:`kubectlicl.html`: ``kubectl icl nodes --html FILE``, one self-contained page of every node's chips.
- :mod:`kubectlicl.cluster`: the API requests (lists only).
- :mod:`kubectlicl.cli`: the command.
"""
