"""asyncio beside the synchronous API: ``await ext.acall(...)`` and ``async with AsyncHost(...)``.

A guest call runs on one of its host's call threads (a bounded pool, :class:`CallWorkers`), never
on the event loop: the loop only waits for a future, so guest code cannot block it. The
synchronous machinery does everything else (the instance pool, budgets, interrupts), so an
async call keeps every guarantee of :meth:`~wasihost.extension.Extension.call`.

Cancellation. Cancelling the task awaiting :func:`call_async` stops the guest of that call
alone: its instance is told to stop (:meth:`~wasihost.engine.Instance.cancel`), the guest traps
at its next epoch tick (a blocking host call wakes at once), the call ends with
:attr:`~wasihost.errors.FailureClass.CANCELLED` and its instance is dropped, never reused; the
extension's lifecycle records no crash. A call still waiting for a thread or an instance never
starts. The awaiting task waits (up to :data:`CANCEL_SETTLE_S`) for the guest to have stopped,
then raises :class:`asyncio.CancelledError`, whose ``__cause__`` is the call's
``CallError(cancelled)`` when the call ended that way. A call that had already finished when
the cancellation arrived (its effects committed) still raises ``CancelledError``: cancellation
says the caller stopped waiting, as everywhere in asyncio.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import CallError, ConfigError, FailureClass
from .extension import CallTicket, Extension, _override
from .hostlog import host_logger
from .lifecycle import State

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from .extension import Handshake
    from .extlog import LogRecord
    from .lifecycle import Lifecycle
    from .policy import Policy
    from .runtime import Host

T = TypeVar("T")

# Threads running guest calls for coroutines, per host. Guest code runs without the GIL, so
# threads beyond the cores only help calls that wait (in async host functions, or for an
# instance); 8 covers a typical host's cores plus a few such waits. Each is an OS thread with
# its own stack (8 MiB reserved by default, of which a call needs max_wasm_stack + 256 KiB).
DEFAULT_CALL_WORKERS = 8
# More threads than this is a configuration mistake, not parallelism: 2 cores or 64, calls
# beyond the cores only queue on the GIL and the CPU.
MAX_CALL_WORKERS = 256
# How long a cancelled task waits for its guest to have stopped before it raises
# CancelledError: an interrupted guest stops within an epoch tick (10 ms by default) and a
# blocking host call wakes at once; a synchronous host function that ignores its wakeup can
# hold the thread longer, and the task does not wait for that.
CANCEL_SETTLE_S = 1.0


class _Job:
    """One piece of work for a call thread, and what to do with its outcome there."""

    __slots__ = ("args", "done", "fn", "queued", "token")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> None:
        self.fn = fn
        self.args = args
        self.done = done
        self.queued = False  # waits in the queue: no thread was free when it started
        # Popped by whichever comes first, a thread starting the job or withdraw(): a
        # list's pop is atomic under the GIL, so exactly one of them wins.
        self.token = [True]

    def withdraw(self) -> bool:
        """True if the job had not started and now never will."""
        try:
            self.token.pop()
        except IndexError:
            return False
        return True


Done = Callable[[bool, Any], None]
"""Told a job's outcome on its thread: ``(True, result)`` or ``(False, exception)``."""


class _Closed(Exception):
    """The outcome of a job withdrawn because its host closed."""


class _Thread:
    """One call thread's hand-over slot: the job given to it and the lock it sleeps on."""

    __slots__ = ("job", "wake")

    def __init__(self, job: _Job | None) -> None:
        self.job = job
        self.wake = threading.Lock()
        self.wake.acquire()  # held: the thread sleeps on it until a job (or stop) is given


class _Shared:
    """What the call threads share with their pool. The threads refer to this, never to
    the CallWorkers, so a pool dropped without close() is collected and stops its threads.

    Exact hand-over: a job goes to one idle thread (the one idle longest last: LIFO, the
    warmest), or starts a new thread, or waits in ``queue`` for a thread to finish, which
    takes it without sleeping. So a caller knows whether its job waits (and only then needs a
    timer for its deadline), and no thread is started while another is about to be free."""

    __slots__ = ("closed", "idle", "lock", "queue", "threads")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: collections.deque[_Job] = collections.deque()
        self.idle: list[_Thread] = []
        self.threads: list[threading.Thread] = []
        self.closed = False

    def stop(self) -> list[_Job]:
        """No new jobs: every idle thread ends now, busy ones after their job. The jobs that
        were waiting, taken from the queue."""
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
            queued = list(self.queue)
            self.queue.clear()
        for slot in idle:
            slot.job = None
            slot.wake.release()
        return queued


