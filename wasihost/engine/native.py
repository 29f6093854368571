"""The native calling convention (the WASI profile's): the guest-memory view its brokers get,
the host-call fuel debt, and the dispatch closure generated for each import.

A WASI program crosses into Python once per line it prints, so this path is written for
speed: arguments are unpacked in place with struct, guest memory is a memoryview kept across
calls, fuel is charged to a Python-side debt settled in batches, and each import's dispatch is
generated with its exact arity (a ``handler(call, *args)`` call costs about a tenth of a line).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import FailureClass
from ..core.guestmem import WriteRoute
from ..core.registry import CORE_CAPABILITY, HostFunction
from ..core.status import (
    GuestDeadline,
    GuestExit,
    GuestFault,
    GuestInterrupted,
    GuestOutOfFuel,
    HostStatus,
)
from .fastcall import NATIVE_ENTRY
from .lowlevel import PROCESS_MEMORY, U32, U64, memory_data, memory_data_size, new_trap
from .sigint import CALLBACK_CODES

if TYPE_CHECKING:
    from typing import Protocol

    from ..core.errors import CallError
    from ..core.status import Status

    # For the type checker only: no class is made at start-up, where this module is loaded.
    class NativeHost(Protocol):
        """What a native dispatch reads and calls of the instance's host context
        (:class:`~wasihost.engine.hostcalls.HostContext`, which makes the dispatches): this
        module is below that one, which imports it."""

        native: NativeCall
        gate: Callable[[HostFunction], bool]
        interrupted: bool
        halt: CallError | None
        fuel_debt: int
        exit_code: int | None

        def context_of(self, caller: int) -> int: ...

        def settle(self, ctx: int, debt: int) -> bool: ...

        def halt_trap(self) -> int: ...

        def fail(self, failure: FailureClass, message: str) -> int: ...

        def crashed(self, exc: BaseException) -> int: ...

        def out_of_fuel(self, ctx: int, entry: HostFunction) -> int: ...

        def status_trap(self, entry: HostFunction, status: Status) -> int: ...

        def denied(
            self,
            entry: HostFunction,
            write_result: Callable[[int, Any], None] | None,
            caller: int,
            args: int,
        ) -> int: ...

        def call_unbound(
            self, dispatch: Dispatch, env: int, caller: int, args: int, n: int
        ) -> int: ...


Dispatch = Callable[[int, int, int, int], int]
"""One import's host call, called by libwasmtime: (env, caller address, address of the
wasmtime_val_raw_t array, its length) -> a trap pointer, or 0. It must not raise."""

SETTLE_FUEL = 100_000
"""Host-call fuel a Store may owe before it is taken from the Store's own counter.

Reading and writing a Store's fuel is two C calls, about half a microsecond: more than the rest
of a small host call. Host calls therefore add their price to a debt that is settled when it
reaches this much, and before any command call or WASI run reports its result. A guest can
overrun its budget by at most this much plus one host call's price before it stops with
``out_of_fuel``; the point where it stops depends only on the guest's own call sequence, so runs
stay reproducible. 100,000 units is about seven cbor host calls at their prices (a 64-byte log
record costs 15,130), so the settling cost is spread over about seven calls; in host time it is
about 60 us at the prices' bound of 0.6 ns a unit (benchmarks/bench_hostcall_prices.py), and in
guest code about 9 us. (It was 10,000 units while a log record cost 628.)
"""

PREPAY_FUEL = SETTLE_FUEL
"""Work a host call may do before checking that the budget can pay for it.

Below this, doing the work and charging it afterwards stays within the overrun SETTLE_FUEL
already allows. Above it (a 1 MiB read, a large random buffer), a native broker asks
:meth:`NativeCall.require_fuel` first, so a guest without the fuel never gets the work done.
"""

_EMPTY_VIEW = memoryview(bytearray())
# The guest's memory as a ctypes char array at its base, for copies out of it: slicing one makes
# the bytes in one step, where a memoryview slice makes a view and then its copy. One array type
# for every memory (ctypes keeps each type it makes), as long as any address space; only ever
# sliced inside the size checked beside it (``_size``).
_GUEST_BYTES = ctypes.c_char * (1 << 48)
_NO_BYTES = (ctypes.c_char * 0)()
_WAKEUP_LOCK = threading.Lock()
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U32X2 = struct.Struct("<II")


BULK_BYTES = 4096
"""An access moving more than this many bytes first checks that the Store can pay for it (see
:meth:`NativeCall.reserve_fuel`); below it the bounded overrun of SETTLE_FUEL applies, and the
check, which reads the Store's fuel, would cost more than the copy."""


