"""An async call: :func:`call_async`, what ``await ext.acall(...)`` runs.

The call runs on one of its host's call threads (``wasihost.host.callworkers``), never on the
event loop: the loop only waits for a future, so guest code cannot block it. The synchronous
machinery does everything else (the instance pool, budgets, interrupts), so an async call keeps
every guarantee of :meth:`~wasihost.host.extension.Extension.call`. What would only wait is
waited for on the loop instead, so that it holds no call thread: a turn among the extension's
``max_concurrency`` (:class:`_Turns`) and, with a scheduler, the host call slot
(:func:`_take_slot`).

Cancellation. Cancelling the task awaiting :func:`call_async` stops the guest of that call
alone: its instance is told to stop (:meth:`~wasihost.engine.Instance.cancel`), the guest traps
at its next epoch tick (a blocking host call wakes at once), the call ends with
:attr:`~wasihost.core.errors.FailureClass.CANCELLED` and its instance is dropped, never reused; the
extension's lifecycle records no crash. A call still waiting for a thread or an instance never
starts. The awaiting task waits (up to :data:`CANCEL_SETTLE_S`) for the guest to have stopped,
then raises :class:`asyncio.CancelledError`, whose ``__cause__`` is the call's
``CallError(cancelled)`` when the call ended that way. A call that had already finished when
the cancellation arrived (its effects committed) still raises ``CancelledError``: cancellation
says the caller stopped waiting, as everywhere in asyncio.

Its own module, apart from ``wasihost.host.aio`` (the asyncio front end, which re-exports
it): ``Extension.acall`` imports it on first use, and it types the extension by a protocol
(:class:`AsyncGated`), so that neither imports the other's module at load.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
import types
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

from ..core.call_ticket import CallTicket
from ..core.errors import CallError, ConfigError, FailureClass
from ..core.lifecycle import SHUTTING_DOWN, ExtensionUnavailable, State
from ..core.limits import lowered
from ..engine.fastcall import WAIT_FLAG
from .callworkers import _Closed

if TYPE_CHECKING:
    import asyncio

    from ..core.lifecycle import ExtensionRevoked
    from ..supervisor.scheduling import Priority, Slot
    from .call_gate import CallGate, Gated
    from .callworkers import CallWorkers

    # For annotations only (defined where they are read, and only for the type checker: an
    # acall loads neither the scheduling hook nor the extension's module for them).

    class CallThreads(Protocol):
        """The host, as an async call uses it: the threads its calls run on."""

        def call_workers(self) -> CallWorkers: ...

    class AsyncGated(Gated, Protocol):
        """The extension, as an async call uses it (``wasihost.host.extension.Extension``):
        what the scheduling hook reads (:class:`~wasihost.host.call_gate.Gated`) and what the
        call's hand-off to a call thread does besides."""

        @property
        def host(self) -> CallThreads: ...

        # Its share of the host's call threads (a _Turns, made by its first acall).
        _acall_turns: Any
        _call_gate: CallGate | None

        def _unavailable(
            self, during: str | None = None
        ) -> ExtensionRevoked | ExtensionUnavailable: ...

        def _no_free_instance(self, exc: CallError) -> None: ...

        def _set_task_fuel(self, used: int | None) -> None: ...

        def wake_waiters(self) -> None: ...


# How long a cancelled task waits for its guest to have stopped before it raises
# CancelledError: an interrupted guest stops within an epoch tick (10 ms by default) and a
# blocking host call wakes at once; a synchronous host function that ignores its wakeup can
# hold the thread longer, and the task does not wait for that.
CANCEL_SETTLE_S = 1.0
# How long the event loop's thread watches, without the GIL, for a call it has just handed to
# an idle call thread to finish, before it awaits the outcome the usual way: a small call's
# outcome then comes back with no wake-up of the loop (a self-pipe write, an epoll return),
# tens of microseconds saved (docs/engine.md "The acall hand-over"). The loop runs nothing else
# meanwhile, so it is kept short; the task still yields once to the loop after such a call.
QUICK_WAIT_NS = 50_000


