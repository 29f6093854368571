"""Opening a file the host reads as data (a package's manifest and module, an archive, a key,
a trust file, a signature, a revocation list): a regular file, or nothing.

``open()`` of a named pipe blocks until a writer comes, so a package directory whose
``extension.toml`` or module is a FIFO would hang ``Host.load`` (and the CLI) for ever; a
directory opens fine and fails only at ``read()``, with an ``IsADirectoryError`` no caller
expected. The file is opened without blocking and checked on its handle (no window between a
check and the open), so only a regular file is ever read.
"""

from __future__ import annotations

import errno
import os
import stat


class NotARegularFile(OSError):
    """The path names a directory, a pipe, a socket or a device."""


def open_regular(path: str | os.PathLike[str], flags: int) -> int:
    """A descriptor of the regular file at ``path``, opened with ``flags`` (read-only flags
    such as ``O_RDONLY | O_NOFOLLOW``); a :class:`NotARegularFile` (an ``OSError`` whose
    ``strerror`` says so) for anything else. Other ``OSError``s of ``open`` pass through."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotARegularFile(errno.EINVAL, kind, str(path))
        # Regular files ignore O_NONBLOCK; cleared anyway so the descriptor reads as asked.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], flags: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file at ``path`` (the caller refuses more:
    one byte over says the file is too large without reading all of it)."""
    with os.fdopen(open_regular(path, flags), "rb") as f:
        return f.read(limit + 1)
