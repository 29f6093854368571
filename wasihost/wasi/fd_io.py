"""Reading and writing entries: fd_read, fd_write, fd_pread, fd_pwrite, fd_seek, fd_tell, and
the hot paths of fd_write and fd_read."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory, WriteRoute
from . import limits
from .abi import (
    FDFLAG_APPEND,
    R_FD_READ,
    R_FD_WRITE,
    Filetype,
    Right,
    Whence,
)
from .errno import Errno, WasiError, from_oserror
from .fd_checks import (
    I64_LIMIT,
    filesize,
    growth_room,
    need,
    regular_file,
    spend_growth,
    writable,
)
from .fds import HostDescriptor, OutputDescriptor, StdinDescriptor
from .memio import charge, gather, iovecs, prepare_read, scatter, total_length
from .registry import FUEL_PER_BYTE, FUEL_PER_LOG_RECORD
from .state import WasiState, under

_MAX_IO = limits.MAX_IO_BYTES_PER_CALL
# A stdio write up to this size goes to its sink without asking the budget first (a line; the
# engine's own threshold for asking is higher still): the check stays off the per-line path.
_SMALL_WRITE = 4096
_WHENCE = {Whence.SET: os.SEEK_SET, Whence.CUR: os.SEEK_CUR, Whence.END: os.SEEK_END}


def fd_write(
    st: WasiState, mem: GuestMemory, fd: int, iovs: int, iovs_len: int, nwritten_ptr: int
) -> int:
    desc = st.fds.get(fd)
    if desc is None or not desc.rights_base & R_FD_WRITE:
        return Errno.BADF
    vecs = iovecs(mem, iovs, iovs_len)
    # The result's slot is checked before the write: a wild pointer faults with nothing written.
    mem.require_range(nwritten_ptr, 4)
    mem.require_fuel(total_length(vecs, _MAX_IO) * FUEL_PER_BYTE)
    data = gather(mem, vecs, _MAX_IO)
    if type(desc) is OutputDescriptor:
        if desc.records:
            charge(mem, log_records(data) * FUEL_PER_LOG_RECORD)
            # Committed, as the core log entry's records are: none is delivered after a
            # revocation (or any grant change) returns.
            authorised, _ = st.commit(lambda: _to_sink(desc, data))
            if not authorised:
                return Errno.NOTCAPABLE
        else:
            desc.sink(data)
        written = len(data)
    elif isinstance(desc, HostDescriptor) and not desc.is_dir:
        if desc.fdflags & FDFLAG_APPEND:
            start = os.fstat(desc.fd).st_size
        else:
            start = os.lseek(desc.fd, 0, os.SEEK_CUR)
        room, size = growth_room(st, desc.fd, start, len(data))
        written = os.write(desc.fd, data[:room] if room < len(data) else data)
        spend_growth(st, size, start, written)
    else:
        return Errno.BADF
    mem.write_u32(nwritten_ptr, written)
    return Errno.SUCCESS


def _take_stdin(desc: StdinDescriptor, want: int) -> bytes:
    data = desc.data[desc.pos : desc.pos + want]
    desc.pos += len(data)
    return data


def _to_sink(desc: OutputDescriptor, data: bytes) -> int:
    desc.sink(data)
    return Errno.SUCCESS


def log_records(data: bytes) -> int:
    """The log records a write of ``data`` makes (see LogLines): one per newline, and one per
    ``MAX_LOG_LINE_BYTES`` of a longer line (a line still pending makes its record in a later
    call, which paid for its bytes)."""
    return data.count(b"\n") + len(data) // limits.MAX_LOG_LINE_BYTES


def fd_read(
    st: WasiState, mem: GuestMemory, fd: int, iovs: int, iovs_len: int, nread_ptr: int
) -> int:
    desc = st.fds.get(fd)
    if desc is None or not desc.rights_base & R_FD_READ:
        return Errno.BADF
    vecs = iovecs(mem, iovs, iovs_len)
    if not isinstance(desc, HostDescriptor | StdinDescriptor) or (
        isinstance(desc, HostDescriptor) and desc.is_dir
    ):
        return Errno.BADF
    mem.require_range(nread_ptr, 4)  # before the read moves the offset or consumes stdin
    want = prepare_read(mem, vecs, _MAX_IO)
    if isinstance(desc, HostDescriptor):
        data = under(st.fs_read, lambda: os.read(desc.fd, want))
    else:
        data = under(st.stdin_read, lambda: _take_stdin(desc, want))
    mem.write_u32(nread_ptr, scatter(mem, vecs, data) if data else 0)
    return Errno.SUCCESS


def fd_pread(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    iovs: int,
    iovs_len: int,
    offset: int,
    nread_ptr: int,
) -> int:
    desc = regular_file(st, fd)
    if not desc.rights_base & R_FD_READ:
        return Errno.BADF
    need(desc, Right.FD_SEEK)
    offset = filesize(offset)
    vecs = iovecs(mem, iovs, iovs_len)
    mem.require_range(nread_ptr, 4)
    want = prepare_read(mem, vecs, _MAX_IO)
    data = under(st.fs_read, lambda: os.pread(desc.fd, want, offset))
    mem.write_u32(nread_ptr, scatter(mem, vecs, data) if data else 0)
    return Errno.SUCCESS


def fd_pwrite(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    iovs: int,
    iovs_len: int,
    offset: int,
    nwritten_ptr: int,
) -> int:
    desc = regular_file(st, fd)
    writable(desc)
    if not desc.rights_base & R_FD_WRITE:
        return Errno.BADF
    need(desc, Right.FD_SEEK)
    offset = filesize(offset)
    vecs = iovecs(mem, iovs, iovs_len)
    mem.require_range(nwritten_ptr, 4)
    mem.require_fuel(total_length(vecs, _MAX_IO) * FUEL_PER_BYTE)
    data = gather(mem, vecs, _MAX_IO)
    if fcntl.fcntl(desc.fd, fcntl.F_GETFL) & os.O_APPEND:
        # Linux's pwrite(2) on an O_APPEND descriptor appends whatever the offset (a documented
        # bug): the bytes land at the end, so they are limited and paid for there. Red-team
        # 2026-12-01: paid at the offset, pwrite at 0 grew a file past the write budget and
        # MAX_FILE_BYTES for free. The host's flag, not fdflags: it is what pwrite obeys.
        offset = os.fstat(desc.fd).st_size
    room, size = growth_room(st, desc.fd, offset, len(data))
    written = os.pwrite(desc.fd, data[:room], offset)
    spend_growth(st, size, offset, written)
    mem.write_u32(nwritten_ptr, written)
    return Errno.SUCCESS


def fd_seek(
    st: WasiState, mem: GuestMemory, fd: int, offset: int, whence: int, newoffset_ptr: int
) -> int:
    desc = regular_file(st, fd)
    need(desc, Right.FD_TELL if offset == 0 and whence == Whence.CUR else Right.FD_SEEK)
    if whence not in _WHENCE:
        return Errno.INVAL
    delta = offset - (1 << 64) if offset >= I64_LIMIT else offset
    mem.require_range(newoffset_ptr, 8)  # before the seek moves the offset
    how = _WHENCE[Whence(whence)]
    mem.write_u64(newoffset_ptr, under(st.fs_read, lambda: os.lseek(desc.fd, delta, how)))
    return Errno.SUCCESS


def fd_tell(st: WasiState, mem: GuestMemory, fd: int, offset_ptr: int) -> int:
    desc = regular_file(st, fd)
    need(desc, Right.FD_TELL)
    mem.write_u64(offset_ptr, under(st.fs_read, lambda: os.lseek(desc.fd, 0, os.SEEK_CUR)))
    return Errno.SUCCESS


# --- hot paths ---------------------------------------------------------------------------------
# Line-buffered stdio writes one iovec per line, and file reads come one buffer at a time; these
# cases skip the general path's helpers (a function call per iovec and per access, a tenth of a
# microsecond each). Everything else falls through to the general handler, so behaviour is the
# same either way.

# Errno members are enum attributes, slower to look up than a plain int on the hot path.
_SUCCESS = int(Errno.SUCCESS)
_NOTCAPABLE = int(Errno.NOTCAPABLE)


def _errno_of(fn: Callable[..., int], *args: Any) -> int:
    try:
        return fn(*args)
    except WasiError as exc:
        return exc.errno
    except OSError as exc:
        return from_oserror(exc)


def _committed_fd_write(
    st: WasiState, mem: GuestMemory, fd: int, iovs: int, iovs_len: int, nwritten_ptr: int
) -> int:
    """Anything but stdio may write a host file: commit it (see binding.MUTATING). Kept out of
    the fast handler, whose arguments would otherwise become closure cells on every call."""
    authorised, result = st.commit(
        lambda: _errno_of(fd_write, st, mem, fd, iovs, iovs_len, nwritten_ptr)
    )
    return result if authorised and result is not None else Errno.NOTCAPABLE


def _sink_errno(exc: WasiError | OSError) -> int:
    """The errno of a sink's failure, as the handler below answers it."""
    return exc.errno if isinstance(exc, WasiError) else from_oserror(exc)