class NativeCall:
    """What a native-convention broker gets besides its arguments: bounds-checked access to the
    calling guest's memory, and the call's deadline. The cbor convention reads requests and
    writes responses through it too.

    Memory is reached through a memoryview over the guest's linear memory, which the engine
    never moves (``memory_may_move`` is off), so the view stays valid as long as the Store; it
    only grows stale in length when the guest grows its memory, which no access can miss: a
    range past the view's end makes it re-read the memory's size (and check the base is
    unchanged) before it decides. Every access checks ``ptr + len`` with Python integers (no
    overflow) and raises :class:`GuestFault` outside memory; ``moved`` counts the bytes copied,
    which the engine charges at the entry's per-byte fuel price.

    The view never leaves this object: brokers get copies (``read``) and checked writes, so no
    slice of guest memory can outlive its Store. Once the Store goes (:meth:`forget`), every
    access raises :class:`MemoryGone`; nothing reaches freed memory.
    """

    __slots__ = (
        "_base",
        "_bytes",  # the same memory as _view, for the routed write's copy out (see _GUEST_BYTES)
        "_charge",
        "_ctx",
        "_mem",
        "_owner",
        "_size",
        "_view",  # the engine's own copies use it too (instance.py, hostcalls.py); no broker
        "_wakeup",
        "_woken",
        "bound",
        "can_pay",
        "deadline",
        "moved",
        "per_byte",
        "room",
    )

    def __init__(self) -> None:
        self._ctx = 0
        self._mem = 0
        self._owner: object = None
        self._base = 0
        self._size = 0
        self._view = _EMPTY_VIEW
        self._bytes: ctypes.Array[ctypes.c_char] = _NO_BYTES
        self.bound = False
        self.moved = 0
        self.deadline = 0.0
        # The response buffer of the cbor host call in progress (its ``resp_cap``): a broker
        # whose answer moves state (a file's position) checks the answer fits before it moves
        # it, so a BUFFER_TOO_SMALL retry finds the state as it was.
        self.room = 0
        # Whether the Store can pay this many more fuel units on top of what host calls owe;
        # the HostContext serving this memory sets it.
        self.can_pay: Callable[[int], bool] = _always
        # Adds units to the host-call fuel debt, settling it past SETTLE_FUEL; raises
        # GuestOutOfFuel if the Store cannot pay. The HostContext serving this memory sets it.
        self._charge: Callable[[int], None] = _free
        # Set by the instance's interrupt (from any thread): a broker waiting in sleep() wakes
        # at once instead of at its deadline. Made on first use (see ``wakeup``).
        self._wakeup: threading.Event | None = None
        self._woken = False  # wake() came before anyone made the event: it is made set
        # The per-byte price reserve_fuel charges: the highest among the instance's native
        # entries (set by the host context), so no dispatch pays to store its own; the WASI
        # entries all share one price, so for them it is exact.
        self.per_byte = 0

    @property
    def wakeup(self) -> threading.Event:
        """The event an interrupt sets. Made on first use, under a lock so that an interrupt
        and a waiting broker always get the same one: a threading.Event costs about a tenth
        of an instance's set-up, and most instances are never interrupted nor wait."""
        event = self._wakeup
        if event is None:
            with _WAKEUP_LOCK:
                event = self._wakeup
                if event is None:
                    event = self._wakeup = threading.Event()
                    if self._woken:
                        event.set()
        return event

    @property
    def woken(self) -> bool:
        """Whether the instance was interrupted (:meth:`wake` came): a handler about to hand
        work to another thread (an async embedder function) looks first, so nothing starts for
        an instance that is to stop."""
        event = self._wakeup
        return self._woken if event is None else event.is_set()

    def wake(self) -> None:
        """Set :attr:`wakeup`. Without making it when nobody made it yet: it is then made set
        (an instance closing, the common case, was never waited on)."""
        event = self._wakeup
        if event is None:
            with _WAKEUP_LOCK:
                event = self._wakeup
                if event is None:
                    self._woken = True
                    return
        event.set()

    def require_fuel(self, units: int) -> None:
        """Before work costing ``units`` fuel: raise :class:`GuestOutOfFuel` if the call's
        budget cannot pay for it (checked above PREPAY_FUEL; below, charging afterwards is
        within the settle bound)."""
        if units > PREPAY_FUEL and not self.can_pay(units):
            raise GuestOutOfFuel(f"{units} fuel units for the work asked")

    def charge(self, units: int) -> None:
        """Pay ``units`` fuel for one step of work this host call is about to do (a path
        component walked, a key listed, a record written), before doing it: the units join the
        call's fuel debt at once, and once the debt reaches SETTLE_FUEL it is taken from the
        Store; a Store that cannot pay ends the call ``out_of_fuel`` (:class:`GuestOutOfFuel`)
        before the step. A broker whose work grows with something the guest controls calls it
        per step (or per batch of steps), so an exhausted budget stops the work part-way, with
        at most SETTLE_FUEL units of it unpaid."""
        self._charge(units)

    def require_range(self, ptr: int, length: int) -> None:
        """Raise :class:`GuestFault` unless ``[ptr, ptr+length)`` lies inside memory; nothing
        is copied (a broker checks its destination before doing the work that fills it)."""
        if ptr + length > self._size or ptr < 0 or length < 0:
            self._check(ptr, length)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or raise :class:`GuestInterrupted` as soon as the host interrupts
        the instance (every blocking broker waits here, never in ``time.sleep``)."""
        if self.wakeup.wait(seconds if seconds > 0 else 0):
            raise GuestInterrupted

    def bind(self, ctx: int, mem: int, owner: object = None) -> None:
        """Serve the memory at address ``mem`` of the Store context ``ctx`` from now on.

        ``owner`` holds what ``ctx`` and ``mem`` point into (the Store and the memory handle):
        kept while bound, so that an Instance dropped without close() does not free them under
        a broker that kept this object (close() frees the Store regardless, after
        :meth:`forget`)."""
        self._ctx = ctx
        self._owner = owner
        if mem != self._mem:
            self._mem = mem
            self._size = 0
            self._drop_view()
        self.bound = True

    @property
    def context(self) -> int:
        """The Store context whose memory is served (valid while ``bound``)."""
        return self._ctx

    def forget(self) -> None:
        """Unbind: the memory's address was good for one call only, or the Store is going
        away. Every later access raises :class:`MemoryGone` instead of reaching the Store."""
        self.bound = False
        self._ctx = 0
        self._mem = 0
        self._owner = None
        self._size = 0
        self._drop_view()

    def _drop_view(self) -> None:
        self._bytes = _NO_BYTES
        view, self._view = self._view, _EMPTY_VIEW
        if view is not _EMPTY_VIEW:
            # Anything still holding it now fails instead of reading. BufferError: only if the
            # private view was re-exported, which nothing in the host does.
            with contextlib.suppress(BufferError):
                view.release()

    def size(self) -> int:
        self._refresh()
        return self._size

    def size_for(self, end: int) -> int:
        """The memory's size, re-read only if ``end`` lies past the view (the guest may have
        grown its memory since)."""
        if end > self._size:
            self._refresh()
        return self._size

    def _refresh(self) -> None:
        if not self.bound:
            raise MemoryGone("guest memory is gone: its instance was closed")
        # Both calls keep the GIL, so the Store cannot be closed between the check and them.
        size = int(memory_data_size(self._ctx, self._mem))
        base = int(memory_data(self._ctx, self._mem) or 0)
        if self._base and base != self._base:
            # Cannot happen with memory_may_move off; if it ever did, every earlier view would
            # have pointed at freed memory, so refuse to go on rather than guess.
            raise MemoryMoved(f"guest memory moved from {self._base:#x} to {base:#x}")
        self._base = base
        self._size = size
        self._drop_view()
        # A slice of the process view: no new ctypes array type per size (ctypes caches every
        # one it makes, so a memory growing page by page would leave one behind per page).
        self._view = PROCESS_MEMORY[base : base + size] if size else _EMPTY_VIEW
        if size:
            self._bytes = _GUEST_BYTES.from_address(base)

    def _check(self, ptr: int, length: int) -> None:
        """Slow path of an access: the memory may have grown since the view was made, and a
        bulk copy must be affordable before it is made."""
        self._refresh()
        if ptr < 0 or length < 0 or ptr + length > self._size:
            raise GuestFault(f"[{ptr}, +{length}) outside guest memory")
        if length > BULK_BYTES:
            self.reserve_fuel(length)

    def reserve_fuel(self, nbytes: int) -> None:
        """Before work proportional to a guest-declared length: raise :class:`GuestOutOfFuel`
        (the call ends ``out_of_fuel``) unless the Store can pay for moving ``nbytes`` more at
        the per-byte price (``per_byte``). Brokers call it before producing bulk data; accesses
        over BULK_BYTES call it themselves before copying."""
        if not self.can_pay(self.per_byte * (self.moved + nbytes)):
            raise GuestOutOfFuel(f"cannot pay for {nbytes} bytes")

    def read(self, ptr: int, length: int) -> bytes:
        end = ptr + length
        if end > self._size or ptr < 0 or length < 0 or length > BULK_BYTES:
            self._check(ptr, length)
        self.moved += length
        return self._view[ptr:end].tobytes()

    def write(self, ptr: int, data: bytes) -> None:
        end = ptr + len(data)
        if end > self._size or ptr < 0 or len(data) > BULK_BYTES:
            self._check(ptr, len(data))
        self.moved += len(data)
        self._view[ptr:end] = data

    def read_u32(self, ptr: int) -> int:
        if ptr + 4 > self._size or ptr < 0:
            self._check(ptr, 4)
        self.moved += 4
        return int(_U32.unpack_from(self._view, ptr)[0])

    def read_iovec(self, ptr: int, cap: int) -> bytes:
        """The bytes an iovec at ``ptr`` points to, at most ``cap`` of them (a short write)."""
        if ptr + 8 > self._size or ptr < 0:
            self._check(ptr, 8)
        buf, length = _U32X2.unpack_from(self._view, ptr)
        length = min(length, cap)
        end = buf + length
        if end > self._size or length > BULK_BYTES:
            self._check(buf, length)
        self.moved += 8 + length
        return self._view[buf:end].tobytes()

    def take_iovec(self, ptr: int, cap: int, count_ptr: int) -> bytes:
        """``read_iovec(ptr, cap)``, with the number of bytes taken written as a u32 at
        ``count_ptr``; both ranges are checked before it returns, so a wild pointer faults
        before the caller outputs anything. A one-iovec write (stdio's ``fd_write``, once per
        line) in one call instead of two."""
        size = self._size
        if ptr + 8 > size or ptr < 0 or count_ptr + 4 > size or count_ptr < 0:
            return self._take_iovec_checked(ptr, cap, count_ptr)
        view = self._view
        buf, length = _U32X2.unpack_from(view, ptr)
        if length > cap:  # noqa: PLR1730 (a min() call is measurable here)
            length = cap
        end = buf + length
        if end > size or length > BULK_BYTES:
            return self._take_iovec_checked(ptr, cap, count_ptr)
        data = view[buf:end].tobytes()  # before the count lands, as the checked path does
        _U32.pack_into(view, count_ptr, length)
        self.moved += 12 + length
        return data

    def _take_iovec_checked(self, ptr: int, cap: int, count_ptr: int) -> bytes:
        data = self.read_iovec(ptr, cap)
        self.write_u32(count_ptr, len(data))
        return data

    def read_u32_pair(self, ptr: int) -> tuple[int, int]:
        if ptr + 8 > self._size or ptr < 0:
            self._check(ptr, 8)
        self.moved += 8
        first, second = _U32X2.unpack_from(self._view, ptr)
        return first, second

    def read_u64(self, ptr: int) -> int:
        if ptr + 8 > self._size or ptr < 0:
            self._check(ptr, 8)
        self.moved += 8
        return int(_U64.unpack_from(self._view, ptr)[0])

    def write_u32(self, ptr: int, value: int) -> None:
        if ptr + 4 > self._size or ptr < 0:
            self._check(ptr, 4)
        self.moved += 4
        _U32.pack_into(self._view, ptr, value & U32)

    def write_u64(self, ptr: int, value: int) -> None:
        if ptr + 8 > self._size or ptr < 0:
            self._check(ptr, 8)
        self.moved += 8
        _U64.pack_into(self._view, ptr, value & U64)


def _always(cost: int) -> bool:
    return True


def _free(units: int) -> None:
    """No engine serves this object (a broker driven directly, in a unit test): nothing to
    charge."""


class MemoryGone(Exception):
    """A broker used its guest-memory access after the instance's Store was closed."""