def _run(
    ext: AsyncGated,
    command: str,
    value: Any,
    fuel: int | None,
    timeout_ms: int | None,
    ticket: CallTicket,
    deadline: float,
    slot: tuple[CallGate, Slot, Priority] | None,
    turn: tuple[_Turns, _Turn],
) -> tuple[bool, Any, int | None]:
    """On a call thread: the call's outcome (ok, its value or what it raised, raised again
    in the awaiting task) and the fuel it burnt (None if it failed before running), run in
    the host call ``slot`` taken for it, if any. :meth:`Extension.call_cancellable` inlined:
    one thread-local lookup and one frame less."""
    state = ext._local.state
    state.fuel = None  # not an earlier call's, made on this thread for another task
    state.ticket = ticket
    state.deadline = deadline
    try:
        if slot is None:
            result = ext.call(command, value, fuel=fuel, timeout_ms=timeout_ms)
        else:
            gate, taken, priority = slot
            result = gate.run_in(
                ext,
                taken,
                priority,
                functools.partial(ext.call, command, value, fuel=fuel, timeout_ms=timeout_ms),
            )
    except BaseException as exc:
        return False, exc, state.fuel
    finally:
        state.ticket = state.deadline = None
        turn[0].give_back(turn[1], ext.resources.max_concurrency)  # the next acall may run
    return True, result, state.fuel


class _Turn:
    """One acall's turn of its extension's share of the call threads: waiting (on its loop),
    granted (its call may take a thread), or given back."""

    __slots__ = ("granted", "notify", "returned")

    def __init__(self, notify: Callable[[], None] | None = None) -> None:
        self.granted = False
        self.returned = False
        # Told, on the granting thread, that a turn it waited for was granted.
        self.notify = notify


class _Turns:
    """One extension's share of the host's call threads: at most ``max_concurrency`` of its
    acalls hold one at once, the rest wait on their loops, first come first served. More
    could only wait on their threads for a free instance, and a backlog on one extension
    held every call thread that way, so that another extension's acall found none
    (red-team 2026-12-01). Any thread may give a turn back (a call thread as its call
    ends); the turn it goes to is woken on its own loop."""

    __slots__ = ("lock", "running", "waiting")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.waiting: collections.deque[_Turn] = collections.deque()

    def take(self, turn: _Turn, limit: int) -> None:
        """Grant ``turn`` now if the share allows and nobody waits, else queue it."""
        with self.lock:
            if self.running < limit and not self.waiting:
                self.running += 1
                turn.granted = True
            else:
                self.waiting.append(turn)

    def give_back(self, turn: _Turn, limit: int) -> None:
        """``turn`` is over (its call ended, or it never ran, or its wait was given up):
        its place goes to the next waiters. Idempotent."""
        woken: list[_Turn] = []
        with self.lock:
            if turn.returned:
                return
            turn.returned = True
            if not turn.granted:
                if turn in self.waiting:
                    self.waiting.remove(turn)
                return
            self.running -= 1
            while self.waiting and self.running < limit:
                nxt = self.waiting.popleft()
                nxt.granted = True
                self.running += 1
                woken.append(nxt)
        for nxt in woken:
            if nxt.notify is not None:
                nxt.notify()


def _turns(ext: AsyncGated) -> _Turns:
    turns = ext._acall_turns
    if turns is None:
        with _TURNS_LOCK:
            turns = ext._acall_turns
            if turns is None:
                turns = ext._acall_turns = _Turns()
    return turns  # type: ignore[no-any-return]


_TURNS_LOCK = threading.Lock()


async def _wait_turn(ext: AsyncGated, turns: _Turns, turn: _Turn, deadline: float) -> None:
    """Wait on the loop until ``turn`` (queued) is granted, until ``deadline`` (then
    ``CallError(deadline)``, the call never having run). A cancel gives it up, granted or
    not."""
    import asyncio

    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def notify() -> None:  # on the thread giving a turn back
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop is closed: nobody will take it, so it goes on
            turns.give_back(turn, ext.resources.max_concurrency)

    turn.notify = notify
    timer = loop.call_at(deadline, wake.set)
    try:
        while True:
            with turns.lock:  # set, then look: a grant may have come before notify was set
                if turn.granted:
                    return
                late = loop.time() >= deadline
            if late:
                raise CallError(
                    FailureClass.DEADLINE,
                    "no free instance before the call's deadline: max_concurrency "
                    f"{ext.resources.max_concurrency}, all in calls",
                )
            await wake.wait()
            wake.clear()
    except BaseException:
        turns.give_back(turn, ext.resources.max_concurrency)
        raise
    finally:
        timer.cancel()


