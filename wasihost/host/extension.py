"""An admitted extension: its grant, lifecycle, log, and (once started) a pool of instances.

It starts on first use (instantiate, then the handshake), applies grant changes between calls
(a downgrade in place, anything else by restarting), and discards its instances after any
failure that may have corrupted a guest. Up to ``max_concurrency`` calls run at once, each on
an instance of its own; an instance serves one call at a time.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import attrs

from ..core import limits, serving
from ..core.admission import AdmissionPlan
from ..core.budgets import Resource
from ..core.call_ticket import CallTicket, _CallLocal
from ..core.codec import CodecLimits, decode, encode
from ..core.errors import (
    AdmissionError,
    CallError,
    CodecError,
    ConfigError,
    FailureClass,
    WasihostError,
)
from ..core.extlog import ExtensionLog, LogRecord
from ..core.grants import Grant, GrantInfo, GrantOrigin, GrantState

# Moved to core.lifecycle (call_gate raises it too); exported from here too (``as``: an
# explicit re-export, for mypy).
from ..core.lifecycle import SHUTTING_DOWN as SHUTTING_DOWN  # noqa: PLC0414
from ..core.lifecycle import (
    Event,
    ExtensionRevoked,
    ExtensionUnavailable,
    Lifecycle,
    State,
    check_reason,
)
from ..core.limits import lowered
from ..core.manifest import PAYLOAD_BYTES, Manifest, Resources
from ..core.registry import CORE_CAPABILITY, HostFunction
from ..core.wasmbin import PAGE_BYTES, read_header_cached
from ..engine import BoundImport, Budget, CompiledModule, StoreLimits
from ..packaging.package import Package
from ..supervisor.governor import TERMINATED_PREFIX, Delayed, DelayState
from ..supervisor.supervision import BackingOff, crash_class
from .handshake import Handshake, guest_error, guest_error_line, run_handshake
from .planning import check_package_policy, plan_package

if TYPE_CHECKING:
    from ..core.budget_crossing import Crossing
    from ..supervisor.eviction import Room
    from ..supervisor.reports import Usage
    from .backend import ExecutionBackend, GuestInstance
    from .services import HostServices

T = TypeVar("T")

RESERVED_PREFIX = "wasihost."
# A command name crosses into the guest on every call; the ABI bounds it at 255 bytes.
MAX_COMMAND_NAME_BYTES = 255
# Extension.wait_idle's longest wait: an hour is far above the longest call a manifest may
# have (limits.MAX_TIMEOUT_MS, ten minutes), so any call in flight ends within it.
MAX_WAIT_IDLE_S = 3600.0
# Validated command names are cached; a bound keeps an embedder looping over made-up names
# from growing the cache.
MAX_CACHED_COMMAND_NAMES = 256
# Start-up and admission steps kept per extension for inspection; older ones fall off.
MAX_STEPS = 100
# The states a call may go ahead in, compared by identity on every call: an Enum member looked
# up on its class costs about 150 ns in Python 3.11, and a tuple membership test of two of them
# half a microsecond, a twentieth of a no-op call.
_RUNNING = State.RUNNING
_PROVISIONING = State.PROVISIONING
CBOR_NULL = b"\xf6"
# How long close() waits for calls in flight (interrupted first) to hand their instances back
# before it closes the brokers: each stops within an epoch tick or so; a host function that
# ignores its wakeup can hold one longer, and close() does not wait past this for it.
CLOSE_DRAIN_S = 1.0
# How often that wait looks again: a fraction of an epoch tick.
CLOSE_DRAIN_POLL_S = 0.005
# The largest CBOR head (a string of up to 2**64 - 1 bytes): a CBOR command's value that is
# one string of max_input_bytes / max_output_bytes encodes to that many bytes plus its head,
# and must still fit, so the encoded payload may exceed the limit by this much.
CBOR_HEAD_BYTES = 9
# A warm spare older than this is dropped instead of used: its handshake (runtime id, token,
# grant) should be as recent as a start's; a minute is far inside the token's lifetime.
SPARE_MAX_AGE_S = 60.0


@attrs.frozen
class CommandWire:
    """How one command's payload crosses (manifest ``input``/``output``), looked up once."""

    name: bytes
    raw_input: bool = False
    raw_output: bool = False


@functools.lru_cache(maxsize=64)  # a few distinct limits per host; CodecLimits is frozen
def payload_limits(max_payload: int) -> CodecLimits:
    """A CBOR command's codec limits: a string may fill the payload limit (not the ABI's 64
    KiB host-call string cap), the encoding may add its head; depth and items as the ABI."""
    return CodecLimits(max_bytes=max_payload + CBOR_HEAD_BYTES, max_string_bytes=max_payload)


# The contract of a profile's binding is core.serving's (the WASI profile implements it below
# the host layer); it keeps its name here, where the host and its users import it from.
ProfileBinding = serving.ProfileBinding
# The host's own table holds any factory that takes its Extension; core.serving's
# ProfileFactory, the one a profile implements, takes any ExtensionView.
ProfileFactory = Callable[["Extension"], ProfileBinding]


# The most a 32-bit linear memory can address (65,536 pages).
WASM32_MAX_MEMORY_BYTES = 4 * 1024 * 1024 * 1024


def refused_grow_text(
    asked_bytes: int, limit_bytes: int, declared_max_bytes: int | None
) -> tuple[str, bool]:
    """What a failed command is told when a memory.grow was refused in its run, and whether
    the host's limit refused it (only then does raising the limit help). A grow is refused
    past wasm32's 4 GiB or the module's own declared maximum whatever the limit: that one was
    named for them too ("grow to 393216 bytes was refused: ... limited to 1073741824 bytes")."""
    text = f"the program's memory.grow to {asked_bytes} bytes was refused: "
    if asked_bytes > WASM32_MAX_MEMORY_BYTES:
        return f"{text}past the {WASM32_MAX_MEMORY_BYTES} bytes a 32-bit memory can hold", False
    if declared_max_bytes is not None and asked_bytes > declared_max_bytes:
        return f"{text}the module declares a maximum of {declared_max_bytes} bytes", False
    if asked_bytes > limit_bytes:
        return f"{text}its linear memory is limited to {limit_bytes} bytes", True
    return f"{text}the memory could not grow (its limit is {limit_bytes} bytes)", False


@runtime_checkable
class CommandMemory(Protocol):
    """A profile factory that also says how far a plain command of its profile may grow its
    linear memory (``wasi_profile``'s carries ``WasiOptions.max_memory_bytes``)."""

    command_max_memory_bytes: int


class _Pooled:
    """One instance of an extension's pool, the profile state (WASI descriptors) that belongs
    to it, and the pool generation it was made in: an instance of an older generation (the
    grant changed, the extension crashed or was stopped) is dropped when its call returns,
    never handed to another call."""

    __slots__ = ("bindings", "epoch", "generation", "instance", "room")

    def __init__(
        self, instance: GuestInstance, bindings: dict[str, ProfileBinding], generation: int
    ) -> None:
        self.instance = instance
        self.bindings = bindings
        self.generation = generation
        # The grant epoch its start-up ran under (and the call that started it runs under).
        self.epoch = -1
        # [density] its place under the host's max_live_instances (eviction.py), if any.
        self.room: Room | None = None


class _Spare:
    """A warm spare: an instance started (start function and handshake run) ahead of need,
    its handshake, and the grant epoch and plan it was started under. It is used by the next
    start only while those are still the extension's (see :meth:`Extension._take_spare`)."""

    __slots__ = ("born", "handshake", "plan", "slot")

    def __init__(self, slot: _Pooled, handshake: Handshake, plan: AdmissionPlan) -> None:
        self.slot = slot
        self.handshake = handshake
        self.plan = plan
        self.born = time.monotonic()


# wasihost.host.acall.call_async, once Extension.acall first needs it (a plain run never does).
_CALL_ASYNC: list[Callable[..., Coroutine[Any, Any, Any]]] = []


def _load_call_async() -> Callable[..., Coroutine[Any, Any, Any]]:
    from .acall import call_async

    _CALL_ASYNC[:] = [call_async]
    return call_async


# Which budget a call ran out of, and what raises it (the CLI says the same in its flags).
_BUDGET_HINTS = {
    FailureClass.OUT_OF_FUEL: (
        "the call used all its fuel: raise [resources] fuel_per_call in extension.toml, or pass "
        "call(..., fuel=N); a guest that loops forever runs out of any budget"
    ),
    FailureClass.DEADLINE: (
        "the call ran past its deadline: raise [resources] timeout_ms in extension.toml, or "
        "pass call(..., timeout_ms=N); a guest that loops forever runs past any deadline"
    ),
}
# The failures of a call that may be at a level's static limit, reported to the governor
# (a trap or panic only with the memory at its limit, see Extension._level_failure).
_LEVEL_FAILURES = frozenset(
    {FailureClass.OUT_OF_FUEL, FailureClass.MEMORY_LIMIT, FailureClass.TRAP, FailureClass.PANIC}
)
# The states that refuse every call whatever the budgets say: the operator's or the
# supervisor's word (a pause, a quarantine) or a stop under way.
_HELD_STATES = frozenset({State.PAUSED, State.QUARANTINED, State.STOPPING})
# One wasm page: a guest's memory within this of its limit could not grow by one more page,
# so a trap there is taken for the refused growth's (budgets: the memory_bytes level).
MEMORY_NEAR_LIMIT_BYTES = 64 * 1024


def _cancelled() -> CallError:
    return CallError(FailureClass.CANCELLED, "cancelled by the caller")


