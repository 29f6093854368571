"""``python -m wasihost.cli``: the ``wasihost`` command, as ``python -m wasihost`` runs it.

When the command line was one module, ``-m`` ran that file as __main__, a second copy of the
module: the subcommands raised wasihost.cli's UsageError, which only that module's main caught.
A package's __main__ imports the entry point (program, which runs main) from the package itself,
the one copy the subcommands use."""

import sys

from . import program

sys.exit(program())
