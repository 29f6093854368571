"""The process runtime (``runtime = "wasm-process"``): each instance in a walled child.

:class:`ProcessBackend` fits the host's ExecutionBackend protocol (``host/backend.py``): it
compiles in the host, as the in-process engine does (its module cache, its compile worker), and
each :class:`ProcessInstance` it makes runs the module in a child process of its own, started
through :func:`.spawn.spawn` and walled by :mod:`.process_child` before it reads a byte of the
module. The instance keeps the GuestInstance protocol, so the Extension above it (its pool,
budgets, grants, logs, events, status) is the same whatever the runtime.

Host calls come back over the channel (:mod:`wasihost.core.channel`) and run HERE, with the
BoundImport handlers the Extension made: the grants, epochs, quotas, secrets, storage, http,
files, events and jobs never leave this process. A broker reaches guest memory through a
:class:`RemoteMemory`, whose reads and writes are MEM requests the child serves.

Trust runs one way. Every frame from a child is bounded and checked (:func:`~wasihost.core.
channel.expect`), and a frame that breaks the protocol, a host call outside the admitted
imports, a request over its entry's limit, or a child that outlives its call's deadline ends
the child: the call fails ``native_process_exit`` (or ``deadline``), the instance is gone, and
the Extension starts a new child for its next call. The fuel a child reports is its claim;
the CPU time the host measures of it (``/proc/PID/schedstat``) is the host's own figure
(:attr:`ProcessInstance.cpu_ns`).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import select
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core.channel import (
    HEADER_BYTES,
    PAYLOAD_LIMITS,
    PROTOCOL_VERSION,
    REFUSED_PREFIX,
    SECRET_BYTES,
    ChannelError,
    Kind,
    decode_frame,
    encode_frame,
    expect,
    frame_length,
    host_call_args,
)
from ..core.codec import CodecLimits, decode, encode
from ..core.errors import CallError, CodecError, ConfigError, FailureClass
from ..core.guestmem import WriteRoute
from ..core.hostlog import host_logger
from ..core.registry import CORE_CAPABILITY
from ..core.status import (
    GuestAbort,
    GuestDeadline,
    GuestExit,
    GuestFault,
    GuestInterrupted,
    GuestOutOfFuel,
    HostFunctionFailed,
    HostStatus,
    Status,
    StatusAnswer,
    UnreadableRequest,
)
from .channel_io import ChannelTimeout, Reader, send_all
from .instance import CallResult, Instance
from .native import PREPAY_FUEL, SETTLE_FUEL, MemoryGone

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.settings import EngineSettings
    from .hostcalls import BoundImport, Gate, HostCallCounter
    from .instance import Budget, CompiledModule, StoreLimits
    from .spawn import Spawned
    from .walls import Wall
    from .wasm_engine import WasmEngine

# A child's start-up (a fresh interpreter importing the engine, then its walls) takes about
# 0.2 s on a quiet machine; one that has not said HELLO after this is stuck.
HELLO_TIMEOUT_S = 10.0
# LOAD (deserialising the module) and the between-call requests; none runs guest code.
CONTROL_TIMEOUT_S = 10.0
# How long past a call's deadline the host waits for the child's own answer (its epoch
# interrupt ends the guest at the deadline) before it kills the child's process group.
DEADLINE_GRACE_S = 0.25
# What the child may print to stderr that the host reads when it dies (the crash record's
# reason); the pipe holds more, nobody reads it, and a child flooding it only blocks itself.
STDERR_TAIL_BYTES = 2048
# The address space a child may map beyond its guest memory's reservation: the interpreter,
# wasmtime's code and the compiled module.
CHILD_BASE_ADDRESS_SPACE = 2 << 30
CHILD_ENV = {"MALLOC_ARENA_MAX": "2", "RUST_BACKTRACE": "0"}
# What the host charges for a child's CPU time beyond what it claims in fuel (the budgets'
# cpu_fuel_per_minute): guest code runs at about 0.07-0.09 ns a fuel unit here
# (benchmarks/bench_hostcall_prices.py), so 10 units a nanosecond undercharges an honest
# guest's own work; and the first CPU_ALLOWANCE_NS of each call (the child's interpreter
# serving the channel, about 20 µs for a small call) are not charged at all. A child that
# under-reports its fuel is charged for the CPU it really used.
FUEL_PER_CPU_NS = 10
CPU_ALLOWANCE_NS = 1_000_000
# And each message the child serves for a call (a host call, a guest-memory request) costs it
# 10-20 µs of interpreter time that no fuel price covers: each is allowed this much.
CPU_ALLOWANCE_PER_MESSAGE_NS = 100_000
# A child's whole CPU time (RLIMIT_CPU): an hour, far past any call's deadline; the host's
# deadline kill is what bounds one call.
CHILD_CPU_SECONDS = 3600



def _died(status: int, stderr: bytes) -> CallError:
    """The failure of a call whose child is gone, naming how it ended."""
    if status < 0:
        try:
            how = f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            how = f"was killed by signal {-status}"
    else:
        how = f"exited with status {status}"
    last = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] if stderr else []
    said = f" (its last words: {last[0][:200]!r})" if last else ""
    return CallError(
        FailureClass.NATIVE_PROCESS_EXIT, f"the extension's process {how}{said}"
    )


class ChildDidNotStart(Exception):
    """A child could not be started or did not say a well-formed HELLO: no guest code ran."""


class RemoteMemory:
    """What a broker gets for guest memory when the guest runs in a child: the GuestMemory
    protocol, each access a MEM request the child serves (its engine checks the bounds and
    counts the bytes). Fuel a broker charges is added up here and paid by the child with the
    next request or the host call's answer."""

    def __init__(self, instance: ProcessInstance) -> None:
        self._instance = instance
        self.deadline = 0.0
        self.room = 0
        # Bytes this host call moved: what the child's engine counted (each MEM answer says),
        # plus what a broker adds as bytes to price its work (memio.charge).
        self.child_moved = 0
        self.extra_moved = 0
        self.bound = True
        self.pending = 0  # fuel charged here, not yet paid by the child
        self.per_byte = 0
        self._wakeup = threading.Event()

    @property
    def moved(self) -> int:
        return self.child_moved + self.extra_moved

    @moved.setter
    def moved(self, value: int) -> None:
        self.extra_moved = value - self.child_moved

    def begin(self, deadline: float) -> None:
        """A new host call."""
        self.deadline = deadline
        self.pending = 0
        self.child_moved = 0
        self.extra_moved = 0

    # -- waits and interrupts: the host's own, as in-process -------------------------------

    @property
    def wakeup(self) -> threading.Event:
        return self._wakeup

    @property
    def woken(self) -> bool:
        return self._wakeup.is_set()

    def wake(self) -> None:
        self._wakeup.set()

    def sleep(self, seconds: float) -> None:
        if self._wakeup.wait(seconds if seconds > 0 else 0):
            raise GuestInterrupted

    # -- fuel ----------------------------------------------------------------------------

    def take_pending(self) -> int:
        pending, self.pending = self.pending, 0
        return pending

    def charge(self, units: int) -> None:
        self.pending += units
        if self.pending >= SETTLE_FUEL:
            self._ask("charge", [self.take_pending()], None)

    def can_pay(self, units: int) -> bool:
        return bool(self._ask("can_pay", [units], bool))

    def require_fuel(self, units: int) -> None:
        if units > PREPAY_FUEL and not self.can_pay(units + self.pending):
            raise GuestOutOfFuel(f"{units} fuel units for the work asked")

    def reserve_fuel(self, nbytes: int) -> None:
        if not self.can_pay(self.per_byte * nbytes + self.pending):
            raise GuestOutOfFuel(f"cannot pay for {nbytes} bytes")

    # -- guest memory ----------------------------------------------------------------------

    def size(self) -> int:
        return int(self._ask("size", [], int))

    def size_for(self, end: int) -> int:
        return self.size()

    def read(self, ptr: int, length: int) -> bytes:
        data = self._ask("read", [ptr, length], bytes)
        if len(data) != length:
            raise self._instance.violation(f"a read of {length} bytes answered {len(data)}")
        return bytes(data)

    def write(self, ptr: int, data: bytes) -> None:
        self._ask("write", [ptr, bytes(data)], None)

    def read_u32(self, ptr: int) -> int:
        return self._word("read_u32", [ptr], 0xFFFF_FFFF)

    def read_u64(self, ptr: int) -> int:
        return self._word("read_u64", [ptr], 0xFFFF_FFFF_FFFF_FFFF)

    def read_iovec(self, ptr: int, cap: int) -> bytes:
        return self._bytes_at_most("read_iovec", [ptr, cap], cap)

    def take_iovec(self, ptr: int, cap: int, count_ptr: int) -> bytes:
        return self._bytes_at_most("take_iovec", [ptr, cap, count_ptr], cap)

    def read_u32_pair(self, ptr: int) -> tuple[int, int]:
        pair = self._ask("read_u32_pair", [ptr], list)
        if len(pair) != 2 or any(type(v) is not int or not 0 <= v <= 0xFFFF_FFFF for v in pair):
            raise self._instance.violation("read_u32_pair answered something else than two u32")
        return int(pair[0]), int(pair[1])

    def write_u32(self, ptr: int, value: int) -> None:
        self._ask("write_u32", [ptr, value], None)

    def write_u64(self, ptr: int, value: int) -> None:
        self._ask("write_u64", [ptr, value], None)

    def require_range(self, ptr: int, length: int) -> None:
        self._ask("require_range", [ptr, length], None)

    def _word(self, op: str, args: list[Any], most: int) -> int:
        value = self._ask(op, args, int)
        if not 0 <= value <= most:
            raise self._instance.violation(f"{op} answered {value}")
        return int(value)

    def _bytes_at_most(self, op: str, args: list[Any], most: int) -> bytes:
        data = self._ask(op, args, bytes)
        if len(data) > most:
            raise self._instance.violation(f"{op} answered more than {most} bytes")
        return bytes(data)

    def _ask(self, op: str, args: list[Any], kind: type | None) -> Any:
        return self._instance.ask_memory(op, args, kind, self.take_pending())


