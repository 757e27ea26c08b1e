"""``icl topo``: the topology core from the terminal (draw, place, validate, encode, and show a live node).

A package of its own, beside ``topology/`` rather than in it: ``topology/`` is pure (no I/O, no Kubernetes; an
import-linter contract in ``pyproject.toml`` keeps it so), while this command reads files, prints, and reads a
live node's annotation and pods through :mod:`kubeauth` (``icl topo show node/NAME``). It is no part of the
simulator, which only replays traces. Like every other part it registers its subcommand through
``topocli.cli.register``, the hook ``icl/cli.py`` dispatches to, so ``icl topo`` imports only this package and
what it uses.

- :mod:`topocli.cli`: the ``icl topo`` verbs and ``tour`` (the built-in walk that ``icl demo`` opens with).
- :mod:`topocli.node_view`: ``icl topo show node/NAME``, a live node's published topology with its pods' devices.
"""
