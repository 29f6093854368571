"""Path entries: path_* of preview1, every path resolved by :class:`~wasihost.wasi.fs.PathWalk`.

Each final system call names one component in a directory the walk holds, and never follows a
symlink itself (``O_NOFOLLOW``, ``follow_symlinks=False``): following, where the spec asks for it,
is done by the walk, inside the mount. Links and renames never cross mounts (XDEV), so nothing
of a read-only mount becomes reachable through a writable one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory
from . import limits
from .abi import (
    ALL_FDFLAGS,
    ALL_OFLAGS,
    DIR_READ_RIGHTS,
    DIR_WRITE_RIGHTS,
    FDFLAG_APPEND,
    FDFLAG_DSYNC,
    FDFLAG_RSYNC,
    FDFLAG_SYNC,
    FILE_READ_RIGHTS,
    FILE_WRITE_RIGHTS,
    LOOKUP_SYMLINK_FOLLOW,
    NEEDS_WRITE_ACCESS,
    OFLAG_CREAT,
    OFLAG_DIRECTORY,
    OFLAG_EXCL,
    OFLAG_TRUNC,
    WRITE_ACCESS_RIGHTS,
    Filetype,
    Right,
)
from .errno import Errno, WasiError
from .fd_attrs import new_times, pack_filestat, set_times
from .fds import HostDescriptor, leave_host_room
from .fs import CREATE_FILE_MODE, OPEN_ALWAYS, Meter, PathWalk, open_walked
from .memio import charge, read_path
from .registry import FUEL_PER_WALK_STEP, WALK_STEPS_IN_BASE
from .state import WasiState

CREATE_DIR_MODE = 0o777
_READ_ACCESS = int(Right.FD_READ | Right.FD_READDIR)


def _any_dir(st: WasiState, fd: int) -> HostDescriptor:
    """The directory descriptor ``fd``, whatever its rights."""
    desc = st.fds.get(fd)
    if desc is None:
        raise WasiError(Errno.BADF)
    if not isinstance(desc, HostDescriptor) or not desc.is_dir:
        raise WasiError(Errno.NOTDIR)
    return desc


def _dir(st: WasiState, fd: int, right: int) -> HostDescriptor:
    """The directory descriptor ``fd``, holding ``right``."""
    desc = _any_dir(st, fd)
    if not desc.rights_base & right:
        raise WasiError(Errno.NOTCAPABLE)
    return desc


def _writable_dir(st: WasiState, fd: int, right: int) -> HostDescriptor:
    """As :func:`_dir`, on a writable mount: a read-only one is ROFS whatever the rights say."""
    desc = st.fds.get(fd)
    if isinstance(desc, HostDescriptor) and desc.is_dir and not desc.mount.writable:
        raise WasiError(Errno.ROFS)
    return _dir(st, fd, right)


def _room_for_entry(st: WasiState) -> None:
    """DQUOT unless the write budget can pay for one more file, directory or link."""
    if st.write_room < limits.NEW_ENTRY_BYTES:
        raise WasiError(Errno.DQUOT)


def _made_entry(st: WasiState) -> None:
    st.write_room -= limits.NEW_ENTRY_BYTES


def _meter(mem: GuestMemory) -> Meter:
    """Charges each component past the base price's before it is walked (see registry)."""

    def meter(step: int) -> None:
        if step > WALK_STEPS_IN_BASE:
            charge(mem, FUEL_PER_WALK_STEP)

    return meter


def _walk(mem: GuestMemory, desc: HostDescriptor, path: bytes) -> PathWalk:
    return PathWalk(desc.fd, desc.ident, path, _meter(mem))


def _locate(walk: PathWalk, follow: bool) -> tuple[int, bytes, bool]:
    return walk.walk_following() if follow or walk.must_dir else walk.walk()


def _open_flags(oflags: int, fdflags: int, read: bool, write: bool) -> int:
    flags = OPEN_ALWAYS
    flags |= os.O_RDWR if read and write else os.O_WRONLY if write else os.O_RDONLY
    if oflags & OFLAG_CREAT:
        flags |= os.O_CREAT
    if oflags & OFLAG_EXCL:
        flags |= os.O_EXCL
    if oflags & OFLAG_TRUNC:
        flags |= os.O_TRUNC
    if oflags & OFLAG_DIRECTORY:
        flags |= os.O_DIRECTORY
    if fdflags & FDFLAG_APPEND:
        flags |= os.O_APPEND
    if fdflags & FDFLAG_DSYNC:
        flags |= getattr(os, "O_DSYNC", os.O_SYNC)
    if fdflags & (FDFLAG_SYNC | FDFLAG_RSYNC):
        flags |= os.O_SYNC
    return flags


