"""Host functions: a ctypes callback per import, the per-instance host context with its error
slot and fuel debt, and the cbor convention (the native one lives in :mod:`.native`).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
from wasmtime import _ffi as ffi

from ..core.codec import CodecLimits, decode, decode_counted, encode
from ..core.codec_fast import UNSURE, flat
from ..core.errors import CallError, CodecError, FailureClass
from ..core.hostlog import host_logger
from ..core.registry import HostFunction
from ..core.status import (
    GuestAbort,
    GuestDeadline,
    GuestInterrupted,
    GuestOutOfFuel,
    HostFunctionFailed,
    HostStatus,
    Status,
    StatusAnswer,
    UnreadableRequest,
)
from .fastcall import HOST_TRAMPOLINE, NATIVE_TRAMPOLINE
from .lowlevel import (
    PROCESS_MEMORY,
    VP,
    get_fuel,
    new_trap,
    private_fn,
    set_fuel,
)
from .native import SETTLE_FUEL, Dispatch, NativeCall, fast_native_entry, native_dispatch
from .sigint import CALLBACK_CODES

if TYPE_CHECKING:
    from typing import Protocol

    # For the type checker only: no class is made at start-up, where this module is loaded.
    class HostCallCounter(Protocol):
        """Where the host-call path reports its refusals and call-ending failures, by class:
        the host's operator metrics (``wasihost.supervisor.hostcall_metrics.HostCallTally``,
        a layer above the engine, which hands it in)."""

        def status(self, code: int) -> None: ...

        def failure(self, failure: FailureClass) -> None: ...

HostHandler = Callable[[Any, Any], Any]
"""A broker entry point: ``handler(call, request)``, the instance's guest-memory accessor (a
:class:`NativeCall`, for its deadline and interrupt) and the decoded, bounded request value in,
response value out."""

Gate = Callable[[HostFunction], bool]
"""Decides, at call time, whether the caller still holds the entry's capability."""


@attrs.frozen
class BoundImport:
    """A registry entry the module imports, with the broker entry point serving it."""

    entry: HostFunction
    handler: HostHandler = attrs.field(eq=False, hash=False)


# The ctypes callback type, where the C extension is not there (engine/fastcall.py): the
# caller and the argument array arrive as plain addresses (ints), so the hot path never builds
# a ctypes pointer object; arguments are unpacked with struct.
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, VP, VP, VP, ctypes.c_size_t)

# Each import is made with its own prepared closure as the callback's env (a table lookup per
# call was a tenth of a line of WASI output). Whatever the callback reaches must live as long as
# wasmtime's function, that is as long as the Store: the Instance owning the Store holds it (a
# module-level table would keep every dropped Store alive).
func_new_unchecked = private_fn("wasmtime_func_new_unchecked", None, VP, VP, VP, VP, VP, VP)
_caller_context = private_fn("wasmtime_caller_context", VP, VP)
_caller_export_get = private_fn(
    "wasmtime_caller_export_get", ctypes.c_bool, VP, ctypes.c_char_p, ctypes.c_size_t, VP
)

_CBOR_ARGS = struct.Struct("<I12xI12xI12xI12x").unpack_from
_put_answer = struct.Struct("<i").pack_into  # a length or a negated status: both fit an i32
# The cbor convention's refusals, as the i32 the guest gets; and CBOR null, the commonest
# response (one byte, written without the encoder).
_DENIED = -Status.DENIED.value
_INVALID_ARGUMENT = -Status.INVALID_ARGUMENT.value
_PAYLOAD_TOO_LARGE = -Status.PAYLOAD_TOO_LARGE.value
_BUFFER_TOO_SMALL = -Status.BUFFER_TOO_SMALL.value
_NULL = b"\xf6"
# A request's decode is priced per data item past the first FREE_REQUEST_ITEMS (the base price
# covers those: a small flat request, the common shape, takes one loop and is never counted).
# Decoding costs the host per item, not per byte: up to 4,096 items (the codec's limit) fit in
# a 4 KiB request, and a 4 KiB ``log`` of 1,280 float16s, or of 4,091 empty arrays, took
# 0.6-1.3 ms of host CPU for its 23,000 fuel units (up to ~350x guest code's CPU per fuel,
# red-team 2026-12-01). The worst shapes cost 330-480 ns an item (scanned, then built by
# cbor2), 750 ns when the exact decoder runs after both to name a fault (a refused request is
# charged its items twice), and a broker that encodes a decoded value again (jobs_schedule's
# input, kept as bytes) spends about 500 ns an item more; guest code runs at about 0.07-0.09 ns
# a unit, so 1,500 units an item keeps these within about 8x (at 1,000, jobs_schedule with an
# input of 4,080 empty arrays was 11x, before job inputs were bounded to 128 items;
# benchmarks/bench_hostcall_prices.py, the "items" rows).
FREE_REQUEST_ITEMS: Final = 16
FUEL_PER_REQUEST_ITEM: Final = 1_500


