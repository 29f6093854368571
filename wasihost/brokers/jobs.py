"""The jobs broker: a guest schedules background jobs, and the host runs each as one of the
guest's own commands, on worker threads the broker owns, under the budget of the manifest's
``[jobs]`` table.

Three kinds (docs/jobs.md): one-shot (``delay_ms``), periodic (``every_ms``, at least
:data:`MIN_PERIOD_MS`) and event-driven (``on_event``: a run for each event of that class the
embedder publishes, through :meth:`JobsBroker.trigger` or :meth:`Host.publish`). Every run is
an ordinary :meth:`Extension.call` with the fuel and deadline lowered to the ``[jobs]``
budget, so no run outlives its deadline. A job has at most one run queued or running: a tick
or event meanwhile is skipped and counted, so nothing piles up behind a slow job. Before each
run the broker looks at the extension: a paused, throttled, quarantined or stopping one skips
the run (counted); a revoked or closed one, or one no longer granted ``jobs``, loses its jobs.
A failed run is recorded and counted, never retried: the job keeps its schedule.

Time comes from an injectable :class:`JobClock`. With the system clock a timer thread calls
:meth:`JobsBroker.tick` when a job is due; with an injected clock (a :class:`ManualClock` in
tests) nothing ticks by itself and the caller calls :meth:`tick` after moving the clock.

Lock order, as in the events broker: the grant table's lock may be held when ``self._cond`` is
taken (a schedule commits through the grant table), never the other way round.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from ..core.budgets import Resource
from ..core.call_ticket import CallTicket
from ..core.codec import CodecLimits, decode, encode
from ..core.errors import CodecError, ConfigError
from ..core.event_classes import MAX_CLASS_CHARS, covered, is_class, is_selector, matches
from ..core.lifecycle import State
from ..core.serving import refuse_any_scope
from ..core.status import HostStatus, Status
from ..core.terminal import printable
from . import run_allowance
from .dispatch import ExtensionDispatcher
from .events import CAPABILITY as EVENTS_CAPABILITY
from .events import MAX_LOOKS, PAYLOAD_LIMITS, ExtensionEvents, _failure_text, _same
from .failure_log import FailureLogGate
from .run_allowance import NetworkAllowance

if TYPE_CHECKING:
    from ..core.manifest_tables import JobsSpec
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

LOG = logging.getLogger("wasihost")

CAPABILITY: Final = "jobs"

# The policy minimum period: a periodic job runs at most once a second, so one extension's
# upkeep (at most MAX_JOBS_PER_EXTENSION jobs) cannot turn into a busy loop on the host's
# workers however small a period the guest asks for.
MIN_PERIOD_MS: Final = 1_000
# The same floor for a timed job scheduled by one of its extension's own job runs: a run that
# schedules a one-shot (or a periodic job's first run) with no delay, every time, is a
# periodic job with no period, which MIN_PERIOD_MS exists to refuse (it kept a worker busy at
# thousands of runs a second). Schedules from ordinary calls keep their delay.
MIN_RESCHEDULE_MS: Final = MIN_PERIOD_MS
# A day: the longest period or delay. A plugin that needs longer keeps its own calendar.
MAX_PERIOD_MS: Final = 24 * 3600 * 1000
MAX_DELAY_MS: Final = MAX_PERIOD_MS
# A job's input is a reminder of what to do, not data to process: 4 KiB, encoded once at
# schedule and kept with the job (so one extension pins at most 32 jobs x 4 KiB).
MAX_JOB_INPUT_BYTES: Final = 4096
# And at most this many CBOR data items: every run decodes the input and encodes it again in
# the command's input, work no fuel pays for (the run's fuel is the guest's own), about 0.8 us
# an item. At the codec's 4,096 items, 32 periodic jobs with inputs of 4,080 empty arrays kept
# 12.4% of a core busy for good (0.6% with no input), for fuel the minute's budget hardly saw
# (red-team 2026-12-01); 128 items is any reminder's structure.
MAX_JOB_INPUT_ITEMS: Final = 128
INPUT_LIMITS: Final = CodecLimits(max_bytes=MAX_JOB_INPUT_BYTES, max_items=MAX_JOB_INPUT_ITEMS)
# Worker threads per broker (one broker per host): jobs are background work, so two threads
# leave the machine to the interactive calls; each run is bounded by its max_runtime_ms.
MAX_JOB_THREADS: Final = 2
# How long shutdown() waits for the workers when its caller gives no deadline: the host
# closes the extensions first, so a worker is at most one epoch tick from done.
DEFAULT_STOP_S: Final = 5.0
# The timer thread re-reads its clock at least this often, so a job scheduled while it waits
# is never late by more than this even if a wake-up were lost.
MAX_TIMER_WAIT_S: Final = 1.0
# Lifecycle states in which a job's run is skipped (the jobs stay) and those that end them.
INACTIVE_STATES: Final = frozenset(
    {State.PAUSED, State.THROTTLED, State.QUARANTINED, State.STOPPING}
)
ENDING_STATES: Final = frozenset({State.REVOKED, State.CLOSED})

_REQUEST_KEYS: Final = frozenset({"command", "input", "every_ms", "delay_ms", "on_event"})


class JobClock(Protocol):
    """Where the broker reads the time: seconds on a monotonic scale."""

    def monotonic(self) -> float: ...


class SystemJobClock:
    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told (for tests: no sleeping)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ConfigError("a monotonic clock does not go back")
        self._now += seconds


@attrs.frozen
class JobStats:
    """A snapshot of one job (``JobsBroker.stats``). Counts are since it was scheduled."""

    id: int
    command: str
    kind: str  # "once", "every" or "event"
    every_ms: int | None
    on_event: str | None
    runs: int  # runs that completed
    failed: int  # runs that failed (trap, deadline, refused...)
    skipped: int  # ticks or events skipped: a run still going, or the extension inactive
    last_failure: str | None


class Job:
    """One scheduled job. Mutable fields change under the broker's lock."""

    def __init__(
        self,
        job_id: int,
        command: str,
        data: bytes,
        *,
        due: float | None,
        every_s: float | None,
        on_event: str | None,
    ) -> None:
        self.id = job_id
        self.command = command
        self.data = data
        self.due = due
        self.every_s = every_s
        self.on_event = on_event
        self.outstanding = False  # a run is queued or running
        self.runs = self.failed = self.skipped = 0
        self.pending_skipped = 0  # reported to the next run, then restarted
        self.last_failure: str | None = None
        self.ended = False
        # When a failure may next go to the host's log (at most once an interval).
        self.failure_log = FailureLogGate()

    @property
    def kind(self) -> str:
        if self.on_event is not None:
            return "event"
        return "every" if self.every_s is not None else "once"

    def skip(self) -> None:
        self.skipped += 1
        self.pending_skipped += 1

    def stats(self) -> JobStats:
        return JobStats(
            id=self.id,
            command=self.command,
            kind=self.kind,
            every_ms=round(self.every_s * 1000) if self.every_s is not None else None,
            on_event=self.on_event,
            runs=self.runs,
            failed=self.failed,
            skipped=self.skipped,
            last_failure=self.last_failure,
        )


