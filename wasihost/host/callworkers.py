"""The threads on which a host's async calls run: :class:`CallWorkers`, a bounded pool that
starts a thread on demand and hands each job to one, with no executor or future in between.

Every :class:`~wasihost.host.runtime.Host` owns one, its threads started on first use, so this
module loads with every host and imports neither ``concurrent.futures`` nor ``asyncio``;
:mod:`wasihost.host.aio`, the asyncio front end on top of it, loads when an application uses it.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.errors import ConfigError
from ..core.hostlog import host_logger
from ..core.threadstack import guest_thread_stack
from ..engine.fastcall import WAIT_FLAG

if TYPE_CHECKING:
    import concurrent.futures

T = TypeVar("T")

# Threads running guest calls for coroutines, per host. Guest code runs without the GIL, so
# threads beyond the cores only help calls that wait (in async host functions, or for an
# instance); 8 covers a typical host's cores plus a few such waits. Each is an OS thread with
# its own stack (8 MiB reserved by default, of which a call needs max_wasm_stack + 256 KiB).
DEFAULT_CALL_WORKERS = 8
# More threads than this is a configuration mistake, not parallelism: 2 cores or 64, calls
# beyond the cores only queue on the GIL and the CPU.
MAX_CALL_WORKERS = 256
# Threads that start warm spares (Extension._make_spare), per host, apart from the call
# threads: a spare's start-up may take its extension's whole timeout_ms, and on the call
# threads a few crashing, slow-starting extensions held every one of them, so that no acall
# of any extension found a thread (red-team 2026-12-01). Spares only save a later call its
# start-up: two threads serve a host's crashes, and a spare that waits for one delays only
# other spares, never a call.
SPARE_WORKERS = 2
# How long a call thread that has just handed an outcome over stays awake for its next job
# before it sleeps on its lock: a caller answering each outcome with its next call (``await
# acall`` in a loop) then hands that job over without waking a sleeping thread, tens of
# microseconds saved (docs/engine.md "The acall hand-over"). It waits without the GIL, yielding
# the CPU between looks, so for at most this long a thread spins per job.
HOT_WAIT_NS = 50_000


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


Done = Callable[[bool, Any], "bytearray | None"]
"""Told a job's outcome on its thread: ``(True, result)`` or ``(False, exception)``. It may
answer a flag that a thread waiting for the outcome watches without the GIL: the call thread
sets it once it has released the GIL (:data:`WAIT_FLAG`'s ``signal``), so the waiter finds the
GIL free."""


class _Closed(Exception):
    """The outcome of a job withdrawn because its host closed."""


class _Thread:
    """One call thread's hand-over slot: the job given to it, the lock it sleeps on, and the
    flag it watches, awake, for a while before it sleeps (HOT_WAIT_NS)."""

    __slots__ = ("given", "job", "wake")

    def __init__(self, job: _Job | None) -> None:
        self.job = job
        self.wake = threading.Lock()
        self.wake.acquire()  # held: the thread sleeps on it until a job (or stop) is given
        # Set with every release of ``wake``: a job (or stop) was given.
        self.given = bytearray(1)

    def give(self, job: _Job | None) -> None:
        """Hand ``job`` (None: stop) to this idle thread, awake or asleep."""
        self.job = job
        self.given[0] = 1
        self.wake.release()

    def wait(self, signal: bytearray | None) -> _Job | None:
        """Idle: the next job given (None: stop), watched for HOT_WAIT_NS without the GIL,
        then slept for; ``signal`` is set once the GIL is released."""
        if WAIT_FLAG is not None:
            WAIT_FLAG(self.given, HOT_WAIT_NS, signal)
        elif signal is not None:
            signal[0] = 1
        self.wake.acquire()  # released with the flag: at once if the flag was seen
        self.given[0] = 0
        job, self.job = self.job, None
        return job


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
            slot.give(None)
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
        signal: bytearray | None = None
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
                signal = done(ok, result)
            except BaseException:  # pragma: no cover - a done callback must not kill us
                host_logger().exception("wasihost: a call thread's completion failed")
            del done, result
        if sleep:
            job = slot.wait(signal)  # None: the pool closed
        elif signal is not None:
            signal[0] = 1


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
                shared.idle.pop().give(job)
            elif len(shared.threads) < self.workers:
                thread = threading.Thread(
                    target=_work,
                    args=(shared, _Thread(job)),
                    name=f"wasihost-call-{len(shared.threads)}",
                    daemon=True,
                )
                with guest_thread_stack():  # whatever threading.stack_size the process has
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
