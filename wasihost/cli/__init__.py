"""The ``wasihost`` command line: run, inspect, abi, state, and packages (keygen, pack, sign,
verify).

Every failure ends as one line ``error: <class>: <message>`` on stderr and a non-zero exit
status; a traceback is a bug.

The package's modules: :mod:`.parser` (every subcommand and its flags), :mod:`.common` (the
usage error, exit statuses and flag limits), :mod:`.options` (readers of the shared options),
:mod:`.run` (run, inspect, abi, wasi, bench), :mod:`.packages` (keygen, pack, sign, verify,
revoke, endorse, install, update, rollback, remove), :mod:`.state_commands` (grants, status),
:mod:`.doctor` (doctor) and :mod:`.remedies` (the hint under a refusal).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..core.errors import WasihostError
from ..core.terminal import printable
from .common import (
    DEFAULT_REVOCATION_DAYS,
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    MAX_CLI_INPUT_BYTES,
    MAX_REVOCATION_DAYS,
    UsageError,
    check_budget_flags,
)
from .parser import COMMANDS, _command_of, _parser

__all__ = [
    "COMMANDS",
    "DEFAULT_REVOCATION_DAYS",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "MAX_CLI_INPUT_BYTES",
    "MAX_REVOCATION_DAYS",
    "UsageError",
    "_command_of",
    "_parser",
    "check_budget_flags",
    "main",
    "program",
]

# Each command imports what only it needs (the package archive, signature and key code, the
# runtime): `wasihost run` of a directory or module loads none of the packaging modules, and
# `wasihost pack` none of the engine. Start-up is most of a short command's time. So the module
# of a command is imported only when that command runs: the table names each command's module
# (in this package) and function.
_HANDLERS: dict[str, tuple[str, str]] = {
    "run": ("run", "_cmd_run"),
    "inspect": ("run", "_cmd_inspect"),
    "keygen": ("packages", "_cmd_keygen"),
    "pack": ("packages", "_cmd_pack"),
    "sign": ("packages", "_cmd_sign"),
    "verify": ("packages", "_cmd_verify"),
    "revoke": ("packages", "_cmd_revoke"),
    "abi": ("run", "_cmd_abi"),
    "install": ("packages", "_cmd_install"),
    "endorse": ("packages", "_cmd_endorse"),
    "update": ("packages", "_cmd_update"),
    "rollback": ("packages", "_cmd_rollback"),
    "remove": ("packages", "_cmd_remove"),
    "grants": ("state_commands", "_cmd_grants"),
    "status": ("state_commands", "_cmd_status"),
    "wasi": ("run", "_cmd_wasi"),
    "bench": ("run", "_cmd_bench"),
    "doctor": ("doctor", "_cmd_doctor"),
}


def _handler(cmd: str) -> Callable[[argparse.Namespace], int]:
    """The function of subcommand ``cmd``, its module imported now."""
    module, name = _HANDLERS[cmd]
    handler: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"{__name__}.{module}"), name
    )
    return handler


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    # Host warnings (a disabled module cache, a rejected cache entry) are for the operator:
    # one plain line, no source location.
    print(f"warning: {printable(str(message))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():  # scoped: an embedding caller keeps its own handler
        warnings.showwarning = _show_warning
        return _main(argv)


def program() -> int:
    """The ``wasihost`` command as a whole process: what the console script and ``python -m
    wasihost`` run, then exit with. :func:`main` on ``sys.argv``, then an exit that does not
    sweep what the process is about to drop anyway; an embedder or a test calls :func:`main`,
    which changes nothing of its caller's collector."""
    code = main()
    # Everything alive now (the modules, classes and functions of wasihost, attrs and
    # wasmtime-py, its ctypes prototypes: about 30,000 tracked objects after a run) lives
    # until the process ends. CPython's exit still runs the cyclic collector over all of it
    # as it clears the modules, and frees what that finds: about a tenth of a warm `wasihost
    # run`, spent after the output is written. Frozen objects are left out of every later
    # collection, so what only a cycle keeps is never freed, and the process's memory goes
    # back to the system whole. The rest of the exit is unchanged: non-daemon threads joined,
    # atexit handlers run (the engine ticker's and weakref.finalize's among them), streams
    # flushed, and what those make collected as before.
    gc.freeze()
    return code


def _main(argv: Sequence[str] | None) -> int:
    args: argparse.Namespace | None = None
    try:
        args = _parser(_command_of(argv)).parse_args(argv)
        handler = _handler(args.cmd)
        return handler(args)
    except UsageError as exc:
        print(f"error: usage: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except WasihostError as exc:
        print(f"error: {exc.error_class}: {printable(exc.message)}", file=sys.stderr)
        from .remedies import _remedy  # only a refusal needs it

        remedy = exc.hint or _remedy(exc, args)
        if remedy is not None:
            print(f"hint: {printable(remedy)}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        # The reader went away (`wasihost abi | head -1`): stop quietly, as Unix tools do.
        # stdout is pointed at /dev/null so that the interpreter's final flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        print(f"error: internal: {type(exc).__name__}: {printable(str(exc))}", file=sys.stderr)
        return EXIT_INTERNAL
