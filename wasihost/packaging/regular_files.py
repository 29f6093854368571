"""Reading the files an operator names: bounded, checked by kind on the open handle.

Data files (manifests, modules, packages, keys, signatures, lists) must be regular files. A
FIFO or a terminal named where one belongs would hold a plain ``open()`` (or its first read)
until some writer appeared, which may be never; a directory fails only at the read, with an
error no caller expects. So they are opened without blocking and refused by kind before
anything is read.

Inputs (a command's input, a WASI program's stdin) are streams by nature: a pipe from a shell's
process substitution (``--stdin <(make-data)``) or a device is what the operator asked for, and
waiting for its writer is the expected behaviour. Only what cannot be read as a stream (a
directory, a socket) is refused there."""

from __future__ import annotations

import os
import stat

_OPEN = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotARegularFile(OSError):
    """What was named is not a regular file; ``strerror`` says what it is instead, so that
    callers reporting ``OSError.strerror`` say it without a case of their own."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.strerror = f"not a regular file but {kind}"


def open_regular(path: str | os.PathLike[str], *, follow: bool = False) -> int:
    """A descriptor of the regular file at ``path``, opened read-only without blocking; a
    final symbolic link is refused unless ``follow``. Raises ``OSError`` (``NotARegularFile``
    for a directory, FIFO, device or socket)."""
    fd = os.open(path, _OPEN if follow else _OPEN | os.O_NOFOLLOW)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise NotARegularFile(kind)
        os.set_blocking(fd, True)  # a regular file never blocks; reads stay ordinary
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``fd``, which this closes: one byte over tells a caller
    that the file is over its bound without reading the rest."""
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def read_stream(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the file, pipe or device at ``path`` (links followed;
    a pipe's writer is waited for). A directory raises ``NotARegularFile``; a socket cannot
    be opened at all (``OSError``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise NotARegularFile("a directory")
    except BaseException:
        os.close(fd)
        raise
    return read_fd(fd, limit)


def read_regular(path: str | os.PathLike[str], limit: int, *, follow: bool = False) -> bytes:
    """At most ``limit + 1`` bytes of the regular file at ``path`` (see :func:`open_regular`);
    ``OSError`` passes through for the caller to name in its own error."""
    return read_fd(open_regular(path, follow=follow), limit)