class MemoryMoved(Exception):
    """The guest's memory base changed, which the engine configuration rules out."""


# A wasmtime_val_raw_t is 16 bytes; scalars sit little-endian at its start.
_ARG_CODES = {"i32": "I12x", "i64": "Q8x", "f32": "f12x", "f64": "d8x"}
_SIGNED_ARG_CODES = {"i32": "i12x", "i64": "q8x"}  # an embedder's integers (signed_args)
_RESULT_CODES = {"i32": ("<I", U32), "i64": ("<Q", U64), "f32": ("<f", None), "f64": ("<d", None)}
_put_u32 = struct.Struct("<I").pack_into

# The most parameters a registry entry may have (path_open has 9); bounds the generated code.
MAX_NATIVE_PARAMS = 16


@functools.cache  # one per value type (four)
def result_writer(kind: str) -> Callable[[int, Any], None]:
    """Writes a host function's single result of ``kind`` into slot 0 of the raw value array
    at address ``args``."""
    code, mask = _RESULT_CODES[kind]
    pack = struct.Struct(code).pack_into
    if mask is None:
        return lambda args, value: pack(PROCESS_MEMORY, args, float(value))
    return lambda args, value: pack(PROCESS_MEMORY, args, int(value) & mask)


# The dispatch of one native import, generated per arity so that the handler is called with
# plain positional arguments. Only the parameter count is substituted (ARGS below), never a name
# or any text from a registry or a guest.
_DISPATCH_SOURCE = """
def make(host, entry, handler, unpack, write_result):
    call = host.native
    gate = host.gate
    settle = host.settle
    name = entry.qualified_name
    gated = entry.capability != CORE_CAPABILITY  # core is granted to everyone, always
    base_price = entry.fuel_base
    per_byte = entry.fuel_per_byte
    i32_result = entry.results == ("i32",)

    def dispatch(env, caller, args, nargs):
        try:
            if host.interrupted:  # revoked or disabled: no host call's effect after that returns
                return host.halt_trap()
            if gated and not gate(entry):
                return host.denied(entry, write_result, caller, args)
            if not call.bound:
                return host.call_unbound(dispatch, env, caller, args, nargs)
            call.moved = 0
            try:
                ARGS = unpack(PROCESS_MEMORY, args)
                result = handler(call, ARGS)
            except CALL_ENDINGS as ending:
                return end_call(host, entry, name, caller, ending)
            if host.halt is not None:  # e.g. Ctrl-C during this call (see sigint.py): stop now
                return host.halt_trap()
            # The price is paid after the handler, once the bytes moved are known; work done
            # without the fuel to pay for it is bounded by SETTLE_FUEL.
            debt = host.fuel_debt + base_price + per_byte * call.moved
            host.fuel_debt = debt
            if debt >= SETTLE_FUEL and not settle(host.context_of(caller), debt):
                return host.out_of_fuel(host.context_of(caller), entry)
            if i32_result:
                put_u32(PROCESS_MEMORY, args, result & U32)
            elif write_result is not None:
                write_result(args, result)
            return 0
        except BaseException as exc:
            return host.crashed(exc)

    return dispatch
"""
_MAKERS: dict[int, Callable[..., Dispatch]] = {}

