"""Guest-memory helpers shared by the handlers: iovecs, paths, out-pointers.

Counts and lengths are checked against the profile's limits *before* guest memory is read, so a
huge count costs the host nothing; every access goes through the bounds-checked
:class:`~wasihost.core.guestmem.GuestMemory`, which faults (a ``protocol`` trap) outside memory.
"""

from __future__ import annotations

from ..core.guestmem import GuestMemory
from . import limits
from .abi import IOVEC
from .errno import Errno, WasiError
from .fs import check_path
from .registry import FUEL_PER_BYTE

_iter_iovecs = IOVEC.iter_unpack
_unpack_iovec = IOVEC.unpack


def iovecs(mem: GuestMemory, ptr: int, count: int) -> list[tuple[int, int]]:
    """The (buf, len) pairs of an iovec array; INVAL over ``MAX_IOVECS`` without reading it."""
    if count > limits.MAX_IOVECS:
        raise WasiError(Errno.INVAL)
    if count == 1:
        return [_unpack_iovec(mem.read(ptr, 8))]
    return list(_iter_iovecs(mem.read(ptr, 8 * count)))


def gather(mem: GuestMemory, vecs: list[tuple[int, int]], cap: int) -> bytes:
    """Up to ``cap`` bytes from the buffers in order (a short write past the cap)."""
    if len(vecs) == 1:
        buf, length = vecs[0]
        return mem.read(buf, length if length <= cap else cap)
    parts = []
    for buf, length in vecs:
        if cap <= 0:
            break
        take = length if length <= cap else cap
        parts.append(mem.read(buf, take))
        cap -= take
    return b"".join(parts)


def total_length(vecs: list[tuple[int, int]], cap: int) -> int:
    """How much a read into ``vecs`` may fetch: their total, at most ``cap``."""
    total = 0
    for _, length in vecs:
        total += length
    return total if total <= cap else cap


def prepare_read(mem: GuestMemory, vecs: list[tuple[int, int]], cap: int) -> int:
    """How much a read into ``vecs`` may fetch (their total, at most ``cap``), once every
    buffer it may fill lies inside memory and the budget can pay for the bytes: a guest that
    cannot pay, or names a wild buffer, gets nothing read (no file offset moved)."""
    want = total_length(vecs, cap)
    left = want
    for buf, length in vecs:
        if left <= 0:
            break
        take = length if length <= left else left
        mem.require_range(buf, take)
        left -= take
    mem.require_fuel(want * FUEL_PER_BYTE)
    return want


def scatter(mem: GuestMemory, vecs: list[tuple[int, int]], data: bytes) -> int:
    """Spread ``data`` over the buffers in order; returns the bytes placed (all of them)."""
    if len(vecs) == 1:
        mem.write(vecs[0][0], data)
        return len(data)
    view = memoryview(data)
    offset = 0
    for buf, length in vecs:
        if offset >= len(data):
            break
        chunk = view[offset : offset + length]
        mem.write(buf, bytes(chunk))
        offset += len(chunk)
    return offset


def read_path(mem: GuestMemory, ptr: int, length: int) -> bytes:
    """A guest path: NAMETOOLONG before reading an over-long one, then validated."""
    if length > limits.MAX_PATH_BYTES:
        raise WasiError(Errno.NAMETOOLONG)
    return check_path(mem.read(ptr, length))


def charge(mem: GuestMemory, units: int) -> None:
    """Work this call is about to do that costs ``units`` fuel beyond its base price (walking a
    component, reading directory entries): a guest whose budget cannot pay for it on top of what
    the call has already moved ends ``out_of_fuel`` before the work; otherwise the units join the
    bytes moved, which the engine charges after the call at ``FUEL_PER_BYTE`` (1) each."""
    mem.require_fuel(mem.moved * FUEL_PER_BYTE + units)
    mem.moved += units // FUEL_PER_BYTE


def write_strings(mem: GuestMemory, ptrs: int, buf: int, items: list[bytes]) -> None:
    """argv/environ layout: a pointer per item at ``ptrs``, the NUL-terminated items at ``buf``."""
    mem.require_fuel(sum(len(item) + 5 for item in items) * FUEL_PER_BYTE)
    pointers = bytearray()
    blob = bytearray()
    for item in items:
        pointers += ((buf + len(blob)) & 0xFFFF_FFFF).to_bytes(4, "little")
        blob += item + b"\0"
    if pointers:
        mem.write(ptrs, bytes(pointers))
        mem.write(buf, bytes(blob))
