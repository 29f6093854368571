"""The files broker: a guest reads and writes files through handles, never through host paths.

``file_open`` names a mount the operator granted (or the embedder configured) and a relative
path; the path is resolved by the WASI profile's own resolution
(:func:`wasihost.wasi.fs.open_beneath`: ``openat`` one component at a time with ``O_NOFOLLOW``,
``..`` never above the mount, symlinks followed only inside it), so there is one implementation
of the part where escapes live. ``file_temp`` makes a private, nameless temporary file that
expires. Everything a guest gets back is a number: a handle of its own extension's table,
bytes, or a count; no host path appears in any response or status.

Every bound is per call (the registry's payload limits, :data:`MAX_IO_BYTES`) and per extension
(:data:`MAX_OPEN_FILES` handles, a quota of bytes written, a size ceiling per file). Opening to
create, creating a temporary file and writing commit through the grant table, so nothing lands
after a revocation returns.
"""

from __future__ import annotations

import contextlib
import errno as host_errno
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..core.budgets import Resource
from ..core.errors import ConfigError
from ..core.limits import MAX_OPEN_FILES  # open handles per extension (see there)
from ..core.status import HostStatus, Status
from ..wasi import limits as wasi_limits
from ..wasi.errno import Errno, WasiError, from_oserror
from ..wasi.fs import (
    CREATE_FILE_MODE,
    DIR_OPEN_FLAGS,
    Meter,
    check_path,
    ident_of,
    open_beneath,
)
from .file_mounts import (
    FileMount,
    FilesScope,
    check_mount_name,
    parse_mounts,
    parse_scope,
    require_directories,
)

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

__all__ = [
    "DEFAULT_MAX_TEMP_BYTES",
    "DEFAULT_MAX_WRITE_BYTES",
    "DEFAULT_TEMP_TTL_S",
    "MAX_IO_BYTES",
    "MAX_OPEN_FILES",
    "MAX_PATH_BYTES",
    "FileMount",
    "FilesBroker",
]

CAPABILITY: Final = "files"
MiB: Final = 1024 * 1024

# Bytes one file_read returns or one file_write takes: the registry's bound (file_read's
# response limit, file_write's request limit, less CBOR framing). Bigger files take more calls.
MAX_IO_BYTES: Final = 32768
# file_open's path, as the registry says (its 1200-byte request leaves room for the rest).
MAX_PATH_BYTES: Final = 1024
# Bytes one extension may write in its lifetime unless its grant scope or the embedder says
# otherwise: enough for logs, caches and exports, small next to a host's disk.
DEFAULT_MAX_WRITE_BYTES: Final = 64 * MiB
# One temporary file's size: scratch space for a call's work, not storage.
DEFAULT_MAX_TEMP_BYTES: Final = 16 * MiB
# How long a temporary file lives if its handle is never closed: longer than any call
# (minutes), short enough that an extension cannot hoard disk between calls.
DEFAULT_TEMP_TTL_S: Final = 600.0
# The broker's sweeper closes a temporary file when its time is up, whether or not its
# extension calls again (a file outlived its TTL until the next files call: red-team
# 2026-12-01, issue 28 item 17). It reads the clock again at least this often, so a file is
# closed within this of its time bound even on an injected clock that moves without telling.
MAX_SWEEP_WAIT_S: Final = 1.0
# How long shutdown() waits for the sweeper (it is at most one wait from seeing it).
SWEEPER_STOP_S: Final = 5.0
# A file under a mount cannot grow past this through the broker: the WASI profile's ceiling, so
# the two ways into a mount bound a file alike (a sparse write far out is refused too).
MAX_FILE_BYTES: Final = wasi_limits.MAX_FILE_BYTES
# What making a file under a mount counts against the write quota: a block and an inode, as the
# WASI profile counts it (wasi_limits.NEW_ENTRY_BYTES), so the two ways into a mount pay alike.
# Counting bytes alone let a guest with a quota of 0 create any number of empty files (each a
# 255-byte name in a directory and an inode of the host's disk) for file_open's price.
NEW_ENTRY_BYTES: Final = wasi_limits.NEW_ENTRY_BYTES
# The host's off_t: an offset beyond it is not a place in any file.
MAX_OFFSET: Final = (1 << 63) - 1
# Handles are CBOR uints (the registry's 9-byte response).
MAX_HANDLE: Final = (1 << 64) - 1
TEMP_PREFIX: Final = "wasihost-files-"
# The path walk's price. file_open's base price covers a walk of WALK_STEPS_IN_BASE components
# (a plain path); each further step (a component, or a symlink's target component: an openat
# and an fstat, or a readlinkat) is charged FUEL_PER_WALK_STEP before it is walked, through the
# call, so a guest whose budget runs out stops the walk part-way (out_of_fuel, nothing opened).
# Measured (benchmarks/bench_hostcall_prices.py): a step costs the host about 1.8 us of CPU on
# the loaded 2-core machine (up to 2.7 us in a busy round), and guest code about 0.09 ns a
# unit; 4,000 units a step keeps the walk within about 10x of guest code. Unpriced, a
# 4,096-step walk through a symlink chain (the resolution's own bound) cost ~7 ms of host CPU
# for file_open's flat price.
WALK_STEPS_IN_BASE: Final = 8
FUEL_PER_WALK_STEP: Final = 4_000