# What a native handler (or the routed write's sink) may raise to end its host call: each
# ends it as end_call says. Shared by both generated dispatches; an exception path, so the
# call to end_call costs nothing that matters.
CALL_ENDINGS = (
    GuestFault,
    GuestDeadline,
    GuestInterrupted,
    GuestOutOfFuel,
    GuestExit,
    MemoryMoved,
    MemoryGone,
    HostStatus,
)


def end_call(
    host: NativeHost, entry: HostFunction, name: str, caller: int, ending: Exception
) -> int:
    """The trap (or 0 after recording an exit) that ends a host call ``ending`` was raised in:
    a fault is the guest's protocol error, a deadline or interrupt ends it as the epoch would,
    and an embedder's HostStatus traps (a native entry has no status slot to answer)."""
    if isinstance(ending, GuestFault):
        return int(host.fail(FailureClass.PROTOCOL, f"{name}: {ending}"))
    if isinstance(ending, GuestDeadline):
        return int(host.fail(FailureClass.DEADLINE, f"{name}: deadline reached"))
    if isinstance(ending, GuestInterrupted):
        return int(host.fail(FailureClass.DEADLINE, f"{name}: interrupted by the host"))
    if isinstance(ending, GuestOutOfFuel):
        return int(host.out_of_fuel(host.context_of(caller), entry))
    if isinstance(ending, GuestExit):
        host.exit_code = ending.code
        return int(new_trap("wasihost: exit"))
    if isinstance(ending, HostStatus):
        return int(host.status_trap(entry, ending.status))
    return int(host.fail(FailureClass.HOST_ERROR, f"{name}: {ending}"))  # the memory went

