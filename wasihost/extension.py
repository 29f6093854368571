"""An admitted extension: its grant, lifecycle, log, and (once started) one live instance.

It starts on first use (instantiate, then the handshake), runs commands only in Running, applies
grant changes between calls (a downgrade in place, anything else by restarting), and discards
its instance after any failure that may have corrupted the guest.
"""

from __future__ import annotations

import collections
import functools
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from .admission import AdmissionPlan
from .codec import CodecLimits, decode, encode
from .engine import BoundImport, Budget, CompiledModule, Instance, StoreLimits
from .errors import (
    AdmissionError,
    CallError,
    CodecError,
    ConfigError,
    FailureClass,
    WasihostError,
)
from .extlog import ExtensionLog, LogRecord
from .grants import GrantState
from .lifecycle import Event, ExtensionRevoked, ExtensionUnavailable, Lifecycle, State
from .manifest import Manifest, Resources
from .package import Package
from .planning import check_package_policy, plan_package
from .policy import Grant
from .registry import HostFunction
from .supervision import BackingOff

if TYPE_CHECKING:
    from .runtime import Host

T = TypeVar("T")

RESERVED_PREFIX = "wasihost."
# A command name crosses into the guest on every call; the ABI bounds it at 255 bytes.
MAX_COMMAND_NAME_BYTES = 255
# Why a call is refused once the host's shutdown has begun (Host.close with a timeout).
SHUTTING_DOWN = "the host is shutting down"
# Handshake answers are a few short fields; anything bigger is a confused or hostile guest.
MAX_HANDSHAKE_BYTES = 4096
# A guest's error map is for a human: class and message, bounded.
MAX_GUEST_ERROR_BYTES = 2048
MAX_GUEST_ERROR_TEXT = 512
MAX_GUEST_ERROR_CLASS = 64
RUNTIME_ID_BYTES = 16
# Validated command names are cached; a bound keeps an embedder looping over made-up names
# from growing the cache.
MAX_CACHED_COMMAND_NAMES = 256
# Start-up and admission steps kept per extension for inspection; older ones fall off.
MAX_STEPS = 100
READINESS = ("ready", "degraded", "failed")
CBOR_NULL = b"\xf6"


class ProfileBinding(Protocol):
    """The brokers of one profile (e.g. WASI) for one instance of one extension.

    Made fresh for every instance, because profile state (open file descriptors, for WASI)
    belongs to the instance and must not survive a discarded one.
    """

    def handler(self, entry: HostFunction) -> Callable[..., Any]: ...

    def close(self) -> None: ...


ProfileFactory = Callable[["Extension"], ProfileBinding]


@attrs.frozen
class Handshake:
    """What the guest said at start-up and what the host answered."""

    runtime_id: bytes
    guest_id: str
    guest_version: str
    abi: str
    requested: tuple[str, ...]
    granted: tuple[str, ...]
    epoch: int
    readiness: str
    reason: str | None