class _Pending:
    """An async call's outcome: taken by the loop's thread watching for it (the quick way,
    :data:`QUICK_WAIT_NS`), or else delivered on the loop with one ``call_soon_threadsafe``."""

    __slots__ = ("flag", "future", "loop", "outcome", "quick", "settled", "token")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.outcome: tuple[bool, Any] | None = None
        # Made when the awaiting task is cancelled and waits for the guest to have stopped.
        self.settled: asyncio.Future[None] | None = None
        # The quick way: the outcome, and who decided how it travels. Popped by whichever
        # comes first (a list's pop is atomic under the GIL): the call thread with the
        # outcome (quick, ``flag`` set once it has let the GIL go), or the loop's thread
        # giving up its watch (delivered on the loop).
        self.quick: tuple[bool, Any] | None = None
        self.token = [True]
        self.flag = bytearray(1)

    def done(self, ok: bool, result: Any) -> bytearray | None:
        """On the call thread: the outcome to the watching loop thread (answering the flag
        to set once the GIL is let go), or one ``call_soon_threadsafe`` (a closed loop means
        nobody waits any more). Not contextlib.suppress: a context manager is a measurable
        share of the hand-off, and the loop is waiting for the GIL meanwhile."""
        self.quick = (ok, result)
        try:
            self.token.pop()
        except IndexError:
            self.quick = None
        else:
            return self.flag
        try:
            self.loop.call_soon_threadsafe(self.deliver, ok, result)
        except RuntimeError:
            return None
        return None

    def watch(self, queued: bool) -> tuple[bool, Any] | None:
        """On the loop's thread, right after the job was handed over, before anything awaits:
        the outcome if it is here already, or comes within QUICK_WAIT_NS (watched only for a
        job that went to an idle thread); else None, and from now on it is delivered on the
        loop. Called once for every job: until it returns, the call thread keeps an outcome
        for it instead of delivering it."""
        if WAIT_FLAG is not None and not queued:
            WAIT_FLAG(self.flag, QUICK_WAIT_NS)
        try:
            self.token.pop()
        except IndexError:  # the call thread took it first: the outcome is here
            quick, self.quick = self.quick, None
            return quick
        return None

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


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    """Let the loop run its other callbacks once (what ``asyncio.sleep(0)`` does, without its
    checks): a call that came back the quick way never suspended its task."""
    yield


async def _take_slot(
    ext: AsyncGated, gate: CallGate, deadline: float
) -> tuple[CallGate, Slot, Priority] | None:
    """With a scheduler: the host call slot of an async call, waited for here, on the event
    loop, until ``deadline`` (``HostBusy`` then), not on a call thread. Waiting there, calls
    of a lower class held the bounded call threads, so that a call of a higher class could
    not even queue for the next slot (red-team 2026-12-01). None if the host's shutdown woke
    the wait (the call then refuses itself, as one waiting on a thread does). The class is
    the awaiting task's: ``calls_as`` around ``await ext.acall(...)`` lowers it. A cancel
    withdraws the wait, or gives back a slot granted meanwhile."""
    import asyncio

    scheduler = gate.scheduler
    priority = gate.priority(ext)
    slot = scheduler.try_acquire(ext.id, priority)
    if slot is not None:
        return gate, slot, priority
    waiter = scheduler.request(ext.id, priority)
    if waiter.slot is not None:
        return gate, waiter.slot, priority
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def notify() -> None:  # on the releasing thread
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop is closed: nobody will use a slot granted now
            if waiter.slot is not None:
                scheduler.release(waiter.slot)

    waiter.notify = notify
    gate.watch(waiter)
    timer = loop.call_at(deadline, wake.set)  # the loop's clock is time.monotonic()
    try:
        while True:
            if waiter.slot is not None:
                return gate, waiter.slot, priority
            if waiter.cancelled and scheduler.withdraw(waiter):
                return None  # the host's shutdown
            if loop.time() >= deadline and scheduler.withdraw(waiter, refused=True):
                raise scheduler.busy(ext.id, priority)
            await wake.wait()
            wake.clear()
    except BaseException:
        # Cancelled (or refused): never leave a slot behind.
        if not scheduler.withdraw(waiter) and waiter.slot is not None:
            scheduler.release(waiter.slot)
        raise
    finally:
        timer.cancel()
        gate.unwatch(waiter)


