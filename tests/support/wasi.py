"""Running WASI command modules in tests: through wasihost's profile, and through wasmtime's
built-in WASI as the reference host (allowed in tests only; the product never uses it)."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import wasmtime

from wasihost.brokers.log import ExtensionLog
from wasihost.core.guestmem import BytearrayMemory
from wasihost.core.sources import Clock, SystemClock
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host
from wasihost.packaging.package import Package
from wasihost.wasi import Mount, WasiBinding, WasiOptions, capabilities_for, wasi_profile
from wasihost.wasi.abi import ALL_RIGHTS, WRITE_ACCESS_RIGHTS
from wasihost.wasi.registry import CAPABILITIES, FUNCTIONS_BY_NAME
from wasihost.wasi.state import WasiState

READ_RIGHTS = ALL_RIGHTS & ~WRITE_ACCESS_RIGHTS

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
PROBE = FIXTURES / "wasi-probe" / "wasi-probe.wasm"
LIBC = FIXTURES / "wasi-libc" / "wasi-libc.wasm"
STD = FIXTURES / "wasi-std" / "wasi-std.wasm"
BENCH = FIXTURES / "wasi-bench" / "wasi-bench.wasm"


@attrs.frozen
class Run:
    code: int
    stdout: bytes
    stderr: bytes
    ext: Extension | None = attrs.field(default=None, eq=False)

    @property
    def lines(self) -> list[str]:
        return self.stdout.decode("utf-8", "replace").splitlines()


# One compiled-module cache for the whole test session: each test builds a Host for its own
# config, and without this every Host would compile the fixtures again.
CACHE_DIR = Path(tempfile.mkdtemp(prefix="wasihost-wasi-tests-"))
atexit.register(shutil.rmtree, CACHE_DIR, ignore_errors=True)


def package(path: Path | bytes, name: str = "guest.wasm") -> Package:
    wasm = path if isinstance(path, bytes) else path.read_bytes()
    return Package(name, None, wasm, hashlib.sha256(wasm).hexdigest())


def run_wasihost(
    module: Path | bytes,
    argv: Sequence[str] = ("guest.wasm",),
    *,
    mounts: Iterable[Mount] = (),
    env: Sequence[tuple[str, str]] = (),
    grants: Iterable[str] | None = None,
    config: WasiOptions | None = None,
    fuel: int = 2_000_000_000,
    timeout_ms: int = 20_000,
    host: Host | None = None,
    **config_kw: Any,
) -> Run:
    """Run ``_start``; stdout/stderr captured through caller sinks (``wasi.stdio``)."""
    out = bytearray()
    err = bytearray()
    if config is None:
        config = WasiOptions(
            argv=list(argv),
            env=list(env),
            mounts=list(mounts),
            stdout=out.extend,
            stderr=err.extend,
            **config_kw,
        )
    caps = capabilities_for(config) if grants is None else frozenset(grants)
    own = host is None
    if host is None:
        host = Host(Policy(allow=caps), cache_dir=CACHE_DIR, profiles=[wasi_profile(config)])
    try:
        ext = host.admit(package(module), grants=caps, fuel=fuel, timeout_ms=timeout_ms)
        code = ext.run_command()
    finally:
        if own:
            host.close()
    return Run(code, bytes(out), bytes(err), ext)


_REF_ENGINE = wasmtime.Engine()


def validates(wasm: bytes) -> bool:
    """Whether wasmtime's default configuration accepts ``wasm`` (growprobe's validator in
    tests that rewrite modules without a host)."""
    try:
        wasmtime.Module.validate(_REF_ENGINE, wasm)
    except wasmtime.WasmtimeError:
        return False
    return True


_REF_MODULES: dict[str, wasmtime.Module] = {}


def run_reference(
    module: Path,
    argv: Sequence[str] = ("guest.wasm",),
    *,
    mounts: Iterable[Mount] = (),
    env: Sequence[tuple[str, str]] = (),
) -> Run:
    """The same run on wasmtime's built-in WASI."""
    key = str(module)
    if key not in _REF_MODULES:
        _REF_MODULES[key] = wasmtime.Module.from_file(_REF_ENGINE, str(module))
    linker = wasmtime.Linker(_REF_ENGINE)
    linker.define_wasi()
    store = wasmtime.Store(_REF_ENGINE)
    cfg = wasmtime.WasiConfig()
    cfg.argv = list(argv)
    cfg.env = [[k, v] for k, v in env]
    for m in mounts:
        cfg.preopen_dir(str(m.host), m.guest, m.writable)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out")
        err_path = os.path.join(tmp, "err")
        cfg.stdout_file = out_path
        cfg.stderr_file = err_path
        store.set_wasi(cfg)
        instance = linker.instantiate(store, _REF_MODULES[key])
        start = instance.exports(store)["_start"]
        code = 0
        try:
            start(store)
        except wasmtime.ExitTrap as exc:
            code = exc.code
        del store, instance, linker
        return Run(code, Path(out_path).read_bytes(), Path(err_path).read_bytes())


