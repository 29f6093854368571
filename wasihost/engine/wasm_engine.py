"""One wasmtime Engine with fuel and epoch interruption, its watchdog and module cache."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import wasmtime

from ..core.errors import CallError, FailureClass
from ..core.registry import HostFunction
from ..core.settings import EngineSettings
from .cache import ModuleCache
from .compile_worker import build_config
from .compiler import ModuleCompiler
from .density import trim_native_heap, use_pooling_allocator
from .hostcalls import BoundImport, Gate, GilTrust
from .instance import CompiledModule, Instance, StoreLimits
from .sigint import install as install_sigint_handler
from .sigint import install_unraisable_hook
from .stack import STACK_MARGIN, check_stack_here
from .ticker import make_ticker

GC_NUDGE_STORES = 64
"""Instances left open that trigger a cyclic garbage collection at the next instantiation.

An Extension dropped without close() is a reference cycle (its instance's host functions call
back into it), freed only by Python's cyclic collector, which counts objects, not the 1 GiB of
address space and the memory maps each Store holds. When the open Stores double past this
many since the last collection, instantiation collects first, so the Stores of dropped
extensions stay bounded by twice the live ones plus this."""

# ---------------------------------------------------------------------------------------------
# Engine and instances
# ---------------------------------------------------------------------------------------------

_VALTYPES = {
    "i32": wasmtime.ValType.i32,
    "i64": wasmtime.ValType.i64,
    "f32": wasmtime.ValType.f32,
    "f64": wasmtime.ValType.f64,
}


def engine_options(settings: EngineSettings) -> dict[str, object]:
    """The wasmtime Config of ``settings``, as data: the compile worker builds the same one."""
    return {
        "consume_fuel": True,
        "epoch_interruption": True,
        "max_wasm_stack": settings.max_wasm_stack,
        "memory_reservation": settings.memory_reservation,
        "memory_guard_size": settings.memory_guard_size,
        # Host calls keep a view of guest memory across calls (hostcalls.NativeCall), which is
        # only sound if a memory's base never changes: growth past the reservation fails.
        "memory_may_move": False,
        # Data images copied, not mapped: 2 memory maps per instance instead of 4 (settings).
        "memory_init_cow": settings.memory_init_cow,
        "cranelift_opt_level": settings.opt_level,
        "parallel_compilation": settings.parallel_compilation,
        "wasm_threads": False,
        "shared_memory": False,
    }


class WasmEngine:
    """One wasmtime Engine with fuel and epoch interruption, its watchdog and module cache."""

    def __init__(self, settings: EngineSettings, cache_dir: Path | None = None) -> None:
        self.settings = settings
        options = engine_options(settings)
        config = build_config(options)
        if settings.pooling_instances:
            use_pooling_allocator(config, settings)
        self._engine = wasmtime.Engine(config)
        self._watchdog = make_ticker(self._engine, settings.epoch_tick_ms)
        # Whether a short call may keep the GIL (Instance.call): only if ticks need none.
        self.keep_gil_below_fuel = settings.keep_gil_below_fuel if self._watchdog.gil_free else 0
        # A WasmEngine dropped without close() (its Host dropped) still stops its ticker.
        weakref.finalize(self, self._watchdog.stop)
        self._open: weakref.WeakSet[Instance] = weakref.WeakSet()
        self._nudge_at = GC_NUDGE_STORES
        self.compiler = ModuleCompiler(self._engine, options, settings)
        self.cache = ModuleCache(self._engine, settings.fingerprint(), cache_dir, self.compiler)
        # A FuncType is registered with the first engine that uses it and must never meet
        # another one (wasmtime asserts, aborting the process): one cache per engine.
        self._func_types: dict[tuple[tuple[str, ...], tuple[str, ...]], wasmtime.FuncType] = {}
        self._func_types_lock = threading.Lock()
        # Their addresses (the FuncTypes above never go while the engine lives).
        self._func_type_addresses: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
        # The digests of the modules whose GIL trust was withdrawn (GilTrust): a few bytes for
        # each module that ever held the GIL through a tick, kept for the engine's life.
        self._gil_withdrawn: set[str] = set()
        # The CompiledModule of each digest while anything (an extension) still holds it.
        self._compiled: weakref.WeakValueDictionary[str, CompiledModule] = (
            weakref.WeakValueDictionary()
        )

    def check_entry_stack(self) -> None:
        """Refuse, as an entry into a guest of this engine would be refused here (stack.py), a
        caller whose thread cannot or whose frames leave too little stack to run one: for an
        owner to look before it commits to a start-up the entry would then refuse."""
        check_stack_here(self.settings.max_wasm_stack + STACK_MARGIN)

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

    def func_type_address(self, entry: HostFunction) -> int:
        """The address of ``entry``'s FuncType (kept alive by this engine's cache), read
        without the lock once known: what every instance's imports are made with."""
        address = self._func_type_addresses.get((entry.params, entry.results))
        if address is None:
            ft = self.func_type(entry)
            address = ctypes.cast(ft.ptr(), ctypes.c_void_p).value or 0
            self._func_type_addresses[(entry.params, entry.results)] = address
        return address

    def compile(self, wasm: bytes, sha256: str | None = None) -> CompiledModule:
        """Compile (or fetch from the cache) under the compile budget. ``sha256``, when given,
        is the digest the caller believes ``wasm`` has; a mismatch is refused, never cached."""
        module, digest = self.cache.get(wasm)  # keyed by the digest it computes itself
        if sha256 is not None and digest != sha256:
            raise CallError(
                FailureClass.ADMISSION, "the package's sha256 does not match its module bytes"
            )
        known = self._compiled.get(digest)
        if known is not None and known.module is module:
            return known  # what is read once per module (its imports) stays read
        trust = GilTrust(digest, self._gil_withdrawn)
        compiled = self._compiled[digest] = CompiledModule(module, digest, trust)
        return compiled

    def validates(self, wasm: bytes) -> bool:
        """Whether this engine's configuration accepts ``wasm`` (validation only, no code
        generated: about 1 ms per 100 KB, against 100+ ms to compile it)."""
        try:
            wasmtime.Module.validate(self._engine, wasm)
        except wasmtime.WasmtimeError:
            return False
        return True

    def new_instance(
        self,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> Instance:
        """A Store under ``limits`` with ``imports`` linked, ready for
        :meth:`Instance.instantiate`; no guest code has run yet. ``command_export`` names the
        entry point of a plain profile command (``_start``) instead of the wasihost ABI
        exports."""
        self._watchdog.ensure_running()
        install_sigint_handler()
        install_unraisable_hook()
        if len(self._open) >= self._nudge_at:
            gc.collect()
            self._nudge_at = max(GC_NUDGE_STORES, 2 * len(self._open))
        instance = Instance(self, module, imports, gate, limits, command_export)
        self._open.add(instance)
        return instance

    def release_memory(self) -> None:
        """Give the native heap's free pages back to the system (see trim_native_heap)."""
        trim_native_heap()

    def close(self) -> None:
        self._watchdog.stop()
        self.cache.close()
        # What the host's Stores freed is still in the C heap: give it back with the host.
        trim_native_heap()

    @property
    def wasmtime_engine(self) -> wasmtime.Engine:
        return self._engine
