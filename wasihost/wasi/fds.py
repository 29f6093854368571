"""The descriptor table of one WASI instance: what each guest fd number stands for.

A descriptor is the guest's capability: the only way to reach a file is through a descriptor
of a mount the grant made visible, and its rights only ever shrink. Every descriptor counts
against the handle budget; host descriptors are closed when the instance ends.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator
from types import ModuleType

import attrs

from .abi import R_FD_WRITE, Filetype
from .errno import Errno, WasiError
from .fs import Ident
from .limits import HOST_RESERVED_FDS

resource: ModuleType | None
try:
    import resource
except ImportError:  # pragma: no cover - not POSIX: no descriptor limit to keep room under
    resource = None


@attrs.define(eq=False)
class MountState:
    """A mount as this instance sees it: writable only if the config and the grant both say so."""

    guest: bytes
    writable: bool


@attrs.define(eq=False, slots=True, kw_only=True)
class Descriptor:
    filetype: int
    rights_base: int
    rights_inheriting: int
    fdflags: int = 0

    def close(self) -> None:
        """Release whatever the descriptor holds on the host."""


@attrs.define(eq=False, slots=True, kw_only=True)
class StdinDescriptor(Descriptor):
    """fd 0: the configured stdin bytes, then end of file."""

    data: bytes = b""
    pos: int = 0


@attrs.define(eq=False, slots=True, kw_only=True)
class OutputDescriptor(Descriptor):
    """fd 1 and 2: bytes go to ``sink`` (the log splitter, or the caller's callable).

    ``records``: the sink makes a log record of each line, which a write pays for per record
    (``FUEL_PER_LOG_RECORD``); such a sink is not routed through the engine's write shortcut,
    which prices bytes only."""

    sink: Callable[[bytes], object]
    records: bool = False


@attrs.define(eq=False, slots=True, kw_only=True)
class HostDescriptor(Descriptor):
    """A file or directory inside a mount, backed by a host descriptor we own."""

    fd: int
    mount: MountState
    ident: Ident
    preopen: bytes | None = None
    # fd_readdir's snapshot: names and types, made at cookie 0 so later cookies stay stable.
    listing: list[tuple[bytes, int, int]] | None = None

    @property
    def is_dir(self) -> bool:
        return self.filetype == Filetype.DIRECTORY

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def leave_host_room(host_fd: int) -> None:
    """Raise NFILE if ``host_fd``, just opened for a guest, leaves this process fewer than
    ``limits.HOST_RESERVED_FDS`` descriptors under its soft ``RLIMIT_NOFILE``.

    Each instance's ``max_fds`` is its own budget, and together (or one budget past the
    limit, ``WasiOptions.max_fds`` goes to 65,536) guests could take every descriptor the
    process may open: the host's own files, sockets and compile pipes then failed with EMFILE
    while a guest held them. The kernel hands out the lowest free number, so a descriptor
    numbered ``soft - HOST_RESERVED_FDS`` or more means that many are open: the guest's open
    is refused, as a full system table (NFILE) rather than its own budget (MFILE). The caller
    closes ``host_fd``."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if resource is not None else -1
    if 0 <= soft - HOST_RESERVED_FDS <= host_fd:
        raise WasiError(Errno.NFILE)


class FdTable:
    """Guest fd numbers to descriptors, at most ``max_fds`` of them at once."""

    def __init__(self, max_fds: int) -> None:
        self.max_fds = max_fds
        self._fds: dict[int, Descriptor] = {}
        # Lowest-free numbering without a scan: every number below ``_next`` is open or in
        # ``_free`` (a heap; an entry reused since it was pushed is skipped when popped). A
        # scan from 0 cost a table of thousands O(n) per open.
        self._next = 0
        self._free: list[int] = []
        # get() without a Python frame, for the per-line hot paths.
        self.lookup = self._fds.get
        # fd -> sink of each output descriptor with the write right (a log splitter's excepted,
        # see OutputDescriptor.records), kept in step with the
        # table by every method below that changes it: fd_write's engine shortcut
        # (guestmem.WriteRoute) reads it with one lookup per printed line.
        self.sinks: dict[int, Callable[[bytes], object]] = {}

    def __len__(self) -> int:
        return len(self._fds)

    def __iter__(self) -> Iterator[tuple[int, Descriptor]]:
        return iter(list(self._fds.items()))

    def get(self, fd: int) -> Descriptor | None:
        return self._fds.get(fd)

    def require_room(self) -> None:
        """Raise MFILE before anything is opened on the host if the budget is spent."""
        if len(self._fds) >= self.max_fds:
            raise WasiError(Errno.MFILE)

    def _route(self, fd: int) -> None:
        """Bring ``sinks`` in step with what ``fd`` now holds."""
        desc = self._fds.get(fd)
        if type(desc) is OutputDescriptor and desc.rights_base & R_FD_WRITE and not desc.records:
            self.sinks[fd] = desc.sink
        else:
            self.sinks.pop(fd, None)

    def insert(self, desc: Descriptor) -> int:
        """The lowest free number, as POSIX open() would give."""
        self.require_room()
        free = self._free
        while free and free[0] in self._fds:
            heapq.heappop(free)
        if free:
            fd = heapq.heappop(free)
        else:
            fd = self._next
            self._next += 1
        self._fds[fd] = desc
        self._route(fd)
        return fd

    def close(self, fd: int) -> None:
        desc = self._fds.pop(fd, None)
        self.sinks.pop(fd, None)
        if desc is None:
            raise WasiError(Errno.BADF)
        heapq.heappush(self._free, fd)
        desc.close()

    def renumber(self, src: int, dst: int) -> None:
        """Move ``src`` onto ``dst``, closing what ``dst`` held; both must be open."""
        if src not in self._fds or dst not in self._fds:
            raise WasiError(Errno.BADF)
        if src == dst:
            return
        self._fds[dst].close()
        self._fds[dst] = self._fds.pop(src)
        heapq.heappush(self._free, src)
        self._route(src)
        self._route(dst)

    def set_rights(self, fd: int, base: int, inheriting: int) -> None:
        """Set the rights of the open descriptor ``fd`` (the caller checked they only shrink)."""
        desc = self._fds[fd]
        desc.rights_base = base
        desc.rights_inheriting = inheriting
        self._route(fd)

    def close_all(self) -> None:
        # Emptied in place: ``lookup`` and ``sinks`` stay the tables' own.
        descs = list(self._fds.values())
        self._fds.clear()
        self.sinks.clear()
        self._free.clear()
        self._next = 0
        for desc in descs:
            desc.close()
