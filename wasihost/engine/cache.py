"""The compiled-module cache: in memory, and on disk in a private, authenticated directory."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import threading
import warnings
from pathlib import Path

import wasmtime

from .cachedir import UnsafeCacheDir, open_private_dir
from .compiler import ModuleCompiler
from .lowlevel import WASMTIME_VERSION

# Compiled modules kept in memory per engine; each is a few MB of machine code at most.
MAX_CACHED_MODULES = 64
# Digests of recently seen module bytes, keyed by the bytes (a bytes object caches its own hash,
# so the same object is found without a pass over it): re-admitting a module skips hashing it
# (about 30 µs for 44 KB). Bounded in entries and in the bytes the keys keep alive (32 x 1 MiB).
DIGEST_MEMO_ENTRIES = 32
DIGEST_MEMO_MAX_MODULE_BYTES = 1024 * 1024
# The host-local MAC key; 32 bytes is HMAC-SHA256's natural key size.
CACHE_KEY_BYTES = 32
CACHE_MAC_BYTES = 32
KEY_NAME = "hmac.key"
# An entry is compiled code the host wrote itself: the compile worker's artifact limit bounds
# it (compiler.MAX_ARTIFACT_BYTES); a bigger file in the directory is not ours to read.
MAX_ENTRY_BYTES = CACHE_MAC_BYTES + 512 * 1024 * 1024
_FILE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_file(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A regular file of ours under ``dir_fd``, at most ``limit`` bytes; None if absent."""
    try:
        fd = os.open(name, _FILE_READ, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > limit:
            raise OSError(f"{name} is not a regular file of this user within {limit} bytes")
        return f.read(limit + 1)


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, _FILE_CREATE, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class ModuleCache:
    """Compiled modules: in memory, and on disk in a private, authenticated directory.

    ``Module.deserialize`` trusts its input completely (tampered bytes crashed the process in
    16 of 60 single-byte flips), so a disk entry is loaded only if its HMAC under a host-local
    key verifies. Entries are keyed by the SHA-256 of the module bytes, computed here (never
    taken from the caller), the wasmtime version and the engine settings. The directory is
    opened once (see :mod:`.cachedir`) and every key and entry access goes through its handle.
    """

    def __init__(
        self,
        engine: wasmtime.Engine,
        fingerprint: str,
        directory: Path | None,
        compiler: ModuleCompiler,
    ) -> None:
        self._engine = engine
        self._compiler = compiler
        self._fingerprint = f"{WASMTIME_VERSION}-{fingerprint}"
        self._memory: collections.OrderedDict[str, wasmtime.Module] = collections.OrderedDict()
        self._digests: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        # Guards the directory handle against close() while an entry is read or written.
        self._dir_lock = threading.Lock()
        self._dir: Path | None = None
        self._dir_fd = -1
        self._key = b""
        self.hits = 0
        self.disk_hits = 0
        self.compiles = 0
        if directory is not None:
            self._open_dir(directory)

    @property
    def directory(self) -> Path | None:
        return self._dir

    def _open_dir(self, directory: Path) -> None:
        try:
            fd = open_private_dir(directory)
        except UnsafeCacheDir as exc:
            warnings.warn(f"module cache disabled: {exc}", stacklevel=4)
            return
        except OSError as exc:
            warnings.warn(f"module cache disabled: {directory}: {exc.strerror}", stacklevel=4)
            return
        try:
            key = self._load_key(fd)
        except OSError as exc:
            os.close(fd)
            reason = exc.strerror or str(exc)
            warnings.warn(f"module cache disabled: {directory}/{KEY_NAME}: {reason}", stacklevel=4)
            return
        self._dir, self._dir_fd, self._key = directory, fd, key

    @staticmethod
    def _load_key(dir_fd: int) -> bytes:
        key = _read_file(dir_fd, KEY_NAME, CACHE_KEY_BYTES)
        if key is None:
            # Written aside and linked into place, so a concurrent reader never sees half a key
            # and two hosts racing to create it end up sharing the first one.
            tmp = f".{KEY_NAME}.{secrets.token_hex(8)}.tmp"
            _write_new(dir_fd, tmp, secrets.token_bytes(CACHE_KEY_BYTES))
            try:
                os.link(tmp, KEY_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp, dir_fd=dir_fd)
            key = _read_file(dir_fd, KEY_NAME, CACHE_KEY_BYTES)
        if key is None or len(key) != CACHE_KEY_BYTES:
            raise OSError(f"the key is not {CACHE_KEY_BYTES} bytes")
        return key

    def close(self) -> None:
        """Release the directory handle; later misses compile and are kept in memory only."""
        with self._dir_lock:
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
            self._dir_fd = -1

    def _entry_name(self, sha256: str) -> str:
        return f"{sha256}-{self._fingerprint}.cwasm"

    def _mac(self, name: str, payload: bytes) -> bytes:
        return hmac.new(self._key, name.encode() + b"\0" + payload, hashlib.sha256).digest()

    def digest(self, wasm: bytes) -> str:
        """The SHA-256 (hex) of ``wasm``, remembered for the last few modules (see
        DIGEST_MEMO_ENTRIES): the same module admitted again is not hashed again."""
        if type(wasm) is not bytes or len(wasm) > DIGEST_MEMO_MAX_MODULE_BYTES:
            return hashlib.sha256(wasm).hexdigest()
        with self._lock:
            known = self._digests.get(wasm)
            if known is not None:
                self._digests.move_to_end(wasm)
                return known
        sha256 = hashlib.sha256(wasm).hexdigest()
        with self._lock:
            self._digests[wasm] = sha256
            while len(self._digests) > DIGEST_MEMO_ENTRIES:
                self._digests.popitem(last=False)
        return sha256

    def get(self, wasm: bytes) -> tuple[wasmtime.Module, str]:
        """The compiled module for ``wasm`` and the SHA-256 (hex) it is cached under."""
        sha256 = self.digest(wasm)
        with self._lock:
            module = self._memory.get(sha256)
            if module is not None:
                self._memory.move_to_end(sha256)
                self.hits += 1
                return module, sha256
        module = self._load(sha256)
        if module is None:
            module, artifact = self._compiler.compile(wasm)
            self.compiles += 1
            self._store(sha256, module, artifact)
        else:
            self.disk_hits += 1
        with self._lock:
            self._memory[sha256] = module
            while len(self._memory) > MAX_CACHED_MODULES:
                self._memory.popitem(last=False)
        return module, sha256

    def _load(self, sha256: str) -> wasmtime.Module | None:
        name = self._entry_name(sha256)
        with self._dir_lock:
            if self._dir_fd < 0:
                return None
            try:
                blob = _read_file(self._dir_fd, name, MAX_ENTRY_BYTES)
            except OSError:
                blob = b""
            if blob is None:
                return None
            mac, payload = blob[:CACHE_MAC_BYTES], blob[CACHE_MAC_BYTES:]
            if len(mac) != CACHE_MAC_BYTES or not hmac.compare_digest(
                mac, self._mac(name, payload)
            ):
                warnings.warn(
                    f"module cache entry {name} failed authentication; recompiling", stacklevel=4
                )
                self._unlink(name)
                return None
            try:
                return wasmtime.Module.deserialize(self._engine, payload)
            except wasmtime.WasmtimeError:
                self._unlink(name)
                return None

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self._dir_fd)

    def _store(self, sha256: str, module: wasmtime.Module, artifact: bytes | None) -> None:
        name = self._entry_name(sha256)
        with self._dir_lock:
            if self._dir_fd < 0:
                return
            payload = artifact if artifact is not None else bytes(module.serialize())
            tmp = f".{name}.{secrets.token_hex(8)}.tmp"
            try:
                _write_new(self._dir_fd, tmp, self._mac(name, payload) + payload)
                os.replace(tmp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            except OSError as exc:
                self._unlink(tmp)
                warnings.warn(f"module cache write failed: {exc.strerror}", stacklevel=4)
