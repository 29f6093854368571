"""One guest instance in its own Store: limits, linking, the fast call path, failures."""

from __future__ import annotations

import ctypes
import functools
import itertools
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from ctypes import POINTER, byref
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

import attrs
import wasmtime
from wasmtime import _bindings as raw
from wasmtime import _ffi as ffi

from ..core.errors import CallError, ConfigError, FailureClass
from ..core.growprobe import GROW_REFUSED_EXPORT, refused_bytes
from ..core.limits import COMMAND_FUEL_PER_BYTE
from . import sigint
from .fastcall import BAD_BLOCK, ENGINE_FAILED, FAST
from .hostcalls import (
    BoundImport,
    Gate,
    GilTrust,
    HostContext,
    func_new_unchecked,
    host_callback,
)
from .lowlevel import (
    EPOCH_CALLBACK,
    PROCESS_MEMORY,
    U32,
    UPDATE_DEADLINE_CONTINUE,
    call_keeping_gil,
    call_unchecked,
    command_call,
    command_call_keeping_gil,
    command_get_fuel,
    command_set_epoch_deadline,
    command_set_fuel,
    error_new,
    fuel_kept_by,
    get_fuel,
    instance_export_get,
    instance_new,
    set_epoch_deadline,
    set_fuel,
    short_message,
    store_context,
    store_delete,
    store_epoch_deadline_callback,
    store_limiter,
    store_new,
    trap_failure,
)
from .stack import (
    GET_CONTEXT,
    SP_WORD,
    STACK_MARGIN,
    THREAD_STACK,
    check_stack_here,
    read_thread_stack,
    refuse_entry,
)
from .ticker import GIL_WANTED

if TYPE_CHECKING:
    from typing import Protocol

    from ..core.registry import HostFunction
    from ..core.settings import EngineSettings
    from .hostcalls import HostCallCounter
    from .native import NativeCall

    # For the type checker only: no class is made at start-up, where this module is loaded.
    class EngineHandle(Protocol):
        """What an instance reads of the engine that makes it
        (:class:`~wasihost.engine.wasm_engine.WasmEngine`, which imports this module)."""

        @property
        def settings(self) -> EngineSettings: ...

        @property
        def keep_gil_below_fuel(self) -> int: ...

        @property
        def wasmtime_engine(self) -> wasmtime.Engine: ...

        def func_type_address(self, entry: HostFunction) -> int: ...


# Refusals pass their exception through Instance._refused as it is.
_E = TypeVar("_E", bound=Exception)


# Where a function sits in a wasmtime_extern_t (after its kind byte), and the struct's size.
_EXTERN_OF = ffi.wasmtime_extern_t.of.offset
_EXTERN_SIZE = ctypes.sizeof(ffi.wasmtime_extern_t)
# A wasmtime_val_raw_t in 8-byte words: the argument arrays are read and written through a
# 'Q' view, word 0 of each slot (an i32 is its low half, little-endian), instead of a ctypes
# union object made per access.
_RAW_WORDS = ctypes.sizeof(ffi.wasmtime_val_raw_t) // 8
# The constant arguments of the command path's calls, as the object-argument prototypes take
# them (lowlevel.object_arg_fn): one and three values, and an epoch deadline of one tick.
_ONE_ARG = ctypes.c_size_t(1)
_THREE_ARGS = ctypes.c_size_t(3)
_ONE_TICK = ctypes.c_uint64(1)
_STATUS = struct.Struct("<I").unpack_from


class _Block(ctypes.Structure):
    """What an instance hands libwasmtime by address, in one allocation instead of a ctypes
    object each: the command path's argument arrays and trap slot, the fuel read back after a
    phase, and, from instantiation on, the instance and the three exports the ABI calls (each
    a ``wasmtime_extern_t`` as the export look-up writes it)."""

    _fields_ = [
        ("args1", ffi.wasmtime_val_raw_t * 1),
        ("args3", ffi.wasmtime_val_raw_t * 3),
        ("trap", ctypes.c_void_p * 1),
        ("fuel_left", ctypes.c_uint64 * 1),
        ("instance", ffi.wasmtime_instance_t),
        ("memory", ffi.wasmtime_extern_t),
        ("alloc", ffi.wasmtime_extern_t),
        ("call", ffi.wasmtime_extern_t),
    ]


# Where each field sits in a _Block, from its start.
_AT: dict[str, int] = {field[0]: getattr(_Block, field[0]).offset for field in _Block._fields_}


class _Store:
    """A libwasmtime Store on its address, made and freed through our own prototypes
    (lowlevel.store_new and the others) instead of wasmtime-py's ``Store``, whose typed
    wrappers and pointer objects were about 3 µs of every instance. Freed by :meth:`close`,
    once; an Instance dropped without close() frees it when collected, as wasmtime-py's did."""

    __slots__ = ("address", "context")

    def __init__(self, engine: wasmtime.Engine) -> None:
        self.address = 0  # what __del__ reads if the next line fails
        self.address = store_new(ctypes.cast(engine.ptr(), ctypes.c_void_p), None, None)
        # The Store's context, as the command path's object-argument prototypes take it.
        self.context = ctypes.c_void_p(store_context(self.address))

    def set_limits(
        self, memory_size: int, table_elements: int, instances: int, tables: int, memories: int
    ) -> None:
        if not self.address:
            raise ValueError("already closed")  # never a freed Store's address (wasmtime-py's)
        store_limiter(self.address, memory_size, table_elements, instances, tables, memories)

    def close(self) -> None:
        address, self.address = self.address, 0
        if address:
            store_delete(address)

    def __del__(self) -> None:
        self.close()