def _abandon(shared: _Shared) -> None:
    """A pool dropped without close(): its threads stop, its waiting jobs are told so."""
    for job in shared.stop():
        if job.withdraw():
            job.done(False, _Closed())


def _work(shared: _Shared, slot: _Thread) -> None:
    """A call thread: jobs until its pool closes.

    The outcome is handed over last, after the thread has taken its next job or made itself
    idle: a caller that answers the outcome with its next job (an ``await acall`` in a loop)
    finds this thread idle rather than starting another, and the waking event loop finds the
    GIL about to be released (the thread's next act is to sleep), not held for bookkeeping."""
    lock = shared.lock
    job = slot.job
    slot.job = None
    while job is not None:
        done: Done | None = None
        if job.withdraw():
            args, job.args = job.args, ()
            try:
                result, ok = job.fn(*args), True
            except BaseException as exc:  # the job's caller raises it, on its own thread
                result, ok = exc, False
            del args  # the call's extension is no longer this thread's to keep alive
            done = job.done
        sleep = False
        with lock:
            if shared.queue:
                job = shared.queue.popleft()
            else:
                job = None
                if not shared.closed:
                    shared.idle.append(slot)
                    sleep = True
        if done is not None:
            try:
                done(ok, result)
            except BaseException:  # pragma: no cover - a done callback must not kill us
                host_logger().exception("wasihost: a call thread's completion failed")
            del done, result
        if sleep:
            slot.wake.acquire()
            job, slot.job = slot.job, None  # None: the pool closed