_FAILURE_ANSWERS: dict[object, int] = {s: -int(s) for s in Status if s is not Status.OK}


def _failure_answer(status: object) -> int:
    """What the guest gets for ``HostStatus(status)``: the negated code of a failure status
    (a ``Status``, or a plain int of its value), or 0 for anything else (OK, a code no status
    has, a negative number, another type)."""
    return _FAILURE_ANSWERS.get(status, 0) if type(status) in (Status, int) else 0


@functools.lru_cache(maxsize=64)  # one per distinct entry limit; CodecLimits is frozen
def _request_limits(max_request_bytes: int) -> CodecLimits:
    return CodecLimits(max_bytes=max(1, max_request_bytes))


def host_callback(dispatch: Dispatch, fast: object = None) -> tuple[int, int | None, object]:
    """How to make the import ``dispatch`` serves: (the C callback's address, its env, what
    must live as long as the Store). With the C extension, a trampoline of ``_fastcall.c``
    (the native one when the import has a native entry, ``fast``); without, a ctypes callback.
    The caller keeps the third alive as long as its Store."""
    if HOST_TRAMPOLINE:
        if fast is not None and NATIVE_TRAMPOLINE:
            return NATIVE_TRAMPOLINE, id(fast), fast
        return HOST_TRAMPOLINE, id(dispatch), dispatch
    callback = _CALLBACK(dispatch)
    return ctypes.cast(callback, VP).value or 0, None, callback


class GilTrust:
    """Whether a module's short calls may keep the GIL: shared by its instances (through
    CompiledModule), withdrawn for good by the first call that keeps it through a whole epoch
    tick (two ticks met, or a call that ran longer than a tick: Instance.call).

    For good means for the engine's life: the module's digest goes into ``withdrawn`` (the
    engine's), and a CompiledModule made again for the same bytes (re-admitted after its
    extensions closed, or compiled again after the module cache let it go) starts without
    trust. Held by the CompiledModule alone, the trust came back with each new one."""

    __slots__ = ("digest", "kept", "withdrawn")

    def __init__(self, digest: str = "", withdrawn: set[str] | None = None) -> None:
        self.digest = digest
        self.withdrawn = withdrawn if withdrawn is not None else set()
        self.kept = digest not in self.withdrawn

    def withdraw(self) -> None:
        """No call of this module keeps the GIL again in this engine."""
        self.kept = False
        self.withdrawn.add(self.digest)


