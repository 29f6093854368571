"""``wasihost wasi``: run a WASI command module's ``_start`` through the WASI profile.

    wasihost wasi [--dir HOST[::GUEST]]... [--dir-ro HOST[::GUEST]]... [--env K=V]...
                  [--profile standard|anonymous|none] [--random | --random-seed HEX | --no-random]
                  [--stdin FILE] [--max-write-bytes N] [--max-memory N] [--max-fds N]
                  [--fuel N] [--timeout-ms N] [--cache-dir DIR | --no-cache]
                  MODULE.wasm [ARGS...]

As in wasmtime's CLI, the guest's argv[0] is the module's file name and ARGS follow it
(everything after MODULE goes to the guest, options included). stdout and stderr go to the
process's; the process exit status is the guest's exit code. With no flags the guest gets stdio,
its argv, the ``standard`` clocks (at the policy's coarse resolution) and the OS CSPRNG, as every
peer runtime grants: an ordinary program (Rust's ``HashMap``, ``Instant::now``) needs both.
Files, env and sockets stay denied unless a flag grants them. Errors are raised as
:class:`~wasihost.core.errors.WasihostError` for the main CLI to print as ``error: <class>:
<message>``; a flag's bad value as the main CLI's ``UsageError`` (exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..core import limits as resource_limits
from ..core.errors import CallError, ConfigError, WasihostError
from ..wasi import limits
from ..wasi.config import (
    MAX_SEED_BYTES,
    MIN_SEED_BYTES,
    ClockProfile,
    Mount,
    WasiOptions,
    capabilities_for,
)
from ..wasi.registry import CAP_CLOCK, CAP_RANDOM
from .common import (
    UsageError,
    add_functions_flag,
    add_runtime_flag,
    budget_hint,
    check_budget_flags,
    whole_number,
)
from .input_files import read_file_or_stdin

if TYPE_CHECKING:
    from ..host.extension import Extension

# What a bare `wasihost wasi prog.wasm` grants besides stdio and argv (see docs/wasi.md).
DEFAULT_CLOCK_PROFILE = ClockProfile.STANDARD.value
NO_CLOCKS = "none"

# A POSIX exit status is one byte; a guest code that would wrap to 0 must not read as success.
EXIT_STATUS_MASK = 0xFF
EXIT_STATUS_WRAPPED = 1


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``wasi`` subcommand to the main CLI's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "wasi",
        help="run a WASI command module (_start) through the restricted WASI profile",
        description="Run a WASI preview1 command module. Granted by default: stdio, argv, "
        "coarse clocks and random bytes; files and env only when a flag grants them.",
    )
    p.add_argument(
        "--dir",
        action="append",
        default=[],
        metavar="HOST[::GUEST]",
        help="mount a host directory read-write (repeatable)",
    )
    p.add_argument(
        "--dir-ro",
        action="append",
        default=[],
        metavar="HOST[::GUEST]",
        help="mount a host directory read-only (repeatable)",
    )
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set a guest env var")
    p.add_argument(
        "--profile",
        choices=[*(c.value for c in ClockProfile), NO_CLOCKS],
        default=DEFAULT_CLOCK_PROFILE,
        help=f"clock profile (default: {DEFAULT_CLOCK_PROFILE}; {NO_CLOCKS}: no clocks)",
    )
    rand = p.add_mutually_exclusive_group()
    rand.add_argument(
        "--random", action="store_true", help="random bytes from the OS CSPRNG (the default)"
    )
    rand.add_argument(
        "--random-seed",
        metavar="HEX",
        help="a seeded, reproducible stream instead; the seed is 16 to 64 bytes, as hex "
        "(32 to 128 hex digits)",
    )
    rand.add_argument("--no-random", action="store_true", help="no random bytes")
    p.add_argument("--stdin", metavar="FILE", help="serve FILE ('-': this process's stdin) on fd 0")
    p.add_argument(
        "--max-write-bytes",
        type=whole_number,
        default=limits.DEFAULT_MAX_WRITE_BYTES,
        metavar="N",
        help="what the run may add to its --dir mounts: file growth and 4 KiB per file, "
        f"directory or link made (default: {limits.DEFAULT_MAX_WRITE_BYTES})",
    )
    p.add_argument(
        "--max-memory",
        default=str(resource_limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES),
        metavar="N",
        help="how far the program may grow its linear memory, in bytes or with a K, M or G "
        f"suffix (KiB, MiB, GiB); {resource_limits.MIN_MAX_MEMORY_BYTES} to "
        f"{resource_limits.MAX_MAX_MEMORY_BYTES} (1G, the default)",
    )
    p.add_argument(
        "--max-fds",
        metavar="N",
        help="descriptors the program may hold open at once, stdio and --dir mounts included "
        f"({limits.MIN_MAX_FDS} to {limits.MAX_MAX_FDS}; default "
        f"{limits.DEFAULT_COMMAND_MAX_FDS}, as a native program's soft limit)",
    )
    p.add_argument(
        "--fuel",
        type=whole_number,
        default=resource_limits.DEFAULT_COMMAND_LINE_FUEL,
        help="fuel budget for the run (default and most: "
        f"{resource_limits.DEFAULT_COMMAND_LINE_FUEL})",
    )
    p.add_argument(
        "--timeout-ms",
        type=whole_number,
        default=resource_limits.DEFAULT_COMMAND_LINE_TIMEOUT_MS,
        help="wall-clock deadline for the run (default and most: "
        f"{resource_limits.DEFAULT_COMMAND_LINE_TIMEOUT_MS} ms)",
    )
    p.add_argument("--cache-dir", type=Path, help="compiled-module cache directory")
    p.add_argument("--no-cache", action="store_true", help="do not use the on-disk cache")
    add_runtime_flag(p)
    add_functions_flag(p)
    p.add_argument("module", help="the WASI command module (.wasm)")
    guest_args = p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the guest")
    # argparse marks a REMAINDER positional required, and a run with no module then said
    # "required: module, args" though the guest's arguments are optional.
    guest_args.required = False
    return p


def _read_stdin(source: str) -> bytes:
    limit = limits.MAX_STDIN_BYTES
    try:
        data = read_file_or_stdin(source, limit)
    except OSError as exc:
        raise ConfigError(f"--stdin {source}: {exc.strerror}") from None
    if data is None:
        raise ConfigError(f"--stdin {source} is larger than {limit} bytes")
    return data


def _seed(text: str) -> bytes:
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"--random-seed {text!r} is not hex") from None
    if not MIN_SEED_BYTES <= len(seed) <= MAX_SEED_BYTES:
        raise ConfigError(
            f"--random-seed is {len(seed)} bytes; it must be {MIN_SEED_BYTES} to "
            f"{MAX_SEED_BYTES} ({2 * MIN_SEED_BYTES} to {2 * MAX_SEED_BYTES} hex digits)"
        )
    return seed


_SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


# A flag's value is quoted in its refusal at most this long (argv may hold megabytes).
_MAX_QUOTED_VALUE = 40
# More digits than any limit a flag counts in has: refused as out of range before int() sees
# them (past 4,300 digits int() raises, and the run ended in "error: internal: ValueError").
_MAX_DIGITS = 20


def _quoted(text: str) -> str:
    if len(text) <= _MAX_QUOTED_VALUE:
        return repr(text)
    return f"{text[:_MAX_QUOTED_VALUE]!r}... ({len(text)} characters)"


def memory_size(text: str) -> int:
    """``--max-memory``'s value: bytes, or a number with a K, M or G suffix (binary units)."""
    digits = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = digits[-1:] if digits[-1:] in _SIZE_SUFFIXES else ""
    number = digits[: len(digits) - len(suffix)]
    low, high = resource_limits.MIN_MAX_MEMORY_BYTES, resource_limits.MAX_MAX_MEMORY_BYTES
    if not (number.isascii() and number.isdigit()):
        raise ConfigError(
            f"--max-memory {_quoted(text)} is not a size: give bytes, or a number with K, M "
            "or G (e.g. --max-memory 512M)"
        )
    in_range = (
        f"it must be {low} (one wasm page) to {high} (1G, the most one memory may reserve here)"
    )
    if len(number.lstrip("0")) > _MAX_DIGITS:
        raise ConfigError(f"--max-memory {_quoted(text)} is far too large; {in_range}")
    size = int(number) * _SIZE_SUFFIXES[suffix]
    if not low <= size <= high:
        raise ConfigError(f"--max-memory {text} is {size} bytes; {in_range}")
    return size


