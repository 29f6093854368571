"""Descriptor attribute entries: close and renumber, fdstat, filestat, times, size, advice,
allocation and sync."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory
from . import limits
from .abi import (
    ALL_FDFLAGS,
    ALL_FSTFLAGS,
    FDFLAG_APPEND,
    FDFLAG_NONBLOCK,
    FDSTAT,
    FILESTAT,
    FST_ATIM,
    FST_ATIM_NOW,
    FST_MTIM,
    FST_MTIM_NOW,
    MAX_ADVICE,
    R_FD_WRITE,
    Filetype,
    Right,
)
from .errno import Errno, WasiError
from .fd_checks import (
    I64_LIMIT,
    descriptor,
    filesize,
    host_descriptor,
    need,
    regular_file,
    require_growth,
    writable,
)
from .fds import HostDescriptor
from .fs import Ident
from .state import WasiState, under

_FADVISE = (
    (
        os.POSIX_FADV_NORMAL,
        os.POSIX_FADV_SEQUENTIAL,
        os.POSIX_FADV_RANDOM,
        os.POSIX_FADV_WILLNEED,
        os.POSIX_FADV_DONTNEED,
        os.POSIX_FADV_NOREUSE,
    )
    if hasattr(os, "posix_fadvise")
    else None
)


def filetype_of(mode: int) -> int:
    if stat.S_ISREG(mode):
        return Filetype.REGULAR_FILE
    if stat.S_ISDIR(mode):
        return Filetype.DIRECTORY
    if stat.S_ISLNK(mode):
        return Filetype.SYMBOLIC_LINK
    if stat.S_ISCHR(mode):
        return Filetype.CHARACTER_DEVICE
    if stat.S_ISBLK(mode):
        return Filetype.BLOCK_DEVICE
    if stat.S_ISSOCK(mode):
        return Filetype.SOCKET_STREAM
    return Filetype.UNKNOWN


def _stamp(value: int, resolution: int) -> int:
    # Preview1 timestamps are unsigned: a time before 1970 (a host file's, e.g. from an old
    # archive) reads as 0 rather than failing the call (struct refuses a negative u64).
    value = max(value, 0)
    return value - value % resolution


def pack_filestat(wasi: WasiState, st: os.stat_result) -> bytes:
    """The filestat of ``st``, its timestamps no finer than the instance's clock profile
    (``WasiState.stamp_resolution_ns``) except those the guest set itself. Red-team 2026-12-01:
    a guest with no clock (or the anonymous one's second) wrote a file and read its mtime, a
    host clock to the nanosecond."""
    resolution = wasi.stamp_resolution_ns
    atime, mtime = st.st_atime_ns, st.st_mtime_ns
    own = wasi.times_set.get((st.st_dev, st.st_ino))
    return FILESTAT.pack(
        st.st_dev,
        st.st_ino,
        filetype_of(st.st_mode),
        st.st_nlink,
        st.st_size,
        max(atime, 0) if own is not None and own[0] == atime else _stamp(atime, resolution),
        max(mtime, 0) if own is not None and own[1] == mtime else _stamp(mtime, resolution),
        _stamp(st.st_ctime_ns, resolution),  # the kernel's alone: always a reading
    )


def set_times(wasi: WasiState, ident: Ident, times: tuple[int, int], fst_flags: int) -> None:
    """Remember the times the guest gave ``ident`` as numbers (``FST_ATIM``/``FST_MTIM``; a
    time it left alone, or set to "now", is the kernel's or ours: still coarsened). The oldest
    record is dropped beyond ``MAX_GUEST_SET_TIMES`` (its times then read coarsened)."""
    remembered = wasi.times_set
    old = remembered.pop(ident, (-1, -1))  # -1: no st_*time_ns equals it
    atime = times[0] if fst_flags & FST_ATIM else old[0]
    mtime = times[1] if fst_flags & FST_MTIM else old[1]
    if len(remembered) >= limits.MAX_GUEST_SET_TIMES:
        del remembered[next(iter(remembered))]
    remembered[ident] = (atime, mtime)


def fd_close(st: WasiState, mem: GuestMemory, fd: int) -> int:
    st.fds.close(fd)
    return Errno.SUCCESS


def fd_renumber(st: WasiState, mem: GuestMemory, fd: int, to: int) -> int:
    st.fds.renumber(fd, to)
    return Errno.SUCCESS


def fd_fdstat_get(st: WasiState, mem: GuestMemory, fd: int, out: int) -> int:
    desc = descriptor(st, fd)
    mem.write(
        out, FDSTAT.pack(desc.filetype, desc.fdflags, desc.rights_base, desc.rights_inheriting)
    )
    return Errno.SUCCESS


def fd_fdstat_set_flags(st: WasiState, mem: GuestMemory, fd: int, flags: int) -> int:
    desc = descriptor(st, fd)
    need(desc, Right.FD_FDSTAT_SET_FLAGS)
    if flags & ~ALL_FDFLAGS:
        return Errno.INVAL
    if flags & ~(FDFLAG_APPEND | FDFLAG_NONBLOCK):
        return Errno.NOTSUP  # sync modes are chosen at open, not changed afterwards
    if isinstance(desc, HostDescriptor) and not desc.is_dir:
        current = fcntl.fcntl(desc.fd, fcntl.F_GETFL)
        wanted = (current | os.O_APPEND) if flags & FDFLAG_APPEND else (current & ~os.O_APPEND)
        fcntl.fcntl(desc.fd, fcntl.F_SETFL, wanted)
    desc.fdflags = (desc.fdflags & ~(FDFLAG_APPEND | FDFLAG_NONBLOCK)) | flags
    return Errno.SUCCESS


def fd_fdstat_set_rights(
    st: WasiState, mem: GuestMemory, fd: int, base: int, inheriting: int
) -> int:
    desc = descriptor(st, fd)
    if base & ~desc.rights_base or inheriting & ~desc.rights_inheriting:
        return Errno.NOTCAPABLE  # rights only ever shrink
    st.fds.set_rights(fd, base, inheriting)
    return Errno.SUCCESS


def fd_filestat_get(st: WasiState, mem: GuestMemory, fd: int, out: int) -> int:
    desc = descriptor(st, fd)
    need(desc, Right.FD_FILESTAT_GET)
    if isinstance(desc, HostDescriptor):
        mem.write(out, pack_filestat(st, under(st.fs_read, lambda: os.fstat(desc.fd))))
    else:
        # stdio is a stream of ours, not a host file: only its type is meaningful.
        mem.write(out, FILESTAT.pack(0, 0, desc.filetype, 1, 0, 0, 0, 0))
    return Errno.SUCCESS


def fd_filestat_set_size(st: WasiState, mem: GuestMemory, fd: int, size: int) -> int:
    desc = regular_file(st, fd)
    writable(desc)
    if not desc.rights_base & R_FD_WRITE:
        return Errno.INVAL  # as ftruncate(2) on a descriptor not open for writing
    need(desc, Right.FD_FILESTAT_SET_SIZE)
    if filesize(size) > limits.MAX_FILE_BYTES:
        return Errno.FBIG
    require_growth(st, size - os.fstat(desc.fd).st_size)
    os.ftruncate(desc.fd, size)
    return Errno.SUCCESS


def new_times(
    wasi: WasiState, current: os.stat_result, atim: int, mtim: int, fst_flags: int
) -> tuple[int, int]:
    """The (atime, mtime) in ns that fst_flags ask for; INVAL for contradictory flags. "Now"
    is no finer than the instance's clock profile (the guest reads back what it set)."""
    if fst_flags & ~ALL_FSTFLAGS:
        raise WasiError(Errno.INVAL)
    if (fst_flags & FST_ATIM and fst_flags & FST_ATIM_NOW) or (
        fst_flags & FST_MTIM and fst_flags & FST_MTIM_NOW
    ):
        raise WasiError(Errno.INVAL)
    now = _stamp(time.time_ns(), wasi.stamp_resolution_ns)
    atime = (
        atim if fst_flags & FST_ATIM else now if fst_flags & FST_ATIM_NOW else current.st_atime_ns
    )
    mtime = (
        mtim if fst_flags & FST_MTIM else now if fst_flags & FST_MTIM_NOW else current.st_mtime_ns
    )
    if atime >= I64_LIMIT or mtime >= I64_LIMIT:
        raise WasiError(Errno.INVAL)
    return atime, mtime


def fd_filestat_set_times(
    st: WasiState, mem: GuestMemory, fd: int, atim: int, mtim: int, fst_flags: int
) -> int:
    desc = host_descriptor(st, fd)
    writable(desc)
    need(desc, Right.FD_FILESTAT_SET_TIMES)
    current = os.fstat(desc.fd)
    times = new_times(st, current, atim, mtim, fst_flags)
    os.utime(desc.fd, ns=times)
    set_times(st, (current.st_dev, current.st_ino), times, fst_flags)
    return Errno.SUCCESS


def fd_advise(
    st: WasiState, mem: GuestMemory, fd: int, offset: int, length: int, advice: int
) -> int:
    desc = regular_file(st, fd)
    need(desc, Right.FD_ADVISE)
    if advice > MAX_ADVICE:
        return Errno.INVAL
    offset, length = filesize(offset), filesize(length)
    if _FADVISE is not None:
        os.posix_fadvise(desc.fd, offset, length, _FADVISE[advice])
    return Errno.SUCCESS


def fd_allocate(st: WasiState, mem: GuestMemory, fd: int, offset: int, length: int) -> int:
    desc = regular_file(st, fd)
    writable(desc)
    if not desc.rights_base & R_FD_WRITE:
        return Errno.BADF
    need(desc, Right.FD_ALLOCATE)
    end = filesize(offset) + filesize(length)
    if end > limits.MAX_FILE_BYTES:
        return Errno.FBIG
    if length == 0:
        return Errno.INVAL  # as posix_fallocate
    size = os.fstat(desc.fd).st_size
    if size < end:
        require_growth(st, end - size)
        os.ftruncate(desc.fd, end)
    return Errno.SUCCESS


def fd_sync(st: WasiState, mem: GuestMemory, fd: int) -> int:
    desc = host_descriptor(st, fd)
    need(desc, Right.FD_SYNC)
    os.fsync(desc.fd)
    return Errno.SUCCESS


def fd_datasync(st: WasiState, mem: GuestMemory, fd: int) -> int:
    desc = host_descriptor(st, fd)
    need(desc, Right.FD_DATASYNC)
    os.fdatasync(desc.fd)
    return Errno.SUCCESS


HANDLERS: dict[str, Callable[..., Any]] = {
    "fd_close": fd_close,
    "fd_renumber": fd_renumber,
    "fd_fdstat_get": fd_fdstat_get,
    "fd_fdstat_set_flags": fd_fdstat_set_flags,
    "fd_fdstat_set_rights": fd_fdstat_set_rights,
    "fd_filestat_get": fd_filestat_get,
    "fd_filestat_set_size": fd_filestat_set_size,
    "fd_filestat_set_times": fd_filestat_set_times,
    "fd_advise": fd_advise,
    "fd_allocate": fd_allocate,
    "fd_sync": fd_sync,
    "fd_datasync": fd_datasync,
}