# The dispatch of a write entry whose handler is a WriteRoute (WASI's fd_write). A one-iovec
# write to an fd its sink table names, both ranges inside the memory the view covers, is done
# right here: the iovec copied to the sink, the count written, the price charged for exactly
# the bytes moved (the line, the iovec and the count), with no handler frame, no descriptor
# checks and none of the general dispatch's bookkeeping for other entries (together about a
# sixth of a printed line's host time, measured with bench_wasi.py's workload). Anything else,
# and any call it is not sure of before it has done anything (unbound memory, a range past the
# view, a bulk write), goes to ``general``, the entry's ordinary dispatch, which checks it all
# again and answers faults. A sink's failure is answered as the handler would: ``answer`` for
# what the handler answers, the general dispatch's mapping for the rest.
_ROUTED_DISPATCH_SOURCE = """
def make(host, entry, general, unpack, sinks, cap, ok, answered, answer):
    call = host.native
    settle = host.settle
    name = entry.qualified_name
    per_byte = entry.fuel_per_byte
    price = entry.fuel_base + 12 * per_byte  # the iovec (8 bytes) and the count (4) it moves
    # Longer lines go the general way, which clamps them to ``cap`` (a short write).
    most = cap if cap < BULK_BYTES else BULK_BYTES

    def dispatch(env, caller, args, nargs):
        try:
            fd, iovs, iovs_len, count_ptr = unpack(PROCESS_MEMORY, args)
            # The size is 0 whenever the memory is not bound (NativeCall.forget), so an unbound
            # call goes the general way too. Unsigned arguments: only the ends need checking.
            size = call._size
            if iovs_len != 1 or iovs + 8 > size or count_ptr + 4 > size:
                return general(env, caller, args, nargs)
            try:
                sink = sinks[fd]  # a subscript, not a get() call: a miss is a rare, dearer way
            except KeyError:
                return general(env, caller, args, nargs)
            view = call._view
            start, length = iovec_of(view, iovs)
            end = start + length
            if end > size or length > most:
                return general(env, caller, args, nargs)
            # A copy (bytes), from the same memory the view covers: ``_bytes`` is its base.
            data = call._bytes[start:end]  # before the count lands, as take_iovec does
            put_u32(view, count_ptr, length)
            if host.interrupted:  # revoked or disabled: no line after that returns
                return host.halt_trap()
            try:
                sink(data)
                result = ok
            except answered as failure:
                result = answer(failure) & U32
            except CALL_ENDINGS as ending:
                return end_call(host, entry, name, caller, ending)
            if host.halt is not None:  # e.g. Ctrl-C during this call (see sigint.py): stop now
                return host.halt_trap()
            debt = host.fuel_debt + price + per_byte * length
            host.fuel_debt = debt
            if debt >= SETTLE_FUEL and not settle(host.context_of(caller), debt):
                return host.out_of_fuel(host.context_of(caller), entry)
            put_u32(PROCESS_MEMORY, args, result)
            return 0
        except BaseException as exc:
            return host.crashed(exc)

    return dispatch
"""
_WRITE_PARAMS = ("i32", "i32", "i32", "i32")
_write_maker: list[Callable[..., Dispatch]] = []


