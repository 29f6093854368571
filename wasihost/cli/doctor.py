"""``wasihost doctor``: which process walls this machine enforces (issue 30, step 1).

Imported only when the command runs: it starts a probe child, which no other command needs."""

from __future__ import annotations

import argparse
import json

from ..core.terminal import printable
from ..engine.walls import probe_walls

# The version of the --json document: a reader checks it before reading "walls".
DOCTOR_SCHEMA = 1


def _cmd_doctor(args: argparse.Namespace) -> int:
    walls = probe_walls()
    if args.json:
        print(json.dumps({"schema": DOCTOR_SCHEMA, "walls": [w.as_json() for w in walls]}))
        return 0
    width = max(len(w.name) for w in walls)
    for wall in walls:
        # The probe already refuses details that are not short printable ASCII; printable()
        # is the CLI's rule for anything that reaches the terminal all the same.
        detail = f" ({printable(wall.detail)})" if wall.detail else ""
        print(f"{wall.name:<{width}}  {wall.state}{detail}")
    # A diagnosis, not a verdict: the exit status is 0 whatever the machine lacks.
    return 0
