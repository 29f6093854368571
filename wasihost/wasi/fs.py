"""Path resolution inside a mount: the security core of the WASI profile.

The kernel is never handed a guest path. A path is split into components and walked one
component at a time with ``openat(dir_fd, name, O_NOFOLLOW | O_DIRECTORY)``, so the kernel only
ever resolves a single name inside a directory we already hold, and never follows a symlink by
itself. Then:

- ``..`` is ours to interpret: it may not climb above the directory the guest named the path
  from (the WASI capability rule), and it is resolved by opening the kernel's ``..`` and checking
  that it is the very directory we descended from (same device and inode), so a directory moved
  underneath us fails closed instead of leading outside;
- a symlink is read (``readlinkat``) and its target spliced into the remaining components, under
  the same rules; an absolute target is refused, and at most ``MAX_SYMLINK_FOLLOWS`` are followed;
- the last component is handed back as ``(dir_fd, name)`` for the caller's final ``*at`` call,
  which again never follows a symlink (``O_NOFOLLOW``, ``AT_SYMLINK_NOFOLLOW``): a symlink
  swapped in after resolution is acted on as a link, never followed (the CVE-2024-38358 class).

Only one walk descriptor is open at a time, whatever the depth.
"""

from __future__ import annotations

import errno as host_errno
import os
from collections.abc import Callable
from types import TracebackType
from typing import Final

from . import limits
from .errno import Errno, WasiError