def descriptor_count(text: str) -> int:
    """``--max-fds``'s value: a whole number in ASCII digits (``int`` also took Arabic-Indic
    and other scripts' digits, ' 8' and '1_000'), in ``MIN_MAX_FDS..MAX_MAX_FDS``."""
    in_range = f"it must be in {limits.MIN_MAX_FDS}..{limits.MAX_MAX_FDS}"
    number = text.removeprefix("-")
    if not (number.isascii() and number.isdigit()):
        raise ConfigError(
            f"--max-fds {_quoted(text)} is not a number of descriptors: give one in decimal "
            f"digits (e.g. --max-fds 4096); {in_range}"
        )
    if len(number.lstrip("0")) > _MAX_DIGITS:
        raise ConfigError(f"--max-fds {_quoted(text)} is far too large; {in_range}")
    count = int(text)
    if not limits.MIN_MAX_FDS <= count <= limits.MAX_MAX_FDS:
        raise ConfigError(
            f"--max-fds must be in {limits.MIN_MAX_FDS}..{limits.MAX_MAX_FDS}, got {count}"
        )
    return count


def _stream(name: str) -> BinaryIO:
    stream = getattr(sys, name)
    buffer: BinaryIO | None = getattr(stream, "buffer", None)
    return buffer if buffer is not None else stream


