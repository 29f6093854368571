"""The engine adapter: the only module of wasihost that imports ``wasmtime``.

It owns everything that touches native handles: the shared Engine and its epoch watchdog, the
compiled-module cache, Stores with their limits, linking admitted imports to host functions,
the fast call path, and the mapping of every engine failure to a :class:`FailureClass`.

Two wasmtime-py behaviours shape it (see DESIGN.md): the generic ``Func.__call__`` converts
every value on every call (tens of µs), and its host-call trampoline keeps the last exception
in a module global shared by all threads. So calls go through ``wasmtime_func_call_unchecked``
on arrays built once per instance, and host functions through our own unchecked trampoline
whose failures land in a slot owned by the instance (used by one thread at a time, under the
instance lock). Every private binding used is imported here and nowhere else.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import hmac
import importlib.metadata
import itertools
import os
import secrets
import stat
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from ctypes import POINTER, byref
from pathlib import Path
from typing import Any, NoReturn

import attrs
import wasmtime
from wasmtime import _bindings as raw
from wasmtime import _ffi as ffi

from .codec import CodecLimits, decode, encode
from .errors import CallError, CodecError, ConfigError, FailureClass
from .registry import CORE_CAPABILITY, HostFunction
from .settings import EngineSettings
from .status import GuestAbort, GuestDeadline, GuestExit, GuestFault, HostStatus, Status

_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF

# Compiled modules kept in memory per engine; each is a few MB of machine code at most.
MAX_CACHED_MODULES = 64
# The host-local MAC key; 32 bytes is HMAC-SHA256's natural key size.
CACHE_KEY_BYTES = 32
CACHE_MAC_BYTES = 32
# A trap message is for the embedder's eyes; the first lines say what and where.
MAX_TRAP_MESSAGE_CHARS = 400

WASMTIME_VERSION = importlib.metadata.version("wasmtime")


def _private_fn(name: str, restype: Any, *argtypes: Any) -> Any:
    """Our own ctypes prototype for a libwasmtime symbol.

    ``dll[name]`` makes a new function object, so its plain ``c_void_p``/integer signature
    does not disturb wasmtime-py's own typed prototypes. Passing raw addresses skips ctypes'
    per-argument type checks and ``cast`` calls, which dominate a no-op call otherwise.
    """
    try:
        fn = ffi.dll[name]
    except AttributeError:
        raise ConfigError(
            f"wasmtime {WASMTIME_VERSION} lacks {name}; wasihost needs the pinned wasmtime major"
        ) from None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_vp = ctypes.c_void_p
_call_unchecked = _private_fn(
    "wasmtime_func_call_unchecked", _vp, _vp, _vp, _vp, ctypes.c_size_t, _vp
)
_memory_data = _private_fn("wasmtime_memory_data", _vp, _vp, _vp)
_memory_data_size = _private_fn("wasmtime_memory_data_size", ctypes.c_size_t, _vp, _vp)
_set_fuel = _private_fn("wasmtime_context_set_fuel", _vp, _vp, ctypes.c_uint64)
_get_fuel = _private_fn("wasmtime_context_get_fuel", _vp, _vp, _vp)
_set_epoch_deadline = _private_fn("wasmtime_context_set_epoch_deadline", None, _vp, ctypes.c_uint64)

_TRAP_CLASSES = {
    wasmtime.TrapCode.OUT_OF_FUEL: FailureClass.OUT_OF_FUEL,
    wasmtime.TrapCode.INTERRUPT: FailureClass.DEADLINE,
    wasmtime.TrapCode.STACK_OVERFLOW: FailureClass.STACK_OVERFLOW,
    # Rust's panic=abort and most language runtimes' abort() compile to `unreachable`.
    wasmtime.TrapCode.UNREACHABLE: FailureClass.PANIC,
}

HostHandler = Callable[[Any], Any]
"""A broker entry point: decoded, bounded request value in, response value out."""

Gate = Callable[[HostFunction], bool]
"""Decides, at call time, whether the caller still holds the entry's capability."""


@attrs.frozen
class BoundImport:
    """A registry entry the module imports, with the broker entry point serving it."""

    entry: HostFunction
    handler: HostHandler = attrs.field(eq=False, hash=False)


@attrs.frozen
class StoreLimits:
    """Per-instance limits applied to the Store before instantiation."""

    max_memory_bytes: int
    max_table_elements: int
    fuel: int
    timeout_ms: int


