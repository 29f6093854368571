"""Opening a directory of wasihost's own (the compile cache, the state directory) so that nobody
but this user can redirect it: the one walk both use.

The walk starts at ``/`` and follows no link by itself: each component is looked at where it is
(``lstat`` relative to the handle of the directory above it, which was checked first), opened
with ``O_NOFOLLOW`` and checked on the handle opened (``fstat``, never the path). Every
directory above the target must be owned by root or this user and not writable by group or
others unless sticky (then others may add entries but not rename ours). A symbolic link on the
way (a user's own ``~/.cache`` or ``~/.local/share`` may be one) is followed only if root or
this user owns it: its directory was checked, so nobody else can replace it, and whoever owns
it can point it elsewhere. Missing directories are made (mode 0700) in the checked directory
above them. The result holds no link: the caller keeps the resolved path, or the handle.

Kept apart from both users so that the state directory's check needs no engine import (the
``engine`` package loads wasmtime); the engine imports this module, never one above it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

# Bits that let somebody other than the owner change a directory's entries.
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
# How each component of such a walk is opened: a directory, never through a link.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# As the kernel's path walk: more links than this in one path is a loop.
MAX_LINKS = 40
PRIVATE_DIR_MODE = 0o700


class UntrustedDir(Exception):
    """The directory, or one above it, could be changed by somebody else; says which and why."""


def parent_problem(st: os.stat_result, euid: int) -> str | None:
    """Why a directory above ours is not trusted, or None if it is.

    Owned by root or by us, and not writable by group or others unless sticky (then others may
    add entries but not rename or remove ours).
    """
    if st.st_uid not in (0, euid):
        return f"is owned by uid {st.st_uid}"
    if st.st_mode & SHARED_WRITE and not st.st_mode & stat.S_ISVTX:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_trusted_dir(
    path: Path,
    own_problem: Callable[[os.stat_result, int], str | None],
    *,
    what: str,
) -> tuple[Path, int]:
    """Walk to ``path`` as the module docstring says, making what is missing, and return the
    resolved path and an open handle of the directory (the caller closes it). Raise
    :class:`UntrustedDir` naming the component that fails: a directory above it not trusted,
    another user's link, a loop of links, something not a directory; or the directory itself
    where ``own_problem(its stat, euid)`` says why (``what`` names it: "/ cannot be the
    ``what``")."""
    euid = os.geteuid()
    text = os.fspath(path)
    if not text.startswith("/"):
        text = os.path.join(os.getcwd(), text)
    pending = [name for name in reversed(text.split("/")) if name not in ("", ".")]
    resolved: list[str] = []
    fds = [os.open("/", DIR_FLAGS)]  # the handles of "/" and of each directory in resolved
    made_last = False  # whether the walk made the directory it reached last
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
            problem = parent_problem(os.fstat(fds[-1]), euid)
            if problem:
                raise UntrustedDir(f"{here} {problem}")
            where = os.path.join(here, name)
            try:
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                made = _make(fds[-1], name, where)
                pending.append(name)  # looked at again: made here or meanwhile by another
                made_last = made and len(pending) == 1
                continue
            except OSError as exc:
                raise UntrustedDir(f"{where}: {exc.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise UntrustedDir(f"{where}: too many levels of symbolic links")
                if st.st_uid not in (0, euid):
                    raise UntrustedDir(
                        f"{where} is a symbolic link owned by uid {st.st_uid}, who can point it "
                        f"elsewhere: give the directory it leads to"
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
                fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):
                    raise UntrustedDir(f"{where} is a symbolic link") from None
                raise UntrustedDir(f"{where}: {exc.strerror}") from None
            resolved.append(name)
            if pending:
                made_last = False
        if not resolved:
            raise UntrustedDir(f"/ cannot be the {what}")
        where = "/" + "/".join(resolved)
        if made_last:
            os.fchmod(fds[-1], PRIVATE_DIR_MODE)  # whatever the umask took away
        problem = own_problem(os.fstat(fds[-1]), euid)
        if problem:
            raise UntrustedDir(f"{where} {problem}")
        result = fds.pop()
        return Path(where), result
    finally:
        for fd in fds:
            os.close(fd)


def _make(parent: int, name: str, where: str) -> bool:
    """Make the directory ``name`` (0700) in ``parent``, a directory checked as trusted: nobody
    else can put anything in its place before the walk looks at it again. False if another
    process made it first."""
    try:
        os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent)
    except FileExistsError:
        return False  # made meanwhile (another host opening the same new directory)
    except OSError as exc:
        raise UntrustedDir(f"cannot create {where}: {exc.strerror}") from None
    return True