def path_open(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    dirflags: int,
    path_ptr: int,
    path_len: int,
    oflags: int,
    rights_base: int,
    rights_inheriting: int,
    fdflags: int,
    fd_out: int,
) -> int:
    parent = _dir(st, fd, Right.PATH_OPEN)
    path = read_path(mem, path_ptr, path_len)
    if oflags & ~ALL_OFLAGS or fdflags & ~ALL_FDFLAGS:
        return Errno.INVAL
    write = bool(rights_base & WRITE_ACCESS_RIGHTS)
    read = bool(rights_base & _READ_ACCESS) or not write
    if write or oflags & (OFLAG_CREAT | OFLAG_TRUNC):
        if not parent.mount.writable:
            return Errno.ROFS
        if oflags & OFLAG_CREAT and not parent.rights_base & Right.PATH_CREATE_FILE:
            return Errno.NOTCAPABLE
        # The spec's gate of O_TRUNC: truncating by path is changing a file's size by path.
        if oflags & OFLAG_TRUNC and not parent.rights_base & Right.PATH_FILESTAT_SET_SIZE:
            return Errno.NOTCAPABLE
        if oflags & OFLAG_CREAT:
            # Counted whether or not the file existed: the walk does not say which.
            _room_for_entry(st)
    flags = _open_flags(oflags, fdflags, read, write)
    st.fds.require_room()
    follow = bool(dirflags & LOOKUP_SYMLINK_FOLLOW)
    with _walk(mem, parent, path) as walk:
        host_fd = open_walked(walk, flags, CREATE_FILE_MODE, follow=follow)
    try:
        leave_host_room(host_fd)
        mode = os.fstat(host_fd)
        if stat.S_ISDIR(mode.st_mode):
            kind = Filetype.DIRECTORY
            allowed = DIR_READ_RIGHTS | (DIR_WRITE_RIGHTS if parent.mount.writable else 0)
        elif stat.S_ISREG(mode.st_mode):
            kind = Filetype.REGULAR_FILE
            allowed = FILE_READ_RIGHTS | (FILE_WRITE_RIGHTS if parent.mount.writable else 0)
            if not write:
                allowed &= ~NEEDS_WRITE_ACCESS
            if not read:
                allowed &= ~int(Right.FD_READ)
        else:
            raise WasiError(Errno.ACCES)  # devices, FIFOs, sockets: not files to hand a guest
        desc = HostDescriptor(
            filetype=kind,
            rights_base=rights_base & parent.rights_inheriting & allowed,
            rights_inheriting=rights_inheriting & parent.rights_inheriting,
            fdflags=fdflags,
            fd=host_fd,
            mount=parent.mount,
            ident=(mode.st_dev, mode.st_ino),
        )
        new_fd = st.fds.insert(desc)
    except BaseException:
        os.close(host_fd)
        raise
    if oflags & OFLAG_CREAT:
        _made_entry(st)
    mem.write_u32(fd_out, new_fd)
    return Errno.SUCCESS


def path_create_directory(
    st: WasiState, mem: GuestMemory, fd: int, path_ptr: int, path_len: int
) -> int:
    parent = _writable_dir(st, fd, Right.PATH_CREATE_DIRECTORY)
    _room_for_entry(st)
    with _walk(mem, parent, read_path(mem, path_ptr, path_len)) as walk:
        dir_fd, name, _ = walk.walk()
        os.mkdir(name, CREATE_DIR_MODE, dir_fd=dir_fd)
    _made_entry(st)
    return Errno.SUCCESS


def path_filestat_get(
    st: WasiState, mem: GuestMemory, fd: int, flags: int, path_ptr: int, path_len: int, out: int
) -> int:
    parent = _dir(st, fd, Right.PATH_FILESTAT_GET)
    with _walk(mem, parent, read_path(mem, path_ptr, path_len)) as walk:
        dir_fd, name, must_dir = _locate(walk, bool(flags & LOOKUP_SYMLINK_FOLLOW))
        result = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if must_dir and not stat.S_ISDIR(result.st_mode):
        return Errno.NOTDIR
    mem.write(out, pack_filestat(st, result))
    return Errno.SUCCESS


def path_filestat_set_times(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    flags: int,
    path_ptr: int,
    path_len: int,
    atim: int,
    mtim: int,
    fst_flags: int,
) -> int:
    parent = _writable_dir(st, fd, Right.PATH_FILESTAT_SET_TIMES)
    with _walk(mem, parent, read_path(mem, path_ptr, path_len)) as walk:
        dir_fd, name, _ = _locate(walk, bool(flags & LOOKUP_SYMLINK_FOLLOW))
        current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        times = new_times(st, current, atim, mtim, fst_flags)
        os.utime(name, ns=times, dir_fd=dir_fd, follow_symlinks=False)
        set_times(st, (current.st_dev, current.st_ino), times, fst_flags)
    return Errno.SUCCESS


def _same_mount(st: WasiState, fd: int, other: int) -> tuple[HostDescriptor, HostDescriptor]:
    """Both directories, of one mount: XDEV otherwise (as between file systems), before any
    other check, so nothing of a read-only mount ever becomes reachable through a writable one."""
    a = _any_dir(st, fd)
    b = _any_dir(st, other)
    if a.mount is not b.mount:
        raise WasiError(Errno.XDEV)
    return a, b