def _maker(arity: int) -> Callable[..., Dispatch]:
    maker = _MAKERS.get(arity)
    if maker is None:
        if not 0 <= arity <= MAX_NATIVE_PARAMS:
            raise ValueError(f"a native host function takes at most {MAX_NATIVE_PARAMS} params")
        names = [f"a{i}" for i in range(arity)]
        source = _DISPATCH_SOURCE.replace(
            "ARGS = unpack(",
            f"{', '.join(names)}{',' if arity == 1 else ''} = unpack(" if arity else "unpack(",
        ).replace("handler(call, ARGS)", f"handler({', '.join(['call', *names])})")
        namespace = _namespace()
        exec(compile(source, f"<wasihost native dispatch/{arity}>", "exec"), namespace)  # noqa: S102
        maker = _MAKERS[arity] = namespace["make"]
    return maker


def _namespace() -> dict[str, Any]:
    """What the generated dispatch code sees: the names it uses, nothing else."""
    return {
        "CORE_CAPABILITY": CORE_CAPABILITY,
        "FailureClass": FailureClass,
        "CALL_ENDINGS": CALL_ENDINGS,
        "end_call": end_call,
        "PROCESS_MEMORY": PROCESS_MEMORY,
        "SETTLE_FUEL": SETTLE_FUEL,
        "U32": U32,
        "new_trap": new_trap,
        "put_u32": _put_u32,
        "iovec_of": _U32X2.unpack_from,
        "BULK_BYTES": BULK_BYTES,
    }


