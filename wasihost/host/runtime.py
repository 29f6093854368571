"""The embedding API: a :class:`Host` admits packages into
:class:`~wasihost.host.extension.Extension` objects, which start (instantiate + handshake) on first
use and run commands.

Data flows one way: package -> admission (pure, :mod:`wasihost.host.planning`) -> compile (cached)
-> instance -> call -> broker. The host owns the engine, the registry, the policy, the grant
table and (with a state directory) the durable state.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ..brokers import builtin_brokers
from ..brokers.clock import Clock, SystemClock
from ..core.admission import AdmissionPlan
from ..core.errors import (
    AdmissionError,
    CallError,
    ConfigError,
    FailureClass,
    PackageError,
    RevocationError,
    WasihostError,
)
from ..core.extlog import LogSink
from ..core.grants import Grant, GrantOrigin, GrantTable, withdrawn
from ..core.lifecycle import ExtensionRevoked, State, check_reason, clip_reason
from ..core.manifest import NATIVE_RUNTIME, Resources
from ..core.registry import (
    HostFunction,
    OpenCapabilities,
    Profile,
    Registry,
    is_application_capability,
)
from ..core.settings import EngineSettings
from ..core.threadstack import guest_thread_stack
from ..core.tokens import TokenIssuer
from ..core.wasmbin import read_header, read_header_cached
from ..engine import WasmEngine
from ..packaging.package import Package, load_package
from ..supervisor.governor import Governor
from ..supervisor.hostcall_metrics import HostCallTally
from ..supervisor.supervision import Supervisor
from .callworkers import DEFAULT_CALL_WORKERS, SPARE_WORKERS, CallWorkers
from .defaults import WASI_IMPORT_MODULE as WASI_MODULE
from .defaults import default_registry
from .extension import CommandMemory, Extension, ProfileBinding, ProfileFactory
from .functions import Broker, Function, HostFunctions
from .options import (
    DEFAULT_CACHE_DIR,
    check_broker,
    check_extension_id,
    check_host_options,
    check_package,
    iterable_option,
)
from .planning import (
    grant_names,
    is_native,
    load_choice,
    plan_package,
    resolve_runtime,
    unsigned_refusal,
)
from .policy import IN_PROCESS, PREFER_PROCESS, PROCESS_ONLY, Policy

# What only some hosts use is imported where it is used: the state store (sqlite3) with a state
# directory, installs and updates, the signature code with trust material, the WASI binding
# when a module imports WASI, eviction, scheduling and published metrics when configured, WASI
# scopes at a WASI grant. A short `wasihost run` pays for none of it at start-up.
if TYPE_CHECKING:
    import concurrent.futures

    from ..engine.instance import CompiledModule
    from ..packaging.allowed_signers import AllowedSigners, SshSigned
    from ..packaging.revocation import VersionFloor
    from ..packaging.trust import TrustStore
    from ..store.presence import Presence
    from ..store.state import InstalledPackage, StateStore
    from ..supervisor.eviction import EvictionPolicy, Evictor
    from ..supervisor.opmetrics import MetricsPublisher
    from ..supervisor.reports import Metrics, QuarantineReport, Usage
    from ..supervisor.scheduling import Scheduler
    from .backend import ExecutionBackend
    from .call_gate import CallGate


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wasihost" / "modules"


# Host.close closes its extensions in parallel: each is interrupted first, so a close waits at
# most about one epoch tick per call in flight; a few threads are enough for that.
MAX_CLOSING_THREADS = 8
# A committing host call re-reads the revocation list at most this often: reading and
# verifying it costs about a tenth of a millisecond, so once a second is invisible beside the
# calls, and a revocation published reaches a busy extension within a second.
REVOCATION_RECHECK_S = 1.0
# With a state directory, a committing host call reads the durable grant epochs of the live
# extensions again when they were read more than this long ago: a grant change another host
# wrote there (the CLI's `wasihost grants revoke`) reaches this one within a second. One
# indexed SQLite query a second, beside calls that commit effects.
GRANT_SYNC_S = 1.0
# The longest shutdown deadline Host.close accepts: ten minutes (the longest call timeout,
# limits.MAX_TIMEOUT_MS) is more than any orderly flush needs.
MAX_SHUTDOWN_S = 600.0
# After its deadline, Host.close interrupts what still runs and waits this long for the flush
# threads to see it: an interrupt reaches a running guest within one epoch tick (10 ms), so
# this is slack for a loaded machine, not time a guest can use.
TERMINATE_WAIT_S = 1.0
# [density] The C heap is trimmed (engine.density.trim_native_heap) once this many extensions
# have closed since the last trim: a trim after 256 closes took under a millisecond with
# 10,000 live, ~3 us a close beside the ~80 us a close costs, and RSS follows closes down.
TRIM_EVERY_CLOSES = 256


def _ssh(allowed: AllowedSigners | None, signature: bytes | None) -> SshSigned | None:
    """The OpenSSH verification asked for: both halves, or neither."""
    if (allowed is None) != (signature is None):
        raise ConfigError("allowed_signers and ssh_signature are given together")
    if allowed is None or signature is None:
        return None
    from ..packaging.allowed_signers import SshSigned

    return SshSigned(allowed, signature)


def _grant_sync_of(host: weakref.ref[Host]) -> Callable[[], None]:
    """The metrics thread's periodic grant sync (:meth:`Host.sync_grants`): a grant change
    another host made reaches extensions that commit nothing too (a revoked one is refused
    within a publishing period). Weak, as :func:`_snapshot_of`."""

    def sync() -> None:
        found = host()
        if found is not None and not found.closed:
            found.sync_grants()

    return sync


def _snapshot_of(host: weakref.ref[Host]) -> Callable[[], dict[str, Any] | None]:
    """What the metrics publisher's thread reads: a weak reference, so that a host dropped
    without close() is still collected (and its publisher stops)."""

    def snapshot() -> dict[str, Any] | None:
        found = host()
        return found.metrics().to_json() if found is not None else None

    return snapshot


def _default_wasi_binding(ext: Extension) -> ProfileBinding:
    """The default WASI profile's binding (``wasi_profile()``'s factory), its modules imported
    on the first WASI guest."""
    from ..wasi.binding import wasi_profile

    return wasi_profile()[1](ext)


# The prefix of every thread the host starts (call threads, broker workers, the event loop's):
# a close from one of them, while another thread closes the host, returns at once (see close).
HOST_THREAD_PREFIX = "wasihost-"
# How often a close waiting for another thread's looks whether that thread is still alive
# (it notifies as it stops; a thread that died without doing so is seen within this).
CLOSER_LOOK_S = 0.1


@attrs.define(eq=False)
class _Closing:
    """How far ``Host.close`` has got, so that a close cut short (Ctrl-C, or any exception in
    a phase) is finished by the next call: a phase done is not done again, the one cut short is
    run again from its start, and what it started (the shutdown hooks) is waited for, not
    started twice."""

    extensions: list[Extension]
    # The thread running the phases now; another thread's close returns at once meanwhile
    # (that thread finishes the work), this thread's own resumes it.
    closer: threading.Thread | None = None
    stopped: bool = False  # phases 1 and 2: no new work, no new calls
    pool: concurrent.futures.ThreadPoolExecutor | None = None  # the shutdown hooks' threads
    flushing: list[concurrent.futures.Future[str]] = attrs.field(factory=list)
    journaled: set[int] = attrs.field(factory=set)  # the hooks whose outcome is journaled
    flushed: bool = False  # phase 3
    extensions_closed: bool = False  # phase 5, the extensions
    # phase 5: which of the closes after the extensions' are done (by their place)
    terminated: set[int] = attrs.field(factory=set)
    done: bool = False


def _failure_of(step: Callable[[], None]) -> BaseException | None:
    """Run ``step``; what it raised, or None. Ctrl-C (KeyboardInterrupt) and SystemExit
    propagate: they end the close at once (see _only_exception)."""
    try:
        step()
    except Exception as exc:
        return exc
    return None


def _only_exception(outcome: BaseException) -> Exception:
    """A step's failure to collect; a KeyboardInterrupt or SystemExit (from an extension
    closed on a thread of the pool) is raised at once."""
    if not isinstance(outcome, Exception):
        raise outcome
    return outcome


class Host:
    """The plugin engine of an application: one wasm engine, one registry, one policy, one
    grant table (durable when ``state_dir`` is given)."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        settings: EngineSettings | None = None,
        cache_dir: Path | object | None = DEFAULT_CACHE_DIR,
        registry: Registry | None = None,
        clock: Clock | None = None,
        log_sink: LogSink | None = None,
        profiles: Iterable[tuple[Profile, ProfileFactory]] = (),
        state_dir: Path | None = None,
        brokers: Iterable[Broker] = (),
        supervisor: Supervisor | None = None,
        async_workers: int = DEFAULT_CALL_WORKERS,
        governor: Governor | None = None,
        eviction: EvictionPolicy | Evictor | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        # Every option is checked before anything is opened (the state database, the engine's
        # timer, threads): a wrong one is a ConfigError naming it, never an AttributeError
        # from deep inside a later load, and a refused Host leaves nothing behind.
        profiles = tuple(iterable_option("profiles", profiles))
        brokers = tuple(iterable_option("brokers", brokers))
        state_dir = check_host_options(
            policy=policy,
            settings=settings,
            cache_dir=cache_dir,
            registry=registry,
            clock=clock,
            log_sink=log_sink,
            profiles=profiles,
            state_dir=state_dir,
            brokers=brokers,
            supervisor=supervisor,
            governor=governor,
            eviction=eviction,
            scheduler=scheduler,
        )
        self.policy = policy if policy is not None else Policy()
        self.registry = registry if registry is not None else default_registry()
        self.profile_factories: dict[str, ProfileFactory] = {}
        # How far a plain command of each profile may grow its memory, where its factory says
        # (WasiOptions.max_memory_bytes); planning gives the others the command default.
        self.command_memory: dict[str, int] = {}
        self._add_profiles(profiles)
        self.functions = HostFunctions(self.registry)
        self._add_brokers(brokers)
        directory = default_cache_dir() if cache_dir is DEFAULT_CACHE_DIR else cache_dir
        if directory is not None and not isinstance(directory, Path):
            directory = Path(str(directory))
        self.state: StateStore | None = None
        # Which extensions this host has admitted, as other hosts on the state directory see
        # it (an update there is refused meanwhile): updates.Presence.
        self.presence: Presence | None = None
        if state_dir is not None:
            self._open_state(state_dir)
        # The highest revocation-list version seen: durable with a state directory. Made when
        # a policy with a revocation list first needs it (see _floor).
        self._revocation_floor: VersionFloor | None = None
        self._floor_lock = threading.Lock()
        # When the revocation list was last read for the running extensions, and what was
        # wrong with it then (None: it verified). Starts due, so the first committing host
        # call reads it.
        self._revocation_verdict: tuple[float, str | None] = (float("-inf"), None)
        self._grants_synced_at = float("-inf")
        self.grants = GrantTable(self.state)
        # Crash records, restart budgets and quarantine (``supervisor.set_policy(id, ...)``).
        self.supervisor = supervisor if supervisor is not None else Supervisor()
        # budgets: rate accounts and their actions (docs/budgets.md).
        self.governor = governor if governor is not None else Governor()
        self.engine = WasmEngine(settings or EngineSettings(), directory)
        # [density] idle extensions' instances dropped under a policy
        # (wasihost/supervisor/eviction.py).
        self.evictor: Evictor | None = None
        if eviction is not None:
            from ..supervisor.eviction import evictor_for

            self.evictor = evictor_for(eviction, self.engine.release_memory)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.tokens = TokenIssuer()
        # Where extension logs go instead of each extension's bounded buffer (see ExtensionLog).
        self.log_sink = log_sink
        self._extensions: dict[str, Extension] = {}
        # The process runtime's backends, made on first use (by mode: with the in-process
        # fallback or without).
        self._process_backends: dict[str, ExecutionBackend] = {}
        self._admitting: set[str] = set()
        self._closes_since_trim = 0  # [density]
        self._lock = threading.Lock()
        self.closed = False
        self._closing: _Closing | None = None  # set by the first close (see _Closing)
        # Notified as a thread stops running close's phases (done, or cut short).
        self._closer_left = threading.Condition(self._lock)
        # The threads running Extension.acall's calls: started on first use.
        self._call_workers = CallWorkers(async_workers)
        # The threads starting warm spares, never a call's (see SPARE_WORKERS).
        self._spare_workers = CallWorkers(SPARE_WORKERS)
        # Scheduling and operator-metrics hooks (docs/scheduling.md, docs/supervision.md):
        # without a scheduler calls take no host-wide slot, as before it existed.
        self.scheduler = scheduler
        self.call_gate: CallGate | None = None
        if scheduler is not None:
            self.call_gate = self._call_gate_of(scheduler)
        self.host_call_tally = HostCallTally()
        self._metrics_publisher: MetricsPublisher | None = None
        if self.state is not None:
            self._metrics_publisher = self._publisher_of(self.state)

    # Host.__init__'s steps that need more than a line, in the order it takes them.

    def _add_profiles(self, profiles: Iterable[tuple[Profile, ProfileFactory]]) -> None:
        """Serve each profile given (added to the registry when it lacks it) with its factory,
        and WASI, when the registry serves it, by default."""
        for profile, factory in profiles:
            if self.registry.profile_for_module(profile.module) is None:
                self.registry.add_profile(profile)
            self.profile_factories[profile.module] = factory
            if isinstance(factory, CommandMemory):
                self.command_memory[profile.module] = factory.command_max_memory_bytes
        if (
            self.registry.serves_profile(WASI_MODULE)
            and WASI_MODULE not in self.profile_factories
        ):
            # WASI is served by default with nothing configured: no mounts, no args or env,
            # stdio to the extension log; what a guest may use still depends on its grant.
            self.profile_factories[WASI_MODULE] = _default_wasi_binding

    def _add_brokers(self, brokers: Iterable[Broker]) -> None:
        """Which broker serves each cbor entry: the built-ins register as an embedder's would,
        and a broker the embedder passes replaces the built-in of the same name (a storage
        broker on its own database, a secrets broker on its own store)."""
        given: dict[str, Broker] = {}
        for broker in brokers:
            if broker.name in given:
                raise ConfigError(f"two brokers named {broker.name!r} given")
            given[broker.name] = broker
        for builtin in builtin_brokers():
            broker = given.pop(builtin.name, builtin)
            if all(self._has_entry(f) for f in broker.functions):
                self.functions.add_broker(broker)
        for broker in given.values():
            self.functions.add_broker(broker)

    def _open_state(self, state_dir: Path) -> None:
        """The durable state store, and this host's presence on its directory."""
        from ..store.state import StateStore
        from .updates import Presence

        self.state = StateStore(state_dir)
        self.presence = Presence(self.state.directory)

    @staticmethod
    def _call_gate_of(scheduler: Scheduler) -> CallGate:
        """The gate of the host's calls on ``scheduler``'s host-wide slots."""
        from ..supervisor.scheduling import Scheduler
        from .call_gate import CallGate

        if not isinstance(scheduler, Scheduler):
            raise ConfigError(
                f"scheduler must be a wasihost.supervisor.scheduling.Scheduler: {scheduler!r}"
            )
        return CallGate(scheduler)

    def _publisher_of(self, state: StateStore) -> MetricsPublisher:
        """The operator metrics published to ``state``; its thread holds the host weakly
        (see _snapshot_of)."""
        from ..supervisor.opmetrics import MetricsPublisher

        me = weakref.ref(self)
        return MetricsPublisher(state, _snapshot_of(me), tick=_grant_sync_of(me))

    def _has_entry(self, qualified: str) -> bool:
        module, _, name = qualified.rpartition(".")
        return self.registry.lookup(module, name) is not None

    # -- host functions -------------------------------------------------------------------

    def function(
        self,
        name: str,
        *,
        capability: str,
        since: str = "1.0",
        convention: str = "cbor",
        params: tuple[str, ...] | None = None,
        results: tuple[str, ...] | None = None,
        max_request_bytes: int | None = None,
        max_response_bytes: int | None = None,
        fuel_base: int,
        fuel_per_byte: int | None = None,
        commits: bool = False,
        doc: str = "",
        request: str = "",
        response: str = "",
    ) -> Callable[[Function], Function]:
        """Decorator: serve ``name`` (``NAMESPACE.NAME``, imported by guests from
        ``<namespace>_v<major of since>``) with ``fn(ctx, request)``, or with
        ``fn(ctx, *ints)`` for ``convention="native"`` and its ``params``/``results``; see
        docs/host-functions.md. Register before loading the extensions that import it."""
        return self.functions.function(
            name,
            capability=capability,
            since=since,
            convention=convention,
            params=params,
            results=results,
            max_request_bytes=max_request_bytes,
            max_response_bytes=max_response_bytes,
            fuel_base=fuel_base,
            fuel_per_byte=fuel_per_byte,
            commits=commits,
            doc=doc,
            request=request,
            response=response,
        )

    def add_function(self, name: str, fn: Function, **options: Any) -> HostFunction:
        """Call form of :meth:`function`; returns the registry entry."""
        return self.functions.register(name, fn, **options)

    def add_broker(self, broker: Broker) -> None:
        """Serve registry entries with ``broker`` (see :class:`wasihost.host.functions.Broker`)."""
        check_broker(broker)
        self.functions.add_broker(broker)

    def broker(self, name: str) -> Broker:
        """The broker named ``name`` serving this host (``host.broker("events")``); a
        ConfigError if none is."""
        return self.functions.broker(name)

    def publish(
        self,
        event_class: str,
        payload: Any = None,
        *,
        critical: bool = False,
        key: str | None = None,
    ) -> int:
        """Publish an event to the extensions subscribed to ``event_class`` (see
        docs/events.md): ``host.broker("events").publish(...)``, and to the event-driven jobs
        listening to it (``host.broker("jobs").trigger(...)``, docs/jobs.md). Returns how many
        subscriptions and jobs queued it; delivery happens on the brokers' own threads."""
        if self.closed:
            raise ConfigError("this host is closed")
        publish = getattr(self.broker("events"), "publish", None)
        if publish is None:
            raise ConfigError("the events broker serving this host has no publish()")
        accepted = int(publish(event_class, payload, critical=critical, key=key))
        jobs = next((b for b in self.functions.brokers() if b.name == "jobs"), None)
        trigger = getattr(jobs, "trigger", None)
        if trigger is not None:
            accepted += int(trigger(event_class, payload))
        return accepted

    def close(self, timeout_s: float = 0.0) -> None:
        """Shut down in phases, done within ``timeout_s`` seconds (plus about an epoch tick);
        docs/supervision.md, "Shutdown". Idempotent, and resumable: a close cut short (Ctrl-C
        in the flush's wait, an exception in a phase) leaves the host closed to new work, and
        the next ``close()`` finishes what it left. While another thread closes the host, a
        close waits for it and finishes the work if it stopped short; from one of the host's
        own threads (inside a call) it returns at once.

        1. Stop new work: nothing more is admitted or published, and each broker with a
           ``quiesce()`` starts nothing new (no event delivery, no job run).
        2. Refuse new calls: every extension answers ``unavailable`` to a call not yet started.
        3. Flush: calls in flight get until the deadline; then each extension's ``[lifecycle]
           on_shutdown`` command runs on its live instance with what remains as its timeout.
        4. Checkpoint: nothing to write. Durable state (grants, storage, the journal) commits
           per operation in SQLite transactions, so what a finished call did is already on
           disk and what an interrupted one had not committed never is.
        5. Terminate: every extension is closed (what still runs is interrupted), the brokers
           stop their threads, then the engine and the state close. A step that raises
           keeps none of the others from running; its exception is raised after them.

        ``close()`` (no timeout) interrupts everything in flight at once, as before."""
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not 0 <= timeout_s <= MAX_SHUTDOWN_S
        ):
            raise ConfigError(f"timeout_s must be a number of seconds in 0..{MAX_SHUTDOWN_S:g}")
        deadline = time.monotonic() + timeout_s
        me = threading.current_thread()
        closing: _Closing | None = None
        try:
            with self._lock:
                closing = self._closing
                if closing is None:
                    self.closed = True
                    closing = self._closing = _Closing(list(self._extensions.values()))
                while closing.closer not in (None, me) and closing.closer.is_alive():
                    if me.name.startswith(HOST_THREAD_PREFIX):
                        # One of the host's own threads (a call thread, a broker's worker)
                        # inside a call: the closing thread may be waiting for it. That
                        # thread finishes the work.
                        return
                    # Another thread is closing the host: wait for it, and finish the work
                    # if it stopped short (Ctrl-C in its flush, an exception). Returning at
                    # once left nothing to finish it then, and told the caller the host
                    # was closed while its calls, ticker and threads ran on.
                    self._closer_left.wait(CLOSER_LOOK_S)
                if closing.done:
                    return
                closing.closer = me
            self._close_phases(closing, timeout_s, deadline)
            closing.done = True
        finally:
            # Cleared here, also when a phase raised (Ctrl-C in the flush's wait): the next
            # close, from any thread, then finishes what this one left; a close waiting in
            # another thread takes over now.
            if closing is not None and closing.closer is me:
                with self._lock:
                    closing.closer = None
                    self._closer_left.notify_all()

    def _close_phases(self, closing: _Closing, timeout_s: float, deadline: float) -> None:
        """The phases of ``close`` that ``closing`` has not done yet (see _Closing)."""
        extensions = closing.extensions
        if not closing.stopped:
            for broker in self.functions.made_brokers():  # one never made has nothing running
                quiesce = getattr(broker, "quiesce", None)
                if quiesce is not None:
                    quiesce()
            for ext in extensions:
                ext.drain()
            if self.call_gate is not None:  # scheduling hook: calls waiting for a slot give up
                self.call_gate.close()
            closing.stopped = True
        if (timeout_s > 0 and extensions) or len(extensions) > 1 or closing.pool is not None:
            # Threads for a flush or for several closes; a lone extension closes on this
            # thread, and a short `wasihost run` never loads concurrent.futures.
            import concurrent.futures
        if not closing.flushed:
            if timeout_s > 0 and extensions and closing.pool is None:
                closing.pool = concurrent.futures.ThreadPoolExecutor(
                    min(MAX_CLOSING_THREADS, len(extensions)),
                    thread_name_prefix="wasihost-shutdown",
                )
                with guest_thread_stack():  # submit starts the threads, which run the hooks
                    closing.flushing = [
                        closing.pool.submit(ext.run_shutdown_hook, deadline) for ext in extensions
                    ]
            if closing.flushing:
                # A close resuming one cut short waits for the hooks that one started, until
                # its own deadline.
                concurrent.futures.wait(
                    closing.flushing, timeout=max(0.0, deadline - time.monotonic())
                )
                for i, (ext, future) in enumerate(zip(extensions, closing.flushing, strict=True)):
                    if i not in closing.journaled and future.done() and future.exception() is None:
                        closing.journaled.add(i)
                        self.journal(ext.id, "shutdown", future.result())
            closing.flushed = True
        # A step's failure (an embedder's profile state or broker that cannot close) keeps
        # no other step from running: each stops something of its own (the engine's ticker,
        # a broker's threads, the state's database), and one failing for good left all those
        # after it running, close after close. The failures are raised once every step ran;
        # the next close runs the failed steps again. Ctrl-C or SystemExit stop the close at
        # once, and the next resumes it.
        failures: list[Exception] = []
        if not closing.extensions_closed:
            outcomes: list[BaseException | None]
            if len(extensions) > 1:
                closers = min(MAX_CLOSING_THREADS, len(extensions))
                with concurrent.futures.ThreadPoolExecutor(closers) as pool:
                    futures = [pool.submit(ext.close) for ext in extensions]
                outcomes = [future.exception() for future in futures]
            else:
                outcomes = [_failure_of(ext.close) for ext in extensions]
            for outcome in outcomes:
                if outcome is not None:
                    failures.append(_only_exception(outcome))
            closing.extensions_closed = not failures
        if closing.pool is not None:
            # Interrupted by the closes above: each flush is at most an epoch tick from done.
            closing.pool.shutdown(wait=False, cancel_futures=True)
            concurrent.futures.wait(closing.flushing, timeout=TERMINATE_WAIT_S)
        # Each once: a close resuming after some of these raised runs those again.
        finals: list[Callable[[], None]] = [
            self._call_workers.close,
            self._spare_workers.close,
            self.functions.close,
        ]
        if self.evictor is not None:
            finals.append(self.evictor.close)  # [density]
        finals.append(self.engine.close)
        if self._metrics_publisher is not None:  # operator metrics hook: the last snapshot
            finals.append(self._metrics_publisher.close)
        if self.presence is not None:
            finals.append(self.presence.close)
        if self.state is not None:
            finals.append(self.state.close)
        for index, final in enumerate(finals):
            if index not in closing.terminated:
                outcome = _failure_of(final)
                if outcome is None:
                    closing.terminated.add(index)
                else:
                    failures.append(_only_exception(outcome))
        if failures:
            first = failures[0]
            for other in failures[1:]:
                first.add_note(f"closing the host also failed: {type(other).__name__}: {other}")
            raise first

    def call_workers(self) -> CallWorkers:
        """The bounded pool of threads on which async calls run
        (:mod:`wasihost.host.callworkers`)."""
        return self._call_workers

    def spare_workers(self) -> CallWorkers:
        """The threads that start extensions' warm spares, apart from the call threads."""
        return self._spare_workers

    def forget(self, ext: Extension) -> None:
        """A closed extension leaves the host: its id may be admitted again."""
        with self._lock:
            if self._extensions.get(ext.id) is ext:
                del self._extensions[ext.id]

    def release_memory(self) -> int:
        """[density] Give back now what closed extensions left: drop the rate accounts whose
        windows have emptied (``Governor.prune``, otherwise run by admissions and closes) and
        trim the C heap (otherwise done every TRIM_EVERY_CLOSES closes). Returns how many
        accounts were dropped. It walks the C heap: a few ms with thousands of extensions."""
        dropped = self.governor.prune()
        self.engine.release_memory()
        return dropped

    def closed_one(self) -> None:
        """[density] An extension finished closing: every TRIM_EVERY_CLOSES of them, give the
        memory their Stores freed back to the system."""
        with self._lock:
            self._closes_since_trim += 1
            due = self._closes_since_trim >= TRIM_EVERY_CLOSES
            if due:
                self._closes_since_trim = 0
        if due and not self.closed:  # Host.close trims once at its end
            self.engine.release_memory()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def journal(self, extension: str, kind: str, detail: str) -> None:
        if self.state is not None:
            self.state.record_event(extension, kind, detail)

    # -- packages -------------------------------------------------------------------------

    def load(
        self,
        source: str | Path,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
        trust: TrustStore | None = None,
        allowed_signers: AllowedSigners | None = None,
        ssh_signature: bytes | None = None,
        runtime: str | None = None,
    ) -> Extension:
        """Load and admit a ``.whpkg``, a package directory, or a bare module with explicit
        ``grants``. ``runtime`` ("in-process", "prefer-process" or "process-only") overrides
        the policy's and the manifest's (docs/process-runtime.md). A signed ``.whpkg`` is
        verified against ``trust`` (default: the policy's trusted publishers); passing
        ``trust`` also requires that this package verify. With
        ``allowed_signers`` and ``ssh_signature`` (an ``ssh-keygen -Y sign -n wasihost``
        signature of the file), the archive must verify by that OpenSSH signature instead."""
        ssh = _ssh(allowed_signers, ssh_signature)
        package = self._load_package(source, trust, ssh)
        if (trust is not None or ssh is not None) and package.signer is None:
            raise AdmissionError([unsigned_refusal(package)])
        return self.admit(
            package, grants=grants, fuel=fuel, timeout_ms=timeout_ms, runtime=runtime
        )

    def _load_package(
        self,
        source: str | Path,
        trust: TrustStore | None = None,
        ssh: SshSigned | None = None,
        applications: bool = False,
    ) -> Package:
        trust = trust if trust is not None else self.policy.trusted_publishers
        known = self.registry.capabilities()
        return load_package(source, OpenCapabilities(known) if applications else known, trust, ssh)

    def load_package(
        self,
        source: str | Path,
        *,
        trust: TrustStore | None = None,
        ssh: SshSigned | None = None,
        applications: bool = False,
    ) -> Package:
        """Load (and, for a signed ``.whpkg``, verify) a package without admitting it. With
        ``applications``, a manifest may request application capabilities this host does not
        serve (``app.users``): for what does not run the guest (an install); loading it to
        run still needs the application's functions registered."""
        return self._load_package(source, trust, ssh, applications)

    def install(
        self,
        source: str | Path,
        *,
        allow_downgrade: bool = False,
        trust: TrustStore | None = None,
        allowed_signers: AllowedSigners | None = None,
        ssh_signature: bytes | None = None,
        adopt_data: bool = False,
    ) -> InstalledPackage:
        """Copy a package into the state directory: a package directory, or a ``.whpkg``
        verified (against ``trust``, the policy's trusted publishers, or an OpenSSH signature)
        and kept as the signed archive itself, in a read-only tree verified again at every
        start. Installing grants nothing, and keeps the grants an earlier install of the same
        id holds. A lower version than the installed one is refused unless ``allow_downgrade``;
        an installed publisher's package is replaced only by that publisher's, and so are
        the grants and data a removal without purge kept, unless ``adopt_data``. The replaced
        version is kept for :meth:`rollback`. To replace a version with checks (a health
        command, migrations, automatic rollback), use :meth:`update_installed`."""
        self.require_state()  # before anything is read: no state directory, no install
        if not isinstance(adopt_data, bool):
            raise ConfigError(f"adopt_data is True or False, not {type(adopt_data).__name__}")
        ssh = _ssh(allowed_signers, ssh_signature)
        from . import updates

        package, current = updates.candidate(
            self,
            source,
            trust=trust,
            ssh=ssh,
            allow_downgrade=allow_downgrade,
            adopt_data=adopt_data,
        )
        assert package.manifest is not None
        with updates.exclusive(self, package.manifest.id):
            updates.still_current(self, package.manifest.id, current)
            return self._install(source, ssh, package, current)

    def _install(
        self,
        source: str | Path,
        ssh: SshSigned | None,
        package: Package,
        current: InstalledPackage | None,
    ) -> InstalledPackage:
        from . import updates

        store = self.require_state()
        assert package.manifest is not None
        # A host killed mid-update left its marker: undo that update first (its migration may
        # have half changed the state), or this install would take the place of the version
        # the marker names and the next start would take the update for committed.
        updates.recover_interrupted(self, package.manifest.id)
        # Refuse what could not run even with every capability it requests granted; an
        # application's capabilities this host does not serve are the application's to check
        # (an install runs nothing).
        manifest = package.manifest
        requested = manifest.required | manifest.optional
        unchecked = frozenset(OpenCapabilities(self.registry.capabilities()).unchecked(requested))
        self.plan(package, granted=frozenset(requested), unchecked=unchecked)
        if not is_native(package):  # plan() checked a native plugin's executable
            from ..core.codeshape import scan_module  # an install's check, not a run's

            scan_module(read_header(package.wasm), package.wasm)
        record = updates.write_install(self, source, package, ssh)
        try:
            # What was written is read again from the source: it must be what was checked.
            updates.verify_installed(self, record)
        except WasihostError:
            from ..store.state import remove_tree

            if current is None or record.path != current.path:
                remove_tree(record.path)
            raise
        previous = attrs.evolve(current, previous=None) if current is not None else None
        activated = attrs.evolve(record, previous=previous)
        store.activate(activated)
        # The trees and checkpoints no record keeps now (a reinstall of the same release wrote
        # a fresh copy, see StateStore.write_tree; an install restores no checkpoint).
        updates.prune(self, activated)
        installed = store.package(package.manifest.id)
        assert installed is not None
        return installed

    def update_installed(
        self,
        source: str | Path,
        *,
        allow_downgrade: bool = False,
        trust: TrustStore | None = None,
        allowed_signers: AllowedSigners | None = None,
        ssh_signature: bytes | None = None,
    ) -> InstalledPackage:
        """Update an installed extension to ``source`` as one transaction: verify, preflight
        (ABI, grants, revocation), pause the running version, checkpoint its state, start the
        new one (handshake, the manifest's ``[update]`` migration and health command),
        re-check revocation, switch, retire the old. If anything fails before the switch, the
        checkpoint is restored and the old version keeps running (:class:`UpdateError`)."""
        ssh = _ssh(allowed_signers, ssh_signature)
        from . import updates

        return updates.update(self, source, trust=trust, ssh=ssh, allow_downgrade=allow_downgrade)

    def rollback(self, extension: str) -> InstalledPackage:
        """Return an installed extension to the version its last update or install replaced
        (see :func:`wasihost.host.updates.rollback`)."""
        check_extension_id(extension)
        from . import updates

        return updates.rollback(self, extension)

    def build_unregistered(self, package: Package) -> Extension:
        """An extension of ``package`` admitted under its stored grants but not registered
        under its id (an update's candidate, started and checked before the switch)."""
        with self._lock:
            if self.closed:
                raise ConfigError("this host is closed")
            self.registry.seal()
        return self._build(package, None, None, None, None)

    def switch(self, old: Extension | None, new: Extension, reason: str) -> None:
        """Register ``new`` in place of ``old`` and close ``old``; with no ``old`` running in
        this host, ``new`` was only a check and is closed."""
        if old is None:
            new.close("update verified")
            return
        with self._lock:
            if self.closed or self._extensions.get(new.id) is not old:
                new.close("replaced meanwhile")
                raise ConfigError(f"{new.id} was replaced or closed during the update")
            self._extensions[new.id] = new
        old.close(reason)

    def load_installed(
        self,
        extension: str,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
        runtime: str | None = None,
    ) -> Extension:
        """Rebuild an installed extension from durable state, under its stored grants, after
        verifying it again (:func:`wasihost.host.updates.verify_installed`); ``runtime`` as
        :meth:`load`'s."""
        check_extension_id(extension)
        store = self.require_state()
        installed = store.package(extension)
        if installed is None:
            raise PackageError(f"{extension} is not installed")
        from . import updates

        if updates.recover_interrupted(self, extension) is not None:
            installed = store.package(extension)
            assert installed is not None
        package = updates.verify_installed(self, installed)
        recorded = store.lifecycle(extension)
        ext = self.admit(package, fuel=fuel, timeout_ms=timeout_ms, runtime=runtime)
        if recorded is not None and recorded[0] == State.QUARANTINED.value:
            # A quarantine outlives the host that decided it: the operator releases it.
            ext.quarantine(clip_reason(recorded[1] or "quarantined before the host restarted"))
        return ext

    def restore(self) -> dict[str, Extension | WasihostError]:
        """After a host restart: rebuild every installed extension from durable state.

        Each maps to its Extension (admitted under its stored grants, started on first use),
        or to the error that keeps it down: revoked, missing a required grant, tampered."""
        restored: dict[str, Extension | WasihostError] = {}
        # By id, each record read on its own: one damaged record raised out of the whole
        # restore (StateStore.packages reads them all), and no extension came back.
        for extension, _, _ in self.require_state().package_rows():
            try:
                restored[extension] = self.load_installed(extension)
            except WasihostError as exc:
                restored[extension] = exc
        return restored

    def require_state(self) -> StateStore:
        if self.state is None:
            raise ConfigError("this host has no state directory (Host(state_dir=...))")
        return self.state

    def plan(
        self,
        package: Package,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
        granted: frozenset[str] | None = None,
        unchecked: frozenset[str] = frozenset(),
    ) -> tuple[AdmissionPlan, Grant, Resources]:
        """Static admission only: no compile, no instantiation, nothing of the guest runs.
        ``unchecked``: application capabilities taken on trust (planning.plan_package)."""
        check_package(package)
        revocations = self.policy.revocations
        if revocations is not None:
            revocations.check(package, revocations.floor or self._floor())
        epoch = 0
        if granted is None and self.state is not None:
            table = self.grants.state(package.name)
            if table.revoked is not None:
                raise ExtensionRevoked(f"{package.name} is revoked: {table.revoked}")
            granted = frozenset(table.entries)
            epoch = table.epoch
        plan, grant, resources = plan_package(
            package,
            self.registry,
            self.policy,
            grants=grants,
            fuel=fuel,
            timeout_ms=timeout_ms,
            granted=granted,
            epoch=epoch,
            command_memory=self.command_memory,
            unchecked=unchecked,
        )
        reservation = self.engine.settings.memory_reservation
        if plan.is_command and resources.max_memory_bytes > reservation:
            # A memory never moves past its reservation (settings), so a command grows no
            # further than that: its limit says so, and so does a refused grow's message.
            resources = attrs.evolve(resources, max_memory_bytes=reservation)
        return plan, grant, resources

    def admit(
        self,
        package: Package,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
        runtime: str | None = None,
    ) -> Extension:
        """Verify, admit statically and compile a package; the extension starts on first use.

        An extension id is admitted once: while one is admitted under that id, another
        package claiming it is refused (replacing it is :meth:`update`)."""
        return self._admit(
            package, grants=grants, fuel=fuel, timeout_ms=timeout_ms, runtime=runtime
        )

    def update(
        self,
        source: str | Path | Package,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
        trust: TrustStore | None = None,
        allowed_signers: AllowedSigners | None = None,
        ssh_signature: bytes | None = None,
        runtime: str | None = None,
    ) -> Extension:
        """Replace the admitted extension of the same id by ``source``, explicitly.

        The new package is admitted and compiled first, so a refused update leaves the old
        extension running; then the old one is closed (its call in flight interrupted) and
        the new one takes its place. Grants are the new package's admission answer. An
        extension whose publisher was verified is replaced only by a package verified (with
        ``trust``, ``allowed_signers`` and ``ssh_signature`` as in :meth:`load`, or the
        policy's trusted publishers) as the same publisher's."""
        ssh = _ssh(allowed_signers, ssh_signature)
        package = source if isinstance(source, Package) else self._load_package(source, trust, ssh)
        old = self.extension(package.name)
        if old is None:
            raise ConfigError(f"{package.name} is not admitted: load it instead of updating")
        signer = old.package.signer
        if signer is not None and package.signer != signer:
            # A verified identity is kept: only the same publisher's signature may replace it.
            raise AdmissionError(
                [
                    f"{package.name} was verified as published by {signer!r}; its update "
                    f"must be signed by {signer!r} too"
                ]
            )
        return self._admit(
            package,
            grants=grants,
            fuel=fuel,
            timeout_ms=timeout_ms,
            replacing=old,
            runtime=runtime,
        )

    def _admit(
        self,
        package: Package,
        *,
        grants: Iterable[str] | None,
        fuel: int | None,
        timeout_ms: int | None,
        replacing: Extension | None = None,
        runtime: str | None = None,
    ) -> Extension:
        check_package(package)
        grants = grant_names(grants)  # once: the plan and the grant table's record read it
        name = package.name
        with self._lock:
            if self.closed:
                raise ConfigError("this host is closed")
            current = self._extensions.get(name)
            if replacing is None and current is not None:
                raise AdmissionError(
                    [
                        f"extension id {name!r} is already admitted; close it first or "
                        "replace it with Host.update()"
                    ]
                )
            if name in self._admitting or current is not replacing:
                raise AdmissionError(
                    [f"extension id {name!r} is being admitted or was replaced meanwhile"]
                )
            # Reserved until this admission ends, so that one id is never admitted twice.
            self._admitting.add(name)
            # What this extension is admitted against stays as it is (no entry added later).
            self.registry.seal()
        try:
            ext = self._build(package, grants, fuel, timeout_ms, replacing, runtime)
            with self._lock:
                closed = self.closed
                if not closed:
                    self._extensions[name] = ext
            if closed:
                ext.close("the host closed during its admission")
                raise ConfigError("this host is closed")
        finally:
            with self._lock:
                self._admitting.discard(name)
        if self._metrics_publisher is not None:  # operator metrics hook: publish from now on
            self._metrics_publisher.start()
        return ext

    def _build(
        self,
        package: Package,
        grants: Iterable[str] | None,
        fuel: int | None,
        timeout_ms: int | None,
        replacing: Extension | None,
        runtime: str | None = None,
    ) -> Extension:
        if self.state is not None:
            # Bound to the id's kept grants, data and storage rows from here: only as the
            # publisher they belong to (a package loaded from a path took them with no check).
            self.state.check_heir(package.name, package.signer)
        # The extension holds its id's grant record from here to its close (GrantTable.hold);
        # an admission that fails lets go of it here.
        if self.presence is not None:  # refused while another host updates it
            self.presence.enter(package.name)
        self.grants.hold(package.name)
        self.supervisor.opened(package.name)
        try:
            return self._build_held(package, grants, fuel, timeout_ms, replacing, runtime)
        except BaseException:
            self.grants.release(package.name)
            if self.presence is not None:
                self.presence.leave(package.name)
            raise

    def _build_held(
        self,
        package: Package,
        grants: Iterable[str] | None,
        fuel: int | None,
        timeout_ms: int | None,
        replacing: Extension | None,
        runtime: str | None,
    ) -> Extension:
        steps = [("verify package", f"sha256 {package.sha256[:16]}")]
        mode = resolve_runtime(package, runtime, self.policy)
        plan, grant, resources = self.plan(package, grants=grants, fuel=fuel, timeout_ms=timeout_ms)
        held_before = frozenset(self.grants.state(package.name).entries)
        if (
            self.state is not None
            and grants is not None
            and self._write_load_grants(package.name, frozenset(grants) - held_before)
        ):
            # Planned again on the table as written: its epoch is the one calls check.
            plan, grant, resources = self.plan(package, fuel=fuel, timeout_ms=timeout_ms)
        native = is_native(package)
        try:
            grow_probed = False
            backend = self.backend_for(NATIVE_RUNTIME if native else mode)
            if plan.is_command:
                compiled, grow_probed = self._compile_command(package, backend)
            else:
                compiled = backend.compile(package.wasm, package.sha256)
        except CallError as exc:
            raise AdmissionError([exc.message]) from None
        if replacing is not None:
            # Everything that can refuse the update has passed: the old extension goes.
            version = package.manifest.version if package.manifest else "a bare module"
            replacing.close(f"replaced by {version}")
        if self.state is None:
            # A stateless host's grant table records what the load gives (before the policy,
            # which the grant rule applies live: a policy allowing more later widens it), so
            # that revocations and the commit-time check work as with durable state.
            chosen = load_choice(package, grants)
            epoch = self.grants.reset(package.name, chosen)
            grant = Grant(grant.capabilities, epoch)
            # Over the whole record, not only what the policy allows now: a policy allowing
            # more later gives what the load chose, with the load's origin.
            origin = GrantOrigin.MANIFEST if grants is None else GrantOrigin.LOAD
            origins = dict.fromkeys(chosen, origin)
            if package.manifest is not None:  # required: given whatever the load names
                origins.update(dict.fromkeys(package.manifest.required, GrantOrigin.MANIFEST))
        else:
            loaded = frozenset(grants or ()) - held_before
            origins = {
                c: GrantOrigin.LOAD if c in loaded else GrantOrigin.GRANT
                for c in self.grants.state(package.name).entries
            }
        steps += [
            ("check revocation state", "not revoked"),
            ("load manifest", package.manifest.id if package.manifest else "bare module"),
            ("resolve ABI compatibility", plan.view.label),
            ("load active grants", ", ".join(sorted(grant.capabilities)) or "none"),
            ("choose runtime", f"{mode} (native plugin)" if native else mode),
            (
                "apply resource policy",
                f"fuel {resources.fuel_per_call}, "
                f"{resources.timeout_ms} ms, {resources.max_memory_bytes} B"
                + (
                    f" (policy ceilings: {', '.join(sorted(self.policy.ceilings))})"
                    if self.policy.ceilings
                    else ""
                ),
            ),
        ]
        ext = Extension(
            self, package, plan, grant, resources, compiled, backend, grow_probed=grow_probed
        )
        ext.runtime = mode
        ext.admitted_grants(origins, grant.epoch)
        for step, detail in steps:
            ext.record_step(step, detail)
        return ext

    def _compile_command(
        self, package: Package, backend: ExecutionBackend
    ) -> tuple[CompiledModule, bool]:
        """A plain command compiled with its memory.grow refusals recorded (growprobe), so
        that a run that fails after one names the memory limit; and whether it was probed
        (only then is the probe's global the host's to read: a module that exports its name
        itself is compiled as it is, and what its global holds is the guest's word)."""
        from ..core.growprobe import probe_refused_grows

        if hashlib.sha256(package.wasm).hexdigest() != package.sha256:
            raise CallError(
                FailureClass.ADMISSION, "the package's sha256 does not match its module bytes"
            )
        probed = probe_refused_grows(
            package.wasm, read_header_cached(package.wasm), backend.validates
        )
        return backend.compile(probed), probed is not package.wasm

    def backend_for(self, runtime: str) -> ExecutionBackend:
        """Where extensions of the runtime mode ``runtime`` run (host/backend.py): this host's
        engine in this process, or a walled child per instance (engine/process.py), with or
        without the in-process fallback for a child that cannot start; ``native-process``:
        native plugins, each instance a walled child executing the plugin
        (engine/native_plugins.py)."""
        if runtime == IN_PROCESS:
            return self.engine
        if runtime not in (PREFER_PROCESS, PROCESS_ONLY, NATIVE_RUNTIME):
            raise ConfigError(f"this host runs no {runtime!r} extensions")
        with self._lock:
            backend = self._process_backends.get(runtime)
            if backend is None:
                if runtime == NATIVE_RUNTIME:
                    from ..engine.native_plugins import NativeBackend

                    backend = NativeBackend(self.engine)
                else:
                    from ..engine.process import ProcessBackend

                    backend = ProcessBackend(self.engine, fallback=runtime == PREFER_PROCESS)
                self._process_backends[runtime] = backend
            return backend

    def extension(self, extension: str) -> Extension | None:
        if not isinstance(extension, str):
            raise ConfigError(f"an extension id is a string, not {type(extension).__name__}")
        with self._lock:
            return self._extensions.get(extension)

    # -- grants ---------------------------------------------------------------------------

    def _check_operator_id(self, extension: object) -> None:
        """An operator action's id: one an extension admitted here has (a bare module's file
        stem may hold any character but '/'), or one that passes :func:`check_extension_id`."""
        if isinstance(extension, str):
            with self._lock:
                if extension in self._extensions:
                    return
        check_extension_id(extension)

    def grant(self, extension: str, capability: str, scope: Mapping[str, Any] | None = None) -> int:
        self._check_operator_id(extension)
        self.sync_grants()  # a change is made to what another host may have changed since
        if not isinstance(capability, str) or (
            capability not in self.registry.capabilities()
            and not self._requested_application(extension, capability)
        ):
            raise ConfigError(f"unknown capability {capability!r}")
        if capability.startswith("wasi."):
            from ..wasi.scopes import check_scope as check_wasi_scope

            check_wasi_scope(capability, scope or {})
        else:
            self.functions.check_scope(capability, scope or {})
        unrequested = self._not_requested(extension, capability)
        before = self.grants.epoch(extension)
        epoch = self.grants.grant(extension, capability, scope)
        # A grant it already holds, with the same scope, changes nothing (the epoch stays):
        # an application that grants at every start would otherwise grow the journal by a
        # line per start.
        if epoch != before:
            detail = f"{capability} scope {scope or {}} epoch {epoch}"
            if unrequested:
                detail += " (not requested by the running version's manifest: no effect yet)"
            self.journal(extension, "grant", detail)
        return epoch

    def _not_requested(self, extension: str, capability: str) -> bool:
        """Whether the extension admitted here under ``extension`` has a manifest that does not
        request ``capability``: the grant rule (requested ∩ granted ∩ allowed) gives it
        nothing. A host without a state directory refuses such a grant (its table is the
        admission's, and a later version is admitted with its own answer); with one, it is
        kept for a later version that requests it, and the journal says it does nothing yet."""
        ext = self.extension(extension)
        manifest = ext.manifest if ext is not None else None
        if manifest is None or capability in manifest.required | manifest.optional:
            return False
        if self.state is None:
            raise ConfigError(
                f"{extension}'s manifest does not request {capability!r}, so a grant of it "
                "would give it nothing: list it in extension.toml's [capabilities] optional "
                "(and enable the guest SDK's feature for it), then load the new version"
            )
        return True

    def _write_load_grants(self, extension: str, capabilities: frozenset[str]) -> bool:
        """A load's ``grants`` on a host with a state directory: written to the grant table as
        :meth:`grant` writes them (durable and journalled), after the plan that checked them
        against the manifest being loaded passed (so not against the version running, which
        an update replaces). Whether any was new."""
        if capabilities:
            self.sync_grants()  # as Host.grant: never write over another host's change
        for capability in sorted(capabilities):
            epoch = self.grants.grant(extension, capability)
            self.journal(extension, "grant", f"{capability} scope {{}} epoch {epoch} (load)")
        return bool(capabilities)

    def _requested_application(self, extension: str, capability: str) -> bool:
        """Whether ``capability`` is an application capability this host does not serve that
        the installed ``extension``'s manifest requests: an operator grants it here (the
        ``wasihost grants`` command), and the application's host, which serves it, reads the
        grant. Any other capability this host does not know is a mistake."""
        if self.state is None or not is_application_capability(capability):
            return False
        installed = self.state.package(extension)
        if installed is None:
            return False
        from . import updates

        try:
            return capability in updates.installed_requests(self, installed)
        except WasihostError:
            return False

    def revoke(self, extension: str, capability: str | None = None, reason: str = "") -> int:
        """Withdraw a capability (the extension's next host call using it fails), or with
        ``capability=None`` revoke the extension as a whole: its running call is interrupted
        and it runs nothing more until reinstated. Its data is kept."""
        self._check_operator_id(extension)
        if capability is not None and not isinstance(capability, str):
            raise ConfigError(
                f"capability must be a string or None, not {type(capability).__name__}"
            )
        check_reason(reason)  # before anything changes: the grant table and the journal keep it
        self.sync_grants()
        before = self.grants.current(extension)
        epoch = self.grants.revoke(extension, capability, reason)
        self.journal(
            extension, "revoke", f"{capability or 'everything'} epoch {epoch} {reason}".strip()
        )
        ext = self.extension(extension)
        if capability is None:
            if ext is not None:
                ext.on_revoked(reason or "revoked by the operator")
            elif self.state is not None:
                self.state.record_state(extension, State.REVOKED.value, reason or None)
        if ext is not None:
            # What the brokers keep under the capability (subscriptions, jobs) ends now, not
            # at its next use: a grant given again before then kept it (issue 28, 18-19).
            ext.withdraw(withdrawn(before, self.grants.current(extension)))
        return epoch

    def update_policy(self, policy: Policy) -> None:
        """A security-policy change: every grant epoch is bumped, so nothing authorised under
        the old policy commits under the new one, and each extension re-evaluates its grant
        (requested ∩ granted ∩ the new policy) before its next call."""
        if not isinstance(policy, Policy):
            # Checked before the host changes: a policy of None once stayed in place and
            # broke every later load with an AttributeError.
            raise ConfigError(f"update_policy takes a Policy, not {type(policy).__name__}")
        dropped = frozenset(self.policy.allow) - frozenset(policy.allow)
        self.policy = policy
        with self._lock:
            live = list(self._extensions.values())
        for ext in live:
            self.governor.rebudget(ext)  # budgets: new ceilings and actions at once
        names = set(self.grants.known())
        if self.state is not None:
            names.update(self.state.extensions())
        for name in sorted(names):
            epoch = self.grants.bump(name)
            self.journal(name, "policy", f"security policy updated, epoch {epoch}")
        # What the brokers keep under a capability no longer allowed (subscriptions, jobs,
        # file handles) ends now. After the bump: a call authorised under the old policy that
        # adds to it commits through the grant table, so it is refused from here on, or it
        # committed before and is ended here (withdrawn before the bump, a subscribe or an
        # open in flight added its own after the withdrawal, and it survived).
        for ext in live:
            ext.withdraw(dropped)

    # -- the revocation list, for what is running ----------------------------------------------

    def _floor(self) -> VersionFloor:
        """This host's revocation-list version floor, one for the host's life. Made on first
        use: a host without a revocation list never imports the list's code."""
        floor = self._revocation_floor
        if floor is None:
            from ..packaging.revocation import MemoryFloor, StateFloor

            with self._floor_lock:  # two first users must share one floor
                floor = self._revocation_floor
                if floor is None:
                    floor = StateFloor(self.state) if self.state is not None else MemoryFloor()
                    self._revocation_floor = floor
        return floor

    def refresh_revocations(self) -> dict[str, str]:
        """Read the policy's revocation list now and disable every admitted extension it
        revokes (its call in flight is interrupted; the revocation is durable). Returns the
        ids disabled, each with why. A stale, unverifiable or rolled-back list raises its
        :class:`~wasihost.core.errors.RevocationError`, and until a good list is read every
        committing host call is refused (fail closed)."""
        revocations = self.policy.revocations
        if revocations is None:
            return {}
        try:
            current = revocations.current(revocations.floor or self._floor())
        except RevocationError as exc:
            self._revocation_verdict = (time.monotonic(), str(exc))
            raise
        self._revocation_verdict = (time.monotonic(), None)
        with self._lock:
            extensions = list(self._extensions.values())
        disabled = {}
        for ext in extensions:
            why = current.revocation_of(ext.package)
            if why is not None:
                self.disable(ext.id, clip_reason(f"{why} by the revocation list"))
                disabled[ext.id] = why
        return disabled

    def sync_grants(self) -> list[str]:
        """Adopt the grant changes another host (another process on the same state
        directory: ``wasihost grants``) wrote for the extensions admitted here: each whose
        durable epoch is newer than the one in memory takes the durable grant, so its calls
        in flight commit nothing more under the old epoch; one now revoked as a whole is
        interrupted as :meth:`disable` does. Returns the ids changed. Nothing without a state
        directory."""
        store = self.state
        if store is None:
            return []
        self._grants_synced_at = time.monotonic()
        with self._lock:
            live = {ext.id: ext for ext in self._extensions.values()}
        changed = []
        for extension, epoch in store.grant_epochs(sorted(live)).items():
            held = self.grants.current(extension)
            if held is None or epoch <= held.epoch:
                continue
            durable = store.load_grants(extension)
            if durable is None or not self.grants.adopt(extension, durable):
                continue
            changed.append(extension)
            if durable.revoked is not None and held.revoked is None:
                live[extension].on_revoked(durable.revoked)
            # Revoked by the other host, or revoked and granted again there since the last
            # look (a new since_epoch): what the brokers keep under it ends.
            live[extension].withdraw(withdrawn(held, durable))
        return changed

    def revocations_allow_commit(self) -> bool:
        """Before a host call commits an effect: with a state directory, adopt what other
        hosts changed in the grant table if it was read more than ``GRANT_SYNC_S`` ago
        (:meth:`sync_grants`); re-read the revocation list if it was read more than
        ``REVOCATION_RECHECK_S`` ago (disabling what it now revokes), and say whether the last
        read verified. Always true without a list."""
        if self.state is not None and time.monotonic() - self._grants_synced_at >= GRANT_SYNC_S:
            try:
                self.sync_grants()
            except WasihostError:
                return False  # the durable grants cannot be read: commit nothing (fail closed)
        if self.policy.revocations is None:
            return True
        at, problem = self._revocation_verdict
        if time.monotonic() - at >= REVOCATION_RECHECK_S:
            try:
                self.refresh_revocations()
            except RevocationError:
                return False
            at, problem = self._revocation_verdict
        return problem is None

    # -- supervision --------------------------------------------------------------------------

    def release(self, extension: str) -> None:
        """Let a quarantined extension out: it is stopped, its restart budget starts afresh,
        and its next call starts it."""
        self._check_operator_id(extension)
        ext = self.extension(extension)
        if ext is None:
            raise ConfigError(f"{extension} is not admitted")
        # The lifecycle first: it refuses an extension that is not quarantined, whose budget
        # and backoff must then stay as they are (red-team 2026-12-01: a release refused for a
        # failed extension had already cleared them, ending its backoff and its crash loop's
        # count).
        ext.release()
        self.supervisor.release(extension)
        self.journal(extension, "release", "released from quarantine")

    def quarantine_report(self, extension: str) -> QuarantineReport:
        """Why ``extension`` is quarantined, its recent crashes, what data it keeps, and what
        the operator can do."""
        self._check_operator_id(extension)
        if self.state is not None:
            kept = self.state.remaining_data(extension)
            storage = (
                f"{kept['storage_bytes']} bytes in {kept['storage_entries']} storage entries"
                if kept["storage_error"] is None
                else "storage that cannot be read now"
            )
            remains = (
                f"{kept['data_bytes']} bytes of files, {storage}, {kept['active_grants']} "
                f"grants, {kept['journal_events']} journal events"
            )
        else:
            remains = "nothing durable: this host has no state directory"
        todo = (
            f"fix and update it (wasihost update PKG), release it as it is "
            f"(Host.release({extension!r})), or remove it (wasihost remove {extension})"
        )
        return self.supervisor.report(extension, remains, todo)

    def metrics(self) -> Metrics:
        """Counts for operators: extensions by lifecycle state, crashes by class, restarts,
        quarantines, restarts refused during a backoff, host-call statuses and failures by
        class, and the call scheduler's counts. Nothing about user content."""
        with self._lock:
            extensions = list(self._extensions.values())
        states = collections.Counter(ext.lifecycle.state.value for ext in extensions)
        fired, refusals = self.governor.counts()  # budgets
        errors = self.host_call_tally.snapshot()
        return attrs.evolve(
            self.supervisor.metrics(states),
            budget_actions=fired,
            throttle_refusals=refusals,
            throttle_delays=self.governor.delays(),
            host_call_errors={"statuses": errors.statuses, "failures": errors.failures},
            scheduler=self.scheduler.stats().to_json() if self.scheduler is not None else {},
        )

    def usage(self, extension: str) -> Usage:
        """budgets: ``extension``'s usage now beside its budget, a frozen snapshot."""
        self._check_operator_id(extension)
        ext = self.extension(extension)
        if ext is None:
            raise ConfigError(f"{extension} is not admitted")
        return ext.usage()

    def publish_metrics(self) -> bool:
        """Write :meth:`metrics` into the state directory now, for ``wasihost status --json``
        in another process (a live host also does every couple of seconds, and as it closes).
        False without a state directory, or with nothing counted yet."""
        if self._metrics_publisher is None:
            return False
        return self._metrics_publisher.publish()

    def disable(self, extension: str, reason: str = "emergency disable") -> int:
        """Emergency stop: revoke everything and interrupt the call in flight."""
        return self.revoke(extension, None, reason)

    def reinstate(self, extension: str) -> int:
        self._check_operator_id(extension)
        self.sync_grants()
        epoch = self.grants.reinstate(extension)
        self.journal(extension, "reinstate", f"epoch {epoch}")
        if self.state is not None:
            self.state.record_state(extension, State.STOPPED.value, "reinstated")
        return epoch


__all__ = [
    "Extension",
    "Host",
    "ProfileBinding",
    "ProfileFactory",
    "default_cache_dir",
    "plan_package",
]