def _is_terminal(stream: object) -> bool:
    """Whether ``stream`` writes to a terminal: os.isatty of its descriptor (a stream with
    none, a test's capture, is no terminal)."""
    try:
        fileno = stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
    return isinstance(fileno, int) and os.isatty(fileno)


def terminal_fds() -> frozenset[int]:
    """The guest descriptors that are terminals: fd 1 and 2 where this process's stdout and
    stderr are. Never fd 0: the guest's stdin is bytes read before the run (--stdin FILE, or
    all of this process's stdin with --stdin -), which no one types into."""
    return frozenset(
        fd for fd, name in ((1, "stdout"), (2, "stderr")) if _is_terminal(getattr(sys, name))
    )


def _open_descriptors() -> int:
    """How many descriptors this process holds now (the interpreter's, the cache's): what
    /proc/self/fd or /dev/fd lists, less the one listing it; HOST_RESERVED_FDS where neither
    can be listed."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(listing)) - 1
        except OSError:
            continue
    return limits.HOST_RESERVED_FDS


def _descriptor_room(text: str | None) -> int:
    """The guest's descriptor budget, with this process's soft RLIMIT_NOFILE raised to hold it
    and the host's own (``limits.HOST_RESERVED_FDS``) as far as the hard limit allows: a
    budget past what the process may open would end in the host's EMFILE, not the guest's.
    A ``--max-fds`` beyond the hard limit is refused; the default is lowered to fit it."""
    explicit = text is not None
    max_fds = limits.DEFAULT_COMMAND_MAX_FDS if text is None else descriptor_count(text)
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX: no limit to raise or to check
        return max_fds
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The guest's opens leave HOST_RESERVED_FDS free under the soft limit, beside what this
    # process holds already (fds.leave_host_room): room for both.
    held = _open_descriptors()
    wanted = max_fds + limits.HOST_RESERVED_FDS + held
    if hard != resource.RLIM_INFINITY and wanted > hard:
        if explicit:
            raise ConfigError(
                f"--max-fds {max_fds} needs {wanted} descriptors with the host's own, and "
                f"this process may open at most {hard} (the hard limit, ulimit -Hn): give "
                f"--max-fds {max(limits.MIN_MAX_FDS, hard - limits.HOST_RESERVED_FDS - held)} "
                "or less"
            )
        max_fds = max(limits.MIN_MAX_FDS, hard - limits.HOST_RESERVED_FDS - held)
        wanted = max_fds + limits.HOST_RESERVED_FDS + held
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return max_fds


def config_from_args(args: argparse.Namespace) -> WasiOptions:
    """The :class:`WasiOptions` the flags ask for; stdio goes to this process's streams."""
    mounts = [Mount.parse(spec, writable=True) for spec in args.dir]
    mounts += [Mount.parse(spec, writable=False) for spec in args.dir_ro]
    stdout = _stream("stdout")
    stderr = _stream("stderr")

    def to_stderr(data: bytes) -> None:
        stderr.write(data)
        stderr.flush()  # unbuffered, as a terminal's stderr is

    if not 0 <= args.max_write_bytes <= limits.MAX_MAX_WRITE_BYTES:
        raise ConfigError(
            f"--max-write-bytes must be in 0..{limits.MAX_MAX_WRITE_BYTES}, "
            f"got {args.max_write_bytes}"
        )
    return WasiOptions(
        argv=[Path(args.module).name, *args.args],
        env=list(args.env),
        stdin=_read_stdin(args.stdin) if args.stdin is not None else b"",
        stdout=stdout.write,
        stderr=to_stderr,
        clock=None if args.profile == NO_CLOCKS else args.profile,
        random=not args.no_random and args.random_seed is None,
        random_seed=_seed(args.random_seed) if args.random_seed is not None else None,
        mounts=mounts,
        max_write_bytes=args.max_write_bytes,
        max_memory_bytes=memory_size(args.max_memory),
        terminal_fds=terminal_fds(),
        max_fds=_descriptor_room(args.max_fds),
    )


