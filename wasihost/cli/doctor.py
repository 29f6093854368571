"""``wasihost doctor``: which process walls this machine enforces (issue 30), and which call
path the engine runs commands on (issue 31: the compiled one, or ctypes and why).

Imported only when the command runs: it starts a probe child, which no other command needs."""

from __future__ import annotations

import argparse
import json

from ..core.terminal import printable
from ..engine.walls import probe_walls

# The version of the --json document: a reader checks it before reading "walls".
DOCTOR_SCHEMA = 1


def _cmd_doctor(args: argparse.Namespace) -> int:
    from ..engine import fastcall

    walls = probe_walls()
    if args.json:
        document = {
            "schema": DOCTOR_SCHEMA,
            "walls": [w.as_json() for w in walls],
            "call_path": {"path": fastcall.PATH, "detail": fastcall.WHY},
        }
        print(json.dumps(document))
        return 0
    width = max(len(w.name) for w in walls)
    for wall in walls:
        # The probe already refuses details that are not short printable ASCII; printable()
        # is the CLI's rule for anything that reaches the terminal all the same.
        detail = f" ({printable(wall.detail)})" if wall.detail else ""
        print(f"{wall.name:<{width}}  {wall.state}{detail}")
    warning = "" if fastcall.PATH == fastcall.COMPILED else "warning: slower calls; "
    print(f"call path: {fastcall.PATH} ({warning}{printable(fastcall.WHY)})")
    # A diagnosis, not a verdict: the exit status is 0 whatever the machine lacks.
    return 0
