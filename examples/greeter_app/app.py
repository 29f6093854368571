"""A small application that embeds wasihost as its plugin engine.

It loads one plugin package (by default the bundled ``hello`` fixture, a Rust guest built on
the guest SDK), grants it what the application's policy allows, calls it, and handles every
outcome the embedding guide describes: guest errors as data, a per-call budget, logs through
Python's ``logging``, and a final close.

    python3 examples/greeter_app/app.py [PACKAGE] [NAME ...]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from wasihost import CallError, FailureClass, Host, Policy, WasihostError, to_logging

DEFAULT_PLUGIN = Path(__file__).resolve().parents[2] / "fixtures" / "hello"


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.DEBUG, format="plugin log [%(name)s] %(message)s")
    plugin = Path(argv[0]) if argv else DEFAULT_PLUGIN
    names = argv[1:] or ["ada", "grace"]
    # The application decides what any plugin may have: here logging and a clock, no more.
    policy = Policy(allow={"log", "clock"})
    try:
        with Host(policy, log_sink=to_logging) as host:
            ext = host.load(plugin)
            print(f"loaded {ext.id}, granted {sorted(ext.grant.capabilities)}")
            for name in names:
                print(ext.call("greet", {"name": name})["greeting"])
            try:
                ext.call("greet", {"name": 42})
            except CallError as exc:
                if exc.failure is not FailureClass.GUEST_ERROR:
                    raise
                print(f"plugin refused bad input: {exc.guest_class}")
            try:
                ext.call("greet", {"name": "x"}, fuel=50)
            except CallError as exc:
                print(f"tiny budget: {exc.failure.value}")
            print(f"last call used {ext.last_fuel_used} fuel")
    except WasihostError as exc:
        print(f"error: {exc.error_class}: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
