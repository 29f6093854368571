"""Worker threads that serve extensions in turn, one item at a time each: what the events
broker delivers and the jobs broker runs.

An extension with work is *scheduled*: put once in a ready queue. A worker takes the first
ready extension, takes one item of its work under the lock, processes it without the lock,
and puts the extension back at the end of the queue if it has more. So one extension never
has two items in progress, a busy one cannot starve the others, and the pool grows to
``max_threads`` only while extensions wait with no idle worker.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Generic, Protocol, TypeVar

from ..core.threadstack import guest_thread_stack
from ..supervisor.scheduling import Priority, run_calls_as

LOG = logging.getLogger("wasihost")


class Scheduled(Protocol):
    """What the pool needs of an extension's state."""

    scheduled: bool

    @property
    def ext(self) -> Any: ...


S = TypeVar("S", bound=Scheduled)
I = TypeVar("I")  # noqa: E741 - an item of work, as in the type parameters of the stdlib


class ExtensionDispatcher(Generic[S, I]):
    """The pool and its lock (``_cond``), shared by a broker's own bookkeeping. A broker sets
    ``_stopping`` to end the workers, ``_held`` to pause them, and implements the four
    hooks."""

    def __init__(self, thread_prefix: str, max_threads: int) -> None:
        self._thread_prefix = thread_prefix
        self._max_threads = max_threads
        self._cond = threading.Condition()
        self._ready: collections.deque[S] = collections.deque()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._busy = 0  # extensions scheduled: waiting in _ready or being served
        self._stopping = False
        self._held = False
        self.failed = 0

    # -- the hooks ---------------------------------------------------------------------------

    def _take(self, state: S) -> I | None:
        """Under the lock: the extension's next item, or None if it has none now."""
        raise NotImplementedError

    def _process(self, state: S, item: I) -> None:
        """Without the lock: do ``item``. Its failures are its own to record."""
        raise NotImplementedError

    def _count_failure(self, item: I) -> None:
        """Under the lock: ``_process`` raised (a bug); count it against ``item``."""
        raise NotImplementedError

    def _done(self, state: S, item: I) -> bool:
        """Under the lock, after ``item``: whether the extension has more work now."""
        raise NotImplementedError

    # -- the pool ----------------------------------------------------------------------------

    def _schedule(self, state: S) -> None:
        """Put ``state`` in the ready queue (caller holds the lock), starting a worker if
        none is idle and the pool has room."""
        if state.scheduled:
            return
        state.scheduled = True
        self._busy += 1
        self._ready.append(state)
        if len(self._ready) > self._idle and len(self._workers) < self._max_threads:
            worker = threading.Thread(
                target=self._work,
                name=f"{self._thread_prefix}-{len(self._workers) + 1}",
                daemon=True,
            )
            self._workers.append(worker)
            with guest_thread_stack():  # it runs jobs and deliveries: guest calls
                worker.start()
        self._cond.notify()

    def _unschedule(self, state: S) -> None:
        state.scheduled = False
        self._busy -= 1
        self._cond.notify_all()

    def _work(self) -> None:
        # Scheduling hook: event deliveries and job runs are background work (docs/scheduling.md).
        run_calls_as(Priority.BACKGROUND)
        while True:
            with self._cond:
                while (not self._ready or self._held) and not self._stopping:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if self._stopping:
                    return
                state = self._ready.popleft()
                item = self._take(state)
                if item is None:
                    self._unschedule(state)
                    continue
            try:
                self._process(state, item)
            except Exception:  # a bug here must not end the worker: say so and go on
                LOG.exception("%s worker failed serving %s", self._thread_prefix, state.ext.id)
                with self._cond:
                    self._count_failure(item)
                    self.failed += 1
            finally:
                with self._cond:
                    if self._done(state, item) and not self._stopping:
                        self._ready.append(state)
                        self._cond.notify()
                    else:
                        self._unschedule(state)

    def drain(self, timeout: float) -> bool:
        """Wait until no work is queued or in progress (or ``timeout`` seconds pass); True if
        drained. Never call it from a host function: the work may be waiting on that call."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._cond.wait(left)
            return True

    @property
    def threads(self) -> int:
        """Worker threads running now (at most ``max_threads``)."""
        with self._cond:
            return sum(1 for w in self._workers if w.is_alive())
