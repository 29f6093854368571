"""What every module of the command line shares: its usage error, its exit statuses, the limits
it puts on its own flags, and the check of the budget flags that ``run`` and ``wasi`` share
(and the hint naming the one a run ran out of)."""

from __future__ import annotations

import argparse

from ..core import limits
from ..core.errors import FailureClass

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE: a bug in wasihost, not in the guest or the input
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a Unix tool killed by a closed pipe reports
# --input-file/--input-bytes: the largest max_input_bytes a manifest may ask for; reading more
# could only be refused later, so it is refused before it is read.
MAX_CLI_INPUT_BYTES = 16 * 1024 * 1024
# `wasihost revoke`'s default lifetime of a list: a week, so that a host cut off from fresh
# lists stops admitting within days (TUF gives its frequently re-signed roles short expiries).
DEFAULT_REVOCATION_DAYS = 7
# A list valid for more than a year would let a frozen copy be served for that long.
MAX_REVOCATION_DAYS = 366


class UsageError(Exception):
    """Bad command-line arguments."""


def check_budget_flags(args: argparse.Namespace) -> None:
    """``--fuel`` and ``--timeout-ms`` are refused in their own words, not the manifest's."""
    for flag, value, (low, high) in (
        ("--fuel", args.fuel, (limits.MIN_FUEL_PER_CALL, limits.MAX_FUEL_PER_CALL)),
        ("--timeout-ms", args.timeout_ms, (limits.MIN_TIMEOUT_MS, limits.MAX_TIMEOUT_MS)),
    ):
        if value is not None and not low <= value <= high:
            raise UsageError(f"{flag} must be in {low}..{high}, got {value}")


# More digits than any count or size a flag takes can hold (2^64 has 20): refused before int()
# reads them (int's own limit is 4,300 digits, and its error would be an internal one).
MAX_FLAG_DIGITS = 20


def whole_number(text: str) -> int:
    """An integer flag's value: ASCII decimal digits, with a '-' in front at most (``int``
    alone also reads other scripts' digits, '1_000' and spaces around the number)."""
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number in digits 0-9")
    if len(digits.lstrip("0")) > MAX_FLAG_DIGITS:
        raise argparse.ArgumentTypeError(f"{text[:40]}... has more digits than any limit here")
    return int(text)


def budget_hint(failure: FailureClass | None, fuel: int, timeout_ms: int) -> str | None:
    """The flag that raises the budget a run ran out of (``run`` and ``wasi``), or None."""
    if failure is FailureClass.OUT_OF_FUEL:
        if fuel >= limits.MAX_FUEL_PER_CALL:
            return f"this run had {fuel} fuel, the most --fuel allows"
        return (
            f"it ran out of fuel: raise --fuel N (this run had {fuel}); a guest that loops "
            "forever runs out of any budget"
        )
    if failure is FailureClass.DEADLINE:
        if timeout_ms >= limits.MAX_TIMEOUT_MS:
            return f"this run had {timeout_ms} ms, the most --timeout-ms allows"
        return (
            f"it ran past its deadline: raise --timeout-ms (this run had {timeout_ms} ms); a "
            "guest that loops forever runs past any deadline"
        )
    return None


RUNTIME_CHOICES = ("in-process", "process", "prefer-process", "process-only")


def add_functions_flag(parser: argparse.ArgumentParser) -> None:
    """``--functions MODULE:ATTR``: an application's own host functions for this run."""
    parser.add_argument(
        "--functions",
        metavar="MODULE:ATTR",
        default=None,
        help="serve an application's own functions: ATTR of MODULE (importable, the current "
        "directory first) is called with the Host and registers them (docs/host-functions.md)",
    )


def add_runtime_flag(parser: argparse.ArgumentParser) -> None:
    """``--runtime``: where the guest runs (docs/process-runtime.md)."""
    parser.add_argument(
        "--runtime",
        choices=RUNTIME_CHOICES,
        default=None,
        help="run the guest in this process, or in a walled child process ('process' is "
        "process-only; default: the manifest's runtime, or WASIHOST_RUNTIME)",
    )