@attrs.frozen
class StoreLimits:
    """Per-instance limits applied to the Store before instantiation."""

    max_memory_bytes: int
    max_table_elements: int
    fuel: int
    timeout_ms: int


class CallResult(NamedTuple):
    """A raw command response: the status word, the body bytes, and what the call cost."""

    status: int
    body: bytes
    fuel_used: int


# Makes a CallResult from a (status, body, fuel_used) tuple in C: CallResult(...) runs the
# Python __new__ namedtuple generates, a frame per command call.
_new_result = functools.partial(tuple.__new__, CallResult)


class Budget:
    """What one embedder call may still spend, across every phase it runs.

    A first call runs the start function, the handshake's two reserved calls and the command;
    each phase draws from the same fuel and the same wall-clock deadline, and none refills
    them, so ``fuel_per_call`` and ``timeout_ms`` bound the embedder's call as a whole.
    """

    __slots__ = ("deadline", "fuel", "used")

    def __init__(self, fuel: int, timeout_ms: int) -> None:
        self.fuel = fuel
        self.deadline = time.monotonic() + timeout_ms / 1000
        self.used = 0

    def spend(self, used: int) -> None:
        self.used += used
        self.fuel = max(0, self.fuel - used)


# env -> the HostContext of a Store, for the epoch callback. Weak: the table must not keep a
# dropped Instance (and its Store, and whatever its brokers hold) alive; an entry goes with
# its context.
EPOCH_TARGETS: weakref.WeakValueDictionary[int, HostContext] = weakref.WeakValueDictionary()
EPOCH_TARGET_IDS = itertools.count(1)

# Commands remembered as short per instance (see Instance.call): the names an embedder calls
# come from a manifest's few commands; past this many, newcomers just release the GIL.
MAX_SHORT_COMMANDS = 64


# How long close() waits for a call in flight on another thread to stop after interrupting it;
# past that the Store is freed by that call when it returns (see Instance.close).
CLOSE_WAIT_S = 0.5
# How often close() looks whether that call has stopped: a fraction of an epoch tick.
CLOSE_POLL_S = 0.002


def _end_at_tick(ctx: int, message: bytes) -> int:
    """The error that ends a call at an epoch tick. What the guest burnt since its last call
    or return is in a register, lost as the error unwinds it (lowlevel.FUEL_KEPT_TRAPS): the
    Store's counter is emptied, so the call is charged all the fuel it was given."""
    set_fuel(ctx, 0)
    return int(error_new(message) or 0)


def _epoch_tick(ctx: int, env: int, delta: Any, kind: Any) -> int:
    """Runs on the guest's thread at every epoch tick of a call.

    Deadlines are one tick long and renewed here, so that the wall-clock deadline and a host's
    interrupt are both honoured within a tick. A longer deadline cannot be shortened from
    another thread: compiled code caches the deadline and rereads it only when it has passed.
    """
    try:
        host = EPOCH_TARGETS.get(env or 0)
        if host is None:
            return _end_at_tick(ctx, b"wasihost: instance is gone")
        if host.interrupted:
            host.failure = host.interrupted_failure()
            return _end_at_tick(ctx, b"wasihost: interrupted")
        if time.monotonic() >= host.native.deadline:
            host.failure = CallError(FailureClass.DEADLINE, "wall-clock deadline passed")
            return _end_at_tick(ctx, b"wasihost: deadline")
        if host.keep_gil:
            # Other threads get the GIL here (this is Python code, where a waiting thread's
            # request is served). A tick may fall into any call; a second one in the same call
            # (same deadline) means it ran a whole tick: not short, and no later call of its
            # module (any instance, now or later) keeps the GIL.
            if host.ticked_deadline == host.native.deadline:
                host.gil_trust.withdraw()
            host.ticked_deadline = host.native.deadline
        delta[0] = 1
        kind[0] = UPDATE_DEADLINE_CONTINUE
        return 0
    except BaseException:
        return _end_at_tick(ctx, b"wasihost: deadline check failed")


on_epoch_tick = EPOCH_CALLBACK(_epoch_tick)
sigint.CALLBACK_CODES.add(_epoch_tick.__code__)


@attrs.frozen
class CompiledModule:
    """A compiled module and the digest of its bytes."""

    module: wasmtime.Module = attrs.field(eq=False)
    sha256: str
    # Withdrawn for good once a call of any of its instances kept the GIL for a whole epoch
    # tick (see Instance.call): that module's calls always release it from then on, also
    # those of a CompiledModule made again for the same bytes (see GilTrust).
    gil_trust: GilTrust = attrs.field(factory=GilTrust, eq=False, repr=False)
    # Read from the engine once per compiled module, not once per instance (about 12 µs).
    _imports: tuple[tuple[str, str], ...] = attrs.field(init=False, eq=False, repr=False)
    # The module's address, as instantiation passes it (the module lives as long as this).
    address: int = attrs.field(init=False, eq=False, repr=False)
    # The registry entries last linked to the module: an instance linked with the same entries
    # (every instance of an extension, and of its restarts) is checked against the module's
    # imports by identity, not name by name (see link_check).
    _linked: tuple[HostFunction, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        names = tuple((i.module, i.name or "") for i in self.module.imports)
        object.__setattr__(self, "_imports", names)
        address = ctypes.cast(self.module.ptr(), ctypes.c_void_p).value or 0
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "_linked", ())

    def import_names(self) -> list[tuple[str, str]]:
        return list(self._imports)

    def link_check(self, imports: Sequence[BoundImport]) -> None:
        """Refuse ``imports`` unless they are the module's imports, in its order (admission
        read them from the bytes; the engine must agree exactly). The entries of a module's
        instances are the same objects from one instance to the next (the registry's,
        sealed), so the entries that passed are kept, and the same entries pass again on
        their identity."""
        entries = tuple(b.entry for b in imports)
        if entries == self._linked and (entries or not self._imports):
            return
        if self._imports != tuple((e.module, e.name) for e in entries):
            raise CallError(FailureClass.ADMISSION, "engine and admission disagree on imports")
        object.__setattr__(self, "_linked", entries)  # one tuple: swapped whole


