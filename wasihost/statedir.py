"""Checking that a state directory is the user's own before the host trusts what is in it.

The state directory decides what runs and with what: the grant table, the installed packages
(an unsigned package directory is trusted by the content digest its record holds), the
revocation list's version floor, quarantines. Whoever else can write it, or rename it or a
directory above it, can grant an extension every capability or swap its module and digest. So
the directory (made 0700 if missing) must be owned by this user and writable by nobody else,
and every directory above it owned by root or this user and not writable by others unless
sticky (then others may add entries but not rename ours): the rule of the compiled-module
cache (``engine/cachedir.py``), walked the same way from ``/`` without following links, each
component checked on the handle opened. A symbolic link on the way is followed only if root or
this user owns it; the host then keeps the resolved path and nothing else.
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


# As the kernel's path walk: more links than this in one path is a loop.
MAX_LINKS = 40


def resolve_state_dir(path: Path) -> Path:
    """The state directory ``path`` resolved, every missing directory made (mode 0700); raise
    :class:`UnsafeStateDir` unless it and every directory above it are safe as described in
    the module docstring.

    The walk starts at ``/`` and follows no link by itself: each component is looked at where
    it is (``lstat`` relative to the directory handle above it, which was checked first). A
    symbolic link (a user's own ``~/.local/share`` may be one) is followed only if owned by
    root or this user: its directory was checked, so nobody else can replace it, and whoever
    owns it can point it elsewhere; the directory reached through another user's link was
    accepted, and the records kept the unresolved path, so that user could swap the trees
    under a running host. The result holds no link: the host uses it, and only it, from
    then on."""
    euid = os.geteuid()
    text = os.fspath(path)
    if not text.startswith("/"):
        text = os.path.join(os.getcwd(), text)
    pending = [name for name in reversed(text.split("/")) if name not in ("", ".")]
    resolved: list[str] = []
    fds = [os.open("/", _DIR_FLAGS)]  # the handles of "/" and of each directory in resolved
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if resolved:
                    resolved.pop()
                    os.close(fds.pop())
                continue
            here = "/" + "/".join(resolved)
            problem = _parent_problem(os.fstat(fds[-1]), euid)
            if problem:
                raise UnsafeStateDir(f"{here} {problem}")
            where = os.path.join(here, name)
            try:
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                _make(fds[-1], name, where)
                pending.append(name)  # looked at again: made here or meanwhile by another
                continue
            except OSError as exc:
                raise UnsafeStateDir(f"{where}: {exc.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise UnsafeStateDir(f"{where}: too many levels of symbolic links")
                if st.st_uid not in (0, euid):
                    raise UnsafeStateDir(
                        f"{where} is a symbolic link owned by uid {st.st_uid}, who can point it "
                        "elsewhere: give the directory it leads to"
                    )
                target = os.readlink(name, dir_fd=fds[-1])
                if target.startswith("/"):
                    for fd in fds[1:]:
                        os.close(fd)
                    del fds[1:]
                    resolved.clear()
                pending.extend(n for n in reversed(target.split("/")) if n not in ("", "."))
                continue
            try:
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):
                    raise UnsafeStateDir(f"{where} is a symbolic link") from None
                raise UnsafeStateDir(f"{where}: {exc.strerror}") from None
            resolved.append(name)
        if not resolved:
            raise UnsafeStateDir("/ cannot be the state directory")
        where = "/" + "/".join(resolved)
        problem = _own_problem(os.fstat(fds[-1]), euid)
        if problem:
            raise UnsafeStateDir(f"{where} {problem}")
        return Path(where)
    finally:
        for fd in fds:
            os.close(fd)


def _make(parent: int, name: str, where: str) -> None:
    """Make the directory ``name`` (0700) in ``parent``, a directory checked as trusted: nobody
    else can put anything in its place before the walk looks at it again."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile (another host opening the same new state directory)
    except OSError as exc:
        raise UnsafeStateDir(f"cannot create {where}: {exc.strerror}") from None