def fast_fd_write(st: WasiState) -> WriteRoute:
    """fd_write with the engine's shortcut for a line to stdout or stderr (``WriteRoute``): the
    descriptor table's ``sinks`` names the sink of each output descriptor with the write right,
    and the engine copies a one-iovec write to it without calling the handler; the handler
    serves the rest (and takes the same shortcut itself, for a caller that is not the engine)."""
    get = st.fds.lookup

    def handler(mem: GuestMemory, fd: int, iovs: int, iovs_len: int, nwritten_ptr: int) -> int:
        try:
            desc = get(fd)
            if type(desc) is OutputDescriptor:
                if iovs_len == 1 and not desc.records and desc.rights_base & R_FD_WRITE:
                    # Both ranges are checked before the sink: a wild pointer faults before
                    # any output.
                    desc.sink(mem.take_iovec(iovs, _MAX_IO, nwritten_ptr))
                    return _SUCCESS
                return fd_write(st, mem, fd, iovs, iovs_len, nwritten_ptr)  # no host file
            return _committed_fd_write(st, mem, fd, iovs, iovs_len, nwritten_ptr)
        except WasiError as exc:
            return exc.errno
        except OSError as exc:
            return from_oserror(exc)

    return WriteRoute(handler, st.fds.sinks, _MAX_IO, _SUCCESS, (WasiError, OSError), _sink_errno)