class ChildProcess:
    """A started child and the host's ends of its sockets. :meth:`end` kills its process
    group, reaps it and closes everything; it is idempotent and runs from the instance's
    close, its failure paths, and a finalizer when an instance is dropped unclosed."""

    def __init__(
        self, spawned: Spawned, channel: socket.socket, control: socket.socket
    ) -> None:
        self.spawned = spawned
        self.pid = spawned.pid
        self.channel = channel
        self.control = control
        self.walls: list[Wall] = []
        self.cpu_fd = _open_schedstat(spawned.pid)
        self._lock = threading.Lock()
        self._ended: tuple[int, bytes] | None = None
        self._final_cpu_ns: int | None = None  # read as it is ended: a killed child's is kept

    def end(self) -> tuple[int, bytes]:
        """Its exit status (negative: the signal) and the tail of what it wrote on stderr."""
        with self._lock:
            if self._ended is not None:
                return self._ended
            # Its CPU time, read before the kill: a call ended by its deadline is charged for
            # the CPU it burnt as much as one that answered.
            self._final_cpu_ns = self.cpu_ns(-1)
            stderr = _stderr_tail(self.spawned)
            status = self.spawned.end()
            for sock in (self.channel, self.control):
                with contextlib.suppress(OSError):
                    sock.close()
            if self.cpu_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.cpu_fd)
                self.cpu_fd = -1
            self._ended = (status, stderr)
            return self._ended

    def cpu_ns(self, otherwise: int) -> int:
        """Its CPU time so far in nanoseconds, as the kernel counts it (``otherwise`` when it
        cannot be read)."""
        if self.cpu_fd < 0:
            final = self._final_cpu_ns
            return final if final is not None and final >= 0 else otherwise
        try:
            return int(_pread(self.cpu_fd, 64, 0).split()[0])
        except (OSError, ValueError, IndexError):
            return otherwise