# mode -> (open flags, readable, writable, append, creates)
MODES: Final[Mapping[str, tuple[int, bool, bool, bool, bool]]] = {
    "r": (os.O_RDONLY, True, False, False, False),
    "w": (os.O_WRONLY | os.O_CREAT | os.O_TRUNC, False, True, False, True),
    "rw": (os.O_RDWR, True, True, False, False),
    "a": (os.O_WRONLY | os.O_CREAT | os.O_APPEND, False, True, True, True),
}

# What a failed resolution or system call tells the guest: a status, never the host's text.
_ERRNO_STATUS: Final[Mapping[Errno, Status]] = {
    Errno.PERM: Status.DENIED,  # `..` above the mount, an absolute symlink target
    Errno.ACCES: Status.DENIED,
    Errno.ROFS: Status.DENIED,
    Errno.ISDIR: Status.DENIED,  # only regular files are handed out
    Errno.LOOP: Status.DENIED,  # too many symlinks or components: resolution refused
    Errno.NOENT: Status.NOT_FOUND,
    Errno.NOTDIR: Status.NOT_FOUND,
    Errno.NAMETOOLONG: Status.INVALID_ARGUMENT,
    Errno.ILSEQ: Status.INVALID_ARGUMENT,
    Errno.INVAL: Status.INVALID_ARGUMENT,
    Errno.NOSPC: Status.QUOTA_EXCEEDED,
    Errno.DQUOT: Status.QUOTA_EXCEEDED,
    Errno.FBIG: Status.QUOTA_EXCEEDED,
}


def _status_of(exc: OSError | WasiError) -> HostStatus:
    errno = exc.errno if isinstance(exc, WasiError) else from_oserror(exc)
    return HostStatus(_ERRNO_STATUS.get(errno, Status.UNAVAILABLE))


def _byte_string_size(n: int) -> int:
    """The bytes a CBOR byte string of ``n`` bytes takes (its head, then the bytes)."""
    if n < 24:
        return 1 + n
    if n < 0x100:
        return 2 + n
    if n < 0x10000:
        return 3 + n
    return 5 + n


def _invalid() -> HostStatus:
    return HostStatus(Status.INVALID_ARGUMENT)


