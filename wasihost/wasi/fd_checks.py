"""Checks shared by the descriptor entries, and their error conventions.

An unknown descriptor is BADF, and so is a file-only call on a directory or fd_readdir on a file
(as in wasmtime); reading or writing a descriptor not open for it is BADF (as POSIX); a missing
right otherwise is NOTCAPABLE; a write through a read-only mount is ROFS; growing a file past
``MAX_FILE_BYTES`` is FBIG, and past what the instance's write budget has left, DQUOT.
"""

from __future__ import annotations

import os

from . import limits
from .errno import Errno, WasiError
from .fds import Descriptor, HostDescriptor
from .state import WasiState

# u64 arguments with the top bit set are negative as filesizes/offsets, and as timestamps.
I64_LIMIT = 1 << 63


def descriptor(st: WasiState, fd: int) -> Descriptor:
    desc = st.fds.get(fd)
    if desc is None:
        raise WasiError(Errno.BADF)
    return desc


def regular_file(st: WasiState, fd: int) -> HostDescriptor:
    """A regular file of a mount; stdio is SPIPE (not seekable), a directory BADF."""
    desc = descriptor(st, fd)
    if not isinstance(desc, HostDescriptor):
        raise WasiError(Errno.SPIPE)
    if desc.is_dir:
        raise WasiError(Errno.BADF)
    return desc


def need(desc: Descriptor, right: int) -> None:
    if not desc.rights_base & right:
        raise WasiError(Errno.NOTCAPABLE)


def writable(desc: HostDescriptor) -> None:
    if not desc.mount.writable:
        raise WasiError(Errno.ROFS)


def filesize(value: int) -> int:
    """A u64 offset/size argument; one with the top bit set is negative as a filesize: INVAL."""
    if value >= I64_LIMIT:
        raise WasiError(Errno.INVAL)
    return value


def room_under_limit(start: int, length: int) -> int:
    """How much of ``length`` bytes at ``start`` fits under the file size limit."""
    room = limits.MAX_FILE_BYTES - start
    if length and room <= 0:
        raise WasiError(Errno.FBIG)
    return min(length, max(room, 0))


def growth_room(st: WasiState, fd: int, start: int, length: int) -> tuple[int, int]:
    """(how many of ``length`` bytes may be written at ``start`` of the file ``fd``, its size
    now): within the file size limit (FBIG) and the instance's write budget, which pays for
    growth past the end, a hole included (DQUOT). Pay with :func:`spend_growth`."""
    room = room_under_limit(start, length)
    size = os.fstat(fd).st_size
    budget = size + st.write_room - start  # the bytes at start the budget can pay for
    if room and budget <= 0:
        raise WasiError(Errno.DQUOT)
    return min(room, max(budget, 0)), size


def spend_growth(st: WasiState, size: int, start: int, written: int) -> None:
    """``written`` bytes went to ``start`` of a file of ``size``: take its growth from the
    write budget (nothing written, nothing grown: an empty write past the end leaves no hole)."""
    end = start + written
    if written and end > size:
        st.write_room -= end - size


def require_growth(st: WasiState, growth: int) -> None:
    """DQUOT unless the write budget can pay ``growth`` (it is taken)."""
    if growth > st.write_room:
        raise WasiError(Errno.DQUOT)
    st.write_room -= max(growth, 0)


def host_descriptor(st: WasiState, fd: int) -> HostDescriptor:
    desc = descriptor(st, fd)
    if not isinstance(desc, HostDescriptor):
        raise WasiError(Errno.BADF)
    return desc