class DirectGuest:
    """The WASI handlers of one instance driven directly, over a :class:`BytearrayMemory`.

    ``scratch`` hands out guest addresses for arguments; results are read back from memory.
    """

    MEMORY_BYTES = 1 << 20

    def __init__(
        self,
        config: WasiOptions,
        grants: Iterable[str] = CAPABILITIES,
        *,
        clock: Clock | None = None,
        resolution_ns: int = 1_000,
        deadline: float = float("inf"),
        policy_seed: bytes | None = None,
    ) -> None:
        allowed = frozenset(grants)
        self.mem = BytearrayMemory(self.MEMORY_BYTES, deadline)
        self.log = ExtensionLog(64 * 1024)
        self.state = WasiState(
            config,
            allowed.__contains__,
            self.log,
            clock or SystemClock(),
            resolution_ns,
            policy_seed=policy_seed,
        )
        self.binding = WasiBinding(self.state)
        self._next = 1024

    def close(self) -> None:
        self.binding.close()

    def call(self, name: str, *args: int) -> Any:
        return self.binding.handler(FUNCTIONS_BY_NAME[name])(self.mem, *args)

    def alloc(self, size: int) -> int:
        ptr = self._next
        self._next += (size + 7) & ~7
        if self._next > self.MEMORY_BYTES // 2:
            self._next = 1024  # reuse: tests read results right after each call
            return self.alloc(size)
        return ptr

    def put(self, data: bytes) -> tuple[int, int]:
        ptr = self.alloc(max(len(data), 1))
        self.mem.write(ptr, data)
        return ptr, len(data)

    def u32(self, ptr: int) -> int:
        return self.mem.read_u32(ptr)

    def u64(self, ptr: int) -> int:
        return self.mem.read_u64(ptr)

    def open(
        self,
        dirfd: int,
        path: bytes | str,
        oflags: int = 0,
        rights: int = READ_RIGHTS,
        fdflags: int = 0,
        follow: bool = True,
    ) -> tuple[int, int]:
        raw = path.encode() if isinstance(path, str) else path
        p, n = self.put(raw)
        out = self.alloc(4)
        err = self.call(
            "path_open", dirfd, int(follow), p, n, oflags, rights, ALL_RIGHTS, fdflags, out
        )
        return int(err), self.u32(out) if err == 0 else -1

    def path_call(self, name: str, dirfd: int, path: bytes | str, *rest: int) -> int:
        raw = path.encode() if isinstance(path, str) else path
        p, n = self.put(raw)
        return int(self.call(name, dirfd, p, n, *rest))

    def write(self, fd: int, data: bytes) -> tuple[int, int]:
        buf, n = self.put(data)
        iov, _ = self.put(buf.to_bytes(4, "little") + n.to_bytes(4, "little"))
        out = self.alloc(4)
        err = self.call("fd_write", fd, iov, 1, out)
        return int(err), self.u32(out) if err == 0 else 0

    def read(self, fd: int, size: int) -> tuple[int, bytes]:
        buf = self.alloc(size)
        iov, _ = self.put(buf.to_bytes(4, "little") + size.to_bytes(4, "little"))
        out = self.alloc(4)
        err = self.call("fd_read", fd, iov, 1, out)
        return int(err), self.mem.read(buf, self.u32(out)) if err == 0 else b""


@attrs.frozen
class RevokedRun:
    """How a command run revoked mid-way ended (see :func:`revoke_mid_run`)."""

    outcome: BaseException | None
    revoked_at: float  # time.monotonic() when host.revoke returned


def revoke_mid_run(
    host: Host,
    ext: Extension,
    ready: Callable[[], bool],
    capability: str | None,
    on_revoked: Callable[[], object] = lambda: None,
) -> RevokedRun:
    """Run ``ext``'s command on a thread, revoke ``capability`` (None: the whole extension) as
    soon as ``ready()`` holds (or after 5 s), call ``on_revoked()`` at once (to take a reading
    while the run may still go on), and wait for the run to end."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            ext.run_command()
        except BaseException as exc:  # the caller inspects it
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 5
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.001)
    host.revoke(ext.id, capability, "test")
    revoked_at = time.monotonic()
    on_revoked()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the run did not end after the revocation"
    return RevokedRun(outcome[0] if outcome else None, revoked_at)
