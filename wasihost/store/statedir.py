"""Checking that a state directory is the user's own before the host trusts what is in it.

The state directory decides what runs and with what: the grant table, the installed packages
(an unsigned package directory is trusted by the content digest its record holds), the
revocation list's version floor, quarantines. Whoever else can write it, or rename it or a
directory above it, can grant an extension every capability or swap its module and digest. So
the directory (made 0700 if missing) must be owned by this user and writable by nobody else,
and every directory above it owned by root or this user and not writable by others unless
sticky (then others may add entries but not rename ours): the rule of the compiled-module
cache (``engine/cachedir.py``), walked the same way from ``/`` without following links, each
component checked on the handle opened, by the one walk both use (``dirtrust.py``). A symbolic
link on the way is followed only if root or this user owns it; the host then keeps the resolved
path and nothing else.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .dirtrust import SHARED_WRITE as _SHARED_WRITE
from .dirtrust import UntrustedDir, open_trusted_dir


class UnsafeStateDir(Exception):
    """The state directory, or one above it, could be changed by somebody else; says why."""


def own_dir_problem(st: os.stat_result, euid: int) -> str | None:
    """Why a directory of the state (the state directory, a data directory it links to) is
    not this user's own, or None."""

    if st.st_uid != euid:
        return f"is owned by uid {st.st_uid}, not by this user ({euid})"
    if st.st_mode & _SHARED_WRITE:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}; make it 0700)"
    return None


def resolve_state_dir(path: Path) -> Path:
    """The state directory ``path`` resolved, every missing directory made (mode 0700); raise
    :class:`UnsafeStateDir` unless it and every directory above it are safe as described in
    the module docstring.

    The walk is the module cache's (:func:`wasihost.store.dirtrust.open_trusted_dir`): from ``/``,
    following a link only if root or this user owns it. The directory reached through another
    user's link was accepted, and the records kept the unresolved path, so that user could
    swap the trees under a running host. The result holds no link: the host uses it, and only
    it, from then on."""
    try:
        resolved, fd = open_trusted_dir(path, own_dir_problem, what="state directory")
    except UntrustedDir as exc:
        raise UnsafeStateDir(str(exc)) from None
    os.close(fd)
    return resolved