def exit_status(code: int) -> int:
    """The process exit status for a guest exit code (a u32)."""
    status = code & EXIT_STATUS_MASK
    return status if status or not code else EXIT_STATUS_WRAPPED


def run(args: argparse.Namespace) -> int:
    """Run the module; return the process exit status (the guest's exit code)."""
    from ..core.registry import OpenCapabilities
    from ..host.planning import is_native
    from ..host.policy import Policy
    from ..host.runtime import Host, default_cache_dir
    from ..packaging.package import load_package
    from ..wasi.binding import wasi_profile
    from .options import with_application_functions

    check_budget_flags(args)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        # Every refusal here is of a flag's value (a mount, --env, --stdin, the seed): a usage
        # error (exit 2), as the main CLI's own flags are.
        raise UsageError(exc.message) from None
    caps = capabilities_for(config)
    cache = None if args.no_cache else (args.cache_dir or default_cache_dir())
    host = Host(Policy(allow=caps), cache_dir=cache, profiles=[wasi_profile(config)])
    host = with_application_functions(host, args, widen_policy=True)
    try:
        package = load_package(args.module, OpenCapabilities(host.registry.capabilities()))
        if is_native(package):
            raise UsageError(
                f"{args.module} is a native plugin (runtime 'native-process'), not a WASI "
                f"command: run one of its commands with: wasihost run {args.module} COMMAND"
            )
        ext = host.admit(
            package, grants=caps, fuel=args.fuel, timeout_ms=args.timeout_ms, runtime=args.runtime
        )
        try:
            code = ext.run_command()
        except WasihostError as exc:
            resources = ext.resources
            exc.hint = (
                memory_hint(ext)
                or exc.hint
                or budget_hint(
                    exc.failure if isinstance(exc, CallError) else None,
                    resources.fuel_per_call,
                    resources.timeout_ms,
                )
                or denial_hint(ext.denied_capabilities)
            )
            raise
        finally:
            _stream("stdout").flush()
        if code != 0:
            for hint in (memory_hint(ext), denial_hint(ext.denied_capabilities)):
                if hint is not None:
                    print(f"hint: {hint}", file=sys.stderr)
        return exit_status(code)
    finally:
        host.close()


# What to add when a failed guest had asked for a capability the flags withheld.
_DENIAL_HINTS = {
    CAP_CLOCK: "the guest asked for a clock, which was withheld: drop --profile none "
    "(the default, --profile standard, grants coarse clocks)",
    CAP_RANDOM: "the guest asked for random bytes, which were withheld: drop --no-random, or "
    "pass --random-seed HEX",
}


def memory_hint(ext: Extension) -> str | None:
    """What to say when a memory.grow was refused in the failed run, and how to raise it."""
    refusal = ext.refused_grow()
    if refusal is None:
        return None
    text, limited = refusal
    if not limited:
        return text  # the module's own maximum or wasm32's: no flag raises it
    if ext.resources.max_memory_bytes >= resource_limits.MAX_MAX_MEMORY_BYTES:
        return f"{text}, the most --max-memory allows"
    return f"{text} (--max-memory): raise it, e.g. --max-memory 1G"


def denial_hint(denied: set[str]) -> str | None:
    hints = [hint for cap, hint in _DENIAL_HINTS.items() if cap in denied]
    return "; ".join(hints) if hints else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``wasi`` arguments without the main CLI (tests; embedders' own front ends)."""
    parser = argparse.ArgumentParser(prog="wasihost")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    return parser.parse_args(["wasi", *argv])
