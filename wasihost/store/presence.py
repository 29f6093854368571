"""The state directory's lock files (``locks/``), and the locks on them that say which hosts
on the directory have an extension admitted (:class:`Presence`).

Every lock here is an ``fcntl`` lock held through a descriptor: it goes with the process
holding it, so a killed host blocks nothing. The files are never removed, since a locked file
removed lets the next opener lock a new one beside it. Besides :class:`Presence`, an install,
update or rollback holds one per extension (``wasihost.host.updates.exclusive``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..core.errors import ConfigError, UpdateError

# Where the lock files are, in the state directory (made with the first of them).
LOCKS_DIR_NAME = "locks"


def lock_file(directory: Path, name: str) -> int:
    """The lock file ``locks/<name>``, made if missing; a ``ConfigError`` naming it if
    something else is in its place (a link or a directory was an internal error, exit 70)."""
    locks = directory / LOCKS_DIR_NAME
    path = locks / name
    try:
        locks.mkdir(mode=0o700, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        link = exc.errno == errno.ELOOP
        what = f"{path} is a symbolic link" if link else f"{path}: {exc.strerror}"
        raise ConfigError(
            f"state directory {directory} is damaged: {what}, where the host keeps a lock "
            "file; move it away while no host runs on the state directory"
        ) from None


# With Linux's open-file-description locks, a host's locks on every id are byte ranges of one
# file through one descriptor (a host may admit 10,000 extensions: a descriptor per id would
# pass the usual limit of 1,024). Elsewhere, one lock file per id (flock).
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
PRESENCE_NAME = "admitted"


def _slot(extension: str) -> int:
    """The byte of the presence file that stands for ``extension`` (62 bits of its hash: two
    ids sharing one would only refuse an update spuriously)."""
    return int.from_bytes(hashlib.sha256(extension.encode()).digest()[:8], "big") >> 2


class Presence:
    """Which hosts on one state directory have an extension admitted: each holds a shared lock
    for the id (a byte of ``locks/admitted``, or ``locks/<id>.admitted``) from the admission of
    its first extension of the id to the close of its last. An update, rollback or removal
    takes it exclusive for its whole transaction
    (:func:`wasihost.host.updates.exclusive` with ``alone``): refused
    while another host runs the extension, whose calls it could neither pause nor wait for (a
    checkpoint restored under them drops writes the guest was told are stored, and a switch
    leaves that host running the old version on the new version's data); and, meanwhile,
    another host's admission of it is refused. The locks go with the process holding them: a
    killed host blocks nothing."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}  # extensions of the id open in this host
        self._alone: set[str] = set()  # ids this host holds exclusive
        self._fd: int | None = None  # OFD locks: the one descriptor
        self._fds: dict[str, int] = {}  # flock: a descriptor per id

    def _set(self, extension: str, kind: int) -> bool:
        """Under ``_lock``: make this host's lock on the id ``kind`` (``F_RDLCK``,
        ``F_WRLCK``, ``F_UNLCK``) without waiting; False if another host's stands in the way
        (this host's lock is then as it was)."""
        if _OFD_SETLK is not None:
            if self._fd is None:
                self._fd = lock_file(self._directory, PRESENCE_NAME)
            request = struct.pack("hhqqi", kind, os.SEEK_SET, _slot(extension), 1, 0)
            try:
                fcntl.fcntl(self._fd, _OFD_SETLK, request)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return False
                raise
            return True
        fd = self._fds.get(extension)
        if kind == fcntl.F_UNLCK:
            if fd is not None:
                os.close(fd)
                del self._fds[extension]
            return True
        if fd is None:
            fd = self._fds[extension] = lock_file(self._directory, f"{extension}.admitted")
        try:
            fcntl.flock(
                fd, (fcntl.LOCK_SH if kind == fcntl.F_RDLCK else fcntl.LOCK_EX) | fcntl.LOCK_NB
            )
        except BlockingIOError:
            if self._count.get(extension):
                # flock's conversion is not atomic: the shared lock may be gone; take it again
                # (no other host holds it exclusive: that needs the transaction lock we hold).
                fcntl.flock(fd, fcntl.LOCK_SH)
            else:
                os.close(fd)
                del self._fds[extension]
            return False
        return True

    def enter(self, extension: str) -> None:
        """An extension of the id is being admitted here; :class:`UpdateError` if another
        host's update, rollback or removal of it is under way."""
        with self._lock:
            held = self._count.get(extension, 0)
            if (
                not held
                and extension not in self._alone
                and not self._set(extension, fcntl.F_RDLCK)
            ):
                raise UpdateError(
                    f"{extension}: an update, rollback or removal of it is under way in another "
                    "host; try again when it has ended"
                )
            self._count[extension] = held + 1

    def leave(self, extension: str) -> None:
        """An extension of the id closed here (or its admission failed)."""
        with self._lock:
            held = self._count.get(extension, 0) - 1
            if held > 0:
                self._count[extension] = held
                return
            self._count.pop(extension, None)
            if extension not in self._alone:
                self._set(extension, fcntl.F_UNLCK)

    @contextmanager
    def alone(self, extension: str) -> Iterator[None]:
        with self._lock:
            if not self._set(extension, fcntl.F_WRLCK):
                raise UpdateError(
                    f"{extension} is running in another host on this state directory (admitted "
                    "there): close it there first, an update, rollback or removal cannot pause "
                    "its calls"
                )
            self._alone.add(extension)
        try:
            yield
        finally:
            with self._lock:
                self._alone.discard(extension)
                # Open here still: shared again, so other hosts may admit it too.
                self._set(extension, fcntl.F_RDLCK if self._count.get(extension) else fcntl.F_UNLCK)

    def close(self) -> None:
        """The host closes: every lock goes."""
        with self._lock:
            for fd in [*self._fds.values(), *([self._fd] if self._fd is not None else [])]:
                os.close(fd)
            self._fds.clear()
            self._fd = None
            self._count.clear()