class ProcessInstance:
    """One guest instance in a child process (the GuestInstance protocol of host/backend.py).

    One thread at a time calls it (``lock``), as an in-process Instance; ``interrupt``,
    ``cancel``, ``stop`` and ``close`` come from any thread."""

    # Whether the host prices the child's host calls itself: a Wasm child's engine charges
    # them to its own fuel meter; a native plugin has none (native_plugins.NativeInstance).
    meters_host_calls = False

    def __init__(
        self,
        backend: ProcessBackend,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None,
    ) -> None:
        self.lock = threading.Lock()
        self.last_call_fuel = 0
        self.fuel_used = 0
        self.started = False
        self.closed = False
        self.exit_code: int | None = None
        self.context = self  # what an owner reads on its hot path: ``interrupted``
        self.cpu_ns = 0  # the child's CPU time as the host measures it
        self.last_call_cpu_ns = 0
        self._imports = tuple(imports)
        self._gate = gate
        self._limits = limits
        self._tally: HostCallCounter | None = None
        self._halt: CallError | None = None
        self._reraise: BaseException | None = None
        self._unclaimed: Callable[[int], object] | None = None
        self._messages = 0  # host calls and memory requests of the call in flight
        # The fuel of the call in flight and what its host calls cost so far, when the host
        # prices them (meters_host_calls).
        self._fuel_cap = 0
        self._metered = 0
        self.unclaimed_fuel = 0  # charged for CPU time beyond the claims (charge_unclaimed)
        self._interrupted = False
        self._dead: CallError | None = None
        self._remote = RemoteMemory(self)
        # The entry token, as an in-process Instance has: two threads in one conversation
        # would interleave their frames on the channel.
        self._token = [True]
        self._request_limits = [
            CodecLimits(max_bytes=max(1, b.entry.max_request_bytes)) for b in self._imports
        ]
        # One entry of each capability the module imports: the gate asks of an entry, and
        # one answers for all of its capability's. Its ``peek``, where it has one, does not
        # count the asking as the guest's (the grant told the child before each call).
        self._entry_of = {b.entry.capability: b.entry for b in reversed(self._imports)}
        self._caps = sorted(self._entry_of)
        self._peek: Gate = getattr(gate, "peek", gate)
        self._most_overrun = _most_overrun(self._imports)
        # Every host call costs at least its entry's base price, so a call's fuel bounds how
        # many it can make; a child making more is lying about its fuel.
        self._cheapest_call = max(1, min((b.entry.fuel_base for b in self._imports), default=1))
        child = self._child = backend.start_child(limits, module)
        self._channel, self._control, self.walls = child.channel, child.control, child.walls
        self._reader = Reader(child.channel)
        # A dropped instance (its Extension never closed) still ends its child.
        weakref.finalize(self, child.end)
        try:
            self._load(backend, module, command_export)
        except BaseException:
            self.close()
            raise
        # The child's start-up (the interpreter, its imports, its walls, the module) is the
        # host's cost of the runtime, not the first call's.
        self.cpu_ns = self._cpu()

    # -- the GuestInstance protocol --------------------------------------------------------

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    @property
    def pid(self) -> int:
        return self._child.pid

    def instantiate(self, budget: Budget) -> None:
        if self.closed or self.started:
            raise CallError(FailureClass.HOST_ERROR, "instance is closed or already started")
        self.started = True
        self._run([Kind.START], budget)

    def run_command(self, budget: Budget) -> int:
        status, _ = self._run([Kind.RUN], budget)
        return status

    def call(
        self,
        command: bytes,
        payload: bytes | bytearray | memoryview,
        max_output_bytes: int,
        budget: Budget | None = None,
        may_keep_gil: bool = True,
    ) -> CallResult:
        if self.closed or self._interrupted:
            self.last_call_fuel = 0
            raise CallError(
                FailureClass.HOST_ERROR if self.closed else FailureClass.DEADLINE,
                "instance is closed" if self.closed else "interrupted by the host",
            )
        if budget is None:
            from .instance import Budget

            budget = Budget(self._limits.fuel, self._limits.timeout_ms)
        message = [Kind.CALL, bytes(command), bytes(payload), max_output_bytes, may_keep_gil]
        status, body = self._run(message, budget)
        if len(body) > max_output_bytes:
            raise self._fail_closed(f"an answer of {len(body)} bytes over {max_output_bytes}")
        return CallResult(status, body, self.last_call_fuel)

    def cap_memory(self, max_memory_bytes: int | None) -> None:
        if self.closed or self._dead is not None:
            return
        limit = self._limits.max_memory_bytes
        cap = limit if max_memory_bytes is None else min(max_memory_bytes, limit)
        self._between_calls([Kind.CAP_MEMORY, cap])

    def memory_bytes(self) -> int | None:
        return self._query("memory")

    def refused_memory_bytes(self) -> int | None:
        return self._query("refused")

    def count_host_calls(self, tally: HostCallCounter | None) -> None:
        self._tally = tally

    def interrupt(self) -> None:
        """From any thread: the running call ends at the child's next epoch tick, and every
        later one is refused; a broker waiting here wakes at once."""
        self._interrupted = True
        self._remote.wake()
        with contextlib.suppress(OSError):
            self._control.send(b"i")

    def cancel(self) -> None:
        self.stop(CallError(FailureClass.CANCELLED, "cancelled by the caller"))

    def stop(self, failure: CallError) -> None:
        if self._halt is None:
            self._halt = failure
        self.interrupt()

    def close(self) -> None:
        """End the child (its whole process group) and forget it. From any thread; a call in
        flight fails as the child goes."""
        if not self._token and self._halt is None:
            # A call runs on another thread: it ends as an interrupted in-process call does.
            self._halt = CallError(FailureClass.DEADLINE, "interrupted by the host")
        self.closed = True
        self._interrupted = True
        self._remote.wake()
        self._end()

    # -- the conversation --------------------------------------------------------------------

    def _load(self, backend: ProcessBackend, module: CompiledModule, export: str | None) -> None:
        from .process_child import entry_record

        limits = self._limits
        message = [
            Kind.LOAD,
            backend.child_settings(),
            backend.artifact(module),
            [entry_record(b.entry) for b in self._imports],
            [limits.max_memory_bytes, limits.max_table_elements, limits.fuel, limits.timeout_ms],
            export,
        ]
        reply = self._exchange(message, time.monotonic() + CONTROL_TIMEOUT_S)
        self._expect(reply, Kind.READY)
        names = reply[1]
        admitted = [[b.entry.module, b.entry.name] for b in self._imports]
        if names != admitted:
            # The health report: the child loaded what the host admitted, import for import.
            raise self._fail_closed("its module's imports are not the ones admitted")

    def _run(self, head: list[Any], budget: Budget) -> tuple[int, bytes]:
        """One START, CALL or RUN under ``budget``: (status, body) of its DONE."""
        if self._dead is not None:
            raise self._dead
        try:
            self._token.pop()
        except IndexError:
            raise ConfigError(
                "Instance entered by a second thread while a call runs: hold Instance.lock "
                "around calls"
            ) from None
        try:
            return self._run_entered(head, budget)
        finally:
            self._token.append(True)

    def _run_entered(self, head: list[Any], budget: Budget) -> tuple[int, bytes]:
        peek, entry_of = self._peek, self._entry_of
        granted = [c for c in self._caps if peek(entry_of[c])]
        message = [*head, budget.fuel, max(0.0, budget.deadline - time.monotonic()), granted]
        self._fuel_cap, self._metered = budget.fuel, 0
        answered = False
        try:
            most = (budget.fuel + SETTLE_FUEL) // self._cheapest_call + 1
            reply = self._exchange(message, budget.deadline + DEADLINE_GRACE_S, most)
            kind = self._expect(reply, Kind.DONE, Kind.FAIL)
            answered = True
        finally:
            # Since the last reading: this call, and the child's bounded wait after the last.
            now = self._cpu()
            self.last_call_cpu_ns = now - self.cpu_ns
            self.cpu_ns = now
            if not answered:  # killed at its deadline, or ended for a violation: no claim
                self._charge_cpu(self._metered)
        stopped = self._interrupted  # by the host, before the child's own word below
        used = reply[3]
        # A call may overrun its fuel by the settling batch and one host call's price.
        if not 0 <= used <= budget.fuel + SETTLE_FUEL + self._most_overrun:
            raise self._fail_closed(f"it claimed {used} fuel of {budget.fuel}")
        used += self._metered  # 0 but for a plugin whose host calls the host priced
        self.fuel_used += used
        self.last_call_fuel = used
        budget.spend(used)
        self._charge_cpu(used)
        reraise, self._reraise = self._reraise, None
        if reraise is not None:  # what a host function raised that was no Exception
            raise reraise
        if reply[4] is not None:
            self.exit_code = reply[4]
        if reply[5]:  # the child's instance may not be entered again (end_mid_guest)
            self._interrupted = True
        if reply[6] is not None:
            self._count(reply[6])
        if kind is Kind.FAIL:
            raise self._failure_of(reply[1], reply[2], stopped)
        if self._halt is not None:
            raise self._halt
        return reply[1], reply[2]

    def charge_unclaimed(self, charge: Callable[[int], object] | None) -> None:
        """Budgets hook: ``charge(units)`` is told the fuel a call's measured CPU time is worth
        beyond the fuel the child claimed (FUEL_PER_CPU_NS), for the extension's rate budget."""
        self._unclaimed = charge

    def _charge_cpu(self, claimed: int) -> None:
        charge = self._unclaimed
        if charge is None:
            return
        allowance = CPU_ALLOWANCE_NS + CPU_ALLOWANCE_PER_MESSAGE_NS * self._messages
        worth = (self.last_call_cpu_ns - allowance) * FUEL_PER_CPU_NS
        if worth > claimed:
            self.unclaimed_fuel += worth - claimed
            charge(worth - claimed)

    def _refused_in_child(self, capability: str) -> None:
        """The child's gate refused ``capability`` to the guest: the host's gate is asked for
        it, so it is recorded as asked for (and refused) as in-process."""
        entry = self._entry_of.get(capability)
        if entry is None:
            raise self._fail_closed(f"a refusal of {capability!r}, which it does not import")
        self._gate(entry)

    def _count(self, flat: list[Any]) -> None:
        """The child's host-call refusals and failures since its last answer, into the host's
        operator metrics; anything but the counts the child's engine makes is a violation."""
        tally = self._tally
        most = len(_STATUS_CODES) + len(FailureClass) + len(self._caps)
        if len(flat) % 2 or len(flat) > 2 * most:
            raise self._fail_closed("a malformed host-call tally")
        for key, n in zip(flat[::2], flat[1::2], strict=True):
            if type(n) is not int or not 0 < n <= _MAX_TALLY:
                raise self._fail_closed("a malformed host-call tally")
            if type(key) is int and key in _STATUS_CODES:
                if tally is not None:
                    for _ in range(n):
                        tally.status(key)
            elif type(key) is str and key in _FAILURE_VALUES:
                if tally is not None:
                    for _ in range(n):
                        tally.failure(FailureClass(key))
            elif type(key) is str and key.startswith(REFUSED_PREFIX):
                self._refused_in_child(key[len(REFUSED_PREFIX) :])
            else:
                raise self._fail_closed(f"a host-call tally of {key!r}")

    def _failure_of(self, failure: str, message: str, stopped: bool) -> CallError:
        if self._halt is not None:
            return self._halt  # the host stopped it: its own reason, not the child's word
        if stopped:  # the host interrupted it: as an in-process call ends, whatever the child says
            return CallError(FailureClass.DEADLINE, "interrupted by the host")
        try:
            kind = FailureClass(failure)
        except ValueError:
            return self._fail_closed(f"an unknown failure class {failure!r}")
        return CallError(kind, message[:1000])

    def _between_calls(self, message: list[Any]) -> Any:
        if self._dead is not None or self.closed:
            return None
        try:
            self._token.pop()
        except IndexError:
            return None  # a call runs (or a close): nothing to ask now
        try:
            reply = self._exchange(message, time.monotonic() + CONTROL_TIMEOUT_S)
            self._expect(reply, Kind.VALUE)
        except CallError:
            return None
        finally:
            self._token.append(True)
        return reply[1]

    def _query(self, what: str) -> int | None:
        value = self._between_calls([Kind.QUERY, what])
        return value if type(value) is int and value >= 0 else None

    def _exchange(
        self, message: list[Any], deadline: float, most_host_calls: int = 0
    ) -> list[Any]:
        """Send ``message``, serve the child's host calls (at most ``most_host_calls``), and
        return its answer."""
        self._send(message, deadline)
        served = self._messages = 0
        while True:
            try:
                reply = self._receive(deadline)
            except KeyboardInterrupt:
                # Ctrl-C while the guest runs: the call ends ``interrupted``, as in-process;
                # a second one does not wait for the child.
                if self._halt is not None and self._halt.failure is FailureClass.INTERRUPTED:
                    self._end()
                    raise
                self.stop(CallError(FailureClass.INTERRUPTED, "interrupted by SIGINT (Ctrl-C)"))
                continue
            if reply[0] != Kind.HOST:
                return reply
            served += 1
            self._messages += 1
            if served > most_host_calls:
                raise self._fail_closed(f"more than {most_host_calls} host calls in one call")
            self._serve_host(reply, deadline)

    def _send(self, message: list[Any], deadline: float) -> None:
        if self._dead is not None:
            raise self._dead
        try:
            send_all(self._channel, encode_frame(message), deadline)
        except ChannelTimeout:
            raise self._overran() from None
        except OSError:
            raise self._gone() from None

    def _receive(self, deadline: float) -> list[Any]:
        try:
            return decode_frame(self._reader.body(deadline))
        except ChannelError as exc:
            raise self._fail_closed(str(exc)) from None
        except ChannelTimeout:
            raise self._overran() from None
        except (EOFError, OSError):
            raise self._gone() from None

    # -- host calls ----------------------------------------------------------------------

    def _serve_host(self, message: list[Any], deadline: float) -> None:
        try:
            index, args = host_call_args(message)
        except ChannelError as exc:
            raise self._fail_closed(str(exc)) from None
        if not 0 <= index < len(self._imports):
            raise self._fail_closed(f"a host call of import {index}, which it does not have")
        bound = self._imports[index]
        remote = self._remote
        remote.begin(deadline - DEADLINE_GRACE_S)
        try:
            if self._interrupted:  # revoked, disabled, cancelled: no handler runs after that
                answer: list[Any] = [Kind.HOST_STOP, "interrupted", "interrupted by the host"]
            elif self.meters_host_calls and not self._pay_for(bound.entry, args):
                # As the engine refuses a host call the guest's fuel cannot pay for: before
                # the handler runs, so it has no effect.
                answer = [Kind.HOST_STOP, "out_of_fuel", f"out of fuel for {bound.entry.name}"]
            else:
                answer = self._host_answer(index, bound, args)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: raised after the call
            if self._reraise is None:
                self._reraise = exc
            answer = [Kind.HOST_STOP, "error", type(exc).__name__]
        charge = remote.take_pending()
        if self.meters_host_calls:
            self._metered += charge
        answer.append(charge)
        answer.append(max(0, remote.extra_moved))
        self._send(answer, deadline)

    def _pay_for(self, entry: HostFunction, args: Any) -> bool:
        """Charge a host call's price (its entry's base and per-byte price) to the call in
        flight, when the host prices them; False, and nothing charged, past the call's fuel."""
        raw = args[0] if type(args) is list and args and type(args[0]) is bytes else b""
        price = entry.fuel_price(len(raw)) if entry.convention != "native" else entry.fuel_base
        if self._metered + price > self._fuel_cap:
            return False
        self._metered += price
        return True

    def _host_answer(self, index: int, bound: BoundImport, args: Any) -> list[Any]:
        entry = bound.entry
        native = entry.convention == "native"
        request = self._checked_request(index, args) if not native else None
        if native and (
            type(args) is not list
            or len(args) != len(entry.params)
            or any(type(a) not in (int, float) for a in args)
        ):
            raise self._fail_closed(f"{entry.qualified_name} called with bad arguments")
        # The gate as the engine applies it in-process (hostcalls, native): every cbor entry,
        # and every native entry but the core ones, which their brokers check themselves.
        if (not native or entry.capability != CORE_CAPABILITY) and not self._gate(entry):
            if native:  # the child answers the entry's denied result, or ends the call
                return [Kind.HOST_STOP, "denied", "not granted"]
            return [Kind.HOST_STATUS, int(Status.DENIED)]
        handler = bound.handler
        if type(handler) is WriteRoute:
            handler = handler.handler
        try:
            if native:
                result = handler(self._remote, *args)
                return [Kind.HOST_OK, encode(result, PAYLOAD_LIMITS), None]
            response = handler(self._remote, request)
            if type(response) is StatusAnswer:
                return [Kind.HOST_OK, b"", int(response.status)]
            body = b"\xf6" if response is None else encode(response, PAYLOAD_LIMITS)
            return [Kind.HOST_OK, body, None]
        except HostStatus as st:
            status = st.status
            return [Kind.HOST_STATUS, int(status) if type(status) in (Status, int) else -1]
        except GuestAbort as exc:
            return [Kind.HOST_STOP, "abort", exc.message]
        except GuestExit as exc:
            return [Kind.HOST_STOP, "exit", str(exc.code)]
        except (GuestOutOfFuel, GuestDeadline, GuestInterrupted, GuestFault, MemoryGone) as exc:
            return [Kind.HOST_STOP, _STOP_KINDS[type(exc)], str(exc)]
        except Exception as exc:
            if not isinstance(exc, HostFunctionFailed):  # that one was logged where it happened
                host_logger().error("host call failed", exc_info=exc)
            return [Kind.HOST_STOP, "error", type(exc).__name__]

    def _checked_request(self, index: int, args: Any) -> Any:
        """A cbor host call's request as the host reads it: bounded by the entry's own limits,
        whatever the child's engine checked."""
        entry = self._imports[index].entry
        if type(args) is not list or len(args) != 3:
            raise self._fail_closed(f"{entry.qualified_name} called with bad arguments")
        raw, room, unreadable = args
        if type(raw) is not bytes or type(room) is not int or room < 0:
            raise self._fail_closed(f"{entry.qualified_name} called with bad arguments")
        self._remote.room = room
        if unreadable is not None:
            if not entry.never_returns or type(unreadable) is not str:
                raise self._fail_closed(f"{entry.qualified_name}: an unreadable request")
            return UnreadableRequest(unreadable[:200])
        if len(raw) > entry.max_request_bytes:
            raise self._fail_closed(
                f"{entry.qualified_name}: a request of {len(raw)} bytes over its "
                f"{entry.max_request_bytes}"
            )
        if not raw:
            return None
        try:
            return decode(raw, self._request_limits[index])
        except CodecError as exc:
            raise self._fail_closed(f"{entry.qualified_name}: {exc}") from None

    def ask_memory(self, op: str, args: list[Any], kind: type | None, charge: int) -> Any:
        """One MEM request, served by the child while a broker runs here. When the host
        prices host calls, it answers the fuel requests itself."""
        if self.meters_host_calls:
            self._metered += charge
            charge = 0
            if op == "charge":
                return None
            if op == "can_pay":
                return self._metered + int(args[0]) <= self._fuel_cap
        deadline = self._remote.deadline + DEADLINE_GRACE_S
        self._messages += 1
        self._send([Kind.MEM, op, args, charge], deadline)
        reply = self._receive(deadline)
        if self._interrupted:
            # Revoked, disabled or cancelled while the child answered: the broker stops before
            # its effect (a line to a sink after revoke() returned), as a host call in-process
            # stops at its interrupt check, which a round trip would otherwise widen.
            raise GuestInterrupted
        got = self._expect(reply, Kind.MEM_OK, Kind.MEM_FAULT)
        if got is Kind.MEM_FAULT:
            fault = _FAULTS.get(reply[1])
            if fault is None:
                raise self._fail_closed(f"an unknown memory fault {reply[1]!r}")
            raise fault(reply[2][:200])
        value = reply[1]
        if reply[2] >= 0:
            self._remote.child_moved = reply[2]
        if kind is None:
            if value is not None:
                raise self._fail_closed(f"{op} answered a value")
        elif type(value) is not kind:
            raise self._fail_closed(f"{op} answered {type(value).__name__}, not {kind.__name__}")
        return value

    # -- failures --------------------------------------------------------------------------

    def _expect(self, message: list[Any], *kinds: Kind) -> Kind:
        """:func:`expect`, ending the child for a message that is not one of ``kinds``."""
        try:
            return expect(message, *kinds)
        except ChannelError as exc:
            raise self._fail_closed(str(exc)) from None

    def violation(self, reason: str) -> CallError:
        return self._fail_closed(reason)

    def _fail_closed(self, reason: str) -> CallError:
        """The child broke the protocol: it is ended, and so is the call."""
        self._end()
        failure = self._halt or CallError(
            FailureClass.NATIVE_PROCESS_EXIT,
            f"the extension's process broke the channel protocol ({reason}) and was ended",
        )
        self._dead = failure
        return failure

    def _overran(self) -> CallError:
        """The child did not answer by its deadline (plus the grace its own epoch interrupt
        has): the host kills its process group."""
        self._end()
        failure = self._halt or CallError(
            FailureClass.DEADLINE, "the call's deadline passed; the extension's process was killed"
        )
        self._dead = failure
        return failure

    def _gone(self) -> CallError:
        """The channel closed: the child died (or was ended by close() or stop())."""
        status, stderr = self._end()
        failure = self._halt or (
            CallError(FailureClass.HOST_ERROR, "instance is closed")
            if self.closed
            else _died(status, stderr)
        )
        self._dead = failure
        return failure

    def _end(self) -> tuple[int, bytes]:
        return self._child.end()

    def _cpu(self) -> int:
        return self._child.cpu_ns(self.cpu_ns)


