"""Opening the on-disk module cache's directory so that nobody else can redirect it.

The cache holds native code that the host maps and runs, authenticated by a key kept in the
same directory. Whoever can rename that directory, or any directory above it, can swap in a
directory of their own (``renameat2(RENAME_EXCHANGE)`` does it atomically) holding their own
key and their own signed entries. So the directory is opened once, component by component
from ``/`` without following symbolic links, each component is checked on the handle that was
opened (``fstat``, never the path), and every later access goes through the final handle
(``dir_fd``): a rename after that point changes nothing the host reads.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..dirtrust import DIR_FLAGS as _DIR_FLAGS
from ..dirtrust import parent_problem as _trusted_parent

# The cache directory itself grants nothing to group or others (mode 0700).
_NOT_PRIVATE = stat.S_IRWXG | stat.S_IRWXO
PRIVATE_DIR_MODE = 0o700


class UnsafeCacheDir(Exception):
    """The directory (or one above it) could be changed by somebody else; says why."""


def dir_fd_supported() -> bool:
    """Whether this platform can do every cache access relative to a directory handle."""
    # os.replace is renameat(2) like os.rename, but only os.rename is listed.
    needed = (os.open, os.mkdir, os.rename, os.unlink, os.link, os.stat)
    return all(f in os.supports_dir_fd for f in needed) and hasattr(os, "O_NOFOLLOW")


def _private(st: os.stat_result, euid: int) -> str | None:
    if st.st_uid != euid:
        return f"is owned by uid {st.st_uid}, not by this user ({euid})"
    if st.st_mode & _NOT_PRIVATE:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700"
    return None


def _open_component(parent: int, name: str, where: str, *, create: bool) -> tuple[int, bool]:
    """Open ``name`` under ``parent`` as a directory, making it (0700) if missing and allowed."""
    created = False
    while True:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent), created
        except FileNotFoundError:
            if not create:
                raise UnsafeCacheDir(f"{where} does not exist") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise UnsafeCacheDir(f"{where} is a symbolic link") from None
            if exc.errno == errno.ENOTDIR:
                raise UnsafeCacheDir(f"{where} is not a directory") from None
            raise UnsafeCacheDir(f"{where}: {exc.strerror}") from None
        try:
            # The parent is trusted, so nobody else can replace what we make before we open it.
            os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent)
            created = True
        except FileExistsError:
            pass  # made meanwhile by another process of ours (or root): open and check it
        except OSError as exc:
            raise UnsafeCacheDir(f"cannot create {where}: {exc.strerror}") from None


def open_private_dir(path: Path) -> int:
    """Open ``path`` (made if missing) as a directory only this user controls; return its fd.

    Raise :class:`UnsafeCacheDir` saying which component fails and why. Symbolic links in
    ``path`` are resolved first (a user's own ``~/.cache`` may be one); the walk that follows
    never follows one, so what is checked is exactly what is opened.
    """
    if not dir_fd_supported():
        raise UnsafeCacheDir("this platform cannot open files relative to a directory handle")
    euid = os.geteuid()
    parts = Path(os.path.realpath(path)).parts
    fd = os.open("/", _DIR_FLAGS)
    try:
        where = "/"
        problem = _trusted_parent(os.fstat(fd), euid)
        if problem:
            raise UnsafeCacheDir(f"{where} {problem}")
        for i, name in enumerate(parts[1:], start=1):
            last = i == len(parts) - 1
            where = os.path.join(where, name)
            child, created = _open_component(fd, name, where, create=True)
            os.close(fd)
            fd = child
            if created and last:
                os.fchmod(fd, PRIVATE_DIR_MODE)  # whatever the umask took away or left
            st = os.fstat(fd)
            problem = _private(st, euid) if last else _trusted_parent(st, euid)
            if problem:
                raise UnsafeCacheDir(f"{where} {problem}")
        if len(parts) == 1:
            raise UnsafeCacheDir("/ cannot be the cache directory")
    except BaseException:
        os.close(fd)
        raise
    return fd
