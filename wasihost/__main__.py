"""``python -m wasihost``: the ``wasihost`` command, for an environment whose scripts directory
is not on PATH."""

import sys

from .cli import main

sys.exit(main())
