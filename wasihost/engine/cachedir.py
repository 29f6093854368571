"""Opening the on-disk module cache's directory so that nobody else can redirect it.

The cache holds native code that the host maps and runs, authenticated by a key kept in the
same directory. Whoever can rename that directory, or any directory above it, can swap in a
directory of their own (``renameat2(RENAME_EXCHANGE)`` does it atomically) holding their own
key and their own signed entries. So the directory is opened once, component by component
from ``/`` without following symbolic links but its user's or root's, each component is checked
on the handle that was opened (``fstat``, never the path), and every later access goes through
the final handle (``dir_fd``): a rename after that point changes nothing the host reads.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..store.dirtrust import UntrustedDir, open_trusted_dir

# The cache directory itself grants nothing to group or others (mode 0700).
_NOT_PRIVATE = stat.S_IRWXG | stat.S_IRWXO


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


def open_private_dir(path: Path) -> int:
    """Open ``path`` (made if missing) as a directory only this user controls; return its fd.

    Raise :class:`UnsafeCacheDir` saying which component fails and why. The walk is the state
    directory's (:func:`wasihost.store.dirtrust.open_trusted_dir`): from ``/``, a symbolic link
    followed only if root or this user owns it (a user's own ``~/.cache`` may be one), so what
    is checked is exactly what is opened. (``os.path.realpath`` first followed every link on
    the way, another user's too, before a walk that then followed none.)
    """
    if not dir_fd_supported():
        raise UnsafeCacheDir("this platform cannot open files relative to a directory handle")
    try:
        _, fd = open_trusted_dir(path, _private, what="cache directory")
    except UntrustedDir as exc:
        raise UnsafeCacheDir(str(exc)) from None
    return fd
