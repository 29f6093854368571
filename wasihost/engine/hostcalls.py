"""Host functions: one ctypes trampoline, the per-instance host context and its error slot,
the cbor and native conventions, and the bounds-checked guest memory view of native brokers.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable, Sequence
from ctypes import POINTER
from typing import Any

import attrs
from wasmtime import _ffi as ffi

from ..codec import CodecLimits, decode, encode
from ..errors import CallError, CodecError, FailureClass
from ..registry import CORE_CAPABILITY, HostFunction
from ..status import GuestAbort, GuestDeadline, GuestExit, GuestFault, HostStatus, Status
from .lowlevel import (
    U32,
    U64,
    VP,
    get_fuel,
    memory_data,
    memory_data_size,
    new_trap,
    private_fn,
    set_fuel,
)

HostHandler = Callable[[Any], Any]
"""A broker entry point: decoded, bounded request value in, response value out."""

Gate = Callable[[HostFunction], bool]
"""Decides, at call time, whether the caller still holds the entry's capability."""


@attrs.frozen
class BoundImport:
    """A registry entry the module imports, with the broker entry point serving it."""

    entry: HostFunction
    handler: HostHandler = attrs.field(eq=False, hash=False)


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
            self._size = int(memory_data_size(self._ctx, self._mem))
            self._data = int(memory_data(self._ctx, self._mem))
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
        self.write(ptr, (value & U32).to_bytes(4, "little"))

    def write_u64(self, ptr: int, value: int) -> None:
        self.write(ptr, (value & U64).to_bytes(8, "little"))


# env pointer -> (instance context, import index). ctypes callbacks receive the env as an int;
# the finalizer removes the entry when the Store that owns the function is dropped.
TARGETS: dict[int, tuple[HostContext, int]] = {}
TARGET_IDS = itertools.count(1)


# Our own callback type: the caller arrives as a plain address (int), so the hot path never
# builds a ctypes pointer object for it.
_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_size_t, VP, VP, POINTER(ffi.wasmtime_val_raw_t), ctypes.c_size_t
)
_FINALIZER = ctypes.CFUNCTYPE(None, VP)
func_new_unchecked = private_fn(
    "wasmtime_func_new_unchecked", None, VP, VP, _CALLBACK, VP, _FINALIZER, VP
)
_caller_context = private_fn("wasmtime_caller_context", VP, VP)
_caller_export_get = private_fn(
    "wasmtime_caller_export_get", ctypes.c_bool, VP, ctypes.c_char_p, ctypes.c_size_t, VP
)


@_CALLBACK  # type: ignore[untyped-decorator]
def trampoline(env: int, caller: int, args: Any, nargs: int) -> int:
    try:
        ctx, index = TARGETS[env]
    except BaseException:
        return new_trap("wasihost: host function lost its instance")
    return ctx.host_call(index, caller, args)


@_FINALIZER  # type: ignore[untyped-decorator]
def finalize(env: int | None) -> None:
    TARGETS.pop(env or 0, None)


