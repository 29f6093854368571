"""What the embedder provides to WASI guests: :class:`WasiOptions`, and the grant it implies.

A guest gets the intersection of what the config provides and what its grant allows: a mount in
the config is invisible without ``wasi.fs.read``, and a granted ``wasi.clock`` is useless without
a clock profile in the config. :func:`capabilities_for` gives the grant that matches a config
exactly, which is what the CLI grants.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ..core import limits as resource_limits
from ..core.errors import ConfigError
from . import limits
from .registry import (
    CAP_ARGS,
    CAP_CLOCK,
    CAP_ENV,
    CAP_FS_READ,
    CAP_FS_WRITE,
    CAP_RANDOM,
    CAP_STDIO,
)

OutputSink = Callable[[bytes], object]
"""A caller-given destination for a guest's stdout or stderr bytes."""

MOUNT_SEPARATOR = "::"
# Random seeds: 16 bytes is the least that is not guessable, 64 the HMAC-SHA256 block size.
MIN_SEED_BYTES = 16
MAX_SEED_BYTES = 64


class ClockProfile(enum.Enum):
    """Which clocks a guest with ``wasi.clock`` sees, and how finely."""

    STANDARD = "standard"
    """realtime, monotonic and both cputime clocks, at the host policy's clock resolution"""
    ANONYMOUS = "anonymous"
    """realtime and monotonic at one-second resolution; no cputime clocks"""


def _guest_text(value: str, what: str) -> bytes:
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {value!r} is not valid Unicode text") from None
    if b"\0" in data:
        raise ConfigError(f"{what} {value!r} contains a NUL character")
    return data


@attrs.frozen
class Mount:
    """A host directory the guest sees at ``guest`` (its preopen name); read-only unless
    ``writable``."""

    host: Path = attrs.field(converter=Path)
    guest: str
    writable: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.host.is_absolute():
            raise ConfigError(f"mount host path {str(self.host)!r} must be absolute")
        if not self.guest:
            raise ConfigError("mount guest path must not be empty")
        if len(_guest_text(self.guest, "mount guest path")) > limits.MAX_PATH_BYTES:
            raise ConfigError(f"mount guest path is over {limits.MAX_PATH_BYTES} bytes")

    @classmethod
    def parse(cls, spec: str, *, writable: bool) -> Mount:
        """``HOST[::GUEST]``; without GUEST the guest sees the path as given (as in wasmtime).

        The host directory must exist; its path is made absolute (symlinks resolved) now, so a
        later change of working directory does not move the mount.
        """
        host, sep, guest = spec.partition(MOUNT_SEPARATOR)
        if not host or (sep and not guest):
            raise ConfigError(f"mount {spec!r} is not HOST[::GUEST]")
        path = Path(host)
        if not path.is_dir():
            raise ConfigError(f"mount {spec!r}: {host} is not a directory")
        return cls(path.resolve(), guest if sep else host, writable)


def _env_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(value, str | bytes):
        raise ConfigError("env must be a mapping or a collection of K=V strings, not one string")
    items: Iterable[Any] = value.items() if isinstance(value, Mapping) else value
    pairs: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str):
            key, sep, val = item.partition("=")
            if not sep:
                raise ConfigError(f"env entry {item!r} is not K=V")
            pairs.append((key, val))
        elif isinstance(item, tuple) and len(item) == 2:
            pairs.append((str(item[0]), str(item[1])))
        else:
            raise ConfigError(f"env entry {item!r} is not K=V")
    return tuple(pairs)


def _str_tuple(value: Any) -> tuple[str, ...]:
    if isinstance(value, str | bytes):
        raise ConfigError("argv must be a sequence of strings, not one string")
    return tuple(value)


def _mounts(value: Iterable[Mount]) -> tuple[Mount, ...]:
    return tuple(value)


STDIO_FDS = frozenset({0, 1, 2})


def _fd_set(value: Any) -> frozenset[int]:
    if isinstance(value, str | bytes | int):
        raise ConfigError(f"terminal_fds must be a collection of 0, 1 and 2, not {value!r}")
    fds = frozenset(value)
    if not all(type(fd) is int for fd in fds) or not fds <= STDIO_FDS:
        raise ConfigError(f"terminal_fds may hold only 0, 1 and 2 (stdio), not {sorted(fds)}")
    return fds