_STOP_KINDS: dict[type, str] = {
    GuestOutOfFuel: "out_of_fuel",
    GuestDeadline: "deadline",
    GuestInterrupted: "interrupted",
    GuestFault: "fault",
    MemoryGone: "gone",
}
_FAULTS: dict[object, type[Exception]] = {
    "fault": GuestFault,
    "out_of_fuel": GuestOutOfFuel,
    "interrupted": GuestInterrupted,
    "gone": MemoryGone,
}
# What a child's tally may name: the engine's refusals (negated status codes) and classes.
_STATUS_CODES = frozenset(v for s in Status if s is not Status.OK for v in (int(s), -int(s)))
_FAILURE_VALUES = frozenset(f.value for f in FailureClass)
# A tally counts host calls of one call, each at least a base price of fuel: far below this.
_MAX_TALLY = 1 << 24


# Bound once: the host's own bookkeeping must not show up in a test (or a profiler) watching
# what a broker does through ``os``.
_pread = os.pread


def _most_overrun(imports: Sequence[BoundImport]) -> int:
    """The most fuel one host call of ``imports`` may cost past a budget (its price for the
    largest request and response, and the codec's items), with the copy of a call's input
    and output: a claim past the budget by more than this is a lie."""
    from ..core.limits import COMMAND_FUEL_PER_BYTE
    from .hostcalls import FUEL_PER_REQUEST_ITEM

    most = max(
        (
            b.entry.fuel_price(b.entry.max_request_bytes + b.entry.max_response_bytes)
            + FUEL_PER_REQUEST_ITEM * 4096
            for b in imports
        ),
        default=0,
    )
    return 2 * most + COMMAND_FUEL_PER_BYTE * (64 << 20)


