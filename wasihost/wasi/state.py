"""The state of one WASI instance: what its grant unlocked, its descriptors, clocks and sinks.

Made fresh for every instance by the binding, and closed with it; nothing here outlives a
discarded instance.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from ..core.errors import ConfigError
from ..core.extlog import ExtensionLog, Level
from ..core.sources import Clock, SeededRandom
from . import limits
from .abi import (
    DIR_READ_RIGHTS,
    DIR_WRITE_RIGHTS,
    FILE_READ_RIGHTS,
    FILE_WRITE_RIGHTS,
    STDIN_RIGHTS,
    STDOUT_RIGHTS,
    Filetype,
)
from .clocks import GuestClocks
from .config import WasiOptions
from .errno import Errno, WasiError
from .fds import FdTable, HostDescriptor, MountState, OutputDescriptor, StdinDescriptor
from .fs import DIR_OPEN_FLAGS, Ident, ident_of
from .registry import (
    CAP_ARGS,
    CAP_CLOCK,
    CAP_ENV,
    CAP_FS_READ,
    CAP_FS_WRITE,
    CAP_RANDOM,
    CAP_STDIO,
)
from .stdio import LogLines

# What descriptors opened below a preopen may inherit: everything a file or directory can do.
# A read-only mount still lists write rights here so that libc passes a write request through
# and gets ROFS from path_open, instead of a descriptor that silently cannot write.
INHERITABLE_RIGHTS = DIR_READ_RIGHTS | DIR_WRITE_RIGHTS | FILE_READ_RIGHTS | FILE_WRITE_RIGHTS


Committer = Callable[[Callable[[], int]], tuple[bool, "int | None"]]
"""Runs a mutation if the call's grant epoch is still current: (authorised, its errno)."""


def _commit_directly(action: Callable[[], int]) -> tuple[bool, int | None]:
    return True, action()


T = TypeVar("T")


class Guard(Protocol):
    """Runs an action if the grant the call started under still allows one capability,
    atomically with respect to every grant change: (authorised, its result)."""

    def __call__(self, action: Callable[[], T], /) -> tuple[bool, T | None]: ...


def _unguarded(action: Callable[[], T]) -> tuple[bool, T | None]:
    return True, action()


def _no_guards(capability: str) -> Guard:
    return _unguarded


def under(guard: Guard, action: Callable[[], T]) -> T:
    """``action()`` if ``guard`` authorises it, else NOTCAPABLE (as a refused commit)."""
    authorised, result = guard(action)
    if not authorised:
        raise WasiError(Errno.NOTCAPABLE)
    return cast("T", result)