class Extension:
    """An admitted extension: its grant, its log, and (once started) one live instance."""

    def __init__(
        self,
        host: Host,
        package: Package,
        plan: AdmissionPlan,
        grant: Grant,
        resources: Resources,
        compiled: CompiledModule,
    ) -> None:
        self.host = host
        self.package = package
        self._id = package.name
        self.plan = plan
        self.grant = grant
        self.resources = resources
        self._compiled = compiled
        sink = host.log_sink
        self.log = ExtensionLog(
            resources.max_log_bytes,
            sink=functools.partial(sink, package.name) if sink is not None else None,
        )
        self._input_limits = CodecLimits(max_bytes=resources.max_input_bytes)
        self._output_limits = CodecLimits(max_bytes=resources.max_output_bytes)
        self._lock = threading.Lock()
        # The live instance between calls, and the one being started or running a plain
        # command: an interrupt (revocation, close) must reach both, in every phase.
        self._instance: Instance | None = None
        self._starting: Instance | None = None
        self.handshake: Handshake | None = None
        self.last_fuel_used = 0
        self.starts = 0
        self._bindings: dict[str, ProfileBinding] = {}
        # The epoch the call in flight was authorised under; host calls and commits check it.
        self._call_epoch = grant.epoch
        self._seen_grants: GrantState | None = None
        self.denied_capabilities: set[str] = set()
        self._command_names: dict[str, bytes] = {}
        self.steps: collections.deque[tuple[str, str]] = collections.deque(maxlen=MAX_STEPS)
        self.lifecycle = Lifecycle(self.id, on_change=self._on_transition)
        # Per-extension state of each broker serving its imports, opened on first use
        # (Broker.open) and closed with the extension (Broker.close).
        self._broker_states: dict[int, tuple[Any, Any]] = {}
        # Set by the host's shutdown: every new call is refused (the one in flight finishes).
        self._draining = False

    @property
    def id(self) -> str:
        return self._id

    @property
    def manifest(self) -> Manifest | None:
        return self.package.manifest

    def _gate(self, entry: HostFunction) -> bool:
        if self.host.grants.authorizes(self._id, self._call_epoch, entry.capability):
            return True
        # Which capabilities the guest asked for and was refused: a front end turns that into
        # a hint (e.g. "add --profile standard"). Bounded by the registry's capabilities.
        self.denied_capabilities.add(entry.capability)
        return False

    def grant_scopes(self) -> dict[str, dict[str, Any]]:
        """The scopes of the capabilities this extension holds now (brokers shape from them)."""
        entries = self.host.grants.state(self._id).entries
        return {cap: entries[cap].scope_value for cap in self.grant.capabilities if cap in entries}

    @property
    def call_epoch(self) -> int:
        """The grant epoch the call in flight was authorised under (brokers commit with it)."""
        return self._call_epoch

    def commit(self, capability: str, action: Callable[[], T]) -> tuple[bool, T | None]:
        """Run a broker's committing ``action`` only if the call's epoch still authorises
        ``capability``, atomically with respect to every grant change, and while the host's
        revocation list (if any) verifies and does not revoke this package."""
        if not self.host.revocations_allow_commit():
            return False, None
        return self.host.grants.commit(self._id, self._call_epoch, capability, action)

    def record_step(self, step: str, detail: str) -> None:
        """One observable step of admission or start-up (also journaled when durable)."""
        self.steps.append((step, detail))
        self.host.journal(self.id, "step", f"{step}: {detail}")

    def _on_transition(self, before: State, event: Event, after: State) -> None:
        if self.host.state is not None:
            self.host.state.record_state(self.id, after.value, self.lifecycle.reason)
            self.host.journal(
                self.id,
                "lifecycle",
                f"{before.value} --{event.value}--> {after.value}"
                + (f" ({self.lifecycle.reason})" if self.lifecycle.reason else ""),
            )

    def _handler(self, entry: HostFunction) -> Callable[..., Any]:
        binding = self._bindings.get(entry.module)
        if binding is not None:
            return binding.handler(entry)
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

    def _store_limits(self) -> StoreLimits:
        r = self.resources
        return StoreLimits(
            max_memory_bytes=r.max_memory_bytes,
            max_table_elements=r.max_table_elements,
            fuel=r.fuel_per_call,
            timeout_ms=r.timeout_ms,
        )

    def start(self) -> Handshake:
        """Instantiate and run the handshake now, under one call's budget (calls do it
        lazily, under their own)."""
        with self._lock:
            self._check_available()
            if self._instance is None:
                self._start(self._budget())
            assert self.handshake is not None
            return self.handshake

    def _new_instance(self) -> Instance:
        self._close_bindings()
        for module in {e.module for e in self.plan.imports}:
            factory = self.host.profile_factories.get(module)
            if factory is not None:
                self._bindings[module] = factory(self)
        bound = [BoundImport(entry, self._handler(entry)) for entry in self.plan.imports]
        profile = self.plan.view.profile
        return self.host.engine.new_instance(
            self._compiled,
            bound,
            self._gate,
            self._store_limits(),
            command_export=profile.command_export if self.plan.is_command and profile else None,
        )

    def _close_bindings(self) -> None:
        bindings, self._bindings = self._bindings, {}
        for binding in bindings.values():
            binding.close()

    def run_command(self) -> int:
        """Run a plain profile command (a WASI ``_start``) once; return its exit code.

        Its start function and its entry point share one budget: ``fuel_per_call`` and
        ``timeout_ms`` bound the run as a whole."""
        if not self.plan.is_command:
            raise ConfigError(f"{self.id} is a wasihost ABI guest: call its commands instead")
        with self._lock:
            self._check_available()
            self._call_epoch = self.grant.epoch
            self._discard()
            budget = self._budget()
            instance = self._new_instance()
            self._starting = instance  # so that a revocation or close can interrupt the run
            self._interrupt_if_halted(instance)
            try:
                with instance.lock:
                    instance.instantiate(budget)
                    self.starts += 1
                    code = instance.run_command(budget)
            except BaseException:
                self._raise_if_halted_during(instance, "run")
                raise
            finally:
                self.last_fuel_used = budget.used
                self._starting = None
                self._drop(instance)
            return code

    def _start(self, budget: Budget) -> Instance:
        """Instantiate and handshake under ``budget``: the start function, ``hello`` and
        ``welcome`` draw from the same fuel and deadline as the command that follows.
        Caller holds ``_lock``."""
        if self.plan.is_command:
            raise ConfigError(f"{self.id} is a plain command module: use run_command()")
        event = Event.START if self.lifecycle.state is State.PROVISIONING else Event.RESTART
        if event is Event.RESTART and self.lifecycle.state is State.FAILED:
            try:
                self.host.supervisor.before_restart(self.id)
            except BackingOff as wait:
                raise ExtensionUnavailable(
                    self.id, State.FAILED, str(wait), retry_after_s=wait.retry_after_s
                ) from None
        if self.lifecycle.try_fire(event) is None:
            raise self._unavailable()
        self.record_step("build sandbox", f"{len(self.plan.imports)} imports bound")
        try:
            instance = self._new_instance()
        except BaseException as exc:
            # Whatever failed, start-up is over: never leave the extension in Starting.
            self._close_bindings()
            self.lifecycle.try_fire(Event.START_FAILED, f"instantiate: {exc}")
            raise
        self._starting = instance
        self._interrupt_if_halted(instance)
        self._call_epoch = self.grant.epoch
        try:
            with instance.lock:
                instance.instantiate(budget)
            self.starts += 1
            self.record_step("instantiate", f"start #{self.starts}")
            self.handshake = self._run_handshake(instance, budget)
        except BaseException as exc:
            self.last_fuel_used = budget.used
            self._starting = None
            self._drop(instance)
            self._raise_if_halted_during(instance, "start-up")
            what = "handshake" if instance.started else "instantiate"
            if self.lifecycle.try_fire(Event.START_FAILED, f"{what}: {exc}") is not None:
                failure = exc.failure if isinstance(exc, CallError) else FailureClass.HANDSHAKE
                self._supervise(failure, f"{what}: {exc}")
            raise
        hs = self.handshake
        self.record_step(
            "handshake", f"{hs.readiness}, runtime {hs.runtime_id.hex()[:8]}, epoch {hs.epoch}"
        )
        self._starting = None
        if self.lifecycle.try_fire(Event.READY, hs.reason) is None:
            # Revoked or closed while the handshake ran: the instance never serves a call.
            self._drop(instance)
            raise self._unavailable()
        self._instance = instance
        return instance

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

    def _interrupt_if_halted(self, instance: Instance) -> None:
        """A revocation or close that landed before ``instance`` was visible to it."""
        if self.lifecycle.state in (State.REVOKED, State.CLOSED):
            instance.interrupt()

    def _check_available(self) -> None:
        """Before each call: honour revocations and grant changes, refuse outside Running."""
        seen = self.host.grants.current(self.id)
        if (
            seen is not None
            and seen is self._seen_grants
            and self.lifecycle.state in (State.RUNNING, State.PROVISIONING)
        ):
            return  # nothing changed since the last call: the common case, kept cheap
        if self.lifecycle.state is State.CLOSED:
            raise self._unavailable()
        if self._draining:
            raise ExtensionUnavailable(self.id, self.lifecycle.state, SHUTTING_DOWN)
        table = self.host.grants.state(self.id)
        if table.revoked is not None or self.lifecycle.state is State.REVOKED:
            self.lifecycle.try_fire(Event.REVOKE, table.revoked)
            self._discard()
            raise ExtensionRevoked(
                f"{self.id} is revoked: {table.revoked or 'reinstated since; load it again'}"
            )
        state = self.lifecycle.state
        if state in (State.PAUSED, State.QUARANTINED, State.STOPPING, State.THROTTLED):
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
            self._discard()
            self.lifecycle.try_fire(Event.STOP)
            self.lifecycle.try_fire(Event.STOPPED)
            raise
        manifest = self.manifest
        requested = (manifest.required | manifest.optional) if manifest is not None else granted
        capabilities = granted & requested & self.host.policy.allow
        # Profile brokers (WASI) shape per-instance state from the grant at start (preopened
        # mounts, stdio routing), so for them any change means a fresh instance.
        stateful_brokers = any(e.convention == "native" for e in self.plan.imports)
        # A policy update may lower resource ceilings; store limits are fixed per instance.
        resources = self.host.policy.cap(self.resources)
        if (
            capabilities <= self.grant.capabilities
            and not stateful_brokers
            and resources == self.resources
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
        )
        self.grant = grant
        self.plan = plan
        self._set_resources(resources)
        self.record_step("load active grants", f"changed, epoch {epoch}: restarting")
        self._discard()
        self.lifecycle.try_fire(Event.STOP)
        self.lifecycle.try_fire(Event.STOPPED)

    def _set_resources(self, resources: Resources) -> None:
        if resources != self.resources:
            self.resources = resources
            self.log.max_bytes = resources.max_log_bytes
            self._input_limits = CodecLimits(max_bytes=resources.max_input_bytes)
            self._output_limits = CodecLimits(max_bytes=resources.max_output_bytes)

    def _raise_if_halted_during(self, instance: Instance, what: str) -> None:
        """A failure caused by an operator's revocation, or by a close, interrupting the guest
        is reported as that (the instance is dropped), not as the deadline it used."""
        if instance.interrupted and self.lifecycle.state in (State.REVOKED, State.CLOSED):
            self._discard()
            raise self._unavailable(during=what) from None

    def on_revoked(self, reason: str) -> None:
        """Called by the host from any thread: stop the call in flight, refuse the next."""
        self.lifecycle.try_fire(Event.REVOKE, reason)
        self._interrupt()

    def _interrupt(self) -> None:
        for instance in (self._instance, self._starting):
            if instance is not None:
                instance.interrupt()

    def pause(self, reason: str = "") -> None:
        self.lifecycle.fire(Event.PAUSE, reason or None)

    def resume(self) -> None:
        self.lifecycle.fire(Event.RESUME)

    def release(self) -> None:
        """Let a quarantined extension out: it is stopped, and the next call starts it afresh
        (use :meth:`Host.release`, which also resets its restart budget)."""
        self.lifecycle.fire(Event.RELEASE)

    def quarantine(self, reason: str) -> None:
        with self._lock:
            self.lifecycle.fire(Event.QUARANTINE, reason)
            self._discard()

    def stop(self) -> None:
        with self._lock:
            if self.lifecycle.try_fire(Event.STOP) is not None:
                self._discard()
                self.lifecycle.fire(Event.STOPPED)

    def _reserved(self, instance: Instance, command: str, value: Any, budget: Budget) -> Any:
        try:
            with instance.lock:
                result = instance.call(command.encode(), encode(value), MAX_HANDSHAKE_BYTES, budget)
        except CallError as exc:
            if exc.failure in (FailureClass.PROTOCOL, FailureClass.GUEST_ERROR):
                raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None
            raise
        if result.status != 0:
            raise CallError(
                FailureClass.HANDSHAKE,
                f"{command}: guest answered status {result.status} "
                f"({_guest_error_text(result.body)})",
            )
        try:
            return decode(result.body, CodecLimits(max_bytes=MAX_HANDSHAKE_BYTES))
        except CodecError as exc:
            raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None

    def _run_handshake(self, instance: Instance, budget: Budget) -> Handshake:
        versions = [str(v) for v in self.host.registry.versions]
        hello = self._reserved(
            instance, "wasihost.hello", {"host": "wasihost", "abi": versions}, budget
        )
        fields = _require_fields(
            hello, "wasihost.hello", {"id": str, "version": str, "abi": str, "features": list}
        )
        features = fields["features"]
        if not all(isinstance(f, str) for f in features):
            raise CallError(FailureClass.HANDSHAKE, "wasihost.hello: features must be text")
        if fields["abi"] != str(self.plan.version):
            raise CallError(
                FailureClass.HANDSHAKE,
                f"wasihost.hello: guest says ABI {fields['abi']!r}, its marker says "
                f"{self.plan.version}",
            )
        manifest = self.manifest
        if manifest is not None and (fields["id"], fields["version"]) != (
            manifest.id,
            manifest.version,
        ):
            raise CallError(
                FailureClass.HANDSHAKE,
                f"wasihost.hello: guest says {fields['id']} {fields['version']}, the manifest "
                f"says {manifest.id} {manifest.version}",
            )
        runtime_id = secrets.token_bytes(RUNTIME_ID_BYTES)
        granted = sorted(self.grant.capabilities)
        welcome = self._reserved(
            instance,
            "wasihost.welcome",
            {
                "runtime_id": runtime_id,
                "granted": granted,
                "epoch": self.grant.epoch,
                "token": self.host.tokens.issue(self.id, runtime_id, self.grant.epoch),
            },
            budget,
        )
        answer = _require_fields(welcome, "wasihost.welcome", {"status": str})
        readiness = answer["status"]
        reason = welcome.get("reason")
        if readiness not in READINESS or (reason is not None and not isinstance(reason, str)):
            raise CallError(FailureClass.HANDSHAKE, f"wasihost.welcome: bad answer {welcome!r}")
        if readiness == "failed":
            raise CallError(
                FailureClass.HANDSHAKE, f"guest reported failed start-up: {reason or 'no reason'}"
            )
        return Handshake(
            runtime_id=runtime_id,
            guest_id=fields["id"],
            guest_version=fields["version"],
            abi=fields["abi"],
            requested=tuple(features),
            granted=tuple(granted),
            epoch=self.grant.epoch,
            readiness=readiness,
            reason=reason,
        )

    def _check_command(self, command: str) -> bytes:
        name = self._command_names.get(command) if isinstance(command, str) else None
        if name is not None:
            return name
        if not isinstance(command, str) or not command:
            raise ConfigError("command name must be a non-empty string")
        if command.startswith(RESERVED_PREFIX):
            raise ConfigError(f"command {command!r} is reserved for the host")
        name = command.encode()
        if len(name) > MAX_COMMAND_NAME_BYTES:
            raise ConfigError(f"command name of {len(name)} bytes exceeds {MAX_COMMAND_NAME_BYTES}")
        manifest = self.manifest
        if manifest is not None and manifest.command(command) is None:
            declared = ", ".join(c.name for c in manifest.commands)
            raise ConfigError(f"command {command!r} is not declared (declared: {declared})")
        if len(self._command_names) < MAX_CACHED_COMMAND_NAMES:
            self._command_names[command] = name
        return name

    def call(
        self,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Any:
        """Run ``command`` with ``value`` (any CBOR-encodable value) and return its output.

        One budget covers everything the call runs: on a first call, or after a crash, that
        includes the start function and the handshake. It is the extension's
        ``fuel_per_call`` and ``timeout_ms``, or ``fuel``/``timeout_ms`` for this call alone,
        which may lower them but never raise them."""
        name = self._check_command(command)
        if self._draining:  # refused at once, not after the call in flight
            raise ExtensionUnavailable(self.id, self.lifecycle.state, SHUTTING_DOWN)
        r = self.resources
        # null in or out is the commonest payload of all: skip the codec for it.
        payload = CBOR_NULL if value is None else encode(value, self._input_limits)
        overridden = fuel is not None or timeout_ms is not None
        if overridden:
            fuel = _override("fuel", fuel, r.fuel_per_call, "fuel_per_call")
            timeout_ms = _override("timeout_ms", timeout_ms, r.timeout_ms, "timeout_ms")
        with self._lock:
            self._check_available()
            instance = self._instance
            # The deadline starts once the call holds the extension, not while it queues.
            budget = self._budget(fuel, timeout_ms) if overridden or instance is None else None
            if instance is None:
                assert budget is not None
                instance = self._start(budget)
            self._call_epoch = self.grant.epoch
            try:
                # No instance.lock here: self._lock serialises this extension's calls, and the
                # Instance refuses a second thread by itself (its entry token).
                result = instance.call(name, payload, r.max_output_bytes, budget)
            except BaseException as exc:
                self.last_fuel_used = budget.used if budget is not None else instance.last_call_fuel
                self._raise_if_halted_during(instance, "call")
                # A trap may have left the guest half-way, and so may a KeyboardInterrupt or
                # SystemExit (or a bug) out of a host function: the instance goes. A refusal
                # before the guest ran (a ConfigError: the caller's stack is too small) keeps it.
                if isinstance(exc, CallError):
                    if exc.failure.discards_instance:
                        self._crash(f"{exc.failure.value}: {exc.message}", exc.failure)
                elif not isinstance(exc, WasihostError):
                    self._crash(f"interrupted: {type(exc).__name__}")
                raise
            self.last_fuel_used = budget.used if budget is not None else result.fuel_used
            if result.status != 0:
                cls, msg = _guest_error(result.body)
                raise CallError(
                    FailureClass.GUEST_ERROR,
                    _guest_error_line(cls, msg),
                    guest_class=cls,
                    guest_message=msg,
                )
            if result.body == CBOR_NULL:
                return None
            try:
                return decode(result.body, self._output_limits)
            except CodecError as exc:
                # The guest broke the protocol: its state is not to be trusted any more.
                self._crash(f"protocol: command output: {exc.message}", FailureClass.PROTOCOL)
                raise CallError(FailureClass.PROTOCOL, f"command output: {exc.message}") from None

    def _crash(self, reason: str, failure: FailureClass = FailureClass.TRAP) -> None:
        """The instance failed in a way that may have corrupted it: drop it, say so in the
        lifecycle, and let the supervisor decide between a restart on the next call (after
        its backoff) and quarantine. Caller holds ``_lock``."""
        self._discard()
        self.lifecycle.try_fire(Event.CRASH, reason)
        self._supervise(failure, reason)

    def _supervise(self, failure: FailureClass, reason: str) -> None:
        self.host.journal(self.id, "crash", reason)
        verdict = self.host.supervisor.on_crash(self.id, failure, reason)
        if verdict is not None:
            self.lifecycle.try_fire(Event.QUARANTINE, verdict)

    def _discard(self) -> None:
        instance, self._instance = self._instance, None
        self._drop(instance)

    def _drop(self, instance: Instance | None) -> None:
        """Free ``instance`` and the profile state (WASI descriptors) that belonged to it."""
        if instance is not None:
            instance.close()
        self._close_bindings()

    def logs(self) -> tuple[LogRecord, ...]:
        return self.log.records

    def drain(self) -> None:
        """The host is shutting down: refuse every new call from now on; the call in flight
        (if any) goes on until the host's deadline."""
        self._draining = True
        self._seen_grants = None  # so that the next call takes the slow path and is refused

    def run_shutdown_hook(self, deadline: float) -> str:
        """Wait (until ``deadline``, on ``time.monotonic()``) for the call in flight, then run
        the manifest's ``[lifecycle] on_shutdown`` command on the live instance with what
        remains of the deadline as its timeout. Returns what happened, for the journal; never
        raises for the guest's sake. No hook, or no live instance: nothing to run."""
        hook = self.manifest.on_shutdown if self.manifest is not None else None
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return "a call was still running at the deadline"
        try:
            instance = self._instance
            if hook is None or instance is None or self.lifecycle.state is State.CLOSED:
                return "no shutdown hook to run"
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms < 1:
                return "no time left for the shutdown hook"
            r = self.resources
            budget = Budget(r.fuel_per_call, min(left_ms, r.timeout_ms))
            try:
                result = instance.call(hook.encode(), CBOR_NULL, r.max_output_bytes, budget)
            except Exception as exc:  # the guest's failure is reported, never raised
                self._discard()
                return f"shutdown hook failed: {type(exc).__name__}: {str(exc)[:200]}"
            return "shutdown hook ran" if result.status == 0 else "shutdown hook answered an error"
        finally:
            self._lock.release()

    def close(self, reason: str = "closed") -> None:
        """Close for good: the call in flight is interrupted (not waited out), the instance
        freed, and every later call answers ``unavailable``. Idempotent."""
        self.lifecycle.try_fire(Event.CLOSE, reason)
        self._interrupt()
        with self._lock:
            self._discard()
            self._close_brokers()
        self.host.forget(self)


def _override(name: str, value: int | None, ceiling: int, key: str) -> int:
    """A per-call budget: at most what the extension was admitted with."""
    if value is None:
        return ceiling
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
        raise ConfigError(
            f"{name}={value!r}: a per-call {name} must be an int in 1..{ceiling}, this "
            f"extension's {key} (raise it in the manifest, Host.load({name}=...) or the policy)"
        )
    return value


def _require_fields(value: Any, where: str, fields: Mapping[str, type]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CallError(FailureClass.HANDSHAKE, f"{where}: answer is not a map")
    for key, kind in fields.items():
        if not isinstance(value.get(key), kind):
            raise CallError(FailureClass.HANDSHAKE, f"{where}: field {key!r} missing or mistyped")
    return value


def _guest_error(body: bytes) -> tuple[str, str]:
    """The guest's ``{"class", "message"}``, bounded; never trusted to be well-formed."""
    try:
        value = decode(body, CodecLimits(max_bytes=MAX_GUEST_ERROR_BYTES))
    except CodecError:
        return "error", "guest error (malformed error body)"
    if not isinstance(value, dict):
        return "error", "guest error (malformed error body)"
    cls = value.get("class")
    msg = value.get("message")
    cls = cls[:MAX_GUEST_ERROR_CLASS] if isinstance(cls, str) and cls else "error"
    msg = msg[:MAX_GUEST_ERROR_TEXT] if isinstance(msg, str) else ""
    return cls, msg


def _guest_error_line(cls: str, msg: str) -> str:
    return f"{cls}: {msg}" if msg else cls


def _guest_error_text(body: bytes) -> str:
    return _guest_error_line(*_guest_error(body))