def _uint(value: Any, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise _invalid()
    return value


def _offset(value: Any) -> int | None:
    return None if value is None else _uint(value, MAX_OFFSET)


def parse_open(request: Any) -> tuple[str, bytes, str]:
    """``[mount, path, mode]``, checked whole before any I/O."""
    if not isinstance(request, list) or len(request) != 3:
        raise _invalid()
    mount, path, mode = request
    if not all(isinstance(v, str) for v in request) or mode not in MODES:
        raise _invalid()
    try:
        check_mount_name(mount)
        raw = path.encode("utf-8")
    except (ConfigError, UnicodeEncodeError):
        raise _invalid() from None
    # Empty, absolute, over the registry's length, or naming a directory (a trailing "/", "."
    # or ".."): not a file under the mount, whatever the disk holds.
    if (
        not raw
        or raw.startswith(b"/")
        or len(raw) > MAX_PATH_BYTES
        or raw.endswith(b"/")
        or raw.rsplit(b"/", 1)[-1] in (b".", b"..")
    ):
        raise _invalid()
    try:
        check_path(raw)  # the WASI profile's own check: NUL, length, UTF-8
    except WasiError:
        raise _invalid() from None
    if any(len(c) > wasi_limits.MAX_NAME_BYTES for c in raw.split(b"/")):
        raise _invalid()
    return mount, raw, mode


def parse_io(request: Any, data_kind: type) -> tuple[int, int | None, Any]:
    """``[handle, offset | null, length or data]``: the third item's type is checked here,
    its bound by the caller."""
    if not isinstance(request, list) or len(request) != 3:
        raise _invalid()
    handle = _uint(request[0], MAX_HANDLE)
    offset = _offset(request[1])
    if not isinstance(request[2], data_kind) or isinstance(request[2], bool):
        raise _invalid()
    return handle, offset, request[2]


@attrs.define(eq=False)
class OpenFile:
    """One handle: a host descriptor and what the guest may do with it."""

    fd: int
    readable: bool
    writable: bool
    append: bool
    max_size: int
    # The mount it was opened under (None: a temporary file); checked on every use, so a
    # mount the operator withdraws stops serving the handles opened under it.
    mount: str | None = None
    host: Path | None = None
    expires: float | None = None
    position: int = 0

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class _HandlesFull(HostStatus):
    """QUOTA_EXCEEDED for a handle over MAX_OPEN_FILES: the handler reports it to the
    governor once out of the state's lock."""


class FilesState:
    """One extension's handles, bytes written and temporary directory."""

    def __init__(self, ext: ExtensionView) -> None:
        self.ext = ext
        # Taken through locked(). Reentrant: a commit made under it may sync the grants, and
        # a revocation it finds withdraws ``files`` (FilesBroker.withdraw) on the same thread.
        self.lock = threading.RLock()
        # ``files`` was withdrawn while another thread held the lock: its holder, or the next
        # to take it, closes every handle (settle) before anything else.
        self.withdrawn = False
        self.handles: dict[int, OpenFile] = {}
        # Handle numbers are never reused, so a stale handle cannot come to name a new file.
        self.next_handle = 1
        self.written = 0
        self.temp_dir: str | None = None
        self.closed = False
        # The grant epoch the scope was last parsed for, with the scope. One attribute,
        # replaced whole: concurrent calls of a pooled extension read and fill it, and two
        # stored one after the other let a call of a new grant read the new epoch with the
        # mounts a stale call had just parsed (red-team 2026-12-01).
        self.scoped: tuple[int, FilesScope] | None = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The state's lock, with a withdrawal that came while another thread held it carried
        out as it is taken and before it is given up, and, if one came just after that, at
        once after (FilesBroker.withdraw never waits for the lock)."""
        with self.lock:
            self.settle()
            try:
                yield
            finally:
                self.settle()
        if self.withdrawn and self.lock.acquire(blocking=False):
            try:
                self.settle()
            finally:
                self.lock.release()

    def withdraw(self) -> bool:
        """Close every handle now if no other thread holds the lock, else as its holder gives
        it up (or the next takes it); True if they are closed."""
        self.withdrawn = True
        if not self.lock.acquire(blocking=False):
            return False
        try:
            self.settle()
        finally:
            self.lock.release()
        return True

    def settle(self) -> None:
        """Carry out a withdrawal that came meanwhile (called under the lock)."""
        if self.withdrawn:
            self.withdrawn = False
            self.close_handles()

    def sweep(self, now: float) -> None:
        """Close the temporary files whose time is up (called under the lock)."""
        if self.closed:
            raise HostStatus(Status.UNAVAILABLE)
        for handle, f in list(self.handles.items()):
            if f.expires is not None and now >= f.expires:
                del self.handles[handle]
                f.close()

    def next_expiry(self) -> float | None:
        """When its next temporary file expires (called under the lock); None: it has none."""
        expiries = [f.expires for f in self.handles.values() if f.expires is not None]
        return min(expiries, default=None)

    def get(self, handle: int) -> OpenFile:
        f = self.handles.get(handle)
        if f is None:
            raise HostStatus(Status.NOT_FOUND)
        return f

    def require_room(self) -> None:
        if len(self.handles) >= MAX_OPEN_FILES:
            raise _HandlesFull(Status.QUOTA_EXCEEDED)

    def add(self, f: OpenFile) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = f
        return handle

    def close(self) -> None:
        with self.locked():
            self.closed = True
            self.close_handles()

    def close_handles(self) -> None:
        """Close every handle and remove the temporary directory (called under the lock):
        the extension closes, or ``files`` is withdrawn. Handle numbers go on from where they
        were, and the bytes written stay counted."""
        handles, self.handles = self.handles, {}
        for f in handles.values():
            f.close()
        if self.temp_dir is not None:
            # Not empty only if something else put a file there: left to the operator.
            with contextlib.suppress(OSError):
                os.rmdir(self.temp_dir)
            self.temp_dir = None


Handler = Callable[[Any, Any], Any]


class FilesBroker:
    """Serves ``file_open``, ``file_temp``, ``file_read``, ``file_write`` and ``file_close``.

    ``mounts`` are available to every extension granted ``files`` (``{"name": FileMount}`` or
    ``{"name": {"host": "/abs", "mode": "r" | "rw"}}``); each extension's grant scope adds its
    own. ``max_write_bytes`` is an extension's write quota unless its scope sets one.
    ``clock`` (seconds, monotonic) decides when temporary files expire."""

    name = "files"
    capabilities = frozenset({CAPABILITY})
    functions = (
        "wasihost_v1.file_open",
        "wasihost_v1.file_temp",
        "wasihost_v1.file_read",
        "wasihost_v1.file_write",
        "wasihost_v1.file_close",
    )

    def __init__(
        self,
        mounts: Mapping[str, Any] | None = None,
        *,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
        max_temp_bytes: int = DEFAULT_MAX_TEMP_BYTES,
        temp_ttl_s: float = DEFAULT_TEMP_TTL_S,
        temp_dir: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mounts = parse_mounts(mounts or {})
        require_directories(self.mounts)
        parse_scope({"max_write_bytes": max_write_bytes})  # the same bounds as a scope's
        if isinstance(max_temp_bytes, bool) or not 0 < max_temp_bytes <= MAX_FILE_BYTES:
            raise ConfigError(f"max_temp_bytes must be in 1..{MAX_FILE_BYTES}")
        if not temp_ttl_s > 0:
            raise ConfigError("temp_ttl_s must be positive")
        self.max_write_bytes = max_write_bytes
        self.max_temp_bytes = max_temp_bytes
        self.temp_ttl_s = float(temp_ttl_s)
        if temp_dir is not None and not Path(temp_dir).is_dir():
            raise ConfigError(f"temp_dir {temp_dir} is not a directory")
        self.temp_dir = str(temp_dir) if temp_dir is not None else None
        self.clock = clock
        # The sweeper's schedule: each extension holding temporary files, with when the first
        # of them expires (under _sweeping; a state's lock may be held when it is taken, never
        # the other way round). One thread, running while the schedule is not empty.
        self._sweeping = threading.Condition()
        self._expiries: dict[FilesState, float] = {}
        self._sweeper: threading.Thread | None = None
        self._stopped = False

    # -- configuration --------------------------------------------------------------------

    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        parsed = parse_scope(scope)
        clash = sorted(set(parsed.mounts) & set(self.mounts))
        if clash:
            raise ConfigError(
                f"files grant scope: mount {', '.join(clash)} is the embedder's already"
            )
        require_directories(parsed.mounts)

    def _scope(self, st: FilesState) -> FilesScope:
        """The extension's scope as of the call's grant epoch: parsed once per epoch, since
        any grant change (a new scope included) moves the epoch."""
        epoch = st.ext.call_epoch
        scoped = st.scoped
        if scoped is None or scoped[0] != epoch:
            try:
                scoped = (epoch, parse_scope(st.ext.grant_scopes().get(CAPABILITY, {})))
            except ConfigError:
                # Stored before this broker could check it: what it says cannot be trusted.
                raise HostStatus(Status.DENIED) from None
            st.scoped = scoped
        return scoped[1]

    def _mount(self, st: FilesState, name: str) -> FileMount | None:
        return self.mounts.get(name) or self._scope(st).mounts.get(name)

    def _quota(self, st: FilesState) -> int:
        quota = self._scope(st).max_write_bytes
        return self.max_write_bytes if quota is None else quota

    # -- the Broker protocol --------------------------------------------------------------

    def open(self, ext: ExtensionView) -> FilesState:
        return FilesState(ext)

    def usage(self, state: FilesState) -> dict[str, int]:
        """budgets: the handles the extension holds open now (Extension.usage)."""
        with state.locked():
            return {"open_handles": len(state.handles)}

    def close(self, state: FilesState) -> None:
        state.close()
        with self._sweeping:
            self._expiries.pop(state, None)
            self._sweeping.notify_all()

    def withdraw(self, state: FilesState, capabilities: frozenset[str]) -> None:
        """``files`` was withdrawn (Extension.withdraw: a revocation, here or by another host,
        or a policy no longer allowing it): every handle, of a mounted or a temporary file,
        is closed now, so a grant given again later starts with none (re-checked at each use
        but never ended, they outlived a revocation followed by a new grant)."""
        if CAPABILITY not in capabilities:
            return
        # Never waiting for the state's lock: the host may withdraw on a thread in a files
        # call of another extension, committing (its grant sync finds the revocation), while
        # a files call of this one, holding this lock, commits and syncs too, and would
        # withdraw that other extension's: two threads, each waiting for the other's lock.
        # A call holding it closes the handles as it ends; that call was authorised before
        # the revocation, and nothing it adds commits after it (see _open).
        if state.withdraw():
            with self._sweeping:
                self._expiries.pop(state, None)
                self._sweeping.notify_all()

    def shutdown(self) -> None:
        """Stop the sweeper (the host calls this when it closes, after its extensions)."""
        with self._sweeping:
            self._stopped = True
            self._expiries.clear()
            sweeper, self._sweeper = self._sweeper, None
            self._sweeping.notify_all()
        if sweeper is not None and sweeper is not threading.current_thread():
            sweeper.join(SWEEPER_STOP_S)

    # -- the sweeper ----------------------------------------------------------------------

    def _schedule_sweep(self, st: FilesState, expires: float) -> None:
        """``st`` (its lock held) has a temporary file expiring at ``expires``."""
        with self._sweeping:
            if self._stopped:
                return
            due = self._expiries.get(st)
            if due is None or expires < due:
                self._expiries[st] = expires
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep_expired, name="wasihost-files-sweeper", daemon=True
                )
                self._sweeper.start()
            self._sweeping.notify_all()

    def _sweep_expired(self) -> None:
        """The sweeper thread: close every temporary file when its time is up."""
        while True:
            with self._sweeping:
                while True:
                    if self._stopped or not self._expiries:
                        if self._sweeper is threading.current_thread():
                            self._sweeper = None
                        return
                    now = self.clock()
                    due = [st for st, at in self._expiries.items() if at <= now]
                    if due:
                        break
                    wait = min(self._expiries.values()) - now
                    self._sweeping.wait(min(wait, MAX_SWEEP_WAIT_S))
            for st in due:
                with st.locked():
                    if not st.closed:
                        st.sweep(now)
                    upcoming = None if st.closed else st.next_expiry()
                    with self._sweeping:
                        if upcoming is None:
                            self._expiries.pop(st, None)
                        elif st in self._expiries:
                            self._expiries[st] = upcoming

    def handler(self, entry: HostFunction, state: FilesState) -> Handler:
        if entry.name == "file_read":

            def read(call: Any, request: Any) -> bytes:
                # The engine's response room: a read that cannot be answered moves nothing.
                return self._read(state, request, getattr(call, "room", None))

            return read
        if entry.name == "file_open":

            def open_file(call: Any, request: Any) -> int:
                try:
                    return self._open(state, request, _walk_meter(call))
                except _HandlesFull:
                    self._handles_full(state)
                    raise

            return open_file
        serve: Callable[[FilesState, Any], Any] = {
            "file_temp": self._temp,
            "file_write": self._write,
            "file_close": self._close,
        }[entry.name]

        def handle(call: Any, request: Any) -> Any:
            try:
                return serve(state, request)
            except _HandlesFull:
                self._handles_full(state)
                raise

        return handle

    @staticmethod
    def _handles_full(state: FilesState) -> None:
        """budgets: the open_handles level refused one; its action fires (here, out of the
        state's lock: the governor may stop calls and move the lifecycle)."""
        ext = state.ext
        ext.host.governor.level_crossed(
            ext,
            Resource.OPEN_HANDLES,
            MAX_OPEN_FILES,
            MAX_OPEN_FILES,
            "an open was refused: the extension holds its maximum of handles",
            in_call=True,
        )

    # -- the entries ----------------------------------------------------------------------

    def _commit(self, st: FilesState, action: Callable[[], Any]) -> Any:
        authorised, result = st.ext.commit(CAPABILITY, action)
        if not authorised:
            raise HostStatus(Status.DENIED)
        return result

    def _open(self, st: FilesState, request: Any, meter: Meter | None = None) -> int:
        """``meter``: told each step of the path walk before it is taken (the call's charge)."""
        name, path, mode = parse_open(request)
        flags, readable, writable, append, creates = MODES[mode]
        mount = self._mount(st, name)
        if mount is None or (writable and not mount.writable):
            raise HostStatus(Status.DENIED)
        with st.locked():
            st.sweep(self.clock())
            st.require_room()
            if creates:
                fd = self._commit(st, lambda: self._open_creating(st, mount, path, flags, meter))
                opened = OpenFile(fd, readable, writable, append, MAX_FILE_BYTES, name, mount.host)
                return st.add(opened)
            fd = _open_file(mount.host, path, flags, meter)
            opened = OpenFile(fd, readable, writable, append, MAX_FILE_BYTES, name, mount.host)
            # The handle is taken through the grant table, as a creating open's file is made:
            # a call authorised before a revocation (whose withdrawal closed the handles
            # already) holds nothing after it returns.
            try:
                handle: int = self._commit(st, lambda: st.add(opened))
            except BaseException:
                opened.close()
                raise
            return handle

    def _open_creating(
        self, st: FilesState, mount: FileMount, path: bytes, flags: int, meter: Meter | None
    ) -> int:
        """Open for ``w`` or ``a`` (under the state's lock, inside the commit): an existing
        file as it is, for nothing; a missing one is made only if the write quota can pay
        :data:`NEW_ENTRY_BYTES` for it, which it then pays (once, in the same walk, so that
        reopening a file to append to it once a call costs no quota)."""
        made = False

        def creating() -> None:
            nonlocal made
            if st.written + NEW_ENTRY_BYTES > self._quota(st):
                raise HostStatus(Status.QUOTA_EXCEEDED)
            made = True

        fd = _open_file(mount.host, path, flags, meter, creating)
        if made:
            st.written += NEW_ENTRY_BYTES
        return fd

    def _temp(self, st: FilesState, request: Any) -> int:
        if request is not None:
            raise _invalid()
        with st.locked():
            now = self.clock()
            st.sweep(now)
            st.require_room()
            fd = self._commit(st, lambda: self._temp_file(st))
            expires = now + self.temp_ttl_s
            handle = st.add(OpenFile(fd, True, True, False, self.max_temp_bytes, expires=expires))
            self._schedule_sweep(st, expires)
            return handle

    def _temp_file(self, st: FilesState) -> int:
        """A new temporary file that has no name: created nameless (``O_TMPFILE``) where the
        file system can, else unlinked at once, in a directory only the host can enter."""
        if st.temp_dir is None:
            try:
                st.temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=self.temp_dir)  # 0700
            except OSError:
                raise HostStatus(Status.UNAVAILABLE) from None  # the host's directory is gone
        try:
            tmpfile = getattr(os, "O_TMPFILE", 0)
            if tmpfile:
                try:
                    return os.open(st.temp_dir, tmpfile | os.O_RDWR | os.O_CLOEXEC, 0o600)
                except OSError as exc:
                    # The file system cannot make nameless files: fall back to unlinking.
                    if exc.errno not in (
                        host_errno.EOPNOTSUPP,
                        host_errno.EISDIR,
                        host_errno.EINVAL,
                    ):
                        raise
            fd, name = tempfile.mkstemp(dir=st.temp_dir)
        except OSError as exc:
            raise _status_of(exc) from None
        try:
            os.unlink(name)
        except OSError:
            os.close(fd)
            raise HostStatus(Status.UNAVAILABLE) from None
        return fd

    def _file(self, st: FilesState, handle: int) -> OpenFile:
        """The handle's file, if it is still this extension's and its mount still granted."""
        st.sweep(self.clock())
        f = st.get(handle)
        if f.mount is not None:
            mount = self._mount(st, f.mount)
            if mount is None or mount.host != f.host or (f.writable and not mount.writable):
                raise HostStatus(Status.DENIED)
        return f

    def _read(self, st: FilesState, request: Any, room: int | None = None) -> bytes:
        """``room``: the response buffer the answer must fit (None: no engine said), checked
        before the position moves, so a read refused BUFFER_TOO_SMALL reads the same bytes
        when the guest retries with more room."""
        handle, offset, length = parse_io(request, int)
        _uint(length, MAX_IO_BYTES)
        with st.locked():
            f = self._file(st, handle)
            if not f.readable:
                raise HostStatus(Status.DENIED)
            at = f.position if offset is None else offset
            try:
                data = os.pread(f.fd, length, at)
            except OSError as exc:
                raise _status_of(exc) from None
            if room is not None and _byte_string_size(len(data)) > room:
                raise HostStatus(Status.BUFFER_TOO_SMALL)
            if offset is None:
                f.position += len(data)
            return data

    def _write(self, st: FilesState, request: Any) -> int:
        handle, offset, data = parse_io(request, bytes)
        if len(data) > MAX_IO_BYTES:
            raise _invalid()
        with st.locked():
            f = self._file(st, handle)
            if not f.writable:
                raise HostStatus(Status.DENIED)
            if f.append and offset is not None:
                raise _invalid()  # an append handle writes at the end, nowhere else
            try:
                size = os.fstat(f.fd).st_size
            except OSError as exc:
                raise _status_of(exc) from None
            at = size if f.append else f.position if offset is None else offset
            if at + len(data) > f.max_size:
                raise HostStatus(Status.QUOTA_EXCEEDED)
            # A write past the end leaves a hole the quota pays for too, as the WASI profile
            # counts it: otherwise one byte at 1 GiB - 1 made a 1 GiB file for one byte of
            # quota (an empty write extends nothing, so it pays nothing).
            hole = max(at - size, 0) if data else 0
            if st.written + len(data) + hole > self._quota(st):
                raise HostStatus(Status.QUOTA_EXCEEDED)

            def write() -> int:
                n = os.write(f.fd, data) if f.append else os.pwrite(f.fd, data, at)
                st.written += n + (hole if n else 0)
                return n

            try:
                n: int = self._commit(st, write)
            except OSError as exc:
                raise _status_of(exc) from None
            if offset is None:
                f.position = at + n
            return n

    def _close(self, st: FilesState, request: Any) -> None:
        handle = _uint(request, MAX_HANDLE)
        with st.locked():
            st.sweep(self.clock())
            f = st.handles.pop(handle, None)
            if f is None:
                raise HostStatus(Status.NOT_FOUND)
            f.close()


def _walk_meter(call: Any) -> Meter:
    """Charges each step of a walk past the base price's, before it is taken."""
    charge = call.charge

    def meter(step: int) -> None:
        if step > WALK_STEPS_IN_BASE:
            charge(FUEL_PER_WALK_STEP)

    return meter


def _open_file(
    root: Path,
    path: bytes,
    flags: int,
    meter: Meter | None = None,
    creating: Callable[[], None] | None = None,
) -> int:
    """A regular file at ``path`` under the mount directory ``root``, by the WASI profile's
    resolution (symlinks followed only while they stay inside the mount); ``meter`` is told
    each step before it is walked, and may end the walk by raising; ``creating`` is called
    before a missing file is made (:func:`~wasihost.wasi.fs.open_walked`)."""
    try:
        base = os.open(root, DIR_OPEN_FLAGS)
    except OSError:
        raise HostStatus(Status.UNAVAILABLE) from None  # the operator's directory is gone
    try:
        fd = open_beneath(
            base,
            ident_of(base),
            path,
            flags,
            CREATE_FILE_MODE,
            follow=True,
            meter=meter,
            creating=creating,
        )
    except (OSError, WasiError) as exc:
        raise _status_of(exc) from None
    finally:
        os.close(base)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostStatus(Status.DENIED)  # devices, FIFOs, sockets: not files to hand out
    except BaseException:
        os.close(fd)
        raise
    return fd