class Instance:
    """One guest instance in its own Store, entered by one thread at a time.

    A Store used from two threads at once crashes the process. Owners serialise their calls
    (``lock`` is there for that; an Extension uses its own lock), and every entry point also
    takes an entry token without waiting, so a second thread entering while a call runs gets a
    ConfigError instead of a crash. After a failure that may have corrupted the guest, the
    owner discards the instance (``close``) and instantiates anew.
    """

    def __init__(
        self,
        engine: EngineHandle,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> None:
        self.lock = threading.Lock()
        # The entry token: popped by whichever thread enters the guest, put back as it leaves
        # (see the class docstring). list.pop and list.append are atomic under the GIL and
        # cost a tenth of a Lock's acquire and release, which a no-op call would notice.
        self._token = [True]
        self._close_pending = False
        self._stack_needed = engine.settings.max_wasm_stack + STACK_MARGIN
        self._engine = engine
        self._limits = limits
        self._store = _Store(engine.wasmtime_engine)
        self._set_memory_limit(limits.max_memory_bytes)
        self._context = self._store.context
        self._ctx_addr: int = self._context.value or 0
        self._ctx = HostContext(imports, gate)
        # The same, for an owner's per-call look at ``interrupted`` without a property's frame.
        self.context = self._ctx
        self._ctx.expected_ctx = self._ctx_addr or 0
        epoch_env = next(EPOCH_TARGET_IDS)
        EPOCH_TARGETS[epoch_env] = self._ctx
        store_epoch_deadline_callback(self._store.address, on_epoch_tick, epoch_env, None)
        self._timeout_s = limits.timeout_ms / 1000
        self._tick_s = engine.settings.epoch_tick_ms / 1000
        # 0 when the engine's ticks need the GIL (then no call may keep it).
        self._keep_gil_below = engine.keep_gil_below_fuel
        self._gil_trust = self._ctx.gil_trust = module.gil_trust
        # The commands whose last call here burnt less fuel than that: their next call keeps
        # the GIL. A command is trusted only once seen short, so a long one never starts so.
        self._short_commands: set[bytes] = set()
        # What get_fuel answers (an array: passed to the command path's calls as it is), in
        # the block of what libwasmtime is handed by address; and what set_fuel is given.
        self._block = block = _Block()
        self._block_addr = ctypes.addressof(block)
        self._fuel_left: ctypes.Array[ctypes.c_uint64] = block.fuel_left
        self._fuel_left_addr = self._block_addr + _AT["fuel_left"]
        self._fuel_arg = ctypes.c_uint64(0)
        self.closed = False
        self.fuel_used = 0
        self.last_call_fuel = 0
        module.link_check(imports)
        externs = (ffi.wasmtime_extern_t * max(1, len(imports)))()
        # The C callbacks live exactly as long as this Instance, which owns the Store calling
        # them (nothing module-level refers to either: a dropped Instance is collected).
        made = [
            host_callback(d, f) for d, f in zip(self._ctx.dispatch, self._ctx.fast, strict=True)
        ]
        self._callbacks = [keep for _, _, keep in made]
        # Each function is made in place, in its slot of the array instantiation reads: no
        # wasmtime_func_t and no extern built and copied per import (two dozen for WASI).
        slot = ctypes.addressof(externs) + _EXTERN_OF
        for i, bound in enumerate(imports):
            externs[i].kind = ffi.WASMTIME_EXTERN_FUNC
            callback, env, _ = made[i]
            func_new_unchecked(
                self._ctx_addr,
                engine.func_type_address(bound.entry),
                callback,
                env,
                None,
                slot + i * _EXTERN_SIZE,
            )
        # Kept alive until instantiation has linked them into the Store.
        self._externs: Any = externs
        self._command_export = command_export
        self._module = module
        self.started = False

    def instantiate(self, budget: Budget) -> None:
        """Run instantiation (the guest's start function, if any) under ``budget``.

        Separate from construction so that an owner holds the instance, and can interrupt
        it, before any guest code runs. One thread at a time, as every entry point.
        """
        if self.closed or self.started:
            raise CallError(FailureClass.HOST_ERROR, "instance is closed or already started")
        # Instantiation runs the start function: it needs the stack a call does (see stack.py).
        check_stack_here(self._stack_needed)
        try:
            self._token.pop()
        except IndexError:
            raise _in_use() from None
        self.started = True
        block, base = self._block, self._block_addr
        externs, module, command_export = self._externs, self._module, self._command_export
        try:
            self._arm(budget)
            GIL_WANTED.add(self)
            try:
                err = instance_new(
                    self._ctx_addr,
                    module.address,
                    ctypes.addressof(externs),
                    len(self._ctx.imports),
                    base + _AT["instance"],
                    base + _AT["trap"],
                )
            finally:
                GIL_WANTED.discard(self)
            trap = block.trap[0]
            if trap:
                block.trap[0] = None  # the command path's trap slot, empty between calls
                self._forfeit_lost_fuel(trap)
            overran = self._account(budget)
            failure: BaseException | None = None
            if err or trap:
                failure = self._failure(
                    ctypes.cast(err, POINTER(ffi.wasmtime_error_t)) if err else None,
                    ctypes.cast(trap, POINTER(ffi.wasm_trap_t)) if trap else None,
                    instantiating=True,
                )
            elif overran:
                failure = _overrun()
            elif self._ctx.halt is not None:
                failure = self._halted()
        finally:
            self._leave()
        if failure is not None:
            self.close()
            raise failure
        self._externs = None
        self._instance = block.instance
        self._export(b"memory", "memory")
        self._memory = block.memory.of.memory
        self._ctx.set_memory(self._memory, self._store)
        if command_export is not None:
            self._export(command_export.encode(), "call")
            alloc = "call"
        else:
            self._export(b"wasihost_alloc", "alloc")
            self._export(b"wasihost_call", "call")
            alloc = "alloc"
        self._alloc = getattr(block, alloc).of.func
        self._call = block.call.of.func
        self._args1 = block.args1
        self._args3 = block.args3
        # Raw addresses for the command path, all in the block, which self keeps alive.
        self._alloc_addr = base + _AT[alloc] + _EXTERN_OF
        self._call_addr = base + _AT["call"] + _EXTERN_OF
        self._memory_addr = base + _AT["memory"] + _EXTERN_OF
        self._args1_addr = base + _AT["args1"]
        self._args3_addr = base + _AT["args3"]
        # The trap slot wasmtime fills: an array, so the command path passes it as it is.
        self._trap_slot = block.trap
        self._trap_slot_addr = base + _AT["trap"]
        # What only the ctypes command path uses is made by its first call (_ctypes_path).
        self._words1: memoryview | None = None

    def _ctypes_path(self) -> tuple[memoryview, memoryview]:
        """The command path's arguments as objects (lowlevel.object_arg_fn), and the argument
        arrays as 8-byte words (_RAW_WORDS), for _call_by_ctypes; self keeps what each points
        into alive. Made once, by its first call: the compiled path needs none of them."""
        self._alloc_ref = ctypes.pointer(self._alloc)
        self._call_ref = ctypes.pointer(self._call)
        self._words3 = PROCESS_MEMORY[
            self._args3_addr : self._args3_addr + ctypes.sizeof(self._args3)
        ].cast("Q")
        self._words1 = PROCESS_MEMORY[
            self._args1_addr : self._args1_addr + ctypes.sizeof(self._args1)
        ].cast("Q")
        return self._words1, self._words3

    @property
    def exit_code(self) -> int | None:
        return self._ctx.exit_code

    def run_command(self, budget: Budget) -> int:
        """Run a profile command's entry point to its end under what is left of ``budget``;
        return its exit code.

        A normal return is exit code 0; ``proc_exit(n)`` ends it with ``n``. One thread at a
        time; the instance cannot run again afterwards.
        """
        if self.closed:
            raise CallError(FailureClass.HOST_ERROR, "instance is closed")
        check_stack_here(self._stack_needed)
        try:
            self._token.pop()
        except IndexError:
            raise _in_use() from None
        overran = False
        try:
            self._arm(budget)
            # A command crosses into Python at each host call (each printed line): with no other
            # Python thread to hand the GIL to, releasing and taking it back there is pure cost
            # (a tenth of a line). Kept only then, with ticks that need no GIL (the setting is 0
            # otherwise, or off); a thread that appears during the run gets the GIL at the next
            # host call or tick, as beside a short call (docs/engine.md).
            keep = self._ctx.keep_gil = (
                self._keep_gil_below > 0 and not GIL_WANTED and threading.active_count() == 1
            )
            try:
                self._invoke(self._call_addr, self._args1_addr, 0, keep)
            except CallError as exc:
                if self._ctx.exit_code is None or exc.failure is FailureClass.INTERRUPTED:
                    raise
            finally:
                overran = self._account(budget)
        finally:
            self._leave()
        if self._ctx.halt is not None:
            raise self._halted()
        if overran:
            raise _overrun()
        return self._ctx.exit_code if self._ctx.exit_code is not None else 0

    def refused_memory_bytes(self) -> int | None:
        """The memory size the last refused ``memory.grow`` asked for, in bytes, for a module
        the host probed (``growprobe``); None when none was refused, the module has no such
        export, or the instance is closed or in use. Only the caller knows whether the host
        probed the module (``Extension`` does): a module exporting the probe's name itself is
        compiled as it is, and what this reads from it is the guest's own word. On the thread
        that owns the instance, after its run: it holds the entry token while it reads, so a
        close from another thread (a revocation) waits instead of freeing the Store under the
        read."""
        instance = getattr(self, "_instance", None)  # set once instantiated
        if instance is None:
            return None
        try:
            self._token.pop()
        except IndexError:
            return None  # being closed from another thread
        try:
            if self.closed:
                return None
            name = GROW_REFUSED_EXPORT.encode()
            item = ffi.wasmtime_extern_t()
            if not instance_export_get(
                self._ctx_addr, ctypes.addressof(instance), name, len(name), ctypes.addressof(item)
            ):
                return None
            kind: Any = item.kind  # ctypes reads the field as an int; its stub says c_ubyte
            if kind != ffi.WASMTIME_EXTERN_GLOBAL.value:
                return None
            value = ffi.wasmtime_val_t()
            context = ctypes.cast(self._ctx_addr, POINTER(ffi.wasmtime_context_t))
            raw.wasmtime_global_get(context, byref(item.of.global_), byref(value))
            pages = int(value.of.i64) & 0xFFFF_FFFF_FFFF_FFFF
        finally:
            self._leave()
        return refused_bytes(pages) if pages else None

    def _export(self, name: bytes, field: str) -> None:
        """Look ``name`` up among the instance's exports, into the block's ``field``."""
        base = self._block_addr
        if not instance_export_get(
            self._ctx_addr, base + _AT["instance"], name, len(name), base + _AT[field]
        ):
            raise CallError(FailureClass.PROTOCOL, f"export {name.decode()} missing")

    def _arm(self, budget: Budget) -> None:
        """Before a phase: what is left of the call's fuel and its deadline."""
        if self._ctx.interrupted:
            raise CallError(FailureClass.DEADLINE, "interrupted by the host")
        set_fuel(self._ctx_addr, budget.fuel)
        self._ctx.fuel_debt = 0
        self._ctx.keep_gil = False  # only Instance.call and run_command keep it
        # One tick, renewed by on_epoch_tick until the wall-clock deadline or an interrupt.
        set_epoch_deadline(self._ctx_addr, 1)
        self._ctx.native.deadline = budget.deadline

    def _account(self, budget: Budget) -> bool:
        """After a phase: what it burnt, host calls' debt included, charged to ``budget`` and
        the instance's total. True if the debt was more than the fuel left (see SETTLE_FUEL)."""
        get_fuel(self._ctx_addr, self._fuel_left_addr)
        left = self._fuel_left[0]
        debt, self._ctx.fuel_debt = self._ctx.fuel_debt, 0
        used = budget.fuel - left + debt
        self.fuel_used += used
        self.last_call_fuel = used
        budget.spend(used)
        return debt > left

    def _forfeit_lost_fuel(self, trap_addr: int) -> None:
        """Before the phase's fuel is read: after a trap that unwound what the guest burnt
        since its last call or return (lowlevel.FUEL_KEPT_TRAPS), the phase is charged all the
        fuel it was given. No bound tighter than that is sound: the CPU time of the call does
        not bound its fuel (see docs/budgets.md), and a trap must never cost less than the
        work it cut short would have."""
        if not fuel_kept_by(trap_addr):
            set_fuel(self._ctx_addr, 0)

    def _failure(self, err: Any, trap: Any, *, instantiating: bool = False) -> CallError:
        failure = self._ctx.take_failure()
        reraise = self._ctx.clear_slots()
        if reraise is not None or self._ctx.halt is not None:
            # Nothing of this call may leak into the next: the slots are empty, the trap freed.
            if trap:
                raw.wasm_trap_delete(trap)
            if err:
                raw.wasmtime_error_delete(err)
            if reraise is not None:
                raise reraise  # KeyboardInterrupt/SystemExit from a host function
            return self._ctx.interrupted_failure()
        if failure is None and self._ctx.exit_code is not None:
            failure = CallError(FailureClass.TRAP, f"guest exited with {self._ctx.exit_code}")
        if failure is not None:
            if trap:
                raw.wasm_trap_delete(trap)
            if err:
                raw.wasmtime_error_delete(err)
            return failure
        if trap:
            return trap_failure(trap)
        message = short_message(str(wasmtime.WasmtimeError._from_ptr(err)))
        if instantiating and ("limit" in message or "minimum" in message):
            return CallError(FailureClass.MEMORY_LIMIT, message)
        return CallError(FailureClass.TRAP, message)

    def _invoke(self, func_addr: int, args_addr: int, n: int, keep_gil: bool = False) -> None:
        if keep_gil:
            err = call_keeping_gil(self._ctx_addr, func_addr, args_addr, n, self._trap_slot_addr)
        else:
            GIL_WANTED.add(self)
            try:
                err = call_unchecked(
                    self._ctx_addr, func_addr, args_addr, n, self._trap_slot_addr
                )
            finally:
                GIL_WANTED.discard(self)
        if err or self._trap_slot[0]:
            self._raise_failure(err)

    def _raise_failure(self, err: int | None) -> NoReturn:
        trap = self._trap_slot[0]
        self._trap_slot[0] = None
        if trap:
            self._forfeit_lost_fuel(trap)
        raise self._failure(
            ctypes.cast(err, POINTER(ffi.wasmtime_error_t)) if err else None,
            ctypes.cast(trap, POINTER(ffi.wasm_trap_t)) if trap else None,
        )

    def call(
        self,
        command: bytes,
        payload: bytes | bytearray | memoryview,
        max_output_bytes: int,
        budget: Budget | None = None,
        may_keep_gil: bool = True,
    ) -> CallResult:
        """Run one command per the ABI calling convention, under what is left of ``budget`` (a fresh
        per-call budget when None). One thread at a time. ``may_keep_gil`` False releases the GIL
        across guest code even for a short call (the owner knows another thread is busy with
        something this call shares). ``payload`` (bytes-like, one byte per item) is copied once
        into the guest's block and the response body once out of guest memory; each copy costs
        ``COMMAND_FUEL_PER_BYTE`` a byte of the call's fuel."""
        # -- refuse -- _arm, _account, _invoke, check_stack_here inline: frames cost a no-op call
        host = self._ctx
        if self.closed or host.interrupted:
            raise self._refused(_not_enterable(self.closed))
        # -- stack -- left below this frame for the guest: a deep caller, or a nested guest
        stack, needed = THREAD_STACK, self._stack_needed
        context = stack.context
        if context is None:
            context = read_thread_stack(needed)
        GET_CONTEXT(context)
        left = context[SP_WORD] - stack.low
        if left < needed or left > stack.size:  # too little, or not the thread's stack
            raise self._refused(refuse_entry(needed, left))
        # -- budget -- the host's copy of the input is paid for before it is made
        started = time.monotonic()
        if budget is None:
            fuel, deadline = self._limits.fuel, started + self._timeout_s
        else:
            fuel, deadline = budget.fuel, budget.deadline
        input_price = len(payload) * COMMAND_FUEL_PER_BYTE
        if input_price >= fuel:
            raise self._refused(_input_unpaid(fuel, len(payload)))
        # -- enter -- the guest is entered in this frame only: sigint's ENTRY_CODES find it
        token = self._token
        try:
            token.pop()
        except IndexError:
            raise _in_use() from None
        ctx = self._context
        # A short call keeps the GIL through both crossings (docs/engine.md, Threads and the GIL)
        keep = host.keep_gil = (
            may_keep_gil and command in self._short_commands
            and self._gil_trust.kept and not GIL_WANTED
        )
        if not keep:
            GIL_WANTED.add(self)
        fuel_left = self._fuel_left
        left = -1  # the fuel left, once the compiled path has read it
        try:
            host.fuel_debt = 0
            mem = host.native
            mem.deadline = deadline
            if FAST is not None:
                # -- arm, alloc, write, run, read: one crossing (engine/fastcall.py) --
                code, status, body, left = FAST(
                    self._ctx_addr,
                    self._alloc_addr,
                    self._call_addr,
                    self._args1_addr,
                    self._args3_addr,
                    self._trap_slot_addr,
                    self._memory_addr,
                    fuel - input_price,
                    keep,
                    command,
                    payload,
                    max_output_bytes,
                )
                if code:
                    if code == ENGINE_FAILED:
                        left = -1  # a trap may forfeit the fuel: read after _raise_failure
                    self._compiled_path_failed(code, status, body, mem, max_output_bytes)
                host.fuel_debt += (len(body) + 4) * COMMAND_FUEL_PER_BYTE
            else:
                status, body = self._call_by_ctypes(
                    command, payload, max_output_bytes, fuel - input_price, mem, keep
                )
        finally:
            # -- account --
            if not keep:
                GIL_WANTED.discard(self)
            if left < 0:
                command_get_fuel(ctx, fuel_left)
                left = fuel_left[0]
            debt, host.fuel_debt = host.fuel_debt, 0
            used = fuel - left + debt
            self.fuel_used += used
            self.last_call_fuel = used
            if used >= self._keep_gil_below:
                self._not_short(command, keep, started)
            elif not keep and len(self._short_commands) < MAX_SHORT_COMMANDS:
                self._short_commands.add(command)
            if budget is not None:
                budget.spend(used)
            # -- leave --
            token.append(True)
            if self._close_pending:
                self.close()
            if host.deferred:
                self._run_deferred_handlers()
        if host.halt is not None:
            raise self._halted()  # e.g. Ctrl-C that came after the guest's last host call
        if debt > left:
            raise _overrun()
        return _new_result((status, body, used))

    def _call_by_ctypes(
        self,
        command: bytes,
        payload: bytes | bytearray | memoryview,
        max_output_bytes: int,
        fuel: int,
        mem: NativeCall,
        keep: bool,
    ) -> tuple[int, bytes]:
        """The command path without the C extension (engine/fastcall.py): the same steps as
        ``FAST``, in five ctypes crossings; the caller armed ``mem``'s deadline and the debt,
        and reads the fuel left and accounts."""
        ctx, host, trap = self._context, self._ctx, self._trap_slot
        cross = command_call_keeping_gil if keep else command_call
        # -- arm --
        fuel_arg = self._fuel_arg
        fuel_arg.value = fuel
        command_set_fuel(ctx, fuel_arg)
        command_set_epoch_deadline(ctx, _ONE_TICK)
        # -- alloc --
        cmd_len = len(command)
        total = cmd_len + len(payload)
        words = self._words1
        if words is None:
            words, _ = self._ctypes_path()
        words[0] = total
        err = cross(ctx, self._alloc_ref, self._args1, _ONE_ARG, trap)
        if err or trap[0]:
            self._raise_failure(err)
        ptr = words[0] & U32
        if ptr == 0 or ptr + total > mem._size:
            _check_block(mem, ptr, total)
        # -- write -- name and payload in place, no joined copy of a large payload
        view = mem._view
        view[ptr : ptr + cmd_len] = command
        view[ptr + cmd_len : ptr + total] = payload
        # -- run --
        words = self._words3
        words[0] = ptr
        words[_RAW_WORDS] = cmd_len
        words[2 * _RAW_WORDS] = total - cmd_len
        err = cross(ctx, self._call_ref, self._args3, _THREE_ARGS, trap)
        if err or trap[0]:
            self._raise_failure(err)
        # -- read -- the copy out is paid for like a host call's bytes, as the call ends
        packed = words[0]
        resp_ptr, resp_len = packed >> 32, packed & U32
        resp_end = resp_ptr + resp_len
        if resp_end > mem._size or resp_len < 4 or resp_len - 4 > max_output_bytes:
            _check_response(mem, resp_ptr, resp_len, max_output_bytes)
        host.fuel_debt += resp_len * COMMAND_FUEL_PER_BYTE
        status = _STATUS(mem._view, resp_ptr)[0]
        body: bytes = mem._bytes[resp_ptr + 4 : resp_end]  # type: ignore[assignment]  # bytes
        return status, body

    def _compiled_path_failed(
        self, code: int, first: int, second: int, mem: NativeCall, max_output_bytes: int
    ) -> NoReturn:
        """Raise the failure the compiled path reported (``code``, with its two numbers) as the
        ctypes path raises it: the same checks, classes and messages."""
        if code == ENGINE_FAILED:
            self._raise_failure(first or None)
        if code == BAD_BLOCK:
            _check_block(mem, first, second)
            raise CallError(FailureClass.PROTOCOL, f"wasihost_alloc returned {first}")
        resp_ptr, resp_len = first >> 32, first & U32
        _check_response(mem, resp_ptr, resp_len, max_output_bytes)
        raise CallError(FailureClass.PROTOCOL, f"response [{resp_ptr}, +{resp_len}) refused")

    def _refused(self, error: _E) -> _E:
        """``error``, refusing a call before the guest runs, which therefore burnt nothing: an
        owner charges ``last_call_fuel`` after a failure, and the last call's figure would
        charge that call twice (12M fuel again for a deep caller's refusal, issue 28 second
        pass)."""
        self.last_call_fuel = 0
        return error

    def _not_short(self, command: bytes, kept: bool, started: float) -> None:
        """A call of ``command`` burnt ``keep_gil_below_fuel`` or more: its next call releases
        the GIL. If this one ``kept`` it past a whole tick, one bulk memory instruction
        (memory.fill of 512 MiB) ran to its end between two epoch checks and met at most one
        tick, so the two-tick rule of on_epoch_tick never saw it: no later call of its module
        keeps the GIL (docs/engine.md, "Threads and the GIL on the call path")."""
        self._short_commands.discard(command)
        if kept and time.monotonic() - started > self._tick_s:
            self._gil_trust.withdraw()

    @property
    def kept_gil(self) -> bool:
        """Whether the last call kept the GIL through its guest crossings (diagnostics)."""
        return self._ctx.keep_gil

    def keeps_gil(self, command: bytes) -> bool:
        """Whether the next call of ``command`` keeps the GIL, unless another thread is then in
        guest code with it released (diagnostics and tests)."""
        return command in self._short_commands and self._gil_trust.kept

    @property
    def interrupted(self) -> bool:
        return self._ctx.interrupted

    def count_host_calls(self, tally: HostCallCounter | None) -> None:
        """Operator metrics hook: tell ``tally`` this instance's host-call refusals and
        failures (counts by class only)."""
        self._ctx.tally = tally

    def memory_bytes(self) -> int | None:
        """The size of the guest's memory now (None: it has none, or it is gone). Only on the
        thread that owns the instance, between or right after its calls."""
        try:
            return self._ctx.native.size()
        except Exception:  # no memory bound, or the instance closed: nothing to measure
            return None

    def interrupt(self) -> None:
        """From any thread: the running call, if any, traps at its next epoch tick, and so does
        every later one; a broker waiting in a blocking host call wakes at once. Only Python
        objects are touched, never the Store."""
        self._ctx.interrupted = True
        self._ctx.native.wake()

    def interrupt_by_signal(self) -> None:
        """Ctrl-C deferred out of a host callback (see sigint.py): the call ends at once with
        class ``interrupted``, and so does every later one."""
        self._ctx.stop_now(CallError(FailureClass.INTERRUPTED, "interrupted by SIGINT (Ctrl-C)"))

    def _set_memory_limit(self, max_memory_bytes: int) -> None:
        # Every limit each time: wasmtime replaces the Store's limiter whole, and one left
        # out would be unlimited.
        self._store.set_limits(
            memory_size=max_memory_bytes,
            table_elements=self._limits.max_table_elements,
            instances=1,
            tables=1,
            memories=1,
        )

    def cap_memory(self, max_memory_bytes: int | None) -> None:
        """Between calls, on the thread that is about to call (or has just called): the next
        calls may grow linear memory to at most ``max_memory_bytes`` (never above the
        instance's own limit), or again to that limit with None. What the memory already
        has stays; growth past the cap fails in the guest (``memory.grow`` answers -1)."""
        limit = self._limits.max_memory_bytes
        token = self._token
        try:
            token.pop()
        except IndexError:
            return  # being closed from another thread: no call will use it again
        try:
            if not self.closed:
                cap = limit if max_memory_bytes is None else min(max_memory_bytes, limit)
                self._set_memory_limit(cap)
        finally:
            self._leave()

    def cancel(self) -> None:
        """From any thread: the caller gave up on the running call. It ends at its next epoch
        tick (a blocking host call wakes at once) with class ``cancelled``, and so does every
        later one: the instance is not to be used again."""
        self._ctx.stop_now(CallError(FailureClass.CANCELLED, "cancelled by the caller"))

    def stop(self, failure: CallError) -> None:
        """From any thread: end the running call at its next epoch tick (a blocking host call
        wakes at once) with ``failure``, and every later one: the resource governor's
        ``terminate``. The instance is not to be used again."""
        self._ctx.stop_now(failure)

    def defer_signal(self, handler: Callable[[int, Any], Any], signum: int) -> None:
        """A signal's Python handler deferred out of a host callback (see sigint.py): it runs
        as the call returns."""
        self._ctx.deferred.append((handler, signum))

    def _run_deferred_handlers(self) -> None:
        """As the call returns, at a safe point: what a deferred handler raises propagates."""
        deferred, self._ctx.deferred = self._ctx.deferred, []
        for handler, signum in deferred:
            handler(signum, None)

    def stop_by_exception(self, exc: BaseException) -> None:
        """An exception escaped one of this instance's callbacks before its ``try`` (see
        sigint.py): ctypes swallowed it, so the call is stopped here, failing ``host_error``,
        and a KeyboardInterrupt or SystemExit is re-raised after it."""
        self._ctx.stop_now(
            CallError(
                FailureClass.HOST_ERROR,
                f"a host callback was aborted on entry by {type(exc).__name__}",
            ),
            None if isinstance(exc, Exception) else exc,
        )

    def _halted(self) -> BaseException:
        reraise = self._ctx.clear_slots()
        return reraise if reraise is not None else self._ctx.interrupted_failure()

    def _leave(self) -> None:
        self._token.append(True)
        if self._close_pending:
            self.close()
        if self._ctx.deferred:
            self._run_deferred_handlers()

    def close(self) -> None:
        """Free the Store. From another thread while a call runs, the call is interrupted
        first and the Store freed once it has stopped (never under a running guest)."""
        if self.closed and not self._close_pending:
            return
        self.closed = True
        if not self._take_token():
            # Still running (a blocking host call, or close() from inside the call on its own
            # thread): that call frees the Store as it leaves.
            self._close_pending = True
            return
        try:
            self._close_pending = False
            self._ctx.native.forget()
            self._store.close()
        finally:
            self._token.append(True)

    def _take_token(self) -> bool:
        """The entry token, for close(): at once if no call runs, else after interrupting the
        call and waiting up to CLOSE_WAIT_S for it to stop."""
        interrupted = False
        give_up = time.monotonic() + CLOSE_WAIT_S
        while True:
            try:
                self._token.pop()
            except IndexError:
                pass
            else:
                return True
            if not interrupted:
                self.interrupt()
                interrupted = True
            if time.monotonic() >= give_up:
                return False
            time.sleep(CLOSE_POLL_S)


sigint.ENTRY_CODES.update(
    {
        f.__code__: "self"
        for f in (
            Instance.instantiate,
            Instance.call,
            Instance._call_by_ctypes,
            Instance.run_command,
        )
    }
)


def _in_use() -> ConfigError:
    return ConfigError(
        "Instance entered by a second thread while a call runs: hold Instance.lock around calls"
    )


def _overrun() -> CallError:
    return CallError(
        FailureClass.OUT_OF_FUEL, "fuel ran out paying for host calls (settled at the end)"
    )


def _not_enterable(closed: bool) -> CallError:
    return CallError(
        FailureClass.HOST_ERROR if closed else FailureClass.DEADLINE,
        "instance is closed" if closed else "interrupted by the host",
    )


def _input_unpaid(fuel: int, size: int) -> CallError:
    return CallError(
        FailureClass.OUT_OF_FUEL,
        f"{fuel} fuel cannot pay for copying {size} bytes of input "
        f"({COMMAND_FUEL_PER_BYTE} a byte)",
    )


def _check_block(mem: NativeCall, ptr: int, total: int) -> None:
    """The block ``wasihost_alloc`` answered is not inside the memory as last seen, or is 0:
    the guest may have grown its memory in the call (``size_for`` sees that, and is only
    called then: its frame is a measurable share of a no-op call); else the guest broke the
    protocol."""
    size = mem._size
    if ptr + total > size:
        size = mem.size_for(ptr + total)
    if ptr == 0 or ptr + total > size:
        raise CallError(
            FailureClass.PROTOCOL,
            f"wasihost_alloc({total}) returned {ptr}, not a block inside memory of "
            f"{size} bytes",
        )


def _check_response(mem: NativeCall, resp_ptr: int, resp_len: int, max_output_bytes: int) -> None:
    """The response is not inside the memory as last seen, or is shorter than its status or
    longer than the output limit: the guest may have grown its memory during the call
    (``size_for`` sees that); else it broke the protocol."""
    resp_end = resp_ptr + resp_len
    size = mem._size
    if resp_end > size:
        size = mem.size_for(resp_end)
        if resp_end > size:
            raise CallError(
                FailureClass.PROTOCOL,
                f"response [{resp_ptr}, +{resp_len}) outside memory of {size} bytes",
            )
    if resp_len < 4:
        raise CallError(FailureClass.PROTOCOL, f"response of {resp_len} bytes has no status")
    if resp_len - 4 > max_output_bytes:
        # The host names the manifest's limit (host/extension.py): this one may include the
        # CBOR head of the answer, which is no number a user sets.
        raise CallError(
            FailureClass.OUTPUT_TOO_LARGE,
            f"the command's output of {resp_len - 4} bytes is over its limit",
        )
