"""Checking that a state directory is the user's own before the host trusts what is in it.

The state directory decides what runs and with what: the grant table, the installed packages
(an unsigned package directory is trusted by the module digest its record holds), the
revocation list's version floor, quarantines. Whoever else can write it, or rename it or a
directory above it, can grant an extension every capability or swap its module and digest. So
the directory (made 0700 if missing) must be owned by this user and writable by nobody else,
and every directory above it owned by root or this user and not writable by others unless
sticky (then others may add entries but not rename ours): the rule of the compiled-module
cache (``engine/cachedir.py``), walked the same way from ``/`` without following links, each
component checked on the handle opened.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .dirtrust import DIR_FLAGS as _DIR_FLAGS
from .dirtrust import SHARED_WRITE as _SHARED_WRITE
from .dirtrust import parent_problem as _parent_problem


class UnsafeStateDir(Exception):
    """The state directory, or one above it, could be changed by somebody else; says why."""


def _own_problem(st: os.stat_result, euid: int) -> str | None:
    if st.st_uid != euid:
        return f"is owned by uid {st.st_uid}, not by this user ({euid})"
    if st.st_mode & _SHARED_WRITE:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}; make it 0700)"
    return None


def check_state_dir(path: Path) -> None:
    """Raise :class:`UnsafeStateDir` unless ``path`` (which exists) and every directory above
    it are safe as described in the module docstring. Links in ``path`` are resolved first
    (a user's own ``~/.local/share`` may be one); the walk after that follows none."""
    euid = os.geteuid()
    parts = Path(os.path.realpath(path)).parts
    fd = os.open("/", _DIR_FLAGS)
    try:
        where = "/"
        for i, name in enumerate(parts):
            if i:
                where = os.path.join(where, name)
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.EMLINK):
                        raise UnsafeStateDir(f"{where} is a symbolic link") from None
                    raise UnsafeStateDir(f"{where}: {exc.strerror}") from None
                os.close(fd)
                fd = child
            st = os.fstat(fd)
            last = i == len(parts) - 1
            problem = _own_problem(st, euid) if last and i else _parent_problem(st, euid)
            if problem:
                raise UnsafeStateDir(f"{where} {problem}")
    finally:
        os.close(fd)