class WasiState:
    """Everything the handlers of one instance share."""

    def __init__(
        self,
        config: WasiOptions,
        allows: Callable[[str], bool],
        log: ExtensionLog,
        clock: Clock,
        clock_resolution_ns: int,
        policy_seed: bytes | None = None,
        commit: Committer | None = None,
        guards: Callable[[str], Guard] = _no_guards,
    ) -> None:
        self.config = config
        # Host-visible mutations (file writes, creating, renaming, removing) run through this,
        # so one authorised before a grant change never lands after it.
        self.commit: Committer = commit if commit is not None else _commit_directly
        # Reads of a mount's files and of stdin through core entries (fd_read, fd_seek, ...,
        # which the engine's gate lets through whatever the grant) run under these, so none
        # lands after a revocation of wasi.fs.read or wasi.stdio (or any grant change) returns.
        self.fs_read: Guard = guards(CAP_FS_READ)
        # (Without wasi.stdio at the start stdin is empty: end of file, nothing to guard.)
        self.stdin_read: Guard = guards(CAP_STDIO) if allows(CAP_STDIO) else _unguarded
        self.args = [a.encode() for a in config.argv] if allows(CAP_ARGS) else []
        self.env = [e.encode() for e in config.env_strings] if allows(CAP_ENV) else []
        self.clocks = GuestClocks(
            config.clock if allows(CAP_CLOCK) else None, clock, clock_resolution_ns
        )
        self.random: Callable[[int], bytes] | None = None
        # The seeded stream costs ~20 times the OS CSPRNG's host time a byte: priced so.
        self.random_seeded = False
        if config.provides_random and allows(CAP_RANDOM):
            seed = config.random_seed if config.random_seed is not None else policy_seed
            self.random = SeededRandom(seed) if seed is not None else os.urandom
            self.random_seeded = seed is not None
        # File timestamps are a clock too (the kernel stamps a write, a create, a *_NOW with the
        # host's time, to the nanosecond on a recent Linux): they are reported no finer than
        # the clock profile, and at the anonymous profile's second without a clock.
        self.stamp_resolution_ns = (
            self.clocks.resolution_ns
            if self.clocks.available
            else limits.ANONYMOUS_CLOCK_RESOLUTION_NS
        )
        # (dev, ino) -> the (atime, mtime) the guest last set on it itself: reported exactly
        # while the file still has them (they are the guest's own numbers, not a reading).
        self.times_set: dict[Ident, tuple[int, int]] = {}
        self.fds = FdTable(config.max_fds)
        # What this instance may still add to its writable mounts (see fd_checks.grow).
        self.write_room = config.max_write_bytes
        self._log_lines: list[LogLines] = []
        self._setup_stdio(allows(CAP_STDIO), log)
        if allows(CAP_FS_READ):
            try:
                self._setup_mounts(allows(CAP_FS_WRITE))
            except BaseException:
                self.fds.close_all()
                raise

    def _stdio_filetype(self, fd: int, stdio: bool) -> int:
        """A character device only where the embedder says the guest's descriptor is a terminal
        (the CLI: where its own is): wasi-libc's isatty() reads this, and a "terminal" made the
        SQLite shell given a script prompt into its output and stdout line-buffered (4.5x the
        writes). Otherwise unknown, as wasmtime reports a pipe or a file."""
        if stdio and fd in self.config.terminal_fds:
            return Filetype.CHARACTER_DEVICE
        return Filetype.UNKNOWN

    def _setup_stdio(self, stdio: bool, log: ExtensionLog) -> None:
        stdin = self.config.stdin if stdio else b""
        self.fds.insert(
            StdinDescriptor(
                filetype=self._stdio_filetype(0, stdio),
                rights_base=STDIN_RIGHTS,
                rights_inheriting=0,
                data=stdin,
            )
        )
        for fd, given, level, source in (
            (1, self.config.stdout, Level.INFO, "stdout"),
            (2, self.config.stderr, Level.WARN, "stderr"),
        ):
            sink: Callable[[bytes], object]
            if given is None or not stdio:
                lines = LogLines(log, level, source)
                self._log_lines.append(lines)
                sink, records = lines, True
            else:
                sink, records = given, False
            self.fds.insert(
                OutputDescriptor(
                    filetype=self._stdio_filetype(fd, stdio and given is not None),
                    rights_base=STDOUT_RIGHTS,
                    rights_inheriting=0,
                    sink=sink,
                    records=records,
                )
            )

    def _setup_mounts(self, fs_write: bool) -> None:
        for mount in self.config.mounts:
            try:
                fd = os.open(mount.host, DIR_OPEN_FLAGS)
            except OSError as exc:
                raise ConfigError(f"mount {mount.host}: {exc.strerror}") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISDIR(st.st_mode):
                    raise ConfigError(f"mount {mount.host} is not a directory")
                state = MountState(mount.guest.encode(), mount.writable and fs_write)
                rights = DIR_READ_RIGHTS | (DIR_WRITE_RIGHTS if state.writable else 0)
                self.fds.insert(
                    HostDescriptor(
                        filetype=Filetype.DIRECTORY,
                        rights_base=rights,
                        rights_inheriting=INHERITABLE_RIGHTS,
                        fd=fd,
                        mount=state,
                        ident=ident_of(fd),
                        preopen=state.guest,
                    )
                )
            except BaseException:
                os.close(fd)
                raise

    def close(self) -> None:
        """Flush partial log lines and close every host descriptor."""
        try:
            for lines in self._log_lines:
                lines.flush()
        finally:
            self.fds.close_all()