async def _quick_outcome(ext: AsyncGated, quick: tuple[bool, Any]) -> Any:
    """What an acall whose outcome came back the quick way answers, after yielding once to
    the loop; a cancel arriving at that yield finds the call finished, as a cancel that
    arrives after a call thread's outcome does (CancelledError, caused by the call's
    CallError if it failed)."""
    job_ok, result = quick
    if not job_ok:  # _run itself failed: what it raised
        raise result
    ok, outcome, used = result
    ext._set_task_fuel(used)
    try:
        await _yield_once()
    except BaseException as stopped:
        if not ok and isinstance(outcome, CallError):
            stopped.__cause__ = outcome
        raise
    if not ok:
        raise outcome
    return outcome


async def call_async(
    ext: AsyncGated,
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
        else lowered("timeout_ms", timeout_ms, ext.resources.timeout_ms, "timeout_ms")
    )
    deadline = time.monotonic() + timeout / 1000
    # A turn of the extension's share of the call threads first (on this loop), then, with
    # a scheduler, a host call slot: a slot is never held while its call waits for a turn.
    turns, turn = _turns(ext), _Turn()
    turns.take(turn, ext.resources.max_concurrency)
    if not turn.granted:
        try:
            await _wait_turn(ext, turns, turn, deadline)
        except CallError as exc:
            ext._no_free_instance(exc)  # budgets: the concurrent-calls level, as in the pool
            raise
    gate = ext._call_gate
    slot = None

    def give_back() -> None:
        """The job never ran: its turn and the slot taken for it go (both idempotent)."""
        turns.give_back(turn, ext.resources.max_concurrency)
        if slot is not None:
            slot[0].scheduler.release(slot[1])

    try:
        if gate is not None and not ext._draining:  # scheduling hook: the slot, here
            slot = await _take_slot(ext, gate, deadline)
            if slot is None:  # woken by the host's shutdown: refused as a call then is
                raise ExtensionUnavailable(ext.id, ext.lifecycle.state, SHUTTING_DOWN)
        ticket = CallTicket(ext)
        loop = asyncio.get_running_loop()
        pending = _Pending(loop)
        # Started last: a call thread woken while the loop still runs Python would only
        # wait for the GIL, one more wake-up.
        try:
            job = ext.host.call_workers().start(
                _run,
                (ext, command, value, fuel, timeout_ms, ticket, deadline, slot, (turns, turn)),
                pending.done,
            )
        except ConfigError:
            # The host closed its call threads since this call began (it waited for a turn
            # or a slot meanwhile): refused as the extension, closed first, refuses calls.
            raise ext._unavailable() from None
    except BaseException:
        give_back()
        raise
    quick = pending.watch(job.queued)
    if quick is not None:
        return await _quick_outcome(ext, quick)
    timer: asyncio.TimerHandle | None = None
    if job.queued:
        # No thread free: withdrawn at its deadline if none took it by then. (Running, its
        # own deadline ends it.) Only then a timer: arming and disarming one costs about
        # what a thread hand-off does. The loop's clock is time.monotonic(), the clock of
        # every wasihost deadline.
        def withdraw() -> None:
            if job.withdraw():
                give_back()
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
        withdrawn = job.withdraw()
        if withdrawn:
            give_back()
        elif pending.outcome is None:
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
        give_back()
        raise ext._unavailable() from None
    finally:
        if timer is not None:
            timer.cancel()
    ext._set_task_fuel(used)
    if not ok:
        raise outcome
    return outcome
