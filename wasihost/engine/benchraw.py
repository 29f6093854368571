"""Raw wasmtime-py contenders for ``wasihost bench``: the generic public API and the unchecked
floor, driving a guest through the same ABI sequence wasihost uses (set fuel and deadline,
``wasihost_alloc``, write command + input, ``wasihost_call``, read the response).

They live in the engine package because only it may import wasmtime. Nothing here is used to
run extensions: it measures what the least and the plainest wasmtime-py host would spend.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import wasmtime
from wasmtime import _bindings as raw
from wasmtime import _ffi as ffi

# Both raw contenders answer every import with this status: not a real broker, a fixed price.
UNSUPPORTED = -9
# Fuel and deadline reset before each call, as wasihost does; large enough for any scenario.
RAW_FUEL = 10_000_000_000
RAW_DEADLINE = 1_000_000

_RAW_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)
_RAW_FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_RAW_CALLBACK  # type: ignore[untyped-decorator]
def _answer_unsupported(env: int, caller: int, args: int, nargs: int) -> int:
    ctypes.c_int32.from_address(args).value = UNSUPPORTED
    return 0


@_RAW_FINALIZER  # type: ignore[untyped-decorator]
def _no_finalizer(env: int) -> None:
    pass


def wat_to_wasm(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))


def raw_engine(*, fuel: bool = True, epoch: bool = True) -> wasmtime.Engine:
    config = wasmtime.Config()
    config.consume_fuel = fuel
    config.epoch_interruption = epoch
    return wasmtime.Engine(config)


class RawModule:
    """A module compiled once on its own engine, to instantiate repeatedly (the raw side of
    ``instantiate-cached``)."""

    def __init__(self, wasm: bytes, *, fuel: bool = True, epoch: bool = True) -> None:
        self.engine = raw_engine(fuel=fuel, epoch=epoch)
        self.module = wasmtime.Module(self.engine, wasm)
        self.fuel = fuel
        self.epoch = epoch

    def instantiate(self, *, raw_imports: bool = False) -> PublicGuest:
        return PublicGuest(self, raw_imports=raw_imports)


class PublicGuest:
    """A guest driven through wasmtime-py's public, generic API; its imports answer
    UNSUPPORTED, through generic ``Func`` objects or (``raw_imports``) bare unchecked ones."""

    def __init__(self, module: RawModule, *, raw_imports: bool = False) -> None:
        self.meter = module
        self.store = wasmtime.Store(module.engine)
        imports: list[Any] = []
        for imp in module.module.imports:
            ty = imp.type
            if not isinstance(ty, wasmtime.FuncType):
                raise ValueError(f"import {imp.module}.{imp.name} is not a function")
            if raw_imports:
                imports.append(self._raw_func(ty))
            else:
                imports.append(wasmtime.Func(self.store, ty, lambda *a: UNSUPPORTED))
        self._reset()
        instance = wasmtime.Instance(self.store, module.module, imports)
        exports: Any = instance.exports(self.store)
        self.memory = exports["memory"]
        self.alloc = exports["wasihost_alloc"]
        self.call_fn = exports["wasihost_call"]
        self.instance = instance

    def _reset(self) -> None:
        if self.meter.fuel:
            self.store.set_fuel(RAW_FUEL)
        if self.meter.epoch:
            self.store.set_epoch_deadline(RAW_DEADLINE)

    def _raw_func(self, ty: wasmtime.FuncType) -> wasmtime.Func:
        new = ffi.dll["wasmtime_func_new_unchecked"]
        new.restype = None
        vp = ctypes.c_void_p
        new.argtypes = [vp, vp, _RAW_CALLBACK, vp, _RAW_FINALIZER, vp]
        func = raw.wasmtime_func_t()
        ctx = ctypes.cast(self.store._context(), vp)
        new(
            ctx,
            ctypes.cast(ty.ptr(), vp),
            _answer_unsupported,
            None,
            _no_finalizer,
            ctypes.addressof(func),
        )
        return wasmtime.Func._from_raw(func)

    def call(self, command: bytes, payload: bytes) -> bytes:
        store = self.store
        self._reset()
        ptr = self.alloc(store, len(command) + len(payload)) & 0xFFFFFFFF
        self.memory.write(store, command + payload, ptr)
        packed = self.call_fn(store, ptr, len(command), len(payload)) & 0xFFFFFFFFFFFFFFFF
        rp, rl = packed >> 32, packed & 0xFFFFFFFF
        return bytes(self.memory.read(store, rp, rp + rl))


class RawFloor:
    """The same sequence with unchecked raw calls and nothing else: the floor."""

    def __init__(self, guest: PublicGuest) -> None:
        self.guest = guest
        self.ctx = ctypes.cast(guest.store._context(), ctypes.c_void_p).value
        vp = ctypes.c_void_p

        def fn(name: str, restype: Any, *args: Any) -> Callable[..., Any]:
            f = ffi.dll[name]
            f.restype = restype
            f.argtypes = list(args)
            return f

        self.call_unchecked = fn(
            "wasmtime_func_call_unchecked", vp, vp, vp, vp, ctypes.c_size_t, vp
        )
        self.mem_data = fn("wasmtime_memory_data", vp, vp, vp)
        self.set_fuel = fn("wasmtime_context_set_fuel", vp, vp, ctypes.c_uint64)
        self.set_deadline = fn("wasmtime_context_set_epoch_deadline", None, vp, ctypes.c_uint64)
        # The exports' raw handles, as wasmtime_func_call_unchecked and memory_data take them.
        self.alloc_addr = ctypes.addressof(guest.alloc._func)
        self.call_addr = ctypes.addressof(guest.call_fn._func)
        self.mem_addr = ctypes.addressof(guest.memory._memory)
        self.a1 = (raw.wasmtime_val_raw_t * 1)()
        self.a3 = (raw.wasmtime_val_raw_t * 3)()
        self.a1_addr = ctypes.addressof(self.a1)
        self.a3_addr = ctypes.addressof(self.a3)
        self.trap = ctypes.c_void_p(0)
        self.trap_addr = ctypes.addressof(self.trap)
        self.fuel = guest.meter.fuel
        self.epoch = guest.meter.epoch

    def call(self, command: bytes, payload: bytes) -> bytes:
        ctx = self.ctx
        if self.fuel:
            self.set_fuel(ctx, RAW_FUEL)
        if self.epoch:
            self.set_deadline(ctx, RAW_DEADLINE)
        data = command + payload
        self.a1[0].i32 = len(data)
        self.call_unchecked(ctx, self.alloc_addr, self.a1_addr, 1, self.trap_addr)
        ptr = self.a1[0].i32 & 0xFFFFFFFF
        ctypes.memmove(self.mem_data(ctx, self.mem_addr) + ptr, data, len(data))
        a3 = self.a3
        a3[0].i32 = ptr
        a3[1].i32 = len(command)
        a3[2].i32 = len(payload)
        self.call_unchecked(ctx, self.call_addr, self.a3_addr, 3, self.trap_addr)
        if self.trap.value:
            raise RuntimeError("the guest trapped")
        packed = a3[0].i64 & 0xFFFFFFFFFFFFFFFF
        return ctypes.string_at(
            self.mem_data(ctx, self.mem_addr) + (packed >> 32), packed & 0xFFFFFFFF
        )


def serialize_module(wasm: bytes) -> bytes:
    """The module compiled for a default metered engine, as ``Module.deserialize_file``
    reads it (the raw side of a warm disk cache)."""
    return bytes(wasmtime.Module(raw_engine(), wasm).serialize())