@attrs.define
class CallResult:
    """A raw command response: the status word, the body bytes, and what the call cost."""

    status: int
    body: bytes
    fuel_used: int


def _trap_failure(trap_ptr: Any) -> CallError:
    trap = wasmtime.Trap._from_ptr(trap_ptr)
    code = trap.trap_code
    message = _short(trap.message)
    return CallError(
        _TRAP_CLASSES.get(code, FailureClass.TRAP) if code else FailureClass.TRAP, message
    )


def _short(message: str) -> str:
    """The cause and the innermost wasm frame of an engine message, on one bounded line.

    wasmtime formats traps as "error while executing at wasm backtrace: <frames> Caused by:
    <cause>"; the cause says what, the first frame says where.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    cause = lines[-1]
    if "Caused by:" in lines:
        cause = " ".join(lines[lines.index("Caused by:") + 1 :])
    frame = next((line for line in lines if line[:1].isdigit() and ":" in line), None)
    text = f"{cause} (at {frame.split(':', 1)[1].strip()})" if frame else cause
    return text[:MAX_TRAP_MESSAGE_CHARS]


def _new_trap(message: str) -> int:
    data = message.encode()
    trap = raw._wasmtime_trap_new(data, len(data))
    return ctypes.cast(trap, ctypes.c_void_p).value or 0


# ---------------------------------------------------------------------------------------------
# Host-function trampoline
# ---------------------------------------------------------------------------------------------


class NativeCall:
    """What a native-convention broker gets besides its arguments: bounds-checked access to the
    calling guest's memory, and the call's deadline.

    Every access checks ``ptr + len`` against the current memory size (Python integers, so no
    overflow) and raises :class:`GuestFault` outside it; ``moved`` counts the bytes copied, which
    the engine charges at the entry's per-byte fuel price.
    """

    __slots__ = ("_ctx", "_data", "_mem", "_size", "deadline", "moved")

    def __init__(self) -> None:
        self._ctx = 0
        self._mem = 0
        self._data = 0
        self._size = -1
        self.moved = 0
        self.deadline = 0.0

    def begin(self, ctx: int, mem: int) -> None:
        """A new host call. Memory base and size are read lazily, once: no wasm runs during a
        host call, so the guest cannot grow (move) its memory until the call returns."""
        self._ctx = ctx
        self._mem = mem
        self._size = -1
        self.moved = 0

    def size(self) -> int:
        if self._size < 0:
            self._size = int(_memory_data_size(self._ctx, self._mem))
            self._data = int(_memory_data(self._ctx, self._mem))
        return self._size

    def read(self, ptr: int, length: int) -> bytes:
        # Bounds check inlined: reads and writes are the bulk of a WASI call's own work.
        size = self._size if self._size >= 0 else self.size()
        if ptr < 0 or length < 0 or ptr + length > size:
            raise GuestFault(f"[{ptr}, +{length}) outside guest memory")
        self.moved += length
        return ctypes.string_at(self._data + ptr, length) if length else b""

    def write(self, ptr: int, data: bytes) -> None:
        size = self._size if self._size >= 0 else self.size()
        length = len(data)
        if ptr < 0 or ptr + length > size:
            raise GuestFault(f"[{ptr}, +{length}) outside guest memory")
        self.moved += length
        if length:
            ctypes.memmove(self._data + ptr, data, length)

    def read_u32(self, ptr: int) -> int:
        return int.from_bytes(self.read(ptr, 4), "little")

    def read_u64(self, ptr: int) -> int:
        return int.from_bytes(self.read(ptr, 8), "little")

    def write_u32(self, ptr: int, value: int) -> None:
        self.write(ptr, (value & _U32).to_bytes(4, "little"))

    def write_u64(self, ptr: int, value: int) -> None:
        self.write(ptr, (value & _U64).to_bytes(8, "little"))


# env pointer -> (instance context, import index). ctypes callbacks receive the env as an int;
# the finalizer removes the entry when the Store that owns the function is dropped.
_TARGETS: dict[int, tuple[_HostContext, int]] = {}
_TARGET_IDS = itertools.count(1)


# Our own callback type: the caller arrives as a plain address (int), so the hot path never
# builds a ctypes pointer object for it.
_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_size_t, _vp, _vp, POINTER(ffi.wasmtime_val_raw_t), ctypes.c_size_t
)
_FINALIZER = ctypes.CFUNCTYPE(None, _vp)
_func_new_unchecked = _private_fn(
    "wasmtime_func_new_unchecked", None, _vp, _vp, _CALLBACK, _vp, _FINALIZER, _vp
)
_caller_context = _private_fn("wasmtime_caller_context", _vp, _vp)
_caller_export_get = _private_fn(
    "wasmtime_caller_export_get", ctypes.c_bool, _vp, ctypes.c_char_p, ctypes.c_size_t, _vp
)


@_CALLBACK  # type: ignore[untyped-decorator]
def _trampoline(env: int, caller: int, args: Any, nargs: int) -> int:
    try:
        ctx, index = _TARGETS[env]
    except BaseException:
        return _new_trap("wasihost: host function lost its instance")
    return ctx.host_call(index, caller, args)


@_FINALIZER  # type: ignore[untyped-decorator]
def _finalize(env: int | None) -> None:
    _TARGETS.pop(env or 0, None)


class _HostContext:
    """Per-instance state shared by its host functions: imports, gate, memory, error slot."""

    def __init__(self, imports: Sequence[BoundImport], gate: Gate) -> None:
        self.imports = tuple(imports)
        self.codec_limits = tuple(
            CodecLimits(max_bytes=max(1, b.entry.max_request_bytes)) for b in imports
        )
        self.gate = gate
        self.memory: Any = None  # the exported memory's wasmtime_memory_t, once resolved
        self.mem_addr = 0
        # The error slot: set by a host function that ends the call, read by the caller of the
        # wasm function on the same thread, under the instance lock. Never global.
        self.failure: CallError | None = None
        self.reraise: BaseException | None = None
        self.exit_code: int | None = None
        self.native = NativeCall()
        self._fuel = ctypes.c_uint64(0)
        self._fuel_addr = ctypes.addressof(self._fuel)
        self._extern = ffi.wasmtime_extern_t()
        self.expected_ctx = 0  # the owning store's context address, set by the Instance
        self.store_ctx = 0  # nonzero once the caller's context was seen to equal it
        self._context_checked = False
        self.native_dispatch = tuple(
            self._native_dispatch(i) if b.entry.convention == "native" else None
            for i, b in enumerate(self.imports)
        )

    def _verified_context(self, caller: int) -> int:
        """The caller's store context. wasmtime hands out the store's own context pointer,
        so after checking that once the hot path reuses the store's address instead of asking
        again on every call; if they ever differ, the shortcut stays off."""
        ctx = int(_caller_context(caller))
        if not self._context_checked:
            self._context_checked = True
            if ctx == self.expected_ctx:
                self.store_ctx = ctx
        return ctx

    def set_memory(self, memory: Any) -> None:
        self.memory = memory
        self.mem_addr = ctypes.addressof(memory)

    def take_failure(self) -> CallError | None:
        failure, self.failure = self.failure, None
        return failure

    def _fail(self, failure: FailureClass, message: str) -> int:
        self.failure = CallError(failure, message)
        return _new_trap(f"wasihost: {failure.value}")

    def _fuel_left(self, ctx: int) -> int:
        _get_fuel(ctx, self._fuel_addr)  # fuel is always on in this adapter's engines
        return int(self._fuel.value)

    def _pay(self, ctx: int, left: int, amount: int, entry: HostFunction) -> bool:
        """Take ``amount`` from ``left`` (the store's fuel, read by the caller)."""
        if left < amount:
            _set_fuel(ctx, 0)
            self.failure = CallError(
                FailureClass.OUT_OF_FUEL,
                f"fuel ran out paying for host call {entry.qualified_name}",
            )
            return False
        _set_fuel(ctx, left - amount)
        return True

    def _memory_of(self, caller: int) -> int:
        """The caller's memory; during a start function, before exports are resolved, it is
        looked up by name (and its address is valid for this host call only)."""
        if self.mem_addr:
            return self.mem_addr
        item = self._extern
        if not _caller_export_get(caller, b"memory", 6, ctypes.addressof(item)):
            return 0
        return ctypes.addressof(item.of.memory)

    def host_call(self, index: int, caller: int, args: Any) -> int:
        try:
            native = self.native_dispatch[index]
            if native is not None:
                return native(caller, args)
            return self._cbor_call(index, caller, args)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.reraise = exc  # KeyboardInterrupt/SystemExit: re-raised after the call
            return self._fail(
                FailureClass.HOST_ERROR, f"host function failed: {type(exc).__name__}"
            )

    def _cbor_call(self, index: int, caller: int, args: Any) -> int:
        bound = self.imports[index]
        entry = bound.entry
        name = entry.qualified_name
        req_ptr = args[0].i32 & _U32
        req_len = args[1].i32 & _U32
        resp_ptr = args[2].i32 & _U32
        resp_cap = args[3].i32 & _U32
        ctx = _caller_context(caller)
        mem = self._memory_of(caller)
        if not mem:
            return self._fail(FailureClass.PROTOCOL, f"{name}: guest exports no memory")
        size = _memory_data_size(ctx, mem)
        # Python ints do not overflow, so these sums are exact; a u32 ptr+len past 2**32 is
        # simply larger than any memory.
        if req_ptr + req_len > size:
            return self._fail(
                FailureClass.PROTOCOL,
                f"{name}: request [{req_ptr}, +{req_len}) outside memory of {size} bytes",
            )
        if resp_ptr + resp_cap > size:
            return self._fail(
                FailureClass.PROTOCOL,
                f"{name}: response buffer [{resp_ptr}, +{resp_cap}) outside memory of {size} bytes",
            )
        if req_len and resp_cap and req_ptr < resp_ptr + resp_cap and resp_ptr < req_ptr + req_len:
            return self._fail(FailureClass.PROTOCOL, f"{name}: request and response overlap")
        left = self._fuel_left(ctx)
        price = entry.fuel_price(req_len)
        if not self._pay(ctx, left, price, entry):
            return _new_trap("wasihost: out of fuel")
        left -= price
        if not self.gate(entry):
            args[0].i32 = -Status.DENIED
            return 0
        if req_len > entry.max_request_bytes:
            args[0].i32 = -Status.PAYLOAD_TOO_LARGE
            return 0
        request: Any = None
        if req_len:
            try:
                request = decode(
                    ctypes.string_at(_memory_data(ctx, mem) + req_ptr, req_len),
                    self.codec_limits[index],
                )
            except CodecError:
                args[0].i32 = -Status.INVALID_ARGUMENT
                return 0
        try:
            response = bound.handler(request)
        except HostStatus as st:
            args[0].i32 = -int(st.status)
            return 0
        except GuestAbort as abort:
            return self._fail(FailureClass.PANIC, abort.message)
        body = encode(response)
        if len(body) > entry.max_response_bytes:
            return self._fail(
                FailureClass.HOST_ERROR,
                f"{name}: host produced {len(body)} bytes over the entry's "
                f"{entry.max_response_bytes}",
            )
        if len(body) > resp_cap:
            args[0].i32 = -Status.BUFFER_TOO_SMALL
            return 0
        # No wasm ran during the handler, so the fuel left is what we set above.
        if not self._pay(ctx, left, entry.fuel_per_byte * len(body), entry):
            return _new_trap("wasihost: out of fuel")
        # The handler cannot grow guest memory, but re-read the base anyway: it is one C call
        # and makes the write independent of what the handler did.
        ctypes.memmove(_memory_data(ctx, mem) + resp_ptr, body, len(body))
        args[0].i32 = len(body)
        return 0

    def _native_dispatch(self, index: int) -> Callable[[int, Any], int]:
        """One closure per native import with everything it needs bound in advance: this is
        the path a WASI program takes for every line it prints, so each lookup counts."""
        bound = self.imports[index]
        entry = bound.entry
        handler = bound.handler
        base_price = entry.fuel_base
        per_byte = entry.fuel_per_byte
        # `core` is granted to everyone, always: no need to ask the gate.
        gated = entry.capability != CORE_CAPABILITY
        gate = self.gate
        call = self.native
        fuel = self._fuel
        fuel_addr = self._fuel_addr
        nparams = len(entry.params)
        wide = tuple(t == "i64" for t in entry.params)
        all_narrow = not any(wide)
        result_kind = entry.results[0] if entry.results else None

        def dispatch(caller: int, args: Any) -> int:
            ctx = self.store_ctx or self._verified_context(caller)
            _get_fuel(ctx, fuel_addr)
            left = fuel.value
            if left < base_price:
                return self._out_of_fuel(ctx, entry)
            # The price is set once, after the handler: no wasm runs in between, so nothing
            # else can spend this fuel, and the base price was checked before any work.
            left -= base_price
            if gated and not gate(entry):
                _set_fuel(ctx, left)
                if entry.denied_result is None:
                    return self._fail(FailureClass.DENIED, f"{entry.qualified_name}: not granted")
                _store_result(entry, args, entry.denied_result)
                return 0
            mem = self.mem_addr or self._memory_of(caller)
            if not mem:
                _set_fuel(ctx, left)
                return self._fail(FailureClass.PROTOCOL, f"{entry.qualified_name}: no memory")
            call.begin(ctx, mem)
            try:
                if all_narrow:
                    result = handler(call, *[args[i].i32 & _U32 for i in range(nparams)])
                else:
                    result = handler(
                        call,
                        *[
                            args[i].i64 & _U64 if w else args[i].i32 & _U32
                            for i, w in enumerate(wide)
                        ],
                    )
            except GuestFault as fault:
                _set_fuel(ctx, left)
                return self._fail(FailureClass.PROTOCOL, f"{entry.qualified_name}: {fault}")
            except GuestDeadline:
                _set_fuel(ctx, left)
                return self._fail(
                    FailureClass.DEADLINE, f"{entry.qualified_name}: deadline reached"
                )
            except GuestExit as exit_:
                _set_fuel(ctx, left)
                self.exit_code = exit_.code
                return _new_trap("wasihost: exit")
            except BaseException:
                _set_fuel(ctx, left)
                raise
            cost = per_byte * call.moved
            if left < cost:
                return self._out_of_fuel(ctx, entry)
            _set_fuel(ctx, left - cost)
            if result_kind == "i32":
                v32 = int(result) & _U32
                args[0].i32 = v32 - (1 << 32) if v32 >= 1 << 31 else v32
            elif result_kind is not None:
                _store_result(entry, args, result)
            return 0

        return dispatch

    def _out_of_fuel(self, ctx: int, entry: HostFunction) -> int:
        _set_fuel(ctx, 0)
        self.failure = CallError(
            FailureClass.OUT_OF_FUEL, f"fuel ran out paying for host call {entry.qualified_name}"
        )
        return _new_trap("wasihost: out of fuel")


def _store_result(entry: HostFunction, args: Any, value: Any) -> None:
    if entry.results[0] == "i64":
        v64 = int(value) & _U64
        args[0].i64 = v64 - (1 << 64) if v64 >= 1 << 63 else v64
    else:
        v32 = int(value) & _U32
        args[0].i32 = v32 - (1 << 32) if v32 >= 1 << 31 else v32


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
                FailureClass.ADMISSION, f"module does not validate: {_short(str(exc))}"
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


# ---------------------------------------------------------------------------------------------
# Engine and instances
# ---------------------------------------------------------------------------------------------

_VALTYPES = {
    "i32": wasmtime.ValType.i32,
    "i64": wasmtime.ValType.i64,
    "f32": wasmtime.ValType.f32,
    "f64": wasmtime.ValType.f64,
}


class _Watchdog:
    """Ticks the engine epoch so that per-call deadlines fire while wasm runs.

    Python signal handlers do not run while wasm executes, so a timer thread is the only way
    to interrupt a guest; the GIL is released during wasm, so this thread does get to run.
    """

    def __init__(self, engine: wasmtime.Engine, tick_ms: int) -> None:
        self._engine = engine
        self._tick = tick_ms / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure_running(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wasihost-epoch", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            self._engine.increment_epoch()

    def stop(self) -> None:
        self._stop.set()


class WasmEngine:
    """One wasmtime Engine with fuel and epoch interruption, its watchdog and module cache."""

    def __init__(self, settings: EngineSettings, cache_dir: Path | None = None) -> None:
        self.settings = settings
        config = wasmtime.Config()
        config.consume_fuel = True
        config.epoch_interruption = True
        config.max_wasm_stack = settings.max_wasm_stack
        config.memory_reservation = settings.memory_reservation
        config.memory_guard_size = settings.memory_guard_size
        config.cranelift_opt_level = settings.opt_level
        config.parallel_compilation = settings.parallel_compilation
        config.wasm_threads = False
        config.shared_memory = False
        self._engine = wasmtime.Engine(config)
        self._watchdog = _Watchdog(self._engine, settings.epoch_tick_ms)
        self.cache = ModuleCache(self._engine, settings.fingerprint(), cache_dir)
        # A FuncType is registered with the first engine that uses it and must never meet
        # another one (wasmtime asserts, aborting the process): one cache per engine.
        self._func_types: dict[tuple[tuple[str, ...], tuple[str, ...]], wasmtime.FuncType] = {}
        self._func_types_lock = threading.Lock()

    def func_type(self, entry: HostFunction) -> wasmtime.FuncType:
        key = (entry.params, entry.results)
        with self._func_types_lock:
            ft = self._func_types.get(key)
            if ft is None:
                ft = wasmtime.FuncType(
                    [_VALTYPES[p]() for p in entry.params], [_VALTYPES[r]() for r in entry.results]
                )
                self._func_types[key] = ft
            return ft

    def ticks_for(self, timeout_ms: int) -> int:
        # +1: the current tick may be about to end; a deadline is never shorter than asked.
        return -(-timeout_ms // self.settings.epoch_tick_ms) + 1

    def compile(self, wasm: bytes, sha256: str) -> CompiledModule:
        return CompiledModule(self.cache.get(wasm, sha256), sha256)

    def instantiate(
        self,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> Instance:
        """Instantiate under ``limits``; ``command_export`` names the entry point of a plain
        profile command (``_start``) instead of the wasihost ABI exports."""
        self._watchdog.ensure_running()
        return Instance(self, module, imports, gate, limits, command_export)

    def close(self) -> None:
        self._watchdog.stop()

    @property
    def wasmtime_engine(self) -> wasmtime.Engine:
        return self._engine


@attrs.frozen
class CompiledModule:
    """A compiled module and the digest of its bytes."""

    module: wasmtime.Module = attrs.field(eq=False)
    sha256: str

    def import_names(self) -> list[tuple[str, str]]:
        return [(i.module, i.name or "") for i in self.module.imports]


class Instance:
    """One guest instance in its own Store. Not thread-safe by itself: callers hold ``lock``.

    A Store used from two threads at once crashes the process, so every entry into the guest
    takes the lock. After a failure that may have corrupted the guest, the owner discards the
    instance (``close``) and instantiates anew.
    """

    def __init__(
        self,
        engine: WasmEngine,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> None:
        self.lock = threading.Lock()
        # Guards close() against interrupt() from another thread (a freed Store must not be
        # written to); never held while wasm runs.
        self._interrupt_lock = threading.Lock()
        self.interrupted = False
        self._engine = engine
        self._limits = limits
        self._store = wasmtime.Store(engine.wasmtime_engine)
        self._store.set_limits(
            memory_size=limits.max_memory_bytes,
            table_elements=limits.max_table_elements,
            instances=1,
            tables=1,
            memories=1,
        )
        self._context = self._store._context()
        self._ctx_addr = ctypes.cast(self._context, ctypes.c_void_p).value
        self._ctx = _HostContext(imports, gate)
        self._ctx.expected_ctx = self._ctx_addr or 0
        self._has_native = any(b.entry.convention == "native" for b in imports)
        self.closed = False
        self.fuel_used = 0
        self.last_call_fuel = 0
        names = module.import_names()
        expected = [(b.entry.module, b.entry.name) for b in imports]
        if names != expected:
            # Admission read the imports from the bytes; the engine must agree exactly.
            raise CallError(FailureClass.ADMISSION, "engine and admission disagree on imports")
        externs = (ffi.wasmtime_extern_t * max(1, len(imports)))()
        for i, bound in enumerate(imports):
            env = next(_TARGET_IDS)
            _TARGETS[env] = (self._ctx, i)
            func = ffi.wasmtime_func_t()
            _func_new_unchecked(
                self._ctx_addr,
                ctypes.cast(engine.func_type(bound.entry).ptr(), ctypes.c_void_p),
                _trampoline,
                env,
                _finalize,
                ctypes.addressof(func),
            )
            externs[i] = ffi.wasmtime_extern_t(
                ffi.WASMTIME_EXTERN_FUNC, ffi.wasmtime_extern_union(func=func)
            )
        instance = ffi.wasmtime_instance_t()
        with self.lock:
            self._arm(limits.fuel)
            self._ctx.native.deadline = time.monotonic() + limits.timeout_ms / 1000
            trap = POINTER(ffi.wasm_trap_t)()
            err = raw._wasmtime_instance_new(
                self._context,
                module.module.ptr(),
                externs,
                len(imports),
                byref(instance),
                byref(trap),
            )
            self._account(limits.fuel)
            if err or trap:
                self.close()
                raise self._failure(err, trap, instantiating=True)
        self._instance = instance
        self._memory = self._export(b"memory").of.memory
        self._ctx.set_memory(self._memory)
        if command_export is not None:
            self._alloc = self._call = self._export(command_export.encode()).of.func
        else:
            self._alloc = self._export(b"wasihost_alloc").of.func
            self._call = self._export(b"wasihost_call").of.func
        self._args1 = (ffi.wasmtime_val_raw_t * 1)()
        self._args3 = (ffi.wasmtime_val_raw_t * 3)()
        # Raw addresses for the fast path; every object they point into is kept alive by self.
        self._mem_addr = ctypes.addressof(self._memory)
        self._alloc_addr = ctypes.addressof(self._alloc)
        self._call_addr = ctypes.addressof(self._call)
        self._args1_addr = ctypes.addressof(self._args1)
        self._args3_addr = ctypes.addressof(self._args3)
        self._trap_slot = ctypes.c_void_p(0)
        self._trap_slot_addr = ctypes.addressof(self._trap_slot)
        self._fuel_left = ctypes.c_uint64(0)
        self._fuel_left_addr = ctypes.addressof(self._fuel_left)
        self._deadline_ticks = engine.ticks_for(limits.timeout_ms)

    @property
    def exit_code(self) -> int | None:
        return self._ctx.exit_code

    def run_command(self) -> int:
        """Run a profile command's entry point to its end; return its exit code.

        A normal return is exit code 0; ``proc_exit(n)`` ends it with ``n``. Caller holds
        ``lock``; the instance cannot run again afterwards.
        """
        if self.closed:
            raise CallError(FailureClass.HOST_ERROR, "instance is closed")
        fuel = self._limits.fuel
        ctx = self._ctx_addr
        _set_fuel(ctx, fuel)
        _set_epoch_deadline(ctx, self._deadline_ticks)
        self._ctx.native.deadline = time.monotonic() + self._limits.timeout_ms / 1000
        try:
            self._invoke(self._call_addr, self._args1_addr, 0)
        except CallError:
            if self._ctx.exit_code is None:
                raise
        finally:
            _get_fuel(ctx, self._fuel_left_addr)
            used = fuel - self._fuel_left.value
            self.fuel_used += used
            self.last_call_fuel = used
        return self._ctx.exit_code if self._ctx.exit_code is not None else 0

    def _export(self, name: bytes) -> Any:
        item = ffi.wasmtime_extern_t()
        if not raw._wasmtime_instance_export_get(
            self._context, byref(self._instance), name, len(name), byref(item)
        ):
            raise CallError(FailureClass.PROTOCOL, f"export {name.decode()} missing")
        return item

    def _arm(self, fuel: int) -> None:
        raw._wasmtime_context_set_fuel(self._context, fuel)
        raw._wasmtime_context_set_epoch_deadline(
            self._context, self._engine.ticks_for(self._limits.timeout_ms)
        )

    def _account(self, fuel: int) -> None:
        left = ctypes.c_uint64(0)
        raw._wasmtime_context_get_fuel(self._context, byref(left))
        self.fuel_used += fuel - left.value

    def _failure(self, err: Any, trap: Any, *, instantiating: bool = False) -> CallError:
        reraise, self._ctx.reraise = self._ctx.reraise, None
        if reraise is not None:
            raise reraise
        failure = self._ctx.take_failure()
        if failure is None and self._ctx.exit_code is not None:
            failure = CallError(FailureClass.TRAP, f"guest exited with {self._ctx.exit_code}")
        if failure is not None:
            if trap:
                raw.wasm_trap_delete(trap)
            if err:
                raw.wasmtime_error_delete(err)
            return failure
        if trap:
            return _trap_failure(trap)
        message = _short(str(wasmtime.WasmtimeError._from_ptr(err)))
        if instantiating and ("limit" in message or "minimum" in message):
            return CallError(FailureClass.MEMORY_LIMIT, message)
        return CallError(FailureClass.TRAP, message)

    def _invoke(self, func_addr: int, args_addr: int, n: int) -> None:
        err = _call_unchecked(self._ctx_addr, func_addr, args_addr, n, self._trap_slot_addr)
        if err or self._trap_slot.value:
            self._raise_failure(err)

    def _raise_failure(self, err: int | None) -> NoReturn:
        trap = self._trap_slot.value
        self._trap_slot.value = 0
        raise self._failure(
            ctypes.cast(err, POINTER(ffi.wasmtime_error_t)) if err else None,
            ctypes.cast(trap, POINTER(ffi.wasm_trap_t)) if trap else None,
        )

    def call(self, command: bytes, payload: bytes, max_output_bytes: int) -> CallResult:
        """Run one command per the ABI calling convention. Caller holds ``lock``."""
        if self.closed:
            raise CallError(FailureClass.HOST_ERROR, "instance is closed")
        fuel = self._limits.fuel
        ctx = self._ctx_addr
        mem = self._mem_addr
        _set_fuel(ctx, fuel)
        _set_epoch_deadline(ctx, self._deadline_ticks)
        if self._has_native:
            self._ctx.native.deadline = time.monotonic() + self._limits.timeout_ms / 1000
        try:
            block = command + payload
            total = len(block)
            args1 = self._args1
            args1[0].i32 = total
            # _invoke inlined: two method calls are a measurable share of a no-op call.
            err = _call_unchecked(ctx, self._alloc_addr, self._args1_addr, 1, self._trap_slot_addr)
            if err or self._trap_slot.value:
                self._raise_failure(err)
            ptr = args1[0].i32 & _U32
            size = _memory_data_size(ctx, mem)
            if ptr == 0 or ptr + total > size:
                raise CallError(
                    FailureClass.PROTOCOL,
                    f"wasihost_alloc({total}) returned {ptr}, not a block inside memory of "
                    f"{size} bytes",
                )
            ctypes.memmove(_memory_data(ctx, mem) + ptr, block, total)
            args3 = self._args3
            args3[0].i32 = ptr
            args3[1].i32 = len(command)
            args3[2].i32 = len(payload)
            err = _call_unchecked(ctx, self._call_addr, self._args3_addr, 3, self._trap_slot_addr)
            if err or self._trap_slot.value:
                self._raise_failure(err)
            packed = args3[0].i64 & _U64
            resp_ptr = packed >> 32
            resp_len = packed & _U32
            # The guest may have grown (moved) its memory during the call: read both afresh.
            size = _memory_data_size(ctx, mem)
            if resp_ptr + resp_len > size:
                raise CallError(
                    FailureClass.PROTOCOL,
                    f"response [{resp_ptr}, +{resp_len}) outside memory of {size} bytes",
                )
            if resp_len < 4:
                raise CallError(
                    FailureClass.PROTOCOL, f"response of {resp_len} bytes has no status"
                )
            if resp_len - 4 > max_output_bytes:
                raise CallError(
                    FailureClass.PROTOCOL,
                    f"response body of {resp_len - 4} bytes over the output limit of "
                    f"{max_output_bytes}",
                )
            data = ctypes.string_at(_memory_data(ctx, mem) + resp_ptr, resp_len)
        finally:
            _get_fuel(ctx, self._fuel_left_addr)
            used = fuel - self._fuel_left.value
            self.fuel_used += used
            self.last_call_fuel = used
        return CallResult(int.from_bytes(data[:4], "little"), data[4:], used)

    def interrupt(self) -> None:
        """From any thread: make the running call, if any, trap at its next epoch check.

        It writes the Store's epoch deadline (one aligned 64-bit field that compiled code polls)
        without the instance lock, which the calling thread holds; that write is the one
        cross-thread touch of a Store the adapter allows. The next call re-arms the deadline.
        """
        with self._interrupt_lock:
            if not self.closed:
                self.interrupted = True
                _set_epoch_deadline(self._ctx_addr, 0)

    def close(self) -> None:
        with self._interrupt_lock:
            if not self.closed:
                self.closed = True
                self._store.close()


__all__ = [
    "BoundImport",
    "CallResult",
    "CompiledModule",
    "Instance",
    "ModuleCache",
    "NativeCall",
    "StoreLimits",
    "WasmEngine",
]


def _check_private_bindings() -> None:
    """Fail at import, by name, if the pinned wasmtime lacks a private symbol we rely on."""
    needed = [
        "_wasmtime_func_call_unchecked",
        "_wasmtime_func_new_unchecked",
        "_wasmtime_caller_context",
        "_wasmtime_caller_export_get",
        "_wasmtime_memory_data",
        "_wasmtime_memory_data_size",
        "_wasmtime_context_get_fuel",
        "_wasmtime_context_set_fuel",
        "_wasmtime_context_set_epoch_deadline",
        "_wasmtime_instance_new",
        "_wasmtime_instance_export_get",
        "_wasmtime_trap_new",
        "wasmtime_func_unchecked_callback_t",
    ]
    missing = [name for name in needed if not hasattr(raw, name)]
    if missing:
        raise ConfigError(
            f"wasmtime {WASMTIME_VERSION} lacks {', '.join(missing)}; "
            "wasihost needs the pinned wasmtime major"
        )


_check_private_bindings()
