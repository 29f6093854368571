"""The rule for trusting a directory above one of wasihost's own (the compile cache, the state
directory): nobody but its owner, root or this user, may rename or remove entries in it.

Kept apart from both users so that the state directory's check needs no engine import (the
``engine`` package loads wasmtime).
"""

from __future__ import annotations

import os
import stat

# Bits that let somebody other than the owner change a directory's entries.
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
# How each component of such a walk is opened: a directory, never through a link.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