def fast_fd_read(st: WasiState) -> Callable[..., int]:
    get = st.fds.lookup
    guard = st.fs_read
    read = os.read

    def handler(mem: GuestMemory, fd: int, iovs: int, iovs_len: int, nread_ptr: int) -> int:
        try:
            desc = get(fd)
            if (
                iovs_len == 1
                and type(desc) is HostDescriptor
                and desc.rights_base & R_FD_READ
                and desc.filetype == Filetype.REGULAR_FILE
            ):
                buf, length = mem.read_u32_pair(iovs)
                if length > _MAX_IO:  # noqa: PLR1730 (a min() call is measurable here)
                    length = _MAX_IO
                # The destination and the price first: a wild buffer or an empty budget gets
                # nothing read, and the file offset does not move.
                mem.require_range(buf, length)
                mem.require_fuel(length * FUEL_PER_BYTE)
                # Under the grant: no read lands after a revocation of wasi.fs.read returns.
                authorised, data = guard(lambda: read(desc.fd, length))
                if not authorised or data is None:
                    return _NOTCAPABLE
                if data:
                    mem.write(buf, data)
                mem.write_u32(nread_ptr, len(data))
                return _SUCCESS
            return fd_read(st, mem, fd, iovs, iovs_len, nread_ptr)
        except WasiError as exc:
            return exc.errno
        except OSError as exc:
            return from_oserror(exc)

    return handler


FAST_HANDLERS: dict[str, Callable[[WasiState], Callable[..., int]]] = {
    "fd_write": fast_fd_write,
    "fd_read": fast_fd_read,
}


HANDLERS: dict[str, Callable[..., Any]] = {
    "fd_read": fd_read,
    "fd_write": fd_write,
    "fd_pread": fd_pread,
    "fd_pwrite": fd_pwrite,
    "fd_seek": fd_seek,
    "fd_tell": fd_tell,
}