@attrs.frozen
class Run:
    """One run on its way to a worker: the job, and the event that triggered it if any."""

    job: Job = attrs.field(eq=False)
    event: tuple[str, bytes] | None


class ExtensionJobs:
    """The jobs of one extension and its runs waiting for a worker (one runs at a time)."""

    def __init__(self, ext: ExtensionView) -> None:
        self.ext = ext
        manifest = ext.manifest
        self.spec: JobsSpec | None = manifest.jobs if manifest is not None else None
        self.jobs: dict[int, Job] = {}
        self.ids = itertools.count(1)
        self.runs: collections.deque[Run] = collections.deque()
        self.closed = False
        self.scheduled = False  # in the ready queue or running
        # What an event-driven job may listen to is what a subscription may: shared with the
        # events broker so the two can never disagree.
        self.events = ExtensionEvents(ext)

    def granted(self) -> bool:
        """Whether the extension still holds ``jobs`` (consults the grant table: never call
        it under the broker's lock)."""
        ext = self.ext
        host = ext.host
        state = host.grants.current(ext.id) or host.grants.state(ext.id)
        granted = CAPABILITY in state.entries and CAPABILITY in host.policy.allow
        return state.revoked is None and granted

    def end_all(self) -> None:
        for job in self.jobs.values():
            job.ended = True
        self.jobs.clear()
        self.runs.clear()

    def end_event_driven(self) -> None:
        """End the jobs run by events, with their queued runs (``events`` was withdrawn)."""
        for job_id, job in list(self.jobs.items()):
            if job.on_event is not None:
                job.ended = True
                del self.jobs[job_id]
        self.runs = collections.deque(run for run in self.runs if not run.job.ended)


