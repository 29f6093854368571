"""Preopen and directory entries: fd_prestat_get, fd_prestat_dir_name, fd_readdir."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory
from . import limits
from .abi import (
    DIRENT,
    PREOPENTYPE_DIR,
    PRESTAT,
    Filetype,
    Right,
)
from .errno import Errno, WasiError
from .fd_attrs import filetype_of
from .fd_checks import descriptor, need
from .fds import HostDescriptor
from .memio import charge
from .registry import FUEL_PER_BYTE, FUEL_PER_DIR_ENTRY
from .state import WasiState

# Directory entries charged for at once while a snapshot is read: a budget check (two C calls)
# per batch, not per entry.
_ENTRY_BATCH = 64


def _preopen(st: WasiState, fd: int) -> bytes:
    desc = st.fds.get(fd)
    if not isinstance(desc, HostDescriptor) or desc.preopen is None:
        raise WasiError(Errno.BADF)  # ends libc's scan of preopens
    return desc.preopen


def fd_prestat_get(st: WasiState, mem: GuestMemory, fd: int, out: int) -> int:
    mem.write(out, PRESTAT.pack(PREOPENTYPE_DIR, len(_preopen(st, fd))))
    return Errno.SUCCESS


def fd_prestat_dir_name(st: WasiState, mem: GuestMemory, fd: int, path: int, length: int) -> int:
    name = _preopen(st, fd)
    if length < len(name):
        return Errno.NAMETOOLONG
    mem.write(path, name)
    return Errno.SUCCESS


def _held_elsewhere(st: WasiState, desc: HostDescriptor) -> int:
    """Entries of the snapshots the instance's other descriptors hold."""
    return sum(
        len(other.listing)
        for _, other in st.fds
        if isinstance(other, HostDescriptor) and other.listing is not None and other is not desc
    )


def _listing(
    st: WasiState, mem: GuestMemory, desc: HostDescriptor
) -> list[tuple[bytes, int, int]]:
    """A sorted snapshot of a directory: ``.`` and ``..`` first, then every entry.

    ``..`` reports the directory's own inode, so a listing never looks above the directory
    (at a mount's root, its parent is outside the mount). Each batch of entries is paid for
    before it is read; the snapshot may hold at most ``MAX_DIR_ENTRIES``, and no more than what
    the instance's other snapshots leave of ``MAX_LISTED_ENTRIES`` (NOBUFS beyond either).
    """
    own = desc.ident[1]
    desc.listing = None  # the old snapshot's share is free whatever happens below
    room = min(limits.MAX_DIR_ENTRIES, limits.MAX_LISTED_ENTRIES - 2 - _held_elsewhere(st, desc))
    entries: list[tuple[bytes, int, int]] = []
    with os.scandir(desc.fd) as it:
        for entry in it:
            if len(entries) >= room:
                raise WasiError(Errno.NOBUFS)
            if len(entries) % _ENTRY_BATCH == 0:
                charge(mem, _ENTRY_BATCH * FUEL_PER_DIR_ENTRY)
            kind: int
            if entry.is_symlink():
                kind = Filetype.SYMBOLIC_LINK
            elif entry.is_dir(follow_symlinks=False):
                kind = Filetype.DIRECTORY
            elif entry.is_file(follow_symlinks=False):
                kind = Filetype.REGULAR_FILE
            else:
                kind = filetype_of(entry.stat(follow_symlinks=False).st_mode)
            entries.append((os.fsencode(entry.name), entry.inode(), kind))
    # The last batch was paid for whole: give back what it did not read.
    mem.moved -= (-len(entries) % _ENTRY_BATCH) * FUEL_PER_DIR_ENTRY // FUEL_PER_BYTE
    entries.sort()
    return [(b".", own, Filetype.DIRECTORY), (b"..", own, Filetype.DIRECTORY), *entries]


def fd_readdir(
    st: WasiState, mem: GuestMemory, fd: int, buf: int, buf_len: int, cookie: int, used_ptr: int
) -> int:
    desc = descriptor(st, fd)
    if not isinstance(desc, HostDescriptor) or not desc.is_dir:
        return Errno.BADF  # not a directory descriptor (wasmtime answers the same)
    need(desc, Right.FD_READDIR)
    # The destination and the price of filling it before the directory is read.
    mem.require_range(buf, buf_len)
    mem.require_fuel(buf_len * FUEL_PER_BYTE)
    if cookie == 0 or desc.listing is None:
        # Not under st.fs_read: a snapshot may take a while and must not hold the grant table's
        # lock; the entry is gated by wasi.fs.read, so no call started after a change gets here.
        desc.listing = _listing(st, mem, desc)
    entries = desc.listing
    out = bytearray()
    index = cookie
    while index < len(entries) and len(out) < buf_len:
        name, ino, kind = entries[index]
        index += 1
        out += DIRENT.pack(index, ino, len(name), kind)
        out += name
    del out[buf_len:]  # the last entry may be cut: the guest sees bufused == buf_len
    mem.write(buf, bytes(out))
    mem.write_u32(used_ptr, len(out))
    return Errno.SUCCESS


HANDLERS: dict[str, Callable[..., Any]] = {
    "fd_prestat_get": fd_prestat_get,
    "fd_prestat_dir_name": fd_prestat_dir_name,
    "fd_readdir": fd_readdir,
}