class Extension:
    """An admitted extension: its grant, its log, and (once started) its pool of instances."""

    def __init__(
        self,
        host: HostServices[Extension],
        package: Package,
        plan: AdmissionPlan,
        grant: Grant,
        resources: Resources,
        compiled: CompiledModule,
        backend: ExecutionBackend,
        *,
        grow_probed: bool = False,
    ) -> None:
        self.host = host
        self.package = package
        self._id = package.name
        # Where its instances live and run: the backend of its runtime mode, the one the host
        # compiled it with (Host.backend_for); the mode is set by the host after admission.
        self.backend = backend
        self.runtime = "in-process"
        self.plan = plan
        self.grant = grant
        # Where each capability of the admission's grant came from, and the epoch it was
        # granted at: one granted anew after it is the grant table's (Extension.grants).
        self._grant_origins: Mapping[str, GrantOrigin] = {}
        self._origins_epoch = grant.epoch
        self.resources = resources
        self._compiled = compiled
        sink = host.log_sink
        self.log = ExtensionLog(
            resources.max_log_bytes,
            sink=functools.partial(sink, package.name) if sink is not None else None,
        )
        self._input_limits = payload_limits(resources.max_input_bytes)
        self._output_limits = payload_limits(resources.max_output_bytes)
        # The policy's clock resolution its instances read the clock at (the clock broker
        # and the WASI profile fix it when an instance starts): a policy update changing it
        # restarts them (see _regrant).
        self._clock_resolution_ns = host.policy.clock_resolution_ns
        # Guards the pool. Held only to hand instances out and take them back, never while
        # guest code runs: calls on different instances run in parallel.
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        # Instances between calls, and those checked out (starting, calling, running a plain
        # command): an interrupt (revocation, close) must reach both, in every phase.
        self._idle: list[_Pooled] = []
        # Set once two calls of this extension were in flight at once (Extension.call).
        self._overlapped = False
        self._slots: set[_Pooled] = set()
        # Instances being built for a call. Those in calls plus these (_in_use()) stay within
        # resources.max_concurrency.
        self._building = 0
        # The governor's terminate that came while instances were being built (a process
        # runtime's child takes tens of milliseconds to start): each is stopped as it registers.
        self._stop_building: CallError | None = None
        self._waiting = 0
        self._generation = 0
        self.handshake: Handshake | None = None
        self.starts = 0
        # Per calling thread (and, for acall, per task): the epoch of the call in flight and
        # the fuel of the last call; the extension-wide values answer a thread that made none.
        self._local = _CallLocal()
        self._last_epoch = grant.epoch
        self._last_fuel = 0
        self._task_fuel: contextvars.ContextVar[int | None] | None = None
        # The gate of its host calls: (epoch, capability) -> bool, lock-free (grants.py).
        self._authorizes = host.grants.authorizer(self._id)
        self._seen_grants: GrantState | None = None
        self.denied_capabilities: set[str] = set()
        # A plain command's last failed run (an exception or a nonzero exit code): the memory
        # size a refused memory.grow asked for in it, in bytes; None when none was refused.
        self.last_refused_memory_bytes: int | None = None
        # Whether the host rewrote this command's memory.grow (growprobe): only then is the
        # exported refusal global the host's own, not one the guest defined and wrote.
        self._grow_probed = grow_probed
        self._gate = self._make_gate()
        self._command_names: dict[str, CommandWire] = {}
        self.steps: collections.deque[tuple[str, str]] = collections.deque(maxlen=MAX_STEPS)
        # budgets: calls waiting for room under ThrottleMode.DELAY, each with the event that
        # ends its wait early (a close, stop, pause, revocation, shutdown). A lock of its own:
        # lifecycle changes set them, and some happen under _lock.
        self._delay_lock = threading.Lock()
        self._delay_wakes: set[threading.Event] = set()
        # Bumped by every such wake-up: a wait that registers after one it should have seen
        # (its check came before the change, its registration after the wake) sees the bump.
        self.wake_generation = 0
        self.lifecycle = Lifecycle(self.id, on_change=self._on_transition)
        # What call()'s inlined availability check reads: the grant table's states (one dict
        # read, as GrantTable.current does).
        self._grant_states = host.grants.live_states()
        # Per-extension state of each broker serving its imports, opened on first use
        # (Broker.open) and closed with the extension (Broker.close).
        self._broker_states: dict[int, tuple[Any, Any]] = {}
        # Set by the host's shutdown: every new call is refused (the one in flight finishes).
        self._draining = False
        # budgets: this id's rate accounts (CPU fuel a minute, network bytes an hour).
        self.account = host.governor.open(self)
        self._add_fuel = self.account.add_fuel
        # [density] the host's idle eviction (eviction.py), None without an eviction policy.
        self._evictor = host.evictor
        # The warm spare (at most one, never shared: its own Store and memory), and the one
        # being built on a spare thread of the host. Wanted once the extension has crashed:
        # the instance that replaces a trapped one is then ready before the next call needs it.
        self._spare: _Spare | None = None
        self._spare_building = False
        self._spare_slot: _Pooled | None = None  # the instance of the spare being built
        self._spare_pending = False
        # Bumped whenever spares must not be used any more (revocation, regrant, stop, close).
        self._spare_generation = 0
        self._want_spare = False
        self._spare_due = False  # a spare was used: make the next after the call returns
        self.spare_starts = 0  # starts served by a warm spare (diagnostics, tests)
        # Scheduling hook (wasihost.host.call_gate): the host's call slots, None without a
        # scheduler.
        self._call_gate = host.call_gate
        # wasihost.host.acall's share of the host's call threads for this extension's acalls
        # (made by the first acall: acall._Turns).
        self._acall_turns: Any = None
        # The host's grant table holds this id's record for it (Host._build): let go once, at
        # close.
        self._holds_grants = True

    @property
    def id(self) -> str:
        return self._id

    @property
    def manifest(self) -> Manifest | None:
        return self.package.manifest

    def _make_gate(self) -> Callable[[HostFunction], bool]:
        """The gate of every host call of this extension's instances: does the epoch of the
        call in flight (:attr:`call_epoch`, read inline: the gate runs on every host call)
        still authorise the entry's capability, and is it in the effective grant (requested
        ∩ granted ∩ the policy's allow)?

        The grant table holds what the operator granted; the policy is not in it. A policy
        update that withdraws a capability from ``allow`` bumps the epoch and narrows
        :attr:`grant` in place (``_regrant``), leaving the table's entry: asking the table
        alone let every such host call through (red-team 2026-12-01). A call's epoch is
        the one ``grant`` was made at, and a newer ``grant`` comes with a newer table epoch
        (which the table refuses), so reading ``grant`` now is reading the call's."""
        authorizes = self._authorizes
        local = self._local
        denied = self.denied_capabilities
        states = self.host.grants.live_states()
        slow = self.host.grants.authorizes
        ext_id = self._id

        def gate(entry: HostFunction) -> bool:
            epoch = local.state.epoch
            if epoch is None:
                epoch = self._last_epoch
            capability = entry.capability
            # GrantTable.authorizer's test, inline: a call less on every host call.
            state = states.get(ext_id)
            if state is None:
                allowed = slow(ext_id, epoch, capability)
            else:
                allowed = (
                    state.revoked is None
                    and state.epoch == epoch
                    and (capability == CORE_CAPABILITY or capability in state.entries)
                )
            if allowed and (capability == CORE_CAPABILITY or capability in self.grant.capabilities):
                return True
            # Which capabilities the guest asked for and was refused: a front end turns that
            # into a hint (e.g. "add --profile standard"). Bounded by the registry's.
            denied.add(capability)
            return False

        def peek(entry: HostFunction) -> bool:
            """The gate's answer, without counting it as the guest's asking: the process
            runtime tells its child, before a call, what the grant is."""
            epoch = local.state.epoch
            capability = entry.capability
            return authorizes(self._last_epoch if epoch is None else epoch, capability) and (
                capability == CORE_CAPABILITY or capability in self.grant.capabilities
            )

        gate.peek = peek  # type: ignore[attr-defined]
        return gate

    def admitted_grants(self, origins: Mapping[str, GrantOrigin], epoch: int) -> None:
        """The host's word, at admission, on where each capability granted came from."""
        self._grant_origins = dict(origins)
        self._origins_epoch = epoch

    @property
    def grants(self) -> Mapping[str, GrantInfo]:
        """The capabilities this extension holds now (requested ∩ granted ∩ allowed, the grant
        rule of docs/grants.md), each with where it came from, the epoch since which it has
        been held without a break, its scope, and whether the manifest requires it."""
        entries = self.host.grants.state(self._id).entries
        required = self.manifest.required if self.manifest is not None else frozenset()
        held: dict[str, GrantInfo] = {}
        for capability in sorted(self.grant.capabilities):
            entry = entries.get(capability)
            since = entry.since_epoch if entry is not None else self.grant.epoch
            origin = GrantOrigin.GRANT
            if since <= self._origins_epoch:  # held since the admission, unbroken
                origin = self._grant_origins.get(capability, GrantOrigin.GRANT)
            held[capability] = GrantInfo(
                capability,
                origin,
                since,
                entry.scope_value if entry is not None else {},
                capability in required,
            )
        return MappingProxyType(held)

    def grant_scopes(self) -> dict[str, dict[str, Any]]:
        """The scopes of the capabilities this extension holds now (brokers shape from them)."""
        entries = self.host.grants.state(self._id).entries
        return {cap: entries[cap].scope_value for cap in self.grant.capabilities if cap in entries}

    @property
    def call_epoch(self) -> int:
        """The grant epoch the call in flight on this thread was authorised under (brokers
        commit with it). Concurrent calls on other instances have their own; a thread not in
        a call of this extension reads the epoch of the latest call to start."""
        epoch = self._local.state.epoch
        return epoch if epoch is not None else self._last_epoch

    @property
    def last_fuel_used(self) -> int:
        """What the last call burnt, start-up included: the last call made on this thread
        (for :meth:`acall`, by this task), else the last call of any thread to end."""
        if self._task_fuel is not None:
            used = self._task_fuel.get()
            if used is not None:
                return used
        used = self._local.state.fuel
        return used if used is not None else self._last_fuel

    def _record_fuel(self, used: int) -> None:
        self._local.state.fuel = used
        self._last_fuel = used
        self._charge_fuel(used)

    def _charge_fuel(self, used: int) -> CallError | None:
        """budgets: count fuel already burnt against the CPU budget and apply the action of a
        crossing; under terminate, the failure the burning call ends with. (The call path
        does this inline, with its own handling of that failure.)"""
        crossing = self._add_fuel(used)
        return None if crossing is None else self.host.governor.fuel_crossed(self, crossing)

    # -- budgets (governor.py) ------------------------------------------------------------

    def usage(self) -> Usage:
        """This extension's usage now beside its budget: a frozen snapshot (docs/budgets.md)."""
        with self._lock:
            in_flight = self._in_use()
            states = tuple(self._broker_states.values())
        return self.host.governor.usage(self, in_flight, states)

    def recheck(self) -> None:
        """The next call takes the slow path (and so meets the governor's check)."""
        self._seen_grants = None

    def stop_calls(self, failure: CallError, *, locked: bool = False) -> int:
        """Every call in flight ends at its next epoch tick with ``failure`` (the governor's
        terminate); each then crashes the extension as any such failure does. ``locked``:
        the caller holds ``_lock`` (a check before a call). Returns how many it stopped."""
        if not locked:
            with self._lock:
                busy, building = self._busy_for_stop(failure)
        else:
            busy, building = self._busy_for_stop(failure)
        for slot in busy:
            slot.instance.stop(failure)
        return len(busy) + building

    def _busy_for_stop(self, failure: CallError) -> tuple[list[_Pooled], int]:
        """Caller holds ``_lock``: the slots in a call, and how many calls are still building
        their instance (each is stopped as it registers)."""
        if self._building:
            self._stop_building = failure
        return [slot for slot in self._slots if slot not in self._idle], self._building

    def terminate(self, failure: CallError) -> None:
        """The governor's ``terminate`` with no call in flight to end: the extension crashes
        as that call would have (its restart policy decides what follows)."""
        self._crash(f"{failure.failure.value}: {failure.message}", failure.failure)

    def delay_wake(self, seen_generation: int) -> threading.Event:
        """A call starts waiting for room, having checked the extension when the wake-up
        generation was ``seen_generation``: the event that ends its wait early (set already
        if something changed since that check)."""
        wake = threading.Event()
        with self._delay_lock:
            self._delay_wakes.add(wake)
            if self.wake_generation != seen_generation:
                wake.set()
        return wake

    def delay_done(self, wake: threading.Event) -> None:
        with self._delay_lock:
            self._delay_wakes.discard(wake)

    def _wake_delays(self) -> None:
        """Every call waiting for room looks at the extension again now."""
        with self._delay_lock:
            self.wake_generation += 1
            for wake in self._delay_wakes:
                wake.set()

    def _set_task_fuel(self, used: int | None) -> None:
        """After an acall, in the awaiting task's context."""
        if used is None:
            return
        if self._task_fuel is None:
            self._task_fuel = contextvars.ContextVar(f"wasihost.fuel.{self._id}", default=None)
        self._task_fuel.set(used)
        self._last_fuel = used

    def commit(self, capability: str, action: Callable[[], T]) -> tuple[bool, T | None]:
        """Run a broker's committing ``action`` only if the call's epoch still authorises
        ``capability``, atomically with respect to every grant change, and while the host's
        revocation list (if any) verifies and does not revoke this package."""
        if not self.host.revocations_allow_commit():
            return False, None
        return self.host.grants.commit(self._id, self.call_epoch, capability, action)

    def committer(self, capability: str) -> Callable[..., tuple[bool, Any]]:
        """:meth:`commit` for a broker that commits on every call: ``commit(action, *args)``
        runs ``action(*args)`` only if the epoch of the call in flight (read when it commits)
        still authorises ``capability``, atomically with respect to every grant change, and
        while the host's revocation list (if any) verifies and does not revoke this package:
        the same checks as :meth:`commit`, with the grant table's lookups bound once."""
        commit = self.host.grants.committer(self._id, capability)
        allowed = self.host.revocations_allow_commit
        local = self._local

        def run(action: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
            if not allowed():
                return False, None
            epoch = local.state.epoch  # call_epoch, read inline: this runs on every host call
            return commit(self._last_epoch if epoch is None else epoch, action, *args)

        return run

    def record_step(self, step: str, detail: str) -> None:
        """One observable step of admission or start-up (also journaled when durable: only
        then is the journal's line made, ten times a start)."""
        self.steps.append((step, detail))
        host = self.host
        if host.state is not None:
            host.journal(self._id, "step", f"{step}: {detail}")

    def _on_transition(self, before: State, event: Event, after: State) -> None:
        self._wake_delays()  # a call waiting for room sees the change at once
        if self.host.state is not None:
            # Closing a quarantined extension (the host shutting down) keeps the durable
            # record saying why it was quarantined: that is what the operator must read.
            if not (after is State.CLOSED and before is State.QUARANTINED):
                self.host.state.record_state(self.id, after.value, self.lifecycle.reason)
            self.host.journal(
                self.id,
                "lifecycle",
                f"{before.value} --{event.value}--> {after.value}"
                + (f" ({self.lifecycle.reason})" if self.lifecycle.reason else ""),
            )

    def _handler(self, entry: HostFunction) -> Callable[..., Any]:
        """The broker handler of a cbor entry (profile entries are their binding's)."""
        broker = self.host.functions.broker_for(entry)
        if broker is None:
            raise ConfigError(f"registry entry {entry.qualified_name} has no broker in this host")
        opened = self._broker_states.get(id(broker))
        if opened is None:
            opened = self._broker_states[id(broker)] = (broker, broker.open(self))
        return broker.handler(entry, opened[1])

    def _close_brokers(self) -> None:
        states, self._broker_states = self._broker_states, {}
        for broker, state in states.values():
            broker.close(state)

    def _budget(self, fuel: int | None = None, timeout_ms: int | None = None) -> Budget:
        """A call's budget from now: the extension's own, or what the caller lowered it to."""
        r = self.resources
        return Budget(fuel or r.fuel_per_call, timeout_ms or r.timeout_ms)

    def _caller_budget(self, r: Resources, fuel: int | None, timeout_ms: int | None) -> Budget:
        """A call's budget from now, what the caller asked for checked against ``r``: at most
        its ``fuel_per_call`` and ``timeout_ms`` (a ConfigError naming the bound otherwise)."""
        return self._budget(
            lowered("fuel", fuel, r.fuel_per_call, "fuel_per_call"),
            lowered("timeout_ms", timeout_ms, r.timeout_ms, "timeout_ms"),
        )

    def _store_limits(self) -> StoreLimits:
        r = self.resources
        return StoreLimits(
            max_memory_bytes=r.max_memory_bytes,
            max_table_elements=r.max_table_elements,
            fuel=r.fuel_per_call,
            timeout_ms=r.timeout_ms,
        )

    def start(self, ticket: CallTicket | None = None) -> Handshake:
        """Instantiate and run the handshake now, under one call's budget (calls do it
        lazily, under their own). With an instance already started, return its handshake.
        ``ticket`` lets another thread cancel the start (``AsyncExtension.astart``'s task)."""
        slot, budget, _ = self._checkout(None, None, None, ticket)
        if ticket is not None:
            ticket.detach()
        self._checkin(slot)
        if budget is not None:  # budgets: the start-up's fuel counts like a call's
            self._charge_fuel(budget.used)
        if self._spare_due:
            self._spare_due = False
            self._schedule_spare()
        assert self.handshake is not None
        return self.handshake

    def _instances(self) -> tuple[GuestInstance, ...]:
        """Every live instance of the pool, idle or in a call (for tests and diagnostics)."""
        with self._lock:
            return tuple(s.instance for s in self._slots)

    def _new_instance(self) -> _Pooled:
        """A new instance of the compiled module with its own profile state, not started."""
        bindings: dict[str, ProfileBinding] = {}
        try:
            for module in {e.module for e in self.plan.imports}:
                factory = self.host.profile_factories.get(module)
                if factory is not None:
                    bindings[module] = factory(self)
            bound = [
                BoundImport(
                    entry,
                    bindings[entry.module].handler(entry)
                    if entry.module in bindings
                    else self._handler(entry),
                )
                for entry in self.plan.imports
            ]
            profile = self.plan.view.profile
            instance = self.backend.new_instance(
                self._compiled,
                bound,
                self._gate,
                self._store_limits(),
                command_export=profile.command_export
                if self.plan.is_command and profile
                else None,
            )
            instance.count_host_calls(self.host.host_call_tally)  # operator metrics hook
            unclaimed = getattr(instance, "charge_unclaimed", None)
            if unclaimed is not None:  # budgets: a child's CPU time beyond its fuel claim
                unclaimed(self._charge_fuel)
        except BaseException:
            _close_bindings(bindings)
            raise
        return _Pooled(instance, bindings, self._generation)

    def _register(self, slot: _Pooled, ticket: CallTicket | None) -> None:
        """``slot`` (reserved by ``_reserve``) exists from now on, in a call: every interrupt
        reaches it, including one that landed before it was visible."""
        with self._lock:
            self._building -= 1
            self._slots.add(slot)
            stop = self._stop_building
            if not self._building:
                self._stop_building = None
        if stop is not None:
            slot.instance.stop(stop)
        self._interrupt_if_halted(slot.instance)
        if ticket is not None:
            ticket.attach(slot.instance)

    def _unreserve(self) -> None:
        """A reservation that made no instance (its start failed before one existed)."""
        with self._lock:
            self._building -= 1
            if not self._building:
                self._stop_building = None
            self._freed.notify()

    def _in_use(self) -> int:
        """Caller holds ``_lock``: instances in a call, plus those being built."""
        return len(self._slots) - len(self._idle) + self._building

    def _reserve(self, budget: Budget, ticket: CallTicket | None) -> _Pooled | None:
        """Caller holds ``_lock``. An idle instance, or None once room for a new one is
        reserved (the caller builds it, then ``_register`` or ``_unreserve``); while
        ``max_concurrency`` calls hold instances, wait for one to come back, until the
        call's deadline (then the call fails ``deadline``)."""
        while True:
            if ticket is not None and ticket.cancelled:
                raise _cancelled()
            if self._idle:
                return self._idle.pop()
            limit = self.resources.max_concurrency
            if self._in_use() < limit:
                self._building += 1
                return None
            left = budget.deadline - time.monotonic()
            if left <= 0:
                raise CallError(
                    FailureClass.DEADLINE,
                    f"no free instance before the call's deadline: max_concurrency {limit}, "
                    "all in calls",
                )
            self._waiting += 1
            try:
                self._freed.wait(left)
            finally:
                self._waiting -= 1
            self._check_available()

    def wake_waiters(self) -> None:
        with self._lock:
            self._freed.notify_all()

    def _checkout(
        self,
        fuel: int | None,
        timeout_ms: int | None,
        budget: Budget | None,
        ticket: CallTicket | None,
    ) -> tuple[_Pooled, Budget | None, int]:
        """An instance ready for a command, the call's budget (None on the fast path: an idle
        instance taken at once, its deadline set as the command starts) and the grant epoch
        the call runs under. A new instance is started under the call's own budget. Over a
        budget under ``ThrottleMode.DELAY``, the call waits here for room, with no lock
        held (governor.wait_for_room)."""
        delay: DelayState | None = None
        while True:
            seen = self.wake_generation  # before the check: see delay_wake
            try:
                with self._lock:
                    self._check_available()
                    if budget is None and self._idle and (ticket is None or not ticket.cancelled):
                        return self._idle.pop(), None, self.grant.epoch
                    if budget is None:
                        # The deadline runs from here: waiting for room or for a free instance
                        # counts.
                        budget = self._budget(fuel, timeout_ms)
                    if self._slots and not self._idle:
                        self._overlapped = True  # every instance is in a call: see call()
                    reused = self._reserve(budget, ticket)
                    if reused is not None:
                        if ticket is not None:
                            ticket.attach(reused.instance)
                        return reused, budget, self.grant.epoch
                break
            except Delayed as delayed:
                if budget is None:
                    budget = self._budget(fuel, timeout_ms)
                if delay is None:
                    delay = DelayState()
                delay.generation = seen
                # With a scheduler, the host call slot this call took is given back for the
                # wait (not by a call nested in one of this extension's: its slot is the
                # outer call's, whose instance is held) and taken again after it.
                gate = self._call_gate
                queue_in = None
                if gate is not None and self._local.state.epoch is None:
                    queue_in = gate.suspend(self)
                self.host.governor.wait_for_room(self, delayed, budget.deadline, ticket, delay)
                if gate is not None and queue_in is not None:
                    gate.resume(self, queue_in, budget.deadline, ticket)
            except CallError as exc:
                self._no_free_instance(exc)
                raise
        room = self._make_room()  # [density]
        try:
            slot = self._start(budget, ticket)
        except BaseException:
            if room is not None:
                room.release()
            raise
        slot.room = room
        return slot, budget, slot.epoch

    def _no_free_instance(self, exc: CallError) -> None:
        """``exc`` came out of :meth:`_reserve` (no lock held now): a ``deadline`` there means
        max_concurrency calls held every instance until this call's deadline, which is the
        concurrent-calls level's crossing (budgets: its action fires)."""
        if exc.failure is FailureClass.DEADLINE:
            limit = self.resources.max_concurrency
            self.host.governor.level_crossed(
                self,
                Resource.CONCURRENT_CALLS,
                limit,
                limit,
                "a call found no free instance before its deadline",
                in_call=False,
            )

    def _checkin(self, slot: _Pooled) -> None:
        """The call on ``slot`` is over: back to the pool, unless it belongs to an older
        generation or was interrupted or closed (then dropped). Inlined in :meth:`call`."""
        instance = slot.instance
        # A revocation or close interrupts every instance (after its state change), so an
        # instance they reach is not kept; one they miss is refused at its next checkout.
        healthy = not instance.closed and not instance.interrupted
        lock = self._lock
        lock.acquire()
        # The generation is compared under the lock: a discard bumps it, then empties _idle.
        keep = healthy and slot.generation == self._generation
        if keep:
            self._idle.append(slot)
        else:
            self._slots.discard(slot)
        if self._waiting:
            self._freed.notify()
        lock.release()
        if not keep:
            _drop(slot)
        elif self._evictor is not None:
            self._evictor.touch(self)  # [density]

    def run_command(self, *, fuel: int | None = None, timeout_ms: int | None = None) -> int:
        """Run a plain profile command (a WASI ``_start``) once, on a fresh instance; return
        its exit code.

        Its start function and its entry point share one budget: ``fuel_per_call`` and
        ``timeout_ms`` bound the run as a whole (waiting for a free instance included), or
        ``fuel``/``timeout_ms`` for this run alone, which may lower them but never raise
        them (as for :meth:`call`)."""
        if not self.plan.is_command:
            raise ConfigError(f"{self.id} is a wasihost ABI guest: call its commands instead")
        r = self.resources
        budget = self._caller_budget(r, fuel, timeout_ms)
        try:
            with self._lock:
                self._check_available()
                if self.resources is not r:
                    # A policy change applied just now (_regrant): its ceilings bound this run,
                    # not the ones the budget above was checked against (as for call()).
                    r = self.resources
                    budget = self._caller_budget(r, fuel, timeout_ms)
                reused = self._reserve(budget, None)
                epoch = self.grant.epoch
        except Delayed as delayed:
            raise self.host.governor.refuse(self, delayed) from None  # a command never waits
        except CallError as exc:
            self._no_free_instance(exc)  # budgets: the concurrent-calls level, as for a call
            raise
        assert reused is None  # a command's instances never return to the pool
        local = self._local.state
        outer = local.epoch
        local.epoch = self._last_epoch = epoch
        slot: _Pooled | None = None
        try:
            room = self._make_room()  # [density]
            try:
                slot = self._new_instance()
            except BaseException:
                if room is not None:
                    room.release()
                self._unreserve()
                raise
            slot.room = room
            instance = slot.instance
            self._register(slot, None)  # so that a revocation or close can interrupt the run
            try:
                with instance.lock:
                    self.last_refused_memory_bytes = None
                    instance.instantiate(budget)
                    self._count_start()
                    try:
                        code = instance.run_command(budget)
                    except CallError as exc:
                        self._note_refused_grow(instance, exc)
                        raise
                    if code:
                        self._note_refused_grow(instance, None)
                    return code
            except BaseException:
                self._raise_if_halted_during(instance, "run")
                raise
        finally:
            local.epoch = outer
            self._record_fuel(budget.used)
            if slot is not None:
                self._unregister(slot)

    def _note_refused_grow(self, instance: GuestInstance, failure: CallError | None) -> None:
        """A command's run failed (``failure``, or a nonzero exit code): if a memory.grow was
        refused in it, say so in ``last_refused_memory_bytes`` and the failure's hint (the
        program's own words, "Out of memory" or a trap, never name the limit)."""
        self.last_refused_memory_bytes = (
            instance.refused_memory_bytes() if self._grow_probed else None
        )
        refusal = self.refused_grow()
        if refusal is not None and failure is not None:
            text, limited = refusal
            failure.hint = (
                f"{text}: raise WasiOptions.max_memory_bytes (or the policy's max_memory_bytes "
                "ceiling)"
                if limited
                else text
            )

    def refused_grow(self) -> tuple[str, bool] | None:
        """After a command's failed run with a refused memory.grow: what to say of it, and
        whether the host's limit refused it (see :func:`refused_grow_text`); None otherwise."""
        refused = self.last_refused_memory_bytes
        if refused is None:
            return None
        memories = read_header_cached(self.package.wasm)
        declared = (memories.imported_memories + memories.memories)[0].maximum
        return refused_grow_text(
            refused,
            self.resources.max_memory_bytes,
            None if declared is None else declared * PAGE_BYTES,
        )

    def _count_start(self) -> None:
        with self._lock:
            self.starts += 1

    def _enter_start(self) -> bool:
        """Before a new instance starts: True if this start is the extension's (it moves the
        lifecycle through Starting), False if it only adds to a pool already started or
        starting."""
        if self.plan.is_command:
            raise ConfigError(f"{self.id} is a plain command module: use run_command()")
        state = self.lifecycle.state
        if state in (State.PROVISIONING, State.FAILED, State.STOPPED):
            event = Event.START if state is State.PROVISIONING else Event.RESTART
            # From stopped too: an operator's stop or a grant change after a crash neither
            # ends its backoff nor makes the next start a free one (red-team 2026-12-01: a
            # stop in each crash loop round escaped the budget and every backoff).
            if state is not State.PROVISIONING:
                try:
                    self.host.supervisor.check_backoff(self.id)
                except BackingOff as wait:
                    raise ExtensionUnavailable(
                        self.id, state, str(wait), retry_after_s=wait.retry_after_s
                    ) from None
            if self.lifecycle.try_fire(event) is not None:
                if state is not State.PROVISIONING:
                    # Counts against the budget if a crash came before it (the supervisor knows).
                    self.host.supervisor.restarted(self.id)
                return True
            state = self.lifecycle.state
        if state in (State.STARTING, State.RUNNING):
            return False
        raise self._unavailable()

    def _start(self, budget: Budget, ticket: CallTicket | None) -> _Pooled:
        """Instantiate and handshake a new instance under ``budget``: the start function,
        ``hello`` and ``welcome`` draw from the same fuel and deadline as the command that
        follows. Returns it in a call. Caller has reserved room for it."""
        owns_lifecycle = False
        try:
            # A caller too deep in its stack to enter the guest is refused before the
            # lifecycle moves (instantiate checks again where it enters): the refusal is the
            # caller's, no failed start of the extension's (docs/engine.md, Stack).
            self.backend.check_entry_stack()
            owns_lifecycle = self._enter_start()
            spare = self._take_spare()
            if spare is None:
                self.record_step("build sandbox", f"{len(self.plan.imports)} imports bound")
                slot = self._new_instance()
        except BaseException as exc:
            self._unreserve()
            # Whatever failed, start-up is over: never leave the extension in Starting.
            if owns_lifecycle:
                self.lifecycle.try_fire(Event.START_FAILED, f"instantiate: {exc}")
            raise
        if spare is not None:
            return self._start_from_spare(spare, ticket, owns_lifecycle)
        instance = slot.instance
        self._register(slot, ticket)
        local = self._local.state
        outer = local.epoch
        local.epoch = self._last_epoch = slot.epoch = self.grant.epoch
        try:
            with instance.lock:
                instance.instantiate(budget)
            self._count_start()
            self.record_step("instantiate", f"start #{self.starts}")
            handshake = self._run_handshake(instance, budget)
        except BaseException as exc:
            self._record_fuel(budget.used)
            self._unregister(slot)
            self._raise_if_halted_during(instance, "start-up")
            what = "handshake" if instance.started else "instantiate"
            if ticket is not None and ticket.cancelled:
                if owns_lifecycle:
                    self.lifecycle.try_fire(Event.START_FAILED, f"{what}: cancelled")
                raise _cancelled() from exc
            # The extension failed to start (or, beside running instances, to grow): it
            # restarts as a whole on the next call, as after a crash.
            self._discard()
            failure = exc.failure if isinstance(exc, CallError) else FailureClass.HANDSHAKE
            if owns_lifecycle:
                if self.lifecycle.try_fire(Event.START_FAILED, f"{what}: {exc}") is not None:
                    self._supervise(failure, f"{what}: {exc}")
            elif self.lifecycle.try_fire(Event.CRASH, f"{what}: {exc}") is not None:
                self._supervise(failure, f"{what}: {exc}")
            raise
        finally:
            local.epoch = outer
        return self._started(slot, handshake, owns_lifecycle)

    def _started(self, slot: _Pooled, handshake: Handshake, owns_lifecycle: bool) -> _Pooled:
        """A new instance of the pool is ready (its handshake done): the lifecycle says so."""
        self.record_step(
            "handshake",
            f"{handshake.readiness}, runtime {handshake.runtime_id.hex()[:8]}, "
            f"epoch {handshake.epoch}",
        )
        if owns_lifecycle:
            ready = self.lifecycle.try_fire(Event.READY, handshake.reason) is not None
        else:
            ready = self.lifecycle.state not in (State.REVOKED, State.CLOSED)
        if not ready:
            # Revoked or closed while the handshake ran: the instance never serves a call.
            self._unregister(slot)
            raise self._unavailable()
        self.handshake = handshake
        return slot

    # -- [density] idle eviction (wasihost/supervisor/eviction.py)

    def _make_room(self) -> Room | None:
        """Before building an instance reserved by ``_reserve``: its place under the host's
        ``max_live_instances`` (evicting another extension's idle instances if need be). If
        the host is full, the reservation is undone and :class:`~.eviction.HostFull` raised,
        before anything of the start-up (lifecycle, restart budget) has happened."""
        if self._evictor is None:
            return None
        try:
            return self._evictor.make_room(self)
        except BaseException:
            self._unreserve()
            raise

    def evict(self) -> int | None:
        """Drop this extension's instances if none is in a call or being built (None if one
        is): they go as after a stop, but the lifecycle stays where it is (a quarantined or
        revoked extension stays so) and the next call instantiates it again, handshake
        included. Broker state and durable data are untouched; guest memory is lost. Returns
        how many instances were dropped."""
        with self._lock:
            if self._in_use():
                return None
            dropped = len(self._idle)
            if dropped or self._spare is not None:
                self._discard_locked()  # the warm spare too: it is a live instance as well
        return dropped

    def _start_from_spare(
        self, spare: _Spare, ticket: CallTicket | None, owns_lifecycle: bool
    ) -> _Pooled:
        """``_start`` with the instance the warm spare already started: nothing runs here,
        and a new spare is made off this call's path."""
        slot = spare.slot
        with self._lock:
            slot.generation = self._generation
            self.starts += 1
            self.spare_starts += 1
        self._register(slot, ticket)
        self.record_step("instantiate", f"start #{self.starts} (warm spare)")
        # The next spare is asked for once this call has returned (see call()): a call
        # thread starting it now would compete with this call for the GIL.
        self._spare_due = True
        return self._started(slot, spare.handshake, owns_lifecycle)

    def _take_spare(self) -> _Spare | None:
        """The warm spare, if it may serve now: started under the current grant epoch and
        plan, not interrupted, not too old. One that may not is dropped."""
        with self._lock:
            spare, self._spare = self._spare, None
            if spare is None:
                return None
            instance = spare.slot.instance
            if (
                spare.slot.epoch == self.grant.epoch
                and spare.plan is self.plan
                and not instance.closed
                and not instance.interrupted
                and time.monotonic() - spare.born < SPARE_MAX_AGE_S
            ):
                return spare
        _drop(spare.slot)
        return None

    def _schedule_spare(self) -> None:
        """Have a spare thread of the host make a warm spare, if one is wanted and none is
        there or coming. Never on the caller's path, nor on a call thread."""
        with self._lock:
            if (
                not self._want_spare
                or self.plan.is_command  # a plain command's instance runs once, never pooled
                # Under an eviction policy every live instance must hold a place under
                # max_live_instances; a spare holds none, so such a host makes none.
                or self._evictor is not None
                or self._spare is not None
                or self._spare_building
                or self._spare_pending
                or self._draining
            ):
                return
            self._spare_pending = True
        try:
            self.host.spare_workers().start(self._make_spare, (), _ignore_outcome)
        except ConfigError:  # the host is closing: no spare
            with self._lock:
                self._spare_pending = False
                self._freed.notify_all()

    def _make_spare(self) -> None:
        """On a spare thread of the host: instantiate and handshake an instance under a
        budget of its own (an embedder's call does not pay for it), and keep it as the warm
        spare if nothing changed meanwhile (grant epoch, plan, a revocation, stop or
        close)."""
        with self._lock:
            self._spare_pending = False
            self._freed.notify_all()
            if (
                self._spare is not None
                or self._spare_building
                or self._draining
                or self.lifecycle.state not in (State.RUNNING, State.FAILED)
            ):
                return
            # From here close() waits for this build (it opens broker state).
            self._spare_building = True
            generation = self._spare_generation
            epoch = self.grant.epoch
            plan = self.plan
        try:
            slot = self._new_instance()
        except BaseException as exc:
            with self._lock:
                self._spare_building = False
                self._freed.notify_all()
            if not isinstance(exc, Exception):
                raise
            self.record_step("warm spare", f"not made: {type(exc).__name__}")
            return
        slot.epoch = epoch
        with self._lock:
            self._spare_slot = slot
        local = self._local.state
        outer = local.epoch
        local.epoch = epoch
        keep = False
        try:
            self._interrupt_if_halted(slot.instance)
            budget = self._budget()
            try:
                with slot.instance.lock:
                    slot.instance.instantiate(budget)
                handshake = self._run_handshake(slot.instance, budget)
            finally:
                # budgets: a spare's start-up is the extension's CPU like any other start's,
                # however it ends: a spare that spins out of fuel and fails is paid for too.
                self._charge_fuel(budget.used)
            with self._lock:
                keep = (
                    generation == self._spare_generation
                    and epoch == self.grant.epoch == handshake.epoch
                    and plan is self.plan
                    and not self._draining
                    and not slot.instance.interrupted
                    and self.lifecycle.state in (State.RUNNING, State.FAILED)
                    and self._spare is None
                )
                if keep:
                    self._spare = _Spare(slot, handshake, plan)
        except Exception as exc:  # a spare that fails to start is not a crash: no call ran
            self.record_step("warm spare", f"failed to start: {type(exc).__name__}")
        finally:
            local.epoch = outer
            with self._lock:
                self._spare_building = False
                self._spare_slot = None
                self._freed.notify_all()
            if not keep:
                _drop(slot)

    def wait_for_spare(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s`` seconds) until no warm spare is being made; True if one
        is ready. For tests and for an embedder warming up after a crash."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._spare_pending or self._spare_building:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._freed.wait(left)
            return self._spare is not None

    def _drop_spare_locked(self) -> None:
        """Caller holds ``_lock``: the spare goes, and one being built is not kept."""
        self._spare_generation += 1
        spare, self._spare = self._spare, None
        if spare is not None:
            _drop(spare.slot)  # idle: nothing runs on it
        building = self._spare_slot
        if building is not None:
            building.instance.interrupt()

    def _unregister(self, slot: _Pooled) -> None:
        """An instance that will serve no more calls: out of the pool, freed."""
        with self._lock:
            self._slots.discard(slot)
            self._freed.notify()
        _drop(slot)

    def _unavailable(self, during: str | None = None) -> ExtensionRevoked | ExtensionUnavailable:
        """Why this extension refuses work now, said as the error its caller gets."""
        state = self.lifecycle.state
        reason = self.lifecycle.reason
        if state is State.REVOKED:
            when = f"was revoked during the {during}" if during else "is revoked"
            return ExtensionRevoked(f"{self.id} {when}: {reason}")
        if during:
            reason = f"{reason or state.value} during the {during}"
        return ExtensionUnavailable(self.id, state, reason)

    def _interrupt_if_halted(self, instance: GuestInstance) -> None:
        """A revocation or close that landed before ``instance`` was visible to it."""
        if self.lifecycle.state in (State.REVOKED, State.CLOSED):
            instance.interrupt()

    def _check_available(self) -> None:
        """Before each call, under ``_lock``: honour revocations and grant changes, refuse
        outside Running."""
        seen = self.host.grants.current(self.id)
        if seen is not None and seen is self._seen_grants:
            state = self.lifecycle.state
            if state is _RUNNING or state is _PROVISIONING:
                return  # nothing changed since the last call: the common case, kept cheap
        if self.lifecycle.state is State.CLOSED:
            raise self._unavailable()
        if self._draining:
            raise ExtensionUnavailable(self.id, self.lifecycle.state, SHUTTING_DOWN)
        table = self.host.grants.state(self.id)
        if table.revoked is not None or self.lifecycle.state is State.REVOKED:
            self.lifecycle.try_fire(Event.REVOKE, table.revoked)
            self._discard_locked()
            raise ExtensionRevoked(
                f"{self.id} is revoked: {table.revoked or 'reinstated since; load it again'}"
            )
        state = self.lifecycle.state
        if state in _HELD_STATES:
            # Refused for its state before the budgets are asked: no wait for room (nor its
            # hint) would let the call run, and a call woken from its wait by the move here
            # meets the same refusal as a fresh one.
            raise ExtensionUnavailable(self.id, state, self.lifecycle.reason)
        self.host.governor.check_call(self)  # budgets: over a rate, wait (or resume)
        state = self.lifecycle.state
        if state in _HELD_STATES or state is State.THROTTLED:
            raise ExtensionUnavailable(self.id, state, self.lifecycle.reason)
        if table.epoch != self.grant.epoch:
            self._regrant(frozenset(table.entries), table.epoch)
        self._seen_grants = table  # only once fully applied: the fast path trusts it

    def _regrant(self, granted: frozenset[str], epoch: int) -> None:
        """The grant changed. A downgrade applies in place: imports stay linked and the gate
        answers DENIED for what was withdrawn. Anything new needs static admission again, so
        an upgrade re-admits and restarts the instance."""
        try:
            # A new policy may refuse the package outright (require_signed): it stops here.
            check_package_policy(self.package, self.host.policy)
        except AdmissionError:
            self._discard_locked()
            self.lifecycle.try_fire(Event.STOP)
            self.lifecycle.try_fire(Event.STOPPED)
            raise
        manifest = self.manifest
        requested = (manifest.required | manifest.optional) if manifest is not None else granted
        capabilities = granted & requested & self.host.policy.allow
        # Profile brokers (WASI) shape per-instance state from the grant at start (preopened
        # mounts, stdio routing), so for them any change means a fresh instance.
        stateful_brokers = any(e.module in self.host.profile_factories for e in self.plan.imports)
        # A policy update may lower resource ceilings; store limits are fixed per instance.
        resources = self.host.policy.cap(self.resources)
        # And coarsen the clock, which instances also fix at their start: kept in place, a
        # running instance went on reading the host's clock at the old, finer resolution.
        clock_resolution_ns = self.host.policy.clock_resolution_ns
        if (
            capabilities <= self.grant.capabilities
            and not stateful_brokers
            and resources == self.resources
            and clock_resolution_ns == self._clock_resolution_ns
        ):
            self.grant = Grant(capabilities, epoch)
            self.record_step("load active grants", f"downgraded in place, epoch {epoch}")
            return
        plan, grant, _ = plan_package(
            self.package,
            self.host.registry,
            self.host.policy,
            fuel=resources.fuel_per_call,
            timeout_ms=resources.timeout_ms,
            granted=granted,
            epoch=epoch,
            command_memory=self.host.command_memory,
        )
        self.grant = grant
        self.plan = plan
        self._set_resources(resources)
        self._clock_resolution_ns = clock_resolution_ns
        self.record_step("load active grants", f"changed, epoch {epoch}: restarting")
        self._discard_locked()
        self.lifecycle.try_fire(Event.STOP)
        self.lifecycle.try_fire(Event.STOPPED)

    def _set_resources(self, resources: Resources) -> None:
        if resources != self.resources:
            self.resources = resources
            self.log.max_bytes = resources.max_log_bytes
            self._input_limits = payload_limits(resources.max_input_bytes)
            self._output_limits = payload_limits(resources.max_output_bytes)
            self.host.governor.rebudget(self)  # budgets

    def _raise_if_halted_during(self, instance: GuestInstance, what: str) -> None:
        """A failure caused by an operator's revocation, or by a close, interrupting the guest
        is reported as that (the instance is dropped), not as the deadline it used."""
        if instance.interrupted and self.lifecycle.state in (State.REVOKED, State.CLOSED):
            self._discard()
            raise self._unavailable(during=what) from None

    def withdraw(self, capabilities: frozenset[str]) -> None:
        """The host withdrew ``capabilities`` (a revocation, here or by another host, or a
        policy no longer allowing them): every broker holding long-lived state made under
        one (events subscriptions, jobs) ends it now. Checked only at their next use, it
        outlived a revocation followed by a new grant (red-team 2026-12-01, issue 28)."""
        if not capabilities:
            return
        with self._lock:
            states = tuple(self._broker_states.values())
        for broker, state in states:
            withdraw = getattr(broker, "withdraw", None)
            if withdraw is not None:
                withdraw(state, capabilities)

    def on_revoked(self, reason: str) -> None:
        """Called by the host from any thread: stop the call in flight, refuse the next."""
        self.lifecycle.try_fire(Event.REVOKE, reason)
        self._interrupt()

    def _interrupt(self) -> None:
        """Every instance, in a call or idle: the calls in flight stop at their next tick."""
        with self._lock:
            slots = tuple(self._slots)
            # Calls waiting for an instance look at the extension again (and refuse).
            self._freed.notify_all()
            building = self._spare_slot
        for slot in slots:
            slot.instance.interrupt()
        if building is not None:
            building.instance.interrupt()
        self._wake_delays()

    def pause(self, reason: str = "") -> None:
        check_reason(reason)
        self.lifecycle.fire(Event.PAUSE, reason or None)

    def resume(self) -> None:
        self.lifecycle.fire(Event.RESUME)

    def release(self) -> None:
        """Let a quarantined extension out: it is stopped, and the next call starts it afresh
        (use :meth:`Host.release`, which also resets its restart budget)."""
        self.lifecycle.fire(Event.RELEASE)

    def quarantine(self, reason: str) -> None:
        """Refuse calls until released; idle instances go now, those in a call as it ends."""
        check_reason(reason)
        with self._lock:
            self.lifecycle.fire(Event.QUARANTINE, reason)
            self._discard_locked()

    def stop(self) -> None:
        """Stop: idle instances go now, those in a call as it ends; the next call restarts."""
        with self._lock:
            if self.lifecycle.try_fire(Event.STOP) is not None:
                self._discard_locked()
                # From failed, STOP goes straight to stopped; from running (paused,
                # throttled) it goes to stopping, and the instances are gone now.
                self.lifecycle.try_fire(Event.STOPPED)

    def _run_handshake(self, instance: GuestInstance, budget: Budget) -> Handshake:
        host = self.host
        return run_handshake(
            instance,
            budget,
            ext_id=self.id,
            plan=self.plan,
            manifest=self.manifest,
            grant=self.grant,
            registry=host.registry,
            tokens=host.tokens,
        )

    def _check_command(self, command: str) -> CommandWire:
        wire = self._command_names.get(command) if isinstance(command, str) else None
        if wire is not None:
            return wire
        if not isinstance(command, str) or not command:
            raise ConfigError("command name must be a non-empty string")
        if command.startswith(RESERVED_PREFIX):
            raise ConfigError(f"command {command!r} is reserved for the host")
        name = command.encode()
        if len(name) > MAX_COMMAND_NAME_BYTES:
            raise ConfigError(f"command name of {len(name)} bytes exceeds {MAX_COMMAND_NAME_BYTES}")
        manifest = self.manifest
        spec = manifest.command(command) if manifest is not None else None
        if manifest is not None and spec is None:
            declared = ", ".join(c.name for c in manifest.commands)
            raise ConfigError(f"command {command!r} is not declared (declared: {declared})")
        wire = CommandWire(name)
        if spec is not None:
            wire = CommandWire(name, spec.input == PAYLOAD_BYTES, spec.output == PAYLOAD_BYTES)
        if len(self._command_names) < MAX_CACHED_COMMAND_NAMES:
            self._command_names[command] = wire
        return wire

    def call(
        self,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Any:
        """Run ``command`` with ``value`` (any CBOR-encodable value) and return its output.

        A command declared ``input = "bytes"`` takes ``value`` bytes-like (bytes, bytearray, a
        contiguous memoryview) as it is, ``output = "bytes"`` returns the guest's bytes, and
        ``max_input_bytes``/``max_output_bytes`` bound the payload either way. One budget covers
        all the call runs (a new instance's start and handshake, a wait for one): ``fuel_per_call``
        and ``timeout_ms``, or lower ``fuel``/``timeout_ms`` for this call (docs/embedding.md)."""
        # -- route -- scheduling hook: take a host call slot first (call_gate.py)
        gate = self._call_gate
        if gate is not None and not gate.holding():
            return gate.call(self, command, value, fuel, timeout_ms)
        # -- wire -- fast paths inline, here and below: a no-op call notices every frame
        wire = self._command_names.get(command) if isinstance(command, str) else None
        if wire is None:
            wire = self._check_command(command)
        # -- admit -- An async call (aio) hands its ticket and deadline over in thread state.
        if self._draining:  # refused at once, not after the call in flight
            raise ExtensionUnavailable(self.id, self.lifecycle.state, SHUTTING_DOWN)
        r = self.resources
        local = self._local.state
        ticket, deadline = local.ticket, local.deadline
        if ticket is not None or deadline is not None:
            local.ticket = local.deadline = None
        try:  # -- encode -- null, the commonest payload of all, without the codec
            payload = (_raw_input(command, value, r.max_input_bytes) if wire.raw_input else
                       CBOR_NULL if value is None else encode(value, self._input_limits))
        except CodecError as exc:
            raise _input_refused(exc, self._input_limits, r.max_input_bytes) from None
        max_body = r.max_output_bytes if wire.raw_output else r.max_output_bytes + CBOR_HEAD_BYTES
        # -- budget -- none for a plain call: _checkout's, or the instance's own
        budget: Budget | None = None
        if fuel is not None or timeout_ms is not None or deadline is not None:
            budget = self._call_budget(r, fuel, timeout_ms, deadline)
        # -- take -- an idle instance at once, or _take_slow (a new one, a wait, new limits)
        lock = self._lock
        lock.acquire()
        slot: _Pooled | None = None
        alone = False  # no other call of this extension ever overlapped one (see below)
        try:
            state = self.lifecycle._state  # without the property's frame
            if (  # nothing changed since the last call, or _check_available whole
                self._grant_states.get(self._id) is not self._seen_grants
                or self._seen_grants is None
                or (state is not _RUNNING and state is not _PROVISIONING)
            ):
                self._check_available()
            idle = self._idle
            if idle and (ticket is None or not ticket.cancelled):
                slot = idle.pop()
                epoch = self.grant.epoch
                if not self._overlapped and len(self._slots) - len(idle) > 1:
                    self._overlapped = True
                alone = not self._overlapped  # overlapped calls keep no GIL: benchmarks/README.md
        except Delayed:
            pass  # budgets: _take_slow waits for room, with the lock released
        finally:
            lock.release()
        if slot is None:
            slot, budget, epoch = self._take_slow(r, fuel, timeout_ms, budget, ticket)
            if slot is None:  # the limits changed: worked out again, from the start
                return self._call_again(command, value, fuel, timeout_ms, ticket, deadline)
        elif ticket is not None:
            ticket.attach(slot.instance)
        # -- run -- no lock: the instance is this call's alone until it is given back
        instance, outer = slot.instance, local.epoch
        local.epoch = self._last_epoch = epoch
        try:
            try:
                if ticket is not None and ticket.memory_cap is not None:
                    instance.cap_memory(ticket.memory_cap)  # the command's only: lifted below
                result = instance.call(wire.name, payload, max_body, budget, alone)
            except BaseException as exc:
                self._call_failed(exc, budget, instance, ticket)
                raise
            # -- charge -- budgets: count the fuel; a crossing under terminate ends this call.
            used = budget.used if budget is not None else result.fuel_used
            local.fuel = self._last_fuel = used
            crossing = self._add_fuel(used)
            if crossing is not None:
                self._fuel_crossed(crossing)
            # -- answer --
            if result.status != 0:
                raise self._guest_error(result.body)
            if wire.raw_output:
                return result.body
            if result.body == CBOR_NULL:
                return None
            try:
                return decode(result.body, self._output_limits)
            except CodecError as exc:
                raise self._protocol_error(exc) from None
        finally:
            # -- give back --
            local.epoch = outer
            if ticket is not None:
                self._ticket_done(ticket, instance)
            healthy = not instance.closed and not instance.context.interrupted
            lock.acquire()
            keep = healthy and slot.generation == self._generation
            if keep:
                self._idle.append(slot)
            else:
                self._slots.discard(slot)
            if self._waiting:
                self._freed.notify()
            lock.release()
            if not keep:
                _drop(slot)
            elif self._evictor is not None:
                self._evictor.touch(self)  # [density]
            if self._spare_due:
                self._spare_after_call()

    def _call_budget(
        self, r: Resources, fuel: int | None, timeout_ms: int | None, deadline: float | None
    ) -> Budget:
        """:meth:`call`'s budget when the caller set ``fuel`` or ``timeout_ms``, or an async
        call handed over its ``deadline`` (the budget ends no later). ``fuel`` and
        ``timeout_ms`` stay the caller's: a call made again (:meth:`_call_again`) passes them
        on, and with a budget ``_checkout`` does not read them."""
        budget = self._caller_budget(r, fuel, timeout_ms)
        if deadline is not None and deadline < budget.deadline:
            budget.deadline = deadline
        return budget

    def _take_slow(
        self,
        r: Resources,
        fuel: int | None,
        timeout_ms: int | None,
        budget: Budget | None,
        ticket: CallTicket | None,
    ) -> tuple[_Pooled | None, Budget | None, int]:
        """:meth:`call`'s take when no idle instance was there at once (a new one to start, a
        wait for a free one or for room): :meth:`_checkout`'s slot, budget and epoch, or no
        slot if the limits ``r`` the call was prepared under changed (it is then made again).

        The availability check (in :meth:`call`, or in ``_checkout`` after a wait) may have
        applied a policy change (``_regrant``) that changed the limits the payload, the output
        bound and the budget were worked out under: then they are worked out again, or this
        one call would pass an input over the new ``max_input_bytes``, or run on a fuel or
        timeout over the new ceilings (red-team 2026-12-01). A change of limits always
        discards the idle instances, so the inlined path (an idle instance taken) never meets
        one, and this costs that path nothing."""
        if self.resources is not r:
            return None, budget, 0
        slot, budget, epoch = self._checkout(fuel, timeout_ms, budget, ticket)
        if self.resources is not r:  # changed while this call waited in _checkout
            if ticket is not None:
                ticket.detach()
            self._checkin(slot)  # unused: it serves the call made again
            if budget is not None:  # a start-up's fuel counts as a call's would
                self._charge_fuel(budget.used)
            return None, budget, 0
        return slot, budget, epoch

    def _call_failed(
        self,
        exc: BaseException,
        budget: Budget | None,
        instance: GuestInstance,
        ticket: CallTicket | None,
    ) -> None:
        """``instance.call`` raised ``exc`` in :meth:`call`, which re-raises it after this:
        the fuel burnt is recorded, and the instance's fate and the extension's are decided.
        Raises instead the revocation or close that interrupted the call, or ``cancelled``
        for a call its caller gave up."""
        self._record_fuel(budget.used if budget is not None else instance.last_call_fuel)
        self._raise_if_halted_during(instance, "call")
        if ticket is not None and ticket.cancelled and isinstance(exc, CallError):
            # The caller gave up: this instance goes (interrupted mid-call, it is dropped as
            # it is checked in); the extension did nothing wrong.
            raise _cancelled() from exc
        # A trap may have left the guest half-way, and so may a KeyboardInterrupt or
        # SystemExit (or a bug) out of a host function: the instance goes. A refusal before
        # the guest ran (a ConfigError: the caller's stack is too small; a CallError
        # before_entry: the caller's frames leave too little of it) keeps it, and is no
        # crash: a deep caller failed the extension before.
        if isinstance(exc, CallError) and not exc.before_entry:
            if exc.failure in _LEVEL_FAILURES:
                self._level_failure(exc, budget, instance)
            if exc.failure.discards_instance:
                self._crash(f"{exc.failure.value}: {exc.message}", exc.failure)
            if exc.failure is FailureClass.OUTPUT_TOO_LARGE:
                raise self._output_too_large(exc) from None
            if exc.hint is None and exc.failure in _BUDGET_HINTS:
                exc.hint = _BUDGET_HINTS[exc.failure]
        elif not isinstance(exc, WasihostError):
            self._crash(f"interrupted: {type(exc).__name__}")

    def _output_too_large(self, exc: CallError) -> CallError:
        """The engine's refusal of an oversized answer, in the manifest's terms: which limit,
        and where to raise it."""
        declared = self.resources.max_output_bytes
        refused = CallError(
            FailureClass.OUTPUT_TOO_LARGE,
            f"{exc.message[:200]} (max_output_bytes {declared})",
        )
        most = limits.RESOURCE_BOUNDS["max_output_bytes"].maximum
        refused.hint = (
            f"raise [resources] max_output_bytes in the extension's extension.toml (now "
            f"{declared}, at most {most}; a policy ceiling may cap it), or have the command "
            "answer less"
        )
        return refused

    def _ticket_done(self, ticket: CallTicket, instance: GuestInstance) -> None:
        """An async call's ticket, as :meth:`call` gives its instance back: detached first (a
        cancel from now on does not reach the instance), then the memory cap it set for the
        command lifted (a start-up needs the module's own memory to instantiate)."""
        ticket.detach()
        if ticket.memory_cap is not None:
            instance.cap_memory(None)

    def _spare_after_call(self) -> None:
        """This call started from the warm spare: the next spare is made now that it is over."""
        self._spare_due = False
        self._schedule_spare()

    def _fuel_crossed(self, crossing: Crossing) -> None:
        """budgets: this call's fuel crossed a level; under ``terminate`` the governor's
        failure ends this call too (and the extension restarts, as after a crash)."""
        ended = self.host.governor.fuel_crossed(self, crossing)
        if ended is not None:
            self._crash(f"{ended.failure.value}: {ended.message}", ended.failure)
            raise ended

    @staticmethod
    def _guest_error(body: bytes) -> CallError:
        """The failure a command answered with a non-zero status ends with: the guest's own
        error class and message (the instance is kept: the guest said what went wrong)."""
        cls, msg = guest_error(body)
        return CallError(
            FailureClass.GUEST_ERROR,
            guest_error_line(cls, msg),
            guest_class=cls,
            guest_message=msg,
        )

    def _protocol_error(self, exc: CodecError) -> CallError:
        """The guest's command output is not the CBOR the protocol promises: its state is not
        to be trusted any more, so the extension restarts, and the call fails ``protocol``."""
        self._crash(f"protocol: command output: {exc.message}", FailureClass.PROTOCOL)
        return CallError(FailureClass.PROTOCOL, f"command output: {exc.message}")

    def _call_again(
        self,
        command: str,
        value: Any,
        fuel: int | None,
        timeout_ms: int | None,
        ticket: CallTicket | None,
        deadline: float | None,
    ) -> Any:
        """:meth:`call` from the start, under the limits now (see its ``_checkout``), with the
        ticket and deadline of an async call handed over again as :meth:`call_cancellable`
        does."""
        local = self._local.state
        local.ticket, local.deadline = ticket, deadline
        try:
            return self.call(command, value, fuel=fuel, timeout_ms=timeout_ms)
        finally:
            local.ticket = local.deadline = None

    def call_cancellable(
        self,
        ticket: CallTicket,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
        deadline: float | None = None,
    ) -> Any:
        """:meth:`call`, stopped by ``ticket.cancel()`` from another thread (class
        ``cancelled``), and with its deadline no later than ``deadline`` (a
        ``time.monotonic()`` value) when given: what :meth:`acall` runs on a call thread."""
        local = self._local.state
        local.ticket = ticket
        local.deadline = deadline
        try:
            return self.call(command, value, fuel=fuel, timeout_ms=timeout_ms)
        finally:
            local.ticket = local.deadline = None

    def acall(
        self,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """:meth:`call` for asyncio (``await ext.acall(...)``): the call runs on one of the
        host's call threads and the event loop is never blocked by guest code. Cancelling the
        awaiting task stops this call's instance at its next epoch tick (class ``cancelled``)
        and raises ``asyncio.CancelledError`` (see :mod:`wasihost.host.acall`). A plain method that
        returns :func:`wasihost.host.acall.call_async`'s coroutine: one coroutine frame and one
        import statement less per call than a coroutine awaiting it."""
        call_async = _CALL_ASYNC[0] if _CALL_ASYNC else _load_call_async()
        return call_async(self, command, value, fuel=fuel, timeout_ms=timeout_ms)

    def _level_failure(
        self, exc: CallError, budget: Budget | None, instance: GuestInstance
    ) -> None:
        """budgets: a call failed at a level's static limit (out of fuel, memory): the
        governor fires that level's action (the call crashes the extension anyway). A trap
        or panic counts as memory's when the guest's memory had grown to within a page of
        its limit: wasmtime answers the refused ``memory.grow`` with -1 and tells the host
        nothing, so that is the trace a guest that died of it leaves."""
        r = self.resources
        if exc.failure in (FailureClass.TRAP, FailureClass.PANIC):
            size = instance.memory_bytes()
            if size is None or size + MEMORY_NEAR_LIMIT_BYTES <= r.max_memory_bytes:
                return
            resource, limit, what = Resource.MEMORY_BYTES, r.max_memory_bytes, "memory"
        elif exc.failure is FailureClass.MEMORY_LIMIT:
            resource, limit, what = Resource.MEMORY_BYTES, r.max_memory_bytes, "memory"
        elif exc.message.startswith(TERMINATED_PREFIX):
            return  # the governor's own terminate, not the guest's fuel running out
        else:
            resource, limit, what = Resource.FUEL_PER_CALL, r.fuel_per_call, "fuel"
            if budget is not None:
                limit = budget.used  # this call's own, perhaps lower, fuel
        self.host.governor.level_crossed(
            self, resource, limit, limit, f"a call ran out of {what}", in_call=False, ending=True
        )

    def _crash(self, reason: str, failure: FailureClass = FailureClass.TRAP) -> None:
        """An instance failed in a way that may have corrupted it: the extension restarts as
        a whole on the next call (every idle instance goes now, those in a call as they end),
        the lifecycle says so, and the supervisor decides between that restart (after its
        backoff) and quarantine."""
        with self._lock:
            self._discard_locked(keep_spare=True)
            self._want_spare = True
        self.lifecycle.try_fire(Event.CRASH, reason)
        self._supervise(failure, reason)
        self._schedule_spare()

    def _supervise(self, failure: FailureClass, reason: str) -> None:
        # The crash class leads the journal line: `wasihost status` counts crashes by it.
        self.host.journal(self.id, "crash", f"{crash_class(failure).value}: {reason}")
        verdict = self.host.supervisor.on_crash(self.id, failure, reason)
        if verdict is not None:
            self.lifecycle.try_fire(Event.QUARANTINE, verdict)
            with self._lock:
                self._drop_spare_locked()  # released, it starts afresh

    def _discard(self) -> None:
        with self._lock:
            self._discard_locked()

    def _discard_locked(self, *, keep_spare: bool = False) -> None:
        """Caller holds ``_lock``. Drop the idle instances now and retire those in a call
        (a new generation): none serves another call. The warm spare goes too, unless
        ``keep_spare`` (a crash: the spare never ran a call, and it is what replaces the
        crashed instance)."""
        if not keep_spare:
            self._drop_spare_locked()
        self._generation += 1
        idle, self._idle = self._idle, []
        self._slots.difference_update(idle)
        self._freed.notify_all()
        for slot in idle:
            _drop(slot)  # idle: nothing runs on it, so this is immediate

    def logs(self) -> tuple[LogRecord, ...]:
        return self.log.records

    def drain(self) -> None:
        """The host is shutting down: refuse every new call from now on; the call in flight
        (if any) goes on until the host's deadline."""
        self._draining = True
        self._seen_grants = None  # so that the next call takes the slow path and is refused
        self._wake_delays()

    def _wait_until_idle(self, deadline: float) -> bool:
        """Caller holds ``_lock``: wait until no instance is in a call or being built, or
        ``deadline`` (on ``time.monotonic()``) passes; True if idle."""
        while (self._in_use() or self._spare_building) and time.monotonic() < deadline:
            self._waiting += 1
            try:
                # Polled: a hand-back's wake-up may go to a call waiting for an instance
                # (which then refuses, closed) instead of this.
                self._freed.wait(min(CLOSE_DRAIN_POLL_S, max(0.0, deadline - time.monotonic())))
            finally:
                self._waiting -= 1
        return not self._in_use() and not self._spare_building

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, until no call of this extension is running (no
        instance in a call or being built); True if none is. With the extension paused, no
        new call starts meanwhile: an update uses it so that its checkpoint is never taken
        under a call that may still write."""
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not 0 <= timeout_s <= MAX_WAIT_IDLE_S
        ):
            # NaN compares false with every deadline: it would return at once, "idle".
            raise ConfigError(f"timeout_s must be a number of seconds in 0..{MAX_WAIT_IDLE_S:g}")
        with self._lock:
            return self._wait_until_idle(time.monotonic() + timeout_s)

    def run_shutdown_hook(self, deadline: float) -> str:
        """Wait (until ``deadline``, on ``time.monotonic()``) for the calls in flight, then run
        the manifest's ``[lifecycle] on_shutdown`` command on an idle instance with what
        remains of the deadline as its timeout. Returns what happened, for the journal; never
        raises for the guest's sake. No hook, or no live instance: nothing to run."""
        hook = self.manifest.on_shutdown if self.manifest is not None else None
        with self._lock:
            if not self._wait_until_idle(deadline):
                return "a call was still running at the deadline"
            if hook is None or not self._idle or self.lifecycle.state is State.CLOSED:
                return "no shutdown hook to run"
            state = self.lifecycle.state
            if state is not _RUNNING:
                # Paused (by the operator or a budget's pause), throttled, quarantined,
                # revoked: a call would be refused, and so is the hook, which is guest code
                # like any call (red-team 2026-12-01: a paused extension's hook ran).
                return f"no shutdown hook: the extension is {state.value}"
            slot = self._idle.pop()  # checked out: an interrupt (close) still reaches it
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms < 1:
            self._checkin(slot)
            return "no time left for the shutdown hook"
        r = self.resources
        budget = Budget(r.fuel_per_call, min(left_ms, r.timeout_ms))
        try:
            result = slot.instance.call(hook.encode(), CBOR_NULL, r.max_output_bytes, budget)
        except Exception as exc:  # the guest's failure is reported, never raised
            self._unregister(slot)
            self._add_fuel(budget.used)  # budgets: the hook's fuel counts like a call's
            return f"shutdown hook failed: {type(exc).__name__}: {str(exc)[:200]}"
        self._checkin(slot)
        self._add_fuel(budget.used)
        return "shutdown hook ran" if result.status == 0 else "shutdown hook answered an error"

    def close(self, reason: str = "closed") -> None:
        """Close for good: every call in flight is interrupted (not waited out), its instance
        freed once its guest has stopped, and every later call answers ``unavailable``.
        Idempotent."""
        check_reason(reason)
        self.lifecycle.try_fire(Event.CLOSE, reason)
        self._interrupt()
        with self._lock:
            self._discard_locked()
        # Instances in a call are freed by their own calls as they return (interrupted, within
        # a tick or so), never from here: a call may be about to enter its instance, and a
        # Store freed under it would crash the process.
        with self._lock:
            idle = self._wait_until_idle(time.monotonic() + CLOSE_DRAIN_S)
            self._close_brokers()
            held, self._holds_grants = self._holds_grants, False
        if self._evictor is not None:
            self._evictor.forget(self)  # [density]
        host = self.host
        host.forget(self)
        # [density] What the host keeps per id goes with the last extension of the id, unless
        # a call was still running when the wait above gave up (it may still use its grant
        # view: the record stays, as before this existed).
        host.governor.close(self)
        if host.extension(self.id) is None:
            host.supervisor.closed(self.id)
        if host.scheduler is not None:
            host.scheduler.forget(self.id)
        if held and idle:
            host.grants.release(self.id)
            if host.presence is not None:
                # Other hosts on the state directory may update it now; not while a call may
                # still write (then the host's close lets go).
                host.presence.leave(self.id)
        if held:
            host.closed_one()


def _ignore_outcome(ok: bool, result: Any) -> None:
    """A spare's build reports nothing: its failures are recorded as steps."""


def _close_bindings(bindings: Mapping[str, ProfileBinding]) -> None:
    for binding in bindings.values():
        binding.close()


def _drop(slot: _Pooled) -> None:
    """Free ``slot``'s instance and the profile state (WASI descriptors) that belonged to it;
    idempotent."""
    slot.instance.close()
    bindings, slot.bindings = slot.bindings, {}
    _close_bindings(bindings)
    room, slot.room = slot.room, None
    if room is not None:
        room.release()  # [density]


def _input_refused(exc: CodecError, bounds: CodecLimits, max_input_bytes: int) -> CodecError:
    """A command input the codec refused, said as what it is and what lifts it: the
    manifest's ``max_input_bytes`` for its size, the ABI's fixed bounds for the rest."""
    text = exc.message
    refused = CodecError(f"command input: {text}")
    if "exceeds" in text:
        refused.hint = (
            f"the input may be at most {max_input_bytes} bytes of CBOR: raise [resources] "
            "max_input_bytes in the extension's extension.toml, or send less"
        )
    elif "data items" in text or "nesting" in text:
        refused.hint = (
            f"an input may hold at most {bounds.max_items} data items, nested at most "
            f"{bounds.max_depth} deep (docs/embedding.md): send it in smaller parts"
        )
    elif "cannot encode" in text:
        refused.hint = (
            "an input is None, a bool, an int, a float, str, bytes, or a list or dict of "
            "those (docs/embedding.md)"
        )
    return refused


def _raw_input(command: str, value: Any, limit: int) -> bytes | bytearray | memoryview:
    """A bytes command's input as it crosses: the caller's own buffer, checked, not copied."""
    if isinstance(value, (bytes, bytearray)):
        data: bytes | bytearray | memoryview = value
    elif isinstance(value, memoryview) and value.c_contiguous:
        data = value if value.format == "B" and value.ndim == 1 else value.cast("B")
    else:
        raise ConfigError(
            f'command {command!r} takes bytes (input = "bytes" in its manifest): pass bytes, '
            f"a bytearray or a contiguous memoryview, not {type(value).__name__}"
        )
    if len(data) > limit:
        raise CodecError(f"input of {len(data)} bytes exceeds max_input_bytes {limit}")
    return data
