"""``python -m wasihost``: the ``wasihost`` command, for an environment whose scripts directory
is not on PATH."""

import sys

from .cli import program

sys.exit(program())