def _clock(value: Any) -> ClockProfile | None:
    if value is None or isinstance(value, ClockProfile):
        return value
    try:
        return ClockProfile(value)
    except ValueError:
        names = ", ".join(p.value for p in ClockProfile)
        raise ConfigError(f"clock profile {value!r} is not one of {names}") from None


@attrs.frozen
class WasiOptions:
    """Everything the WASI profile provides to one extension; nothing by default.

    - ``argv``: the guest's arguments, argv[0] included (needs ``wasi.args``);
    - ``env``: an explicit allowlist of ``K=V`` pairs, never the host's environment
      (needs ``wasi.env``);
    - ``stdin``: bytes served on fd 0; ``stdout``/``stderr``: caller sinks for fd 1 and 2
      (need ``wasi.stdio``; without it fd 1/2 go to the extension's log, one record per line);
    - ``terminal_fds``: which of fd 0, 1 and 2 the guest sees as a terminal (a character
      device: wasi-libc's ``isatty()`` is true, its stdout line-buffered, a shell prompts);
      none by default, since bytes and a callable are no terminal. A named descriptor is a
      terminal only where ``wasi.stdio`` is granted, and fd 1 or 2 only with its sink (one
      going to the extension's log is none). The others are of type unknown, as wasmtime's
      built-in WASI reports a pipe or file. ``wasihost wasi`` names
      the descriptors its own stdout and stderr are terminals on (needs ``wasi.stdio``);
    - ``clock``: the clock profile (needs ``wasi.clock``); None provides no clocks;
    - ``random``: provide random bytes from the OS CSPRNG, or from the deterministic stream of
      ``random_seed`` (needs ``wasi.random``);
    - ``mounts``: host directories (need ``wasi.fs.read``; writes need ``wasi.fs.write`` and a
      writable mount);
    - ``max_fds``: the handle budget: open descriptors of one instance, stdio and mounts
      included (256 by default; each is a host descriptor, so a larger budget needs the
      process's RLIMIT_NOFILE to match: an open that would leave the process fewer than
      ``limits.HOST_RESERVED_FDS`` under its soft limit is refused with NFILE, whatever the
      budget);
    - ``max_write_bytes``: what one instance may add to its writable mounts (file growth, holes
      included, and 4 KiB per file, directory or link made); DQUOT beyond;
    - ``max_memory_bytes``: how far a plain command run under these options may grow its linear
      memory (1 GiB by default, ``limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES``; a policy ceiling
      lowers it); a ``memory.grow`` past it answers -1, and a run that then fails says so. A
      wasihost ABI guest importing WASI keeps its manifest's ``max_memory_bytes``.
    """

    argv: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_env_pairs)
    stdin: bytes = b""
    stdout: OutputSink | None = attrs.field(default=None, eq=False)
    stderr: OutputSink | None = attrs.field(default=None, eq=False)
    clock: ClockProfile | None = attrs.field(default=None, converter=_clock)
    random: bool = False
    random_seed: bytes | None = attrs.field(default=None, repr=False)
    mounts: tuple[Mount, ...] = attrs.field(default=(), converter=_mounts)
    max_fds: int = limits.DEFAULT_MAX_FDS
    max_write_bytes: int = limits.DEFAULT_MAX_WRITE_BYTES
    max_memory_bytes: int = resource_limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES
    terminal_fds: frozenset[int] = attrs.field(default=frozenset(), converter=_fd_set)

    def __attrs_post_init__(self) -> None:
        args = [_guest_text(a, "argument") for a in self.argv]
        if sum(len(a) + 1 for a in args) > limits.MAX_ARGS_BYTES:
            raise ConfigError(f"argv is over {limits.MAX_ARGS_BYTES} bytes")
        keys: set[str] = set()
        size = 0
        for key, value in self.env:
            if not key or "=" in key:
                raise ConfigError(f"env name {key!r} is empty or contains '='")
            if key in keys:
                raise ConfigError(f"env name {key!r} is given twice")
            keys.add(key)
            size += len(_guest_text(f"{key}={value}", "env entry")) + 1
        if size > limits.MAX_ENV_BYTES:
            raise ConfigError(f"env is over {limits.MAX_ENV_BYTES} bytes")
        if not isinstance(self.stdin, bytes) or len(self.stdin) > limits.MAX_STDIN_BYTES:
            raise ConfigError(f"stdin must be bytes, at most {limits.MAX_STDIN_BYTES}")
        for name, sink in (("stdout", self.stdout), ("stderr", self.stderr)):
            if sink is not None and not callable(sink):
                raise ConfigError(f"{name} must be a callable taking bytes, or None for the log")
        if self.random_seed is not None and not (
            MIN_SEED_BYTES <= len(self.random_seed) <= MAX_SEED_BYTES
        ):
            raise ConfigError(f"random_seed must be {MIN_SEED_BYTES} to {MAX_SEED_BYTES} bytes")
        if not all(isinstance(m, Mount) for m in self.mounts):
            raise ConfigError("mounts must be Mount values")
        if len(self.mounts) > limits.MAX_MOUNTS:
            raise ConfigError(f"at most {limits.MAX_MOUNTS} mounts")
        guests = [m.guest for m in self.mounts]
        if len(set(guests)) != len(guests):
            raise ConfigError("two mounts share a guest path")
        # Compared as the directories they are (``..`` and symlinks resolved): a lexical test
        # let a writable "/srv/x/.." hold a read-only "/srv/in".
        real = {m: Path(os.path.realpath(m.host)) for m in self.mounts}
        for outer in self.mounts:
            for inner in self.mounts:
                inside = real[inner].is_relative_to(real[outer])
                if outer.writable and not inner.writable and inside:
                    raise ConfigError(
                        f"read-only mount {inner.host} lies inside writable mount {outer.host}, "
                        "through which it would be writable"
                    )
        if isinstance(self.max_fds, bool) or not (
            limits.MIN_MAX_FDS <= self.max_fds <= limits.MAX_MAX_FDS
        ):
            raise ConfigError(
                f"max_fds={self.max_fds!r} outside {limits.MIN_MAX_FDS}..{limits.MAX_MAX_FDS}"
            )
        if isinstance(self.max_write_bytes, bool) or not (
            isinstance(self.max_write_bytes, int)
            and 0 <= self.max_write_bytes <= limits.MAX_MAX_WRITE_BYTES
        ):
            raise ConfigError(
                f"max_write_bytes={self.max_write_bytes!r} outside 0..{limits.MAX_MAX_WRITE_BYTES}"
            )
        low, high = resource_limits.MIN_MAX_MEMORY_BYTES, resource_limits.MAX_MAX_MEMORY_BYTES
        if type(self.max_memory_bytes) is not int or not low <= self.max_memory_bytes <= high:
            raise ConfigError(f"max_memory_bytes={self.max_memory_bytes!r} outside {low}..{high}")
        if self.max_fds < 3 + len(self.mounts) + 1:
            raise ConfigError(
                f"max_fds={self.max_fds} leaves no descriptor beyond stdio and mounts"
            )

    @property
    def provides_random(self) -> bool:
        return self.random or self.random_seed is not None

    @property
    def env_strings(self) -> tuple[str, ...]:
        return tuple(f"{k}={v}" for k, v in self.env)


def capabilities_for(config: WasiOptions) -> frozenset[str]:
    """The capabilities that give a guest exactly what ``config`` provides, and nothing else."""
    caps: set[str] = set()
    if config.stdout is not None or config.stderr is not None or config.stdin:
        caps.add(CAP_STDIO)
    if config.argv:
        caps.add(CAP_ARGS)
    if config.env:
        caps.add(CAP_ENV)
    if config.clock is not None:
        caps.add(CAP_CLOCK)
    if config.provides_random:
        caps.add(CAP_RANDOM)
    if config.mounts:
        caps.add(CAP_FS_READ)
    if any(m.writable for m in config.mounts):
        caps.add(CAP_FS_WRITE)
    return frozenset(caps)


__all__ = ["ClockProfile", "Mount", "OutputSink", "WasiOptions", "capabilities_for"]
