"""``python -m icl``: the ``icl`` command."""

import sys

from icl.cli import main

sys.exit(main())