def _open_schedstat(pid: int) -> int:
    try:
        return os.open(f"/proc/{pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _stderr_tail(child: Spawned) -> bytes:
    """What the child wrote on stderr and nobody read yet (its pipe is gone once it ended)."""
    stream = child.proc.stderr
    if stream is None or stream.closed:
        return b""
    return _read_tail(stream.fileno())


def _read_tail(fd: int) -> bytes:
    """What is waiting in the child's stderr pipe, at most STDERR_TAIL_BYTES, never blocking."""
    out = b""
    with contextlib.suppress(OSError):
        while len(out) < 1 << 16 and select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out = (out + chunk)[-STDERR_TAIL_BYTES:]
    return out


class ProcessBackend:
    """The ExecutionBackend of ``runtime = "wasm-process"``: compiles with the host's engine,
    runs each instance in a walled child (module docstring)."""

    def __init__(
        self,
        engine: WasmEngine,
        *,
        fallback: bool = False,
        program: Sequence[str] | None = None,
        rlimits: Mapping[str, int] | None = None,
    ) -> None:
        self._engine = engine
        # The child's command line before its own arguments (the control descriptor and its
        # rlimits): None runs wasihost's child (process_child); another program must speak
        # the same channel protocol (a test's hostile child, a native plugin).
        self.program = list(program) if program is not None else None
        # Replaces any of the children's rlimits (rlimits() has the defaults).
        self.rlimit_overrides = dict(rlimits or {})
        # prefer-process: an instance whose child cannot start (before any guest code ran, so
        # nothing can have committed) runs in this process instead.
        self.fallback = fallback
        self.fallbacks = 0
        self._artifacts: weakref.WeakKeyDictionary[CompiledModule, bytes] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    @property
    def settings(self) -> EngineSettings:
        return self._engine.settings

    def compile(self, wasm: bytes, sha256: str | None = None) -> CompiledModule:
        return self._engine.compile(wasm, sha256)

    def validates(self, wasm: bytes) -> bool:
        return self._engine.validates(wasm)

    def new_instance(
        self,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> ProcessInstance | Instance:
        try:
            return ProcessInstance(self, module, imports, gate, limits, command_export)
        except ChildDidNotStart as exc:
            if not self.fallback:
                raise CallError(FailureClass.NATIVE_PROCESS_EXIT, str(exc)) from None
            host_logger().warning("running in-process: %s", exc)
            self.fallbacks += 1
            return self._engine.new_instance(module, imports, gate, limits, command_export)

    def check_entry_stack(self) -> None:
        """Nothing to refuse: the guest runs on the child's own main thread, whatever stack
        the calling thread has left."""

    def release_memory(self) -> None:
        self._engine.release_memory()

    def close(self) -> None:
        """The engine is the host's, closed with it; each child goes with its instance."""

    def artifact(self, module: CompiledModule) -> bytes:
        """The compiled module as the child deserialises it (made once per module)."""
        with self._lock:
            data = self._artifacts.get(module)
            if data is None:
                data = self._artifacts[module] = bytes(module.module.serialize())
            return data

    def child_settings(self) -> dict[str, Any]:
        """The engine settings a child's engine is built with: the host's, without pooling
        (one instance a child)."""
        import attrs

        settings = attrs.asdict(self._engine.settings)
        settings["pooling_instances"] = 0
        return settings

    def rlimits(self, limits: StoreLimits) -> dict[str, int]:
        """A child's rlimits. Address space: its guest memory's reservation and guard, and
        CHILD_BASE_ADDRESS_SPACE for the interpreter and the engine. CPU: a child serves many
        calls, each bounded by its own deadline; this bounds a child whose calls never end
        (SIGXCPU, then SIGKILL a second later). Open files: the interpreter's own few, no
        more. Processes: counted per user, so it bounds a fork bomb's size, not the child's
        own threads (the seccomp filter refuses every fork). File size 0: it writes no file."""
        defaults = {
            "RLIMIT_AS": self.address_space(limits),
            "RLIMIT_CPU": CHILD_CPU_SECONDS,
            "RLIMIT_NOFILE": 64,
            "RLIMIT_NPROC": 4096,
            "RLIMIT_FSIZE": 0,
            "RLIMIT_CORE": 0,
        }
        defaults.update(self.rlimit_overrides)
        return defaults

    def address_space(self, limits: StoreLimits) -> int:
        """RLIMIT_AS of a child: its guest memory's reservation and guard, and
        CHILD_BASE_ADDRESS_SPACE for the interpreter and the engine."""
        settings = self._engine.settings
        return settings.memory_reservation + settings.memory_guard_size + CHILD_BASE_ADDRESS_SPACE

    # Whether each child is a launcher that says HELLO itself (with the walls it checked)
    # before it executes the program, which says its own (native_plugins.NativeBackend).
    launched = False

    def child_env(self) -> dict[str, str]:
        """What a child's environment holds besides the locale and its secret."""
        return {**CHILD_ENV, **_import_path()}

    def child_program(self, module: Any) -> tuple[list[str], tuple[int, ...]]:
        """The child's command line before its own arguments (the control descriptor and the
        rlimits), and the descriptors it must inherit beyond the channel and the control
        socket: wasihost's child, or ``program``."""
        return self.program or [sys.executable, "-P", "-m", "wasihost.engine.process_child"], ()

    def start_child(self, limits: StoreLimits, module: Any = None) -> ChildProcess:
        """A new walled child that has said HELLO, with its walls as it checked them."""
        from .spawn import DEVNULL, PIPE, spawn
        from .walls import SECRET_ENV

        secret = os.urandom(SECRET_BYTES)
        channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        control, their_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**self.child_env(), SECRET_ENV: secret.hex()}
        fd = their_control.fileno()
        program, inherited = self.child_program(module)
        argv = [*program, str(fd)]
        argv += [f"{k}={v}" for k, v in self.rlimits(limits).items()]
        try:
            child = spawn(
                argv,
                env=env,
                stdin=theirs.fileno(),
                stdout=DEVNULL,
                stderr=PIPE,
                prefix="wasihost-process-",
                pass_fds=(fd, *inherited),
            )
        except OSError as exc:
            channel.close()
            control.close()
            raise ChildDidNotStart(f"cannot start the extension's process: {exc}") from None
        finally:
            theirs.close()
            their_control.close()
        started = ChildProcess(child, channel, control)
        try:
            started.walls = _hello(child, channel, secret)
            if self.launched:
                _hello(child, channel, secret)  # the program's own, its walls its word only
        except BaseException:
            started.end()
            raise
        return started


def _hello(child: Spawned, channel: socket.socket, secret: bytes) -> list[Wall]:
    """Read and check a new child's HELLO: its protocol version and its secret."""
    from .walls import STATES, Wall

    channel.settimeout(HELLO_TIMEOUT_S)
    try:
        header = _recv_exactly(channel, HEADER_BYTES)
        message = decode_frame(_recv_exactly(channel, frame_length(header, 1 << 16)))
        expect(message, Kind.HELLO)
    except (OSError, EOFError, ChannelError) as exc:
        stderr = _stderr_tail(child)
        status = child.end()
        said = stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise ChildDidNotStart(
            f"the extension's process did not start ({exc or type(exc).__name__}; status "
            f"{status}{'; ' + said[0][:200] if said else ''})"
        ) from None
    finally:
        channel.settimeout(None)
    _, version, said, _pid, report = message
    if version != PROTOCOL_VERSION or not hmac.compare_digest(said, secret):
        raise ChildDidNotStart("the extension's process failed its hello")
    walls = []
    for item in report[:16]:
        if (
            type(item) is list
            and len(item) == 3
            and all(type(v) is str and len(v) <= 300 for v in item)
            and item[1] in STATES
        ):
            walls.append(Wall(item[0], item[1], item[2]))
    return walls


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the channel closed")
        buf += chunk
    return bytes(buf)


def _import_path() -> dict[str, str]:
    """PYTHONPATH for the child: the directory this wasihost was imported from, so the child
    runs the same copy as the host, and wasmtime's when a fresh interpreter would not find it
    (the compile worker's rule, compiler.worker_env)."""
    from .compiler import worker_env

    # wasihost/engine/process.py: three levels up is the directory holding the package.
    ours = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    theirs = worker_env().get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(p for p in (ours, theirs) if p)}