@functools.lru_cache(maxsize=256)  # one per distinct parameter list of the registry's entries
def _unpacker(params: tuple[str, ...], signed: bool) -> Callable[[Any, int], tuple[Any, ...]]:
    """Reads ``params`` out of a raw value array (integers as signed values for an embedder's
    entry, ``signed_args``); made once per parameter list, not once per import of every
    instance (a WASI module imports two dozen)."""
    if not params:
        return _no_args  # the array may be empty: do not touch it
    codes = _SIGNED_ARG_CODES if signed else _ARG_CODES
    unpack: Callable[[Any, int], tuple[Any, ...]] = struct.Struct(
        "<" + "".join(codes[t] for t in params)
    ).unpack_from
    return unpack


def _no_args(memory: Any, args: int) -> tuple[Any, ...]:
    return ()


def _routed_maker() -> Callable[..., Dispatch]:
    if not _write_maker:
        namespace = _namespace()
        source = compile(_ROUTED_DISPATCH_SOURCE, "<wasihost routed write dispatch>", "exec")
        exec(source, namespace)  # noqa: S102
        _write_maker.append(namespace["make"])
    return _write_maker[0]


def native_dispatch(host: NativeHost, entry: HostFunction, handler: Any) -> Dispatch:
    """The dispatch closure of one native import of ``host``'s instance."""
    unpack = _unpacker(tuple(entry.params), entry.signed_args)
    write_result = result_writer(entry.results[0]) if entry.results else None
    if type(handler) is WriteRoute:
        if tuple(entry.params) != _WRITE_PARAMS or tuple(entry.results) != ("i32",):
            raise ValueError(f"{entry.qualified_name}: a write route needs (i32 x 4) -> i32")
        if not 0 <= handler.ok <= U32:
            raise ValueError(f"{entry.qualified_name}: a write route's answer must fit a u32")
        general = _maker(len(entry.params))(host, entry, handler.handler, unpack, write_result)
        CALLBACK_CODES.add(general.__code__)
        if entry.capability != CORE_CAPABILITY:
            return general  # the gate is the general dispatch's; a gated write takes no shortcut
        dispatch = _routed_maker()(
            host,
            entry,
            general,
            unpack,
            handler.sinks,
            handler.cap,
            handler.ok,
            handler.answered,
            handler.answer,
        )
    else:
        dispatch = _maker(len(entry.params))(host, entry, handler, unpack, write_result)
    CALLBACK_CODES.add(dispatch.__code__)
    return dispatch


