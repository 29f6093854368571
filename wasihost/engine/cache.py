"""The compiled-module cache: in memory, and on disk in a private, authenticated directory."""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import secrets
import stat
import threading
import warnings
from pathlib import Path

import wasmtime

from ..errors import CallError, FailureClass
from .lowlevel import WASMTIME_VERSION, short_message

# Compiled modules kept in memory per engine; each is a few MB of machine code at most.
MAX_CACHED_MODULES = 64
# The host-local MAC key; 32 bytes is HMAC-SHA256's natural key size.
CACHE_KEY_BYTES = 32
CACHE_MAC_BYTES = 32

# ---------------------------------------------------------------------------------------------
# Compiled-module cache
# ---------------------------------------------------------------------------------------------


def _private_dir(path: Path) -> bool:
    """True if ``path`` is a directory only we can write (so nobody else can plant entries)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


class ModuleCache:
    """Compiled modules: in memory, and on disk in a private, authenticated directory.

    ``Module.deserialize`` trusts its input completely (tampered bytes crashed the process in
    16 of 60 single-byte flips), so a disk entry is loaded only if its HMAC under a host-local
    key verifies. Entries are keyed by module SHA-256, wasmtime version and engine settings.
    """

    def __init__(self, engine: wasmtime.Engine, fingerprint: str, directory: Path | None) -> None:
        self._engine = engine
        self._fingerprint = f"{WASMTIME_VERSION}-{fingerprint}"
        self._memory: collections.OrderedDict[str, wasmtime.Module] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._dir: Path | None = None
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
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            warnings.warn(f"module cache disabled: {directory}: {exc.strerror}", stacklevel=3)
            return
        if not _private_dir(directory):
            warnings.warn(
                f"module cache disabled: {directory} is not a private directory of this user",
                stacklevel=3,
            )
            return
        key_path = directory / "hmac.key"
        try:
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(CACHE_KEY_BYTES))
        try:
            fd = os.open(key_path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                key = f.read(CACHE_KEY_BYTES + 1)
        except OSError as exc:
            warnings.warn(f"module cache disabled: {key_path}: {exc.strerror}", stacklevel=3)
            return
        if len(key) != CACHE_KEY_BYTES:
            warnings.warn(f"module cache disabled: {key_path} is malformed", stacklevel=3)
            return
        self._dir = directory
        self._key = key

    def _entry_name(self, sha256: str) -> str:
        return f"{sha256}-{self._fingerprint}.cwasm"

    def _mac(self, name: str, payload: bytes) -> bytes:
        return hmac.new(self._key, name.encode() + b"\0" + payload, hashlib.sha256).digest()

    def get(self, wasm: bytes, sha256: str) -> wasmtime.Module:
        with self._lock:
            module = self._memory.get(sha256)
            if module is not None:
                self._memory.move_to_end(sha256)
                self.hits += 1
                return module
        module = self._load(sha256)
        if module is None:
            module = self._compile(wasm)
            self.compiles += 1
            self._store(sha256, module)
        else:
            self.disk_hits += 1
        with self._lock:
            self._memory[sha256] = module
            while len(self._memory) > MAX_CACHED_MODULES:
                self._memory.popitem(last=False)
        return module

    def _compile(self, wasm: bytes) -> wasmtime.Module:
        try:
            return wasmtime.Module(self._engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise CallError(
                FailureClass.ADMISSION, f"module does not validate: {short_message(str(exc))}"
            ) from None

    def _load(self, sha256: str) -> wasmtime.Module | None:
        if self._dir is None:
            return None
        name = self._entry_name(sha256)
        path = self._dir / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                blob = f.read()
        except OSError:
            return None
        mac, payload = blob[:CACHE_MAC_BYTES], blob[CACHE_MAC_BYTES:]
        if len(mac) != CACHE_MAC_BYTES or not hmac.compare_digest(mac, self._mac(name, payload)):
            warnings.warn(
                f"module cache entry {name} failed authentication; recompiling", stacklevel=3
            )
            path.unlink(missing_ok=True)
            return None
        try:
            return wasmtime.Module.deserialize(self._engine, payload)
        except wasmtime.WasmtimeError:
            path.unlink(missing_ok=True)
            return None

    def _store(self, sha256: str, module: wasmtime.Module) -> None:
        if self._dir is None:
            return
        name = self._entry_name(sha256)
        payload = bytes(module.serialize())
        tmp = self._dir / f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self._mac(name, payload) + payload)
            os.replace(tmp, self._dir / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            warnings.warn(f"module cache write failed: {exc.strerror}", stacklevel=3)