class CallWorkers:
    """The bounded pool of threads on which a host's async calls run.

    A job hands its outcome back through a callback on its thread (for an asyncio call, one
    ``call_soon_threadsafe``), about half what ``ThreadPoolExecutor`` plus ``wrap_future``
    cost per call. Threads start on demand, up to ``workers``; beyond that jobs queue, each
    withdrawn by its caller at its deadline if no thread took it."""

    def __init__(self, workers: int = DEFAULT_CALL_WORKERS) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise ConfigError(f"async_workers must be an int, got {workers!r}")
        if not 1 <= workers <= MAX_CALL_WORKERS:
            raise ConfigError(f"async_workers={workers}: must be in 1..{MAX_CALL_WORKERS}")
        self.workers = workers
        self._shared = _Shared()
        weakref.finalize(self, _abandon, self._shared)

    @property
    def _threads(self) -> list[threading.Thread]:
        return self._shared.threads

    def start(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> _Job:
        """Run ``fn(*args)`` on a call thread and tell ``done`` its outcome there. The job's
        ``queued`` says whether it waits for a thread to finish another job."""
        job = _Job(fn, args, done)
        shared = self._shared
        with shared.lock:
            if shared.closed:
                raise ConfigError("this host is closed")
            if shared.idle:
                slot = shared.idle.pop()
                slot.job = job
                slot.wake.release()
            elif len(shared.threads) < self.workers:
                thread = threading.Thread(
                    target=_work,
                    args=(shared, _Thread(job)),
                    name=f"wasihost-call-{len(shared.threads)}",
                    daemon=True,
                )
                thread.start()  # it takes no lock before its first job is done
                shared.threads.append(thread)
            else:
                shared.queue.append(job)
                job.queued = True
        return job

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """``fn(*args)`` on a call thread, as a concurrent future."""
        import concurrent.futures  # here: a host that makes no such future never loads it

        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> T | None:
            if not future.set_running_or_notify_cancel():
                return None
            return fn(*args)

        def done(ok: bool, result: Any) -> None:
            if future.done():
                return
            if ok:
                future.set_result(result)
            elif isinstance(result, _Closed):
                future.set_exception(ConfigError("this host is closed"))
            else:
                future.set_exception(result)

        job = self.start(run, (), done)
        future.add_done_callback(lambda f: f.cancelled() and job.withdraw())
        return future

    def close(self) -> None:
        """No new jobs; queued ones are withdrawn (their callers told the host closed),
        running ones end as their extensions close (the host closes those first)."""
        shared = self._shared
        queued = shared.stop()
        with shared.lock:
            threads = list(shared.threads)
        for job in queued:
            if job.withdraw():
                job.done(False, _Closed())
        # From one of its own threads (a host closed inside a call), waiting would wait for
        # itself.
        if not threading.current_thread().name.startswith("wasihost-call"):
            for thread in threads:
                thread.join()


def _run(
    ext: Extension,
    command: str,
    value: Any,
    fuel: int | None,
    timeout_ms: int | None,
    ticket: CallTicket,
    deadline: float,
) -> tuple[bool, Any, int | None]:
    """On a call thread: the call's outcome (ok, its value or what it raised, raised again
    in the awaiting task) and the fuel it burnt (None if it failed before running).
    :meth:`Extension.call_cancellable` inlined: one thread-local lookup and one frame less."""
    state = ext._local.state
    state.fuel = None  # not an earlier call's, made on this thread for another task
    state.ticket = ticket
    state.deadline = deadline
    try:
        result = ext.call(command, value, fuel=fuel, timeout_ms=timeout_ms)
    except BaseException as exc:
        return False, exc, state.fuel
    finally:
        state.ticket = state.deadline = None
    return True, result, state.fuel


class _Pending:
    """An async call's outcome, delivered on the loop's thread."""

    __slots__ = ("future", "loop", "outcome", "settled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.outcome: tuple[bool, Any] | None = None
        # Made when the awaiting task is cancelled and waits for the guest to have stopped.
        self.settled: asyncio.Future[None] | None = None

    def done(self, ok: bool, result: Any) -> None:
        """On the call thread: one ``call_soon_threadsafe`` (a closed loop means nobody waits
        any more). Not contextlib.suppress: a context manager is a measurable share of the
        hand-off, and the loop is waiting for the GIL meanwhile."""
        try:
            self.loop.call_soon_threadsafe(self.deliver, ok, result)
        except RuntimeError:
            return

    def deliver(self, ok: bool, result: Any) -> None:
        self.outcome = (ok, result)
        future = self.future
        if not future.done():
            if ok:
                future.set_result(result)
            else:
                future.set_exception(result)
        if self.settled is not None and not self.settled.done():
            self.settled.set_result(None)


async def call_async(
    ext: Extension,
    command: str,
    value: Any = None,
    *,
    fuel: int | None = None,
    timeout_ms: int | None = None,
) -> Any:
    """:meth:`Extension.call` on a call thread of ``ext``'s host (see the module docstring
    for cancellation). The deadline runs from now: waiting for a thread counts."""
    import asyncio

    if ext.lifecycle.state is State.CLOSED:
        raise ext._unavailable()  # as call() says it, even once the host's threads are gone
    timeout = (
        ext.resources.timeout_ms
        if timeout_ms is None
        else _override("timeout_ms", timeout_ms, ext.resources.timeout_ms, "timeout_ms")
    )
    deadline = time.monotonic() + timeout / 1000
    ticket = CallTicket(ext)
    loop = asyncio.get_running_loop()
    pending = _Pending(loop)
    # Started last: a call thread woken while the loop still runs Python would only wait
    # for the GIL, one more wake-up.
    job = ext.host.call_workers().start(
        _run, (ext, command, value, fuel, timeout_ms, ticket, deadline), pending.done
    )
    timer: asyncio.TimerHandle | None = None
    if job.queued:
        # No thread free: withdrawn at its deadline if none took it by then. (Running, its
        # own deadline ends it.) Only then a timer: arming and disarming one costs about
        # what a thread hand-off does. The loop's clock is time.monotonic(), the clock of
        # every wasihost deadline.
        def withdraw() -> None:
            if job.withdraw():
                pending.deliver(
                    False,
                    CallError(
                        FailureClass.DEADLINE,
                        f"no call thread free before the call's deadline ({timeout} ms)",
                    ),
                )

        timer = loop.call_at(deadline, withdraw)
    try:
        ok, outcome, used = await pending.future
    except asyncio.CancelledError as cancelled:
        ticket.cancel()
        if not job.withdraw() and pending.outcome is None:
            # Running: wait (bounded) for its guest to have stopped.
            pending.settled = loop.create_future()
            await asyncio.wait({pending.settled}, timeout=CANCEL_SETTLE_S)
        if pending.outcome is not None and pending.outcome[0]:
            ok, outcome, used = pending.outcome[1]
            ext._set_task_fuel(used)
            if not ok and isinstance(outcome, CallError):
                cancelled.__cause__ = outcome
        raise
    except _Closed:
        # Withdrawn by the host closing its call threads (after closing its extensions).
        raise ext._unavailable() from None
    finally:
        if timer is not None:
            timer.cancel()
    ext._set_task_fuel(used)
    if not ok:
        raise outcome
    return outcome


async def _on_thread(host: Host, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking host operation (admission compiles; close waits a tick per call) on one of
    the host's call threads, so the loop stays free."""
    import asyncio

    future = host.call_workers().submit(functools.partial(fn, *args, **kwargs))
    return await asyncio.wrap_future(future)


class AsyncExtension:
    """An admitted extension seen from asyncio: coroutines for what may run guest code or
    wait, plain attributes for what is only read. ``sync`` is the
    :class:`~wasihost.extension.Extension` itself (operators' methods, ``commit`` for
    brokers)."""

    def __init__(self, ext: Extension) -> None:
        self.sync = ext

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def lifecycle(self) -> Lifecycle:
        return self.sync.lifecycle

    @property
    def handshake(self) -> Handshake | None:
        return self.sync.handshake

    @property
    def last_fuel_used(self) -> int:
        """What this task's last call of the extension burnt (start-up included)."""
        return self.sync.last_fuel_used

    def logs(self) -> tuple[LogRecord, ...]:
        return self.sync.logs()

    async def acall(
        self,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Any:
        """See :meth:`Extension.acall`."""
        return await call_async(self.sync, command, value, fuel=fuel, timeout_ms=timeout_ms)

    async def astart(self) -> Handshake:
        """Instantiate and handshake now (calls do it lazily)."""
        return await _on_thread(self.sync.host, self.sync.start)

    async def aclose(self, reason: str = "closed") -> None:
        """Close for good; calls in flight are interrupted."""
        await _on_thread(self.sync.host, self.sync.close, reason)


class AsyncHost:
    """A :class:`~wasihost.runtime.Host` for asyncio applications::

        async with AsyncHost(Policy(allow={"log"})) as host:
            ext = await host.load("fixtures/echo")
            out = await ext.acall("echo", "hi")

    Keyword options are the Host's; ``async_workers`` bounds the threads that run calls.
    Operator actions (``grant``, ``revoke``, ``disable``...) are quick and thread-safe: call
    them on ``host.host``."""

    def __init__(self, policy: Policy | None = None, **options: Any) -> None:
        from .runtime import Host

        self.host = Host(policy, **options)

    async def __aenter__(self) -> AsyncHost:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def load(self, source: str | Path, **options: Any) -> AsyncExtension:
        """:meth:`Host.load`, with admission and compilation off the loop."""
        return AsyncExtension(await _on_thread(self.host, self.host.load, source, **options))

    async def load_installed(self, extension: str, **options: Any) -> AsyncExtension:
        return AsyncExtension(
            await _on_thread(self.host, self.host.load_installed, extension, **options)
        )

    async def update(self, source: str | Path, **options: Any) -> AsyncExtension:
        return AsyncExtension(await _on_thread(self.host, self.host.update, source, **options))

    def extension(self, extension: str) -> AsyncExtension | None:
        ext = self.host.extension(extension)
        return AsyncExtension(ext) if ext is not None else None

    async def aclose(self) -> None:
        """Close the host: calls in flight are interrupted (each within a tick or so)."""
        import asyncio

        await asyncio.to_thread(self.host.close)


__all__ = ["AsyncExtension", "AsyncHost", "CallWorkers", "call_async"]