def _uint(request: dict[Any, Any], key: str, low: int, high: int) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise HostStatus(Status.INVALID_ARGUMENT)
    return value


class JobsBroker(ExtensionDispatcher["ExtensionJobs", "Run"]):
    """Serves ``jobs_schedule`` and ``jobs_cancel`` and runs the jobs on worker threads it
    owns (stopped by :meth:`shutdown`, which the host calls when it closes)."""

    name = "jobs"
    functions = ("wasihost_v1.jobs_schedule", "wasihost_v1.jobs_cancel")
    capabilities = frozenset({CAPABILITY})


    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        refuse_any_scope(capability, scope)
    def __init__(
        self, *, clock: JobClock | None = None, max_threads: int = MAX_JOB_THREADS
    ) -> None:
        if type(max_threads) is not int or not 1 <= max_threads <= MAX_JOB_THREADS:
            raise ConfigError(f"max_threads must be an int in 1..{MAX_JOB_THREADS}")
        super().__init__("wasihost-jobs", max_threads)
        # Only the system clock gets a timer thread: an injected clock is ticked by its owner.
        self._timed = clock is None
        self.clock: JobClock = clock if clock is not None else SystemJobClock()
        self._states: dict[ExtensionJobs, None] = {}
        self._timer: threading.Thread | None = None
        self.runs = 0
        self.skipped = 0
        # The extension whose job this worker thread is running (its ``ExtensionJobs``), so a
        # schedule made from inside that run is told apart (see MIN_RESCHEDULE_MS).
        self._running = threading.local()

    # -- Broker protocol ---------------------------------------------------------------------

    def open(self, ext: ExtensionView) -> ExtensionJobs:
        state = ExtensionJobs(ext)
        with self._cond:
            self._states[state] = None
        return state

    def usage(self, state: ExtensionJobs) -> dict[str, int]:
        """budgets: the jobs the extension holds now (Extension.usage)."""
        with self._cond:
            return {"background_jobs": len(state.jobs)}

    def close(self, state: ExtensionJobs) -> None:
        with self._cond:
            state.closed = True
            state.end_all()
            self._states.pop(state, None)
            self._cond.notify_all()

    def withdraw(self, state: ExtensionJobs, capabilities: frozenset[str]) -> None:
        """``jobs`` was withdrawn (Extension.withdraw): every job ends now, its queued run
        with it, so a grant given again later starts with none. ``events`` was: the
        event-driven jobs end, as the subscriptions do (an event-driven job is one, run as a
        command), and a grant of ``events`` given again later revives none."""
        if CAPABILITY in capabilities:
            with self._cond:
                state.end_all()
                self._cond.notify_all()
        elif EVENTS_CAPABILITY in capabilities:
            with self._cond:
                state.end_event_driven()
                self._cond.notify_all()

    def handler(self, entry: HostFunction, state: ExtensionJobs) -> Callable[[Any, Any], Any]:
        if entry.name == "jobs_schedule":
            return self._schedule_handler(entry, state)
        if entry.name == "jobs_cancel":
            return self._cancel_handler(entry, state)
        raise ConfigError(f"the jobs broker does not serve {entry.qualified_name}")

    def _schedule_handler(
        self, entry: HostFunction, state: ExtensionJobs
    ) -> Callable[[Any, Any], Any]:
        def handle(call: Any, request: Any) -> int:
            if (
                not isinstance(request, dict)
                or not set(request) <= _REQUEST_KEYS
                or not isinstance(request.get("command"), str)
            ):
                raise HostStatus(Status.INVALID_ARGUMENT)
            every_ms = _uint(request, "every_ms", MIN_PERIOD_MS, MAX_PERIOD_MS)
            delay_ms = _uint(request, "delay_ms", 0, MAX_DELAY_MS)
            on_event = request.get("on_event")
            if on_event is not None and (
                not is_selector(on_event) or every_ms is not None or delay_ms is not None
            ):
                raise HostStatus(Status.INVALID_ARGUMENT)
            if on_event is None and every_ms is None and delay_ms is None:
                raise HostStatus(Status.INVALID_ARGUMENT)
            try:
                data = encode(request.get("input"), INPUT_LIMITS)
            except CodecError:
                raise HostStatus(Status.INVALID_ARGUMENT) from None
            spec = state.spec
            command = request["command"]
            if spec is None or command not in spec.commands:
                raise HostStatus(Status.DENIED)
            if on_event is not None:
                allowed = state.events.allowed()
                if allowed is None or not covered(allowed, on_event):
                    raise HostStatus(Status.DENIED)
            now = self.clock.monotonic()
            if every_ms is not None:
                first = delay_ms if delay_ms is not None else every_ms
                due: float | None = now + first / 1000
            else:
                due = now + delay_ms / 1000 if delay_ms is not None else None
            if due is not None and getattr(self._running, "state", None) is state:
                due = max(due, now + MIN_RESCHEDULE_MS / 1000)
            every_s = every_ms / 1000 if every_ms is not None else None

            def add() -> int | None:
                with self._cond:
                    if state.closed or self._stopping or len(state.jobs) >= spec.max_jobs:
                        return None
                    job_id = next(state.ids)
                    state.jobs[job_id] = Job(
                        job_id, command, data, due=due, every_s=every_s, on_event=on_event
                    )
                    if due is not None:
                        self._start_timer()
                        self._cond.notify_all()
                    return job_id

            authorised, added = state.ext.commit(entry.capability, add)
            if not authorised:
                raise HostStatus(Status.DENIED)
            if added is None:
                if state.closed or self._stopping:
                    raise HostStatus(Status.UNAVAILABLE)
                # budgets: the background_jobs level refused one; its action fires.
                ext = state.ext
                ext.host.governor.level_crossed(
                    ext,
                    Resource.BACKGROUND_JOBS,
                    spec.max_jobs,
                    spec.max_jobs,
                    "a job was refused: the extension holds its maximum",
                    in_call=True,
                )
                raise HostStatus(Status.QUOTA_EXCEEDED)
            return added

        return handle

    def _cancel_handler(
        self, entry: HostFunction, state: ExtensionJobs
    ) -> Callable[[Any, Any], Any]:
        def handle(call: Any, request: Any) -> bool:
            if type(request) is not int or request < 0:
                raise HostStatus(Status.INVALID_ARGUMENT)

            def remove() -> bool:
                with self._cond:
                    job = state.jobs.pop(request, None)
                    if job is None:
                        return False
                    job.ended = True
                    return True

            authorised, removed = state.ext.commit(entry.capability, remove)
            if not authorised:
                raise HostStatus(Status.DENIED)
            return bool(removed)

        return handle

    # -- time and events -----------------------------------------------------------------------

    def tick(self) -> int:
        """Queue a run of every job due by the clock now; returns how many were queued. A
        periodic job whose previous run is still queued or running skips this tick (counted),
        and so does each whole period the clock jumped over."""
        now = self.clock.monotonic()
        queued = 0
        with self._cond:
            if self._stopping:
                return 0
            for state in self._states:
                for job in list(state.jobs.values()):
                    if job.due is None or job.due > now:
                        continue
                    if job.every_s is None:
                        del state.jobs[job.id]  # a one-shot runs (or is skipped) once
                        job.due = None
                    else:
                        late = int((now - job.due) // job.every_s)
                        for _ in range(late):
                            job.skip()
                            self.skipped += 1
                        job.due += (late + 1) * job.every_s
                    queued += self._offer(state, Run(job, None))
        return queued

    def next_due(self) -> float | None:
        """When the next job is due, on the broker's clock (None: no timed job)."""
        with self._cond:
            return self._next_due()

    def _next_due(self) -> float | None:
        dues = [j.due for s in self._states for j in s.jobs.values() if j.due is not None]
        return min(dues) if dues else None

    def trigger(self, event_class: str, payload: Any = None) -> int:
        """Queue a run of every event-driven job listening to ``event_class`` (and whose
        extension may still receive it); returns how many were queued. :meth:`Host.publish`
        calls this for every event it publishes."""
        if not is_class(event_class):
            raise ConfigError(
                f"event class {str(event_class)[:40]!r} is not [a-z][a-z0-9_.-]* of at most "
                f"{MAX_CLASS_CHARS} characters"
            )
        try:
            data = encode(payload, PAYLOAD_LIMITS)
        except CodecError as exc:
            raise ConfigError(f"event payload: {exc.message}") from None
        with self._cond:
            if self._stopping:
                return 0
            listening = [
                s
                for s in self._states
                if any(
                    j.on_event is not None and matches(j.on_event, event_class)
                    for j in s.jobs.values()
                )
            ]
        queued = 0
        for _ in range(MAX_LOOKS):
            # The grant table is consulted outside the broker's lock (see the lock order
            # above): a look no longer current when the lock is taken is taken again, as the
            # events broker's publish does (a stale look queued a run for a class the grant
            # had stopped covering meanwhile).
            views = [(s, s.events.stamp(), s.events.allowed()) for s in listening]
            stale: list[ExtensionJobs] = []
            with self._cond:
                for state, stamp, allowed in views:
                    if not _same(stamp, state.events.stamp()):
                        stale.append(state)
                        continue
                    for job in list(state.jobs.values()):
                        if job.on_event is None or not matches(job.on_event, event_class):
                            continue
                        if allowed is None or not covered(allowed, job.on_event):
                            continue  # the operator narrowed the events grant since
                        queued += self._offer(state, Run(job, (event_class, data)))
            if not stale:
                break
            listening = stale
        return queued

    def _offer(self, state: ExtensionJobs, run: Run) -> int:
        """Queue ``run`` unless its job already has one queued or running (caller holds the
        lock); 1 if queued."""
        job = run.job
        if job.outstanding or state.closed:
            job.skip()
            self.skipped += 1
            return 0
        job.outstanding = True
        state.runs.append(run)
        self._schedule(state)
        return 1

    # -- the embedder's side -----------------------------------------------------------------

    def stats(self, extension: str) -> dict[int, JobStats]:
        """The jobs of the extension ``extension`` (by id), as they are now."""
        with self._cond:
            for state in self._states:
                if state.ext.id == extension:
                    return {job_id: job.stats() for job_id, job in state.jobs.items()}
        return {}

    def quiesce(self) -> None:
        """Start nothing new: queued runs are dropped, later schedules answer ``UNAVAILABLE``
        and ticks and events queue nothing; a run in progress finishes (the host's shutdown
        calls this first, then interrupts what still runs at its deadline)."""
        with self._cond:
            self._stopping = True
            for state in self._states:
                state.runs.clear()
            self._ready.clear()
            self._cond.notify_all()

    def shutdown(self, timeout_s: float = DEFAULT_STOP_S) -> None:
        """Stop the workers and the timer (the host calls this when it closes), waiting at
        most ``timeout_s`` for them; every job ends."""
        self.quiesce()
        with self._cond:
            for state in self._states:
                state.end_all()
            self._states.clear()
            threads = [*self._workers, *([self._timer] if self._timer is not None else [])]
            self._workers, self._timer = [], None
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- workers -------------------------------------------------------------------------------

    def _start_timer(self) -> None:
        if self._timed and self._timer is None and not self._stopping:
            self._timer = threading.Thread(
                target=self._time, name="wasihost-jobs-timer", daemon=True
            )
            self._timer.start()

    def _time(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                due = self._next_due()
                wait = MAX_TIMER_WAIT_S if due is None else due - self.clock.monotonic()
                if wait > 0:
                    self._cond.wait(min(wait, MAX_TIMER_WAIT_S))
                    continue
            self.tick()

    def _take(self, state: ExtensionJobs) -> Run | None:
        if not state.runs or state.closed:
            state.runs.clear()
            return None
        return state.runs.popleft()

    def _process(self, state: ExtensionJobs, item: Run) -> None:
        self._run(state, item)

    def _count_failure(self, item: Run) -> None:
        item.job.failed += 1

    def _done(self, state: ExtensionJobs, item: Run) -> bool:
        item.job.outstanding = False
        return bool(state.runs) and not state.closed

    def _run(self, state: ExtensionJobs, run: Run) -> None:
        """Run one job as its command, under the [jobs] budget; any failure is this run's."""
        job = run.job
        ext = state.ext
        lifecycle = ext.lifecycle.state
        if job.ended or state.closed:
            return
        if lifecycle in ENDING_STATES or not state.granted():
            # Revoked, closed, or no longer granted jobs: its jobs end with it.
            with self._cond:
                state.end_all()
            return
        if lifecycle in INACTIVE_STATES:
            with self._cond:
                job.skip()
                self.skipped += 1
            return
        spec = state.spec
        assert spec is not None  # a job exists only with a [jobs] table
        with self._cond:
            if job.ended or state.closed:
                # Ended since the look above (a revocation's withdrawal, while the grant
                # table was consulted: revoked and granted again then, the run went ahead).
                return
            skipped, job.pending_skipped = job.pending_skipped, 0
            number = job.runs + job.failed + 1
        event = None
        if run.event is not None:
            event = {"class": run.event[0], "payload": decode(run.event[1], PAYLOAD_LIMITS)}
        value = {
            "job": job.id,
            "run": number,
            "input": decode(job.data, INPUT_LIMITS),
            "skipped": skipped,
            "event": event,
        }
        # The extension's own budget may have been lowered by a policy since admission.
        resources = ext.resources
        running = self._running
        outer = getattr(running, "state", None)
        running.state = state
        # The run's own memory and network bytes: the command grows linear memory to at most
        # [jobs] max_memory_bytes, and its http requests move at most max_network_bytes.
        memory = spec.max_memory_bytes
        ticket = CallTicket(ext, memory if memory < resources.max_memory_bytes else None)
        network = spec.max_network_bytes
        allowance = None if network is None else NetworkAllowance(ext.id, network)
        try:
            with run_allowance.running(allowance):
                ext.call_cancellable(
                    ticket,
                    job.command,
                    value,
                    fuel=min(spec.fuel, resources.fuel_per_call),
                    timeout_ms=min(spec.max_runtime_ms, resources.timeout_ms),
                )
        except Exception as exc:  # one failed run must not stop the worker
            text = _failure_text(exc)
            now = self.clock.monotonic()
            with self._cond:
                job.failed += 1
                job.last_failure = text
                self.failed += 1
                quiet = job.failure_log.due(now)
            if quiet is not None:
                more = f" ({quiet} failed runs since its last line)" if quiet else ""
                # Escaped, as in the events broker: the text may quote the guest's panic.
                LOG.warning("job %d of %s failed: %s%s", job.id, ext.id, printable(text), more)
            return
        finally:
            running.state = outer
        with self._cond:
            job.runs += 1
            self.runs += 1