class HostContext:
    """Per-instance state shared by its host functions: imports, gate, memory, error slot."""

    def __init__(self, imports: Sequence[BoundImport], gate: Gate) -> None:
        self.imports = tuple(imports)
        self.codec_limits = tuple(
            CodecLimits(max_bytes=max(1, b.entry.max_request_bytes)) for b in imports
        )
        self.gate = gate
        self.mem_addr = 0  # the exported memory (kept alive by the Instance), once resolved
        # The error slot: set by a host function that ends the call, read by the caller of the
        # wasm function on the same thread, under the instance lock. Never global.
        self.failure: CallError | None = None
        self.reraise: BaseException | None = None
        self.exit_code: int | None = None
        # Read by the epoch callback on every tick of a running call: set from any thread to
        # stop the guest at its next tick (emergency disable).
        self.interrupted = False
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
        self.mem_addr = ctypes.addressof(memory)

    def take_failure(self) -> CallError | None:
        failure, self.failure = self.failure, None
        return failure

    def _fail(self, failure: FailureClass, message: str) -> int:
        self.failure = CallError(failure, message)
        return new_trap(f"wasihost: {failure.value}")

    def _fuel_left(self, ctx: int) -> int:
        get_fuel(ctx, self._fuel_addr)  # fuel is always on in this adapter's engines
        return int(self._fuel.value)

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
        req_ptr = args[0].i32 & U32
        req_len = args[1].i32 & U32
        resp_ptr = args[2].i32 & U32
        resp_cap = args[3].i32 & U32
        ctx = self.store_ctx or self._verified_context(caller)
        mem = self._memory_of(caller)
        if not mem:
            return self._fail(FailureClass.PROTOCOL, f"{name}: guest exports no memory")
        size = memory_data_size(ctx, mem)
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
        if left < price:
            return self._out_of_fuel(ctx, entry)
        left -= price
        set_fuel(ctx, left)
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
                    ctypes.string_at(memory_data(ctx, mem) + req_ptr, req_len),
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
        cost = entry.fuel_per_byte * len(body)
        if left < cost:
            return self._out_of_fuel(ctx, entry)
        set_fuel(ctx, left - cost)
        # The handler cannot grow guest memory, but re-read the base anyway: it is one C call
        # and makes the write independent of what the handler did.
        ctypes.memmove(memory_data(ctx, mem) + resp_ptr, body, len(body))
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
            get_fuel(ctx, fuel_addr)
            left = fuel.value
            if left < base_price:
                return self._out_of_fuel(ctx, entry)
            # The price is set once, after the handler: no wasm runs in between, so nothing
            # else can spend this fuel, and the base price was checked before any work.
            left -= base_price
            if gated and not gate(entry):
                set_fuel(ctx, left)
                if entry.denied_result is None:
                    return self._fail(FailureClass.DENIED, f"{entry.qualified_name}: not granted")
                _store_result(entry, args, entry.denied_result)
                return 0
            mem = self.mem_addr or self._memory_of(caller)
            if not mem:
                set_fuel(ctx, left)
                return self._fail(FailureClass.PROTOCOL, f"{entry.qualified_name}: no memory")
            call.begin(ctx, mem)
            try:
                if all_narrow:
                    result = handler(call, *[args[i].i32 & U32 for i in range(nparams)])
                else:
                    result = handler(
                        call,
                        *[
                            args[i].i64 & U64 if w else args[i].i32 & U32
                            for i, w in enumerate(wide)
                        ],
                    )
            except GuestFault as fault:
                set_fuel(ctx, left)
                return self._fail(FailureClass.PROTOCOL, f"{entry.qualified_name}: {fault}")
            except GuestDeadline:
                set_fuel(ctx, left)
                return self._fail(
                    FailureClass.DEADLINE, f"{entry.qualified_name}: deadline reached"
                )
            except GuestExit as exit_:
                set_fuel(ctx, left)
                self.exit_code = exit_.code
                return new_trap("wasihost: exit")
            except BaseException:
                set_fuel(ctx, left)
                raise
            cost = per_byte * call.moved
            if left < cost:
                return self._out_of_fuel(ctx, entry)
            set_fuel(ctx, left - cost)
            if result_kind == "i32":
                v32 = int(result) & U32
                args[0].i32 = v32 - (1 << 32) if v32 >= 1 << 31 else v32
            elif result_kind is not None:
                _store_result(entry, args, result)
            return 0

        return dispatch

    def _out_of_fuel(self, ctx: int, entry: HostFunction) -> int:
        set_fuel(ctx, 0)
        self.failure = CallError(
            FailureClass.OUT_OF_FUEL, f"fuel ran out paying for host call {entry.qualified_name}"
        )
        return new_trap("wasihost: out of fuel")


def _store_result(entry: HostFunction, args: Any, value: Any) -> None:
    if entry.results[0] == "i64":
        v64 = int(value) & U64
        args[0].i64 = v64 - (1 << 64) if v64 >= 1 << 63 else v64
    else:
        v32 = int(value) & U32
        args[0].i32 = v32 - (1 << 32) if v32 >= 1 << 31 else v32
