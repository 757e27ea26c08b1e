"""kube-icl's ``icl`` command: the entry point that dispatches to the parts (``icl/cli.py``)."""