class HostContext:
    """Per-instance state shared by its host functions: imports, gate, memory, error slot,
    and the host-call fuel not yet taken from the Store."""

    def __init__(self, imports: Sequence[BoundImport], gate: Gate) -> None:
        self.imports = tuple(imports)
        self.codec_limits = tuple(_request_limits(b.entry.max_request_bytes) for b in imports)
        self.gate = gate
        # The error slot: set by a host function that ends the call, read by the caller of the
        # wasm function on the same thread, under the instance lock. Never global.
        self.failure: CallError | None = None
        self.reraise: BaseException | None = None
        self.exit_code: int | None = None
        # Read by the epoch callback on every tick of a running call: set from any thread to
        # stop the guest at its next tick (emergency disable).
        self.interrupted = False
        # Set (with ``interrupted``) when the call must stop at once and end with this error:
        # Ctrl-C deferred out of a callback, or an exception that escaped a callback before
        # its ``try`` (see sigint.py). Host calls check it, so the guest stops at the next.
        self.halt: CallError | None = None
        # Signal handlers deferred out of a callback (see sigint.py), run after the call.
        self.deferred: list[tuple[Callable[[int, Any], Any], int]] = []
        # Host-call fuel charged but not yet taken from the Store (see SETTLE_FUEL).
        self.fuel_debt = 0
        # Whether the running call keeps the GIL through its guest crossings (Instance.call),
        # and its module's trust, which the epoch callback withdraws from a call that kept it
        # through a whole tick.
        self.keep_gil = False
        self.gil_trust = GilTrust()
        self.ticked_deadline = 0.0  # the deadline of the call that saw the last tick
        self.native = NativeCall()
        self.native.can_pay = self.can_pay
        self.native._charge = self.charge_work
        # Operator metrics hook (the host's HostCallTally): told every refusal and every
        # call-ending failure of a host call, by class; None counts nothing.
        self.tally: HostCallCounter | None = None
        self.native.per_byte = max(
            (b.entry.fuel_per_byte for b in self.imports if b.entry.convention == "native"),
            default=0,
        )
        self._fuel = ctypes.c_uint64(0)
        self._fuel_addr = ctypes.addressof(self._fuel)
        self._extern = ffi.wasmtime_extern_t()
        self.expected_ctx = 0  # the owning store's context address, set by the Instance
        self.store_ctx = 0  # nonzero once the caller's context was seen to equal it
        self._context_checked = False
        self.dispatch: tuple[Dispatch, ...] = tuple(
            native_dispatch(self, b.entry, b.handler)
            if b.entry.convention == "native"
            else self._cbor_dispatch(i)
            for i, b in enumerate(self.imports)
        )
        # The C half of each native dispatch that has one (native.fast_native_entry), or None.
        self.fast: tuple[object, ...] = tuple(
            fast_native_entry(self, b.entry, b.handler, d)
            if b.entry.convention == "native"
            else None
            for b, d in zip(self.imports, self.dispatch, strict=True)
        )

    def context_of(self, caller: int) -> int:
        return self.store_ctx or self._verified_context(caller)

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

    def set_memory(self, memory: Any, store: object) -> None:
        """Serve the exported memory (kept alive by the Instance) to every later host call."""
        # The memory handle and its Store are held with the binding (see NativeCall.bind).
        self.native.bind(self.expected_ctx, ctypes.addressof(memory), (store, memory))

    def take_failure(self) -> CallError | None:
        failure, self.failure = self.failure, None
        return failure

    def clear_slots(self) -> BaseException | None:
        """Empty the error slots after a call; returns the exception to re-raise, if any."""
        reraise, self.reraise = self.reraise, None
        self.failure = None
        return reraise

    def stop_now(self, failure: CallError, reraise: BaseException | None = None) -> None:
        """End the running call at its next callback with ``failure`` (the first one stays),
        re-raising ``reraise`` after it; every later call of this instance ends the same."""
        if self.halt is None:
            self.halt = failure
        if reraise is not None and self.reraise is None:
            self.reraise = reraise
        self.interrupted = True
        self.native.wake()  # a broker blocked in sleep() stops waiting too

    def interrupted_failure(self) -> CallError:
        if self.halt is not None:
            return self.halt
        return CallError(FailureClass.DEADLINE, "interrupted by the host")

    def halt_trap(self) -> int:
        halt = self.interrupted_failure()
        return self.fail(halt.failure, halt.message)

    def fail(self, failure: FailureClass, message: str) -> int:
        self.failure = CallError(failure, message)
        if self.tally is not None:  # operator metrics hook
            self.tally.failure(failure)
        return new_trap(f"wasihost: {failure.value}")

    def crashed(self, exc: BaseException) -> int:
        """A host function raised: the call ends with ``host_error`` (no text of the
        exception crosses to the guest)."""
        if not isinstance(exc, Exception):
            self.reraise = exc  # KeyboardInterrupt/SystemExit: re-raised after the call
        elif not isinstance(exc, HostFunctionFailed):  # that one was logged where it happened
            host_logger().error("host call failed", exc_info=exc)
        return self.fail(FailureClass.HOST_ERROR, f"host function failed: {type(exc).__name__}")

    def can_pay(self, cost: int) -> bool:
        """Whether the Store's fuel covers ``cost`` more on top of the debt, checked before
        work proportional to a guest-declared length. Below SETTLE_FUEL in all the bounded
        overrun applies and the Store's counter is not read."""
        total = self.fuel_debt + cost
        if total < SETTLE_FUEL:
            return True
        get_fuel(self.expected_ctx, self._fuel_addr)
        return int(self._fuel.value) >= total

    def charge_work(self, units: int) -> None:
        """A broker's per-step price (:meth:`NativeCall.charge`): joins the debt, which is
        settled once it reaches SETTLE_FUEL; raises :class:`GuestOutOfFuel` (the Store emptied)
        if the Store cannot pay, before the step is done."""
        debt = self.fuel_debt + units
        self.fuel_debt = debt
        if debt >= SETTLE_FUEL and not self.settle(self.expected_ctx, debt):
            raise GuestOutOfFuel(f"cannot pay {units} fuel units for the next step")

    def settle(self, ctx: int, debt: int) -> bool:
        """Take ``debt`` from the Store's fuel; False (and the Store emptied) if it cannot pay."""
        self.fuel_debt = 0
        get_fuel(ctx, self._fuel_addr)
        left = int(self._fuel.value)
        if left < debt:
            set_fuel(ctx, 0)
            return False
        set_fuel(ctx, left - debt)
        return True

    def _memory_by_name(self, caller: int) -> int:
        """The caller's exported memory, looked up by name: its address is valid for this host
        call only."""
        item = self._extern
        if not _caller_export_get(caller, b"memory", 6, ctypes.addressof(item)):
            return 0
        return ctypes.addressof(item.of.memory)

    def _cbor_dispatch(self, index: int) -> Dispatch:
        """The dispatch closure of one cbor import: the entry's limits and prices, its handler
        and the instance's gate and memory are bound once, here, so a call reads locals."""
        bound = self.imports[index]
        entry = bound.entry
        if entry.never_returns:
            return self._final_dispatch(bound)
        handler, gate, mem, settle = bound.handler, self.gate, self.native, self.settle
        limits = self.codec_limits[index]
        max_items, max_string = limits.max_items, limits.max_string_bytes
        base_price, per_byte = entry.fuel_base, entry.fuel_per_byte
        max_request, max_response = entry.max_request_bytes, entry.max_response_bytes
        commits = entry.commits

        def dispatch(env: int, caller: int, args: int, nargs: int) -> int:
            # The checks, in order: the ranges, the fuel for the request, the gate, the payload
            # limit, the response buffer of a committing entry, the fuel for the most the
            # handler may answer; then decode, serve, encode, pay for the response. A guest's
            # mistake in the ranges ends its call; a refusal is answered with a status.
            try:
                if self.interrupted:  # revoked, disabled, cancelled: no handler runs after that
                    return self.halt_trap()
                if not mem.bound:
                    return self.call_unbound(dispatch, env, caller, args, nargs)
                # -- ranges -- Python ints do not overflow, so these sums are exact; a u32
                # ptr+len past 2**32 is simply larger than any memory.
                req_ptr, req_len, resp_ptr, resp_cap = _CBOR_ARGS(PROCESS_MEMORY, args)
                req_end = req_ptr + req_len
                resp_end = resp_ptr + resp_cap
                size = mem._size
                if (
                    req_end > size
                    or resp_end > size
                    or (req_len and resp_cap and req_ptr < resp_end and resp_ptr < req_end)
                ):
                    fault = self._bad_ranges(entry, req_ptr, req_len, resp_ptr, resp_cap)
                    if fault is not None:
                        return fault
                # -- price -- charge() inlined: the request's price joins the debt, settled
                # past SETTLE_FUEL.
                debt = self.fuel_debt + base_price + per_byte * req_len
                self.fuel_debt = debt
                if debt >= SETTLE_FUEL and not settle(self.context_of(caller), debt):
                    return self.out_of_fuel(self.context_of(caller), entry)
                # -- admit --
                if not gate(entry):
                    answer = _DENIED
                elif req_len > max_request:
                    answer = _PAYLOAD_TOO_LARGE
                elif commits and resp_cap < max_response:
                    # Before the effect: a retry with a bigger buffer (ABI section 7) commits once.
                    answer = _BUFFER_TOO_SMALL
                else:
                    # The response is paid once its length is known, but the broker's work grows
                    # with what it may answer: refused before the work if the Store cannot pay.
                    most = per_byte * (resp_cap if resp_cap < max_response else max_response)
                    if self.fuel_debt + most >= SETTLE_FUEL and not self.can_pay(most):
                        return self.out_of_fuel(self.context_of(caller), entry)
                    # -- decode --
                    request: Any = None
                    answer = 0
                    if req_len:
                        raw = mem._view[req_ptr:req_end].tobytes()
                        # A small flat array or map (most requests) straight to its builder,
                        # without decode()'s dispatch; anything it is unsure of, decoded whole.
                        head = raw[0]
                        request = (
                            flat(raw, max_items, max_string)
                            if 0x81 <= head < 0x98 or 0xA1 <= head < 0xB8
                            else UNSURE
                        )
                        if request is UNSURE:
                            request, answer, trap = self._decode_priced(raw, limits, caller, entry)
                            if trap is not None:  # the items' price could not be paid
                                return trap
                    # -- serve --
                    if not answer:
                        mem.room = resp_cap
                        try:
                            response = handler(mem, request)
                        except HostStatus as st:
                            answer = _failure_answer(st.status)
                            if not answer:
                                return self._not_a_failure(entry, st.status)
                        except (GuestAbort, GuestOutOfFuel, GuestDeadline, GuestInterrupted) as e:
                            return self._stopped_by_handler(e, caller, entry)
                        else:
                            # -- answer --
                            if type(response) is StatusAnswer:
                                answer = response.result
                            else:  # null, the commonest answer, without the encoder
                                body = _NULL if response is None else encode(response)
                                size = len(body)
                                if size > max_response:
                                    return self._over_entry(entry, size)
                                if size > resp_cap:
                                    answer = _BUFFER_TOO_SMALL
                                else:
                                    debt = self.fuel_debt + per_byte * size
                                    self.fuel_debt = debt
                                    if debt >= SETTLE_FUEL and not settle(
                                        self.context_of(caller), debt
                                    ):
                                        return self.out_of_fuel(self.context_of(caller), entry)
                                    # No wasm ran in the handler: the view is what was checked.
                                    mem._view[resp_ptr : resp_ptr + size] = body
                                    answer = size
                if answer < 0 and self.tally is not None:  # operator metrics hook
                    self.tally.status(answer)
                _put_answer(PROCESS_MEMORY, args, answer)
                if self.halt is not None:  # e.g. Ctrl-C during this call (see sigint.py)
                    return self.halt_trap()
                return 0
            except BaseException as exc:
                return self.crashed(exc)

        CALLBACK_CODES.add(dispatch.__code__)
        return dispatch

    def _bad_ranges(
        self, entry: HostFunction, req_ptr: int, req_len: int, resp_ptr: int, resp_cap: int
    ) -> int | None:
        """The request or the response buffer lies past the memory as last seen, or they
        overlap: the guest may have grown its memory since (re-read then); else its call ends
        (``protocol``), and the trap is returned. None: the ranges are good after all."""
        name = entry.qualified_name
        mem = self.native
        req_end = req_ptr + req_len
        resp_end = resp_ptr + resp_cap
        size = mem._size
        if req_end > size or resp_end > size:
            size = mem.size_for(req_end if req_end > resp_end else resp_end)
        if req_end > size:
            return self.fail(
                FailureClass.PROTOCOL,
                f"{name}: request [{req_ptr}, +{req_len}) outside memory of {size} bytes",
            )
        if resp_end > size:
            return self.fail(
                FailureClass.PROTOCOL,
                f"{name}: response buffer [{resp_ptr}, +{resp_cap}) outside memory of "
                f"{size} bytes",
            )
        if req_len and resp_cap and req_ptr < resp_end and resp_ptr < req_end:
            return self.fail(FailureClass.PROTOCOL, f"{name}: request and response overlap")
        return None

    def _decode_priced(
        self, raw: bytes, limits: CodecLimits, caller: int, entry: HostFunction
    ) -> tuple[Any, int, int | None]:
        """A request the flat builder was unsure of, decoded whole: the request and the answer
        so far (0, or INVALID_ARGUMENT's for one not well-formed or over ``limits``), and None;
        or, third, the out-of-fuel trap if its items' price cannot be paid. The decode's work
        grows with the items, not the bytes: they are paid per item past FREE_REQUEST_ITEMS
        (refused requests too, for what was read)."""
        request: Any = None
        answer = 0
        head = raw[0]
        try:
            if head < 0x80 or head >= 0xE0:
                # A number, a string or a simple value: one item, and decode's direct path.
                request, items = decode(raw, limits), 1
            else:
                request, items = decode_counted(raw, limits)
        except CodecError as exc:
            # Read twice at worst: scanned and built by cbor2, then by the exact decoder that
            # names the fault.
            items = 2 * exc.items
            answer = _INVALID_ARGUMENT
        if items > FREE_REQUEST_ITEMS:
            debt = self.fuel_debt + FUEL_PER_REQUEST_ITEM * (items - FREE_REQUEST_ITEMS)
            self.fuel_debt = debt
            if debt >= SETTLE_FUEL and not self.settle(self.context_of(caller), debt):
                return None, 0, self.out_of_fuel(self.context_of(caller), entry)
        return request, answer, None

    def _not_a_failure(self, entry: HostFunction, status: object) -> int:
        """A handler raised HostStatus with OK, or with no status at all: the handler's bug,
        never an answer (OK would tell the guest 0 bytes were written, a negative number that
        some were). The call ends ``host_error``."""
        return self.fail(
            FailureClass.HOST_ERROR,
            f"{entry.qualified_name} raised HostStatus({status!r}), not a failure status",
        )

    def _stopped_by_handler(self, stop: Exception, caller: int, entry: HostFunction) -> int:
        """A handler ended the guest's call: it panicked (:class:`GuestAbort`), a per-step
        price could not be paid (:class:`GuestOutOfFuel`), or its wait met the deadline or an
        interrupt."""
        name = entry.qualified_name
        if isinstance(stop, GuestAbort):
            return self.fail(FailureClass.PANIC, stop.message)
        if isinstance(stop, GuestOutOfFuel):
            return self.out_of_fuel(self.context_of(caller), entry)
        if isinstance(stop, GuestDeadline):
            return self.fail(FailureClass.DEADLINE, f"{name}: deadline reached")
        return self.fail(FailureClass.DEADLINE, f"{name}: interrupted by the host")

    def _over_entry(self, entry: HostFunction, size: int) -> int:
        """The handler answered more than its entry's ``max_response_bytes``: the host's bug,
        so the call ends ``host_error`` (the guest's buffer is never the judge of that)."""
        return self.fail(
            FailureClass.HOST_ERROR,
            f"{entry.qualified_name}: host produced {size} bytes over the entry's "
            f"{entry.max_response_bytes}",
        )

    def _final_dispatch(self, bound: BoundImport) -> Dispatch:
        """The dispatch closure of an entry that never returns (``abort``): see
        :meth:`_final_call`."""

        def final(env: int, caller: int, args: int, nargs: int) -> int:
            try:
                if self.interrupted:  # its handler records the guest's message: not now
                    return self.halt_trap()
                if not self.native.bound:
                    return self.call_unbound(final, env, caller, args, nargs)
                req_ptr, req_len, _, _ = _CBOR_ARGS(PROCESS_MEMORY, args)
                return self._final_call(bound, caller, req_ptr, req_len)
            except BaseException as exc:
                return self.crashed(exc)

        CALLBACK_CODES.add(final.__code__)
        return final

    def _final_call(self, bound: BoundImport, caller: int, req_ptr: int, req_len: int) -> int:
        """An entry that never returns (``abort``): the call ends whatever the request, so no
        check below may answer the guest with a status and let it carry on. A request the host
        cannot read reaches the handler as :class:`UnreadableRequest`."""
        entry = bound.entry
        mem = self.native
        req_end = req_ptr + req_len
        request: Any = None
        if req_end > mem.size_for(req_end):
            request = UnreadableRequest("outside memory")
        elif req_len > entry.max_request_bytes:
            request = UnreadableRequest(f"{req_len} bytes, over {entry.max_request_bytes}")
        elif req_len:
            limits = CodecLimits(max_bytes=entry.max_request_bytes)
            try:
                request = decode(mem.read(req_ptr, req_len), limits)
            except CodecError:
                request = UnreadableRequest("not well-formed CBOR")
        read = 0 if isinstance(request, UnreadableRequest) else req_len
        # Priced like any call for what was read; a guest that cannot pay still ends here (its
        # fuel emptied), as the entry promises.
        self.charge(caller, entry.fuel_price(read))
        try:
            bound.handler(self.native, request)
        except GuestAbort as abort:
            return self.fail(FailureClass.PANIC, abort.message)
        return self.fail(FailureClass.HOST_ERROR, f"{entry.qualified_name} returned; it must not")

    def charge(self, caller: int, cost: int) -> bool:
        """Add ``cost`` to the fuel debt, settling it once it reaches SETTLE_FUEL; False if the
        Store cannot pay (the native dispatch inlines the same steps)."""
        debt = self.fuel_debt + cost
        self.fuel_debt = debt
        return debt < SETTLE_FUEL or self.settle(self.context_of(caller), debt)

    def denied(
        self,
        entry: HostFunction,
        write_result: Callable[[int, Any], None] | None,
        caller: int,
        args: int,
    ) -> int:
        """An ungranted native call: it pays its base price and answers the entry's
        ``denied_result`` (or, for an entry admission refuses when ungranted, its
        ``revoked_result``: the grant was revoked since) through its ``write_result``, or ends
        the call if it has neither."""
        if not self.charge(caller, entry.fuel_base):
            return self.out_of_fuel(self.context_of(caller), entry)
        answer = entry.denied_result if entry.denied_result is not None else entry.revoked_result
        if answer is None or write_result is None:
            return self.end_mid_guest(FailureClass.DENIED, f"{entry.qualified_name}: not granted")
        if self.tally is not None:  # operator metrics hook
            self.tally.status(Status.DENIED)
        write_result(args, answer)
        return 0

    def end_mid_guest(self, failure: FailureClass, message: str) -> int:
        """End the call with ``failure`` from inside a host call, and let the instance serve no
        other: the trap unwinds the guest's frames without their epilogues (Rust's shadow stack
        pointer stays lowered), which matters even for a class that otherwise keeps the
        instance (``denied``)."""
        self.interrupted = True
        return self.fail(failure, message)

    def status_trap(self, entry: HostFunction, status: Status) -> int:
        """A native embedder function raised :class:`HostStatus`: it has no status slot, so
        the call ends, with class ``denied`` for DENIED (``ctx.commit`` after a revocation)
        and ``host_error`` for any other status."""
        if status is Status.DENIED:
            return self.end_mid_guest(FailureClass.DENIED, f"{entry.qualified_name}: denied")
        return self.fail(
            FailureClass.HOST_ERROR,
            f"{entry.qualified_name} answered {Status(status).name}; a native function has no "
            "status slot",
        )

    def call_unbound(self, dispatch: Dispatch, env: int, caller: int, args: int, n: int) -> int:
        """A host call from a start function, before the Instance has resolved the memory
        export: the memory is looked up by name and served for this one call."""
        mem = self._memory_by_name(caller)
        if not mem:
            return self.fail(FailureClass.PROTOCOL, "host call from a guest with no memory")
        self.native.bind(self.context_of(caller), mem)
        try:
            return dispatch(env, caller, args, n)
        finally:
            self.native.forget()

    def out_of_fuel(self, ctx: int, entry: HostFunction) -> int:
        set_fuel(ctx, 0)
        self.fuel_debt = 0
        if self.tally is not None:  # operator metrics hook
            self.tally.failure(FailureClass.OUT_OF_FUEL)
        self.failure = CallError(
            FailureClass.OUT_OF_FUEL, f"fuel ran out paying for host call {entry.qualified_name}"
        )
        return new_trap("wasihost: out of fuel")