def path_link(
    st: WasiState,
    mem: GuestMemory,
    old_fd: int,
    old_flags: int,
    old_ptr: int,
    old_len: int,
    new_fd: int,
    new_ptr: int,
    new_len: int,
) -> int:
    _same_mount(st, old_fd, new_fd)
    src = _writable_dir(st, old_fd, Right.PATH_LINK_SOURCE)
    dst = _dir(st, new_fd, Right.PATH_LINK_TARGET)
    old_path = read_path(mem, old_ptr, old_len)
    new_path = read_path(mem, new_ptr, new_len)
    with _walk(mem, src, old_path) as old_walk, _walk(mem, dst, new_path) as new_walk:
        old_dir, old_name, _ = _locate(old_walk, bool(old_flags & LOOKUP_SYMLINK_FOLLOW))
        new_dir, new_name, new_must_dir = new_walk.walk()
        if new_must_dir:
            return Errno.NOENT
        _room_for_entry(st)
        os.link(old_name, new_name, src_dir_fd=old_dir, dst_dir_fd=new_dir, follow_symlinks=False)
    _made_entry(st)
    return Errno.SUCCESS


def path_readlink(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    path_ptr: int,
    path_len: int,
    buf: int,
    buf_len: int,
    used_ptr: int,
) -> int:
    parent = _dir(st, fd, Right.PATH_READLINK)
    with _walk(mem, parent, read_path(mem, path_ptr, path_len)) as walk:
        dir_fd, name, _ = walk.walk()
        if name == b".":
            return Errno.INVAL
        target = os.readlink(name, dir_fd=dir_fd)
    out = target[:buf_len]  # preview1 truncates silently
    mem.write(buf, out)
    mem.write_u32(used_ptr, len(out))
    return Errno.SUCCESS


def path_remove_directory(
    st: WasiState, mem: GuestMemory, fd: int, path_ptr: int, path_len: int
) -> int:
    parent = _writable_dir(st, fd, Right.PATH_REMOVE_DIRECTORY)
    with _walk(mem, parent, read_path(mem, path_ptr, path_len)) as walk:
        dir_fd, name, _ = walk.walk()
        os.rmdir(name, dir_fd=dir_fd)
    return Errno.SUCCESS


def _check_dir_if_required(dir_fd: int, name: bytes, must_dir: bool) -> None:
    if must_dir and not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
        raise WasiError(Errno.NOTDIR)


def path_rename(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    old_ptr: int,
    old_len: int,
    new_fd: int,
    new_ptr: int,
    new_len: int,
) -> int:
    _same_mount(st, fd, new_fd)
    src = _writable_dir(st, fd, Right.PATH_RENAME_SOURCE)
    dst = _dir(st, new_fd, Right.PATH_RENAME_TARGET)
    old_path = read_path(mem, old_ptr, old_len)
    new_path = read_path(mem, new_ptr, new_len)
    with _walk(mem, src, old_path) as old_walk, _walk(mem, dst, new_path) as new_walk:
        old_dir, old_name, old_must_dir = old_walk.walk()
        new_dir, new_name, new_must_dir = new_walk.walk()
        _check_dir_if_required(old_dir, old_name, old_must_dir or new_must_dir)
        os.rename(old_name, new_name, src_dir_fd=old_dir, dst_dir_fd=new_dir)
    return Errno.SUCCESS


def path_symlink(
    st: WasiState,
    mem: GuestMemory,
    old_ptr: int,
    old_len: int,
    fd: int,
    new_ptr: int,
    new_len: int,
) -> int:
    parent = _writable_dir(st, fd, Right.PATH_SYMLINK)
    target = read_path(mem, old_ptr, old_len)
    if not target:
        return Errno.NOENT
    if target.startswith(b"/"):
        return Errno.PERM  # would name the host's root; the walk would refuse it anyway
    with _walk(mem, parent, read_path(mem, new_ptr, new_len)) as walk:
        dir_fd, name, must_dir = walk.walk()
        if must_dir:
            return Errno.NOENT
        _room_for_entry(st)
        os.symlink(target, name, dir_fd=dir_fd)
    _made_entry(st)
    return Errno.SUCCESS


def path_unlink_file(st: WasiState, mem: GuestMemory, fd: int, path_ptr: int, path_len: int) -> int:
    parent = _writable_dir(st, fd, Right.PATH_UNLINK_FILE)
    with _walk(mem, parent, read_path(mem, path_ptr, path_len)) as walk:
        if walk.must_dir:
            # "x/" names a directory (through a symlink too): never a file to unlink.
            dir_fd, name, _ = walk.walk_following()
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            return Errno.ISDIR if stat.S_ISDIR(mode) else Errno.NOTDIR
        dir_fd, name, _ = walk.walk()
        os.unlink(name, dir_fd=dir_fd)
    return Errno.SUCCESS


HANDLERS: dict[str, Callable[..., Any]] = {
    "path_create_directory": path_create_directory,
    "path_filestat_get": path_filestat_get,
    "path_filestat_set_times": path_filestat_set_times,
    "path_link": path_link,
    "path_open": path_open,
    "path_readlink": path_readlink,
    "path_remove_directory": path_remove_directory,
    "path_rename": path_rename,
    "path_symlink": path_symlink,
    "path_unlink_file": path_unlink_file,
}