# A native entry's parameter codes for the C side (_fastcall.c's NativeEntry): unsigned, or
# signed for an embedder's entry (signed_args), as _unpacker reads them.
_ENTRY_PARAM_CODES = {"i32": "I", "i64": "Q"}
_ENTRY_SIGNED_CODES = {"i32": "i", "i64": "q"}
_ENTRY_RESULTS = {(): 0, ("i32",): 1, ("i64",): 2}


def fast_native_entry(host: NativeHost, entry: HostFunction, handler: Any, slow: Dispatch) -> Any:
    """The C half of ``slow``, the native dispatch of ``entry`` (``_fastcall.NativeEntry``,
    called by the native trampoline), or None where there is none: the extension is not built,
    the handler is a write route (its own shortcut), or a parameter or the result is a float.

    The C half serves the common call alone (docs/engine.md "Host-call trampolines"); every
    other turn goes to one of the closures below, each doing exactly what ``slow`` does at that
    point, so a call decides the same on either path (tests/engine/test_host_trampolines.py)."""
    params, results = tuple(entry.params), tuple(entry.results)
    if (
        NATIVE_ENTRY is None
        or type(handler) is WriteRoute
        or results not in _ENTRY_RESULTS
        or len(params) > MAX_NATIVE_PARAMS
        or any(kind not in _ENTRY_PARAM_CODES for kind in params)
    ):
        return None
    codes = _ENTRY_SIGNED_CODES if entry.signed_args else _ENTRY_PARAM_CODES
    name = entry.qualified_name
    call = host.native
    write_result = result_writer(results[0]) if results else None
    i32_result = results == ("i32",)

    def on_denied(caller: int, args: int) -> int:
        try:
            return host.denied(entry, write_result, caller, args)
        except BaseException as exc:
            return host.crashed(exc)

    def on_raise(caller: int, exc: BaseException) -> int:
        try:
            if isinstance(exc, CALL_ENDINGS):
                return end_call(host, entry, name, caller, exc)
            return host.crashed(exc)
        except BaseException as again:
            return host.crashed(again)

    def pay(caller: int) -> int:
        try:
            if host.halt is not None:  # e.g. Ctrl-C during this call (see sigint.py): stop now
                return host.halt_trap()
            debt = host.fuel_debt + entry.fuel_base + entry.fuel_per_byte * call.moved
            host.fuel_debt = debt
            if debt >= SETTLE_FUEL and not host.settle(host.context_of(caller), debt):
                return host.out_of_fuel(host.context_of(caller), entry)
            return 0
        except BaseException as exc:
            return host.crashed(exc)

    def finish(args: int, result: Any) -> int:
        # The generic dispatch's last step, as it is there (a result that is not an int).
        try:
            if i32_result:
                _put_u32(PROCESS_MEMORY, args, result & U32)
            elif write_result is not None:
                write_result(args, result)
            return 0
        except BaseException as exc:
            return host.crashed(exc)

    for closure in (on_denied, on_raise, pay, finish):
        CALLBACK_CODES.add(closure.__code__)
    return NATIVE_ENTRY(
        host,
        call,
        host.gate if entry.capability != CORE_CAPABILITY else None,
        entry,
        handler,
        slow,
        on_denied,
        on_raise,
        pay,
        finish,
        entry.fuel_base,
        entry.fuel_per_byte,
        SETTLE_FUEL,
        "".join(codes[kind] for kind in params).encode(),
        _ENTRY_RESULTS[results],
    )