# Walk descriptors only name a directory for the next *at call: O_PATH needs no read permission
# and reads nothing. Without O_PATH (non-Linux), a read-only open serves the same purpose.
O_PATH: Final = getattr(os, "O_PATH", 0)
WALK_FLAGS: Final = (
    (O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
)  # fmt: skip
DIR_OPEN_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Added to every final open: never follow a symlink (the walk does that, inside the mount), never
# block on opening a FIFO or device someone left in a mount, never acquire a terminal.
OPEN_ALWAYS: Final = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
# Files are created rw for everyone, minus the host's umask, as open(2) callers usually ask.
CREATE_FILE_MODE: Final = 0o666

Ident = tuple[int, int]
"""(st_dev, st_ino): what a directory is, independent of the names it has."""


def ident_of(fd: int) -> Ident:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def check_path(raw: bytes) -> bytes:
    """A guest path, validated before anything touches the host."""
    if len(raw) > limits.MAX_PATH_BYTES:
        raise WasiError(Errno.NAMETOOLONG)
    if b"\0" in raw:
        raise WasiError(Errno.INVAL)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WasiError(Errno.ILSEQ) from None
    return raw


def readlink_at(dir_fd: int, name: bytes) -> bytes | None:
    """The target of ``name`` if it is a symlink, else None (errors other than "not a link"
    propagate)."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (host_errno.EINVAL, host_errno.ENOENT):
            return None
        raise


def _components(path: bytes) -> list[bytes]:
    parts = [c for c in path.split(b"/") if c and c != b"."]
    for c in parts:
        if len(c) > limits.MAX_NAME_BYTES:
            raise WasiError(Errno.NAMETOOLONG)
    return parts


def _names_a_directory(path: bytes) -> bool:
    """A trailing ``/``, ``/.`` or ``/..`` says the path must name a directory."""
    last = path.rstrip(b"/").rsplit(b"/", 1)[-1]
    return path.endswith(b"/") or last in (b".", b"..")


Meter = Callable[[int], None]
"""Told the number of each component a walk is about to resolve (1, 2, ...), before its system
calls: the WASI profile charges fuel from it (and ends a guest that cannot pay)."""


class PathWalk:
    """One resolution of ``path`` relative to the directory ``base_fd`` (identity ``base_id``).

    Use as a context manager; :meth:`walk` gives ``(dir_fd, name, must_be_dir)`` where ``name``
    is one component (or ``b"."`` for the directory itself) and ``dir_fd`` stays valid until the
    walk is closed. :meth:`follow` continues through a symlink found at ``name``. ``meter``, if
    given, is called before each component is resolved (see :data:`Meter`).
    """

    def __init__(
        self, base_fd: int, base_id: Ident, path: bytes, meter: Meter | None = None
    ) -> None:
        check_path(path)
        if not path:
            raise WasiError(Errno.NOENT)
        if path.startswith(b"/"):
            # Preview1 paths are relative to a directory descriptor; an absolute one would
            # escape it.
            raise WasiError(Errno.PERM)
        self._base_fd = base_fd
        self._fd = base_fd
        self._owned = False
        self._ids: list[Ident] = [base_id]
        self._pending = list(reversed(_components(path)))
        self._must_dir = _names_a_directory(path)
        self._follows = 0
        self._steps = 0
        self._meter = meter

    def __enter__(self) -> PathWalk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self._owned = False
            os.close(self._fd)
        self._fd = self._base_fd

    @property
    def must_dir(self) -> bool:
        """The path ends in ``/`` (or ``.``/``..``): it names a directory, so a symlink in its
        last component is followed, as POSIX resolves ``link/``."""
        return self._must_dir

    @property
    def depth(self) -> int:
        """Directories below the base that the walk currently stands in."""
        return len(self._ids) - 1

    def _enter(self, fd: int, owned: bool) -> None:
        if self._owned:
            os.close(self._fd)
        self._fd = fd
        self._owned = owned

    def _up(self) -> None:
        if len(self._ids) == 1:
            raise WasiError(Errno.PERM)  # above the base directory: an escape
        if len(self._ids) == 2:
            self._ids.pop()
            self._enter(self._base_fd, owned=False)
            return
        fd = os.open(b"..", WALK_FLAGS, dir_fd=self._fd)
        try:
            if ident_of(fd) != self._ids[-2]:
                raise WasiError(Errno.NOENT)  # moved underneath us: fail closed
        except BaseException:
            os.close(fd)
            raise
        self._ids.pop()
        self._enter(fd, owned=True)

    def _down(self, name: bytes) -> None:
        try:
            fd = os.open(name, WALK_FLAGS, dir_fd=self._fd)
        except OSError as exc:
            if exc.errno in (host_errno.ELOOP, host_errno.ENOTDIR):
                target = readlink_at(self._fd, name)
                if target is not None:
                    self._splice(target)
                    return
            raise
        try:
            ident = ident_of(fd)
        except BaseException:
            os.close(fd)
            raise
        self._ids.append(ident)
        self._enter(fd, owned=True)

    def _splice(self, target: bytes) -> None:
        self._follows += 1
        if self._follows > limits.MAX_SYMLINK_FOLLOWS:
            raise WasiError(Errno.LOOP)
        if not target:
            raise WasiError(Errno.NOENT)
        if target.startswith(b"/"):
            raise WasiError(Errno.PERM)  # an absolute target points outside the mount's tree
        self._pending.extend(reversed(_components(target)))

    def walk(self) -> tuple[int, bytes, bool]:
        """Resolve every component but the last; the last is not looked at."""
        pending = self._pending
        while pending:
            name = pending.pop()
            self._steps += 1
            if self._steps > limits.MAX_WALK_STEPS:
                raise WasiError(Errno.LOOP)
            if self._meter is not None:
                self._meter(self._steps)
            if name == b"..":
                self._up()
                continue
            if not pending:
                return self._fd, name, self._must_dir
            self._down(name)
        return self._fd, b".", True

    def follow(self, target: bytes) -> tuple[int, bytes, bool]:
        """The last component was a symlink with ``target``: continue through it."""
        self._must_dir = self._must_dir or _names_a_directory(target)
        self._splice(target)
        return self.walk()

    def walk_following(self) -> tuple[int, bytes, bool]:
        """Resolve the whole path, following a symlink in the last component too."""
        dir_fd, name, must_dir = self.walk()
        while name != b".":
            target = readlink_at(dir_fd, name)
            if target is None:
                break
            dir_fd, name, must_dir = self.follow(target)
        return dir_fd, name, must_dir


def open_walked(
    walk: PathWalk,
    flags: int,
    mode: int,
    *,
    follow: bool,
    creating: Callable[[], None] | None = None,
) -> int:
    """Open the walk's path with ``flags`` (:data:`OPEN_ALWAYS` added) and return the host
    descriptor: the one final ``openat`` of every open below a mount, for the WASI profile's
    ``path_open`` and the files broker alike.

    A symlink in the last component is refused by ``O_NOFOLLOW`` (``ELOOP``, or ``ENOTDIR`` when
    ``O_DIRECTORY`` is checked first); it is continued through by the walk, inside the mount,
    if ``follow`` or the path names a directory, and answers ``LOOP`` otherwise.

    ``creating``, with ``O_CREAT`` in ``flags``: the file is first opened without ``O_CREAT``,
    and only if it is missing is ``creating`` called (it may raise: nothing is made) before the
    open that makes it, so a caller can pay for what is made, in the same walk."""
    flags |= OPEN_ALWAYS
    dir_fd, name, must_dir = walk.walk()
    while True:
        final = flags | (os.O_DIRECTORY if must_dir else 0)
        try:
            if creating is not None and final & os.O_CREAT:
                try:
                    return os.open(name, final & ~os.O_CREAT, mode, dir_fd=dir_fd)
                except FileNotFoundError:
                    creating()
            return os.open(name, final, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (host_errno.ELOOP, host_errno.ENOTDIR):
                raise
            target = readlink_at(dir_fd, name)
            if target is None:
                raise
            if not (follow or must_dir):
                raise WasiError(Errno.LOOP) from None
            dir_fd, name, must_dir = walk.follow(target)


def open_beneath(
    base_fd: int,
    base_id: Ident,
    path: bytes,
    flags: int,
    mode: int,
    *,
    follow: bool,
    meter: Meter | None = None,
    creating: Callable[[], None] | None = None,
) -> int:
    """:func:`open_walked` for ``path`` resolved from the directory ``base_fd``; ``meter``
    as :class:`PathWalk`'s, ``creating`` as :func:`open_walked`'s."""
    with PathWalk(base_fd, base_id, path, meter) as walk:
        return open_walked(walk, flags, mode, follow=follow, creating=creating)


__all__ = [
    "CREATE_FILE_MODE",
    "DIR_OPEN_FLAGS",
    "OPEN_ALWAYS",
    "WALK_FLAGS",
    "Ident",
    "Meter",
    "PathWalk",
    "check_path",
    "ident_of",
    "open_beneath",
    "open_walked",
]
