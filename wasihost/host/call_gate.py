"""Extension calls through the host's :class:`~wasihost.supervisor.scheduling.Scheduler`.

With ``Host(scheduler=Scheduler(max_concurrent_calls=N))`` every :meth:`Extension.call` (and
so every ``acall``, event delivery and job run) first takes one of the host's N call slots,
waiting for one by priority class and fair share, and gives it back when the call ends. The
slot is taken before the extension's instance pool is entered and no lock is held while the
call waits or runs.

A call's class is the lower of its extension's class (the manifest's ``[scheduling]
priority``, capped by the scheduler's ceiling, or the operator's :meth:`Scheduler.assign`)
and the class of the calling context (:func:`calls_as`): the events and jobs brokers run
their work as ``background``, so an interactive extension's jobs never compete with its
interactive callers as equals. A call made while its thread already holds a slot (a host
function calling another extension) goes on in that slot: waiting for a second one could
deadlock a chain of nested calls.

Waiting counts against the call's deadline (``timeout_ms``); a call still waiting at its
deadline never starts and raises :class:`~wasihost.supervisor.scheduling.HostBusy` with a retry
hint. A
cancelled ``acall`` stops waiting at once, and its slot (if it was granted meanwhile) goes to
the next waiter. An ``acall`` waits for its slot on its event loop (``wasihost.host.aio``), in the
awaiting task's context, and runs on a call thread in it (:meth:`CallGate.run_in`): waiting
calls hold no call thread.

A call that must wait for room under its budget (``ThrottleMode.DELAY``, see
docs/budgets.md) gives its slot back for the wait (:meth:`CallGate.suspend`) and queues for
one again once the wait is over (:meth:`CallGate.resume`), on the same deadline and ticket: a
delayed extension does not keep others from the host's slots. A nested call keeps the slot
it goes on in (the call that took the slot is still in guest code, its instance held).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..core.errors import CallError, FailureClass
from ..core.lifecycle import SHUTTING_DOWN, ExtensionUnavailable

# calls_as and run_calls_as live in supervisor.scheduling with the class they set (the brokers'
# dispatchers, below the host, set it too); they are re-exported from here, their old home.
from ..supervisor.scheduling import (  # noqa: F401
    _CALLS_AS,
    Priority,
    Scheduler,
    Slot,
    Waiter,
    calls_as,
    lower,
    run_calls_as,
)

if TYPE_CHECKING:
    from ..core.call_ticket import CallTicket, _CallLocal
    from ..core.lifecycle import Lifecycle
    from ..core.manifest import Manifest, Resources

T = TypeVar("T")


class Gated(Protocol):
    """An extension as the gate sees it (``wasihost.host.extension.Extension``): its id and
    claimed class, its deadline and state, the call it lets through, and the call in flight
    on this thread (its ticket and deadline, handed over by an acall)."""

    @property
    def id(self) -> str: ...

    @property
    def manifest(self) -> Manifest | None: ...

    @property
    def resources(self) -> Resources: ...

    @property
    def lifecycle(self) -> Lifecycle: ...

    # Set by the host's shutdown: a call waiting for a slot then refuses itself.
    _draining: bool
    _local: _CallLocal

    def call(
        self,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Any: ...


# A manifest's claim, by name (the manifest parser admitted only these).
_CLAIMS = {p.value: p for p in Priority}


class _Held(threading.local):
    def __init__(self) -> None:
        # True while this thread is inside a call that went through the gate.
        self.inside = False
        # The slot that call holds (None: none yet, or given back for a wait for room), the
        # extension whose call took it, and its class.
        self.slot: Slot | None = None
        self.owner: Gated | None = None
        self.priority = Priority.INTERACTIVE


class CallGate:
    """The hook :meth:`Extension.call` goes through when the host has a scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._held = _Held()
        # The calls of this host waiting for a slot, for its shutdown to wake them.
        self._lock = threading.Lock()
        self._waiters: set[Waiter] = set()
        self._closing = False

    def close(self) -> None:
        """The host is shutting down: every call waiting for a slot stops waiting now (and is
        refused as the extension is, "the host is shutting down"), and none waits again."""
        with self._lock:
            self._closing = True
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter.cancel()

    def holding(self) -> bool:
        """Whether this thread is inside a scheduled call (a nested call goes on in its slot)."""
        return self._held.inside

    def priority(self, ext: Gated) -> Priority:
        """The class of a call of ``ext`` made now, on this thread."""
        manifest = ext.manifest
        claimed = _CLAIMS[manifest.priority] if manifest is not None else Priority.INTERACTIVE
        cls = self.scheduler.class_of(ext.id, claimed)
        context = _CALLS_AS.get()
        return cls if context is None else lower(cls, context)

    def call(
        self,
        ext: Gated,
        command: str,
        value: Any,
        fuel: int | None,
        timeout_ms: int | None,
    ) -> Any:
        """Take a slot (waiting until the call's deadline), run the call in it, give it back."""
        if ext._draining:
            return self._run(ext, command, value, fuel, timeout_ms)  # refused at once
        scheduler = self.scheduler
        priority = self.priority(ext)
        slot = scheduler.try_acquire(ext.id, priority)
        if slot is None:
            slot = self._wait(ext, priority, timeout_ms)
            if slot is None:  # cancelled, or the host is closing: the call refuses itself
                return self._run(ext, command, value, fuel, timeout_ms)
        held = self._held
        held.slot, held.owner, held.priority = slot, ext, priority
        try:
            return self._run(ext, command, value, fuel, timeout_ms)
        finally:
            # The slot held now: a wait for room may have given it back and taken another.
            slot = held.slot
            held.slot = held.owner = None
            if slot is not None:
                scheduler.release(slot)

    def run_in(self, ext: Gated, slot: Slot, priority: Priority, call: Callable[[], T]) -> T:
        """Run ``call`` (a call of ``ext``) on this thread in ``slot``, taken for it before it
        came here (an acall waits for its slot on its event loop, not on a call thread: see
        wasihost.host.aio), and give the slot back after, as :meth:`call` does."""
        held = self._held
        held.slot, held.owner, held.priority = slot, ext, priority
        held.inside = True
        try:
            return call()
        finally:
            held.inside = False
            # The slot held now: a wait for room may have given it back and taken another.
            taken = held.slot
            held.slot = held.owner = None
            if taken is not None:
                self.scheduler.release(taken)

    def watch(self, waiter: Waiter) -> None:
        """A waiter that waits on an event loop (an acall): the host's shutdown cancels it
        as it does the waiters of :meth:`call`, at once if it is under way already."""
        with self._lock:
            self._waiters.add(waiter)
            closing = self._closing
        if closing:
            waiter.cancel()

    def unwatch(self, waiter: Waiter) -> None:
        with self._lock:
            self._waiters.discard(waiter)

    def suspend(self, ext: Gated) -> Priority | None:
        """A call of ``ext`` on this thread, in no call of ``ext`` already, is about to wait
        for room under its budget: give its slot back for the wait, if this call took one
        (not a nested call going on in another's slot). Returns the class to queue in again
        (:meth:`resume`), or None when no slot was given back."""
        held = self._held
        slot = held.slot
        if slot is None or held.owner is not ext:
            return None
        held.slot = None
        self.scheduler.release(slot)
        return held.priority

    def resume(
        self,
        ext: Gated,
        priority: Priority,
        deadline: float,
        ticket: CallTicket | None,
    ) -> None:
        """The wait for room is over: take a slot again, queueing for it until the call's
        ``deadline`` (``time.monotonic()``) as any call does (:class:`HostBusy` then). A
        cancel or the host's shutdown while queued ends the call as it would end any."""
        slot = self.scheduler.try_acquire(ext.id, priority)
        if slot is None:
            if ticket is not None and ticket.cancelled:
                raise CallError(FailureClass.CANCELLED, "cancelled by the caller")
            slot = self._queue(ext, priority, deadline, ticket)
            if slot is None:  # woken by the host's shutdown
                raise ExtensionUnavailable(ext.id, ext.lifecycle.state, SHUTTING_DOWN)
        self._held.slot = slot

    def _wait(self, ext: Gated, priority: Priority, timeout_ms: int | None) -> Slot | None:
        """Queue for a slot until the call's deadline; None if the call was cancelled before
        it queued or the host's shutdown woke it (the call then refuses itself, with its own
        error)."""
        local = ext._local.state
        ticket: CallTicket | None = local.ticket
        if ticket is not None and ticket.cancelled:
            return None
        given: float | None = local.deadline
        ceiling = ext.resources.timeout_ms
        if (
            timeout_ms is None
            or isinstance(timeout_ms, bool)
            or not isinstance(timeout_ms, int)
            or not 1 <= timeout_ms <= ceiling
        ):
            timeout_ms = ceiling  # a wrong one is refused by the call itself, in its words
        deadline = time.monotonic() + timeout_ms / 1000
        if given is not None and given < deadline:
            deadline = given
        slot = self._queue(ext, priority, deadline, ticket)
        if slot is not None:
            # The wait counted: the call runs to the deadline taken before it.
            local.deadline = deadline
        return slot

    def _queue(
        self, ext: Gated, priority: Priority, deadline: float, ticket: CallTicket | None
    ) -> Slot | None:
        """Wait in the scheduler's queue until ``deadline`` (``time.monotonic()``); None if
        the host's shutdown woke the call."""
        waiting: list[Waiter] = []

        def on_wait(waiter: Waiter | None) -> None:
            with self._lock:
                if waiter is not None:
                    waiting.append(waiter)
                    self._waiters.add(waiter)
                    closing = self._closing
                else:
                    self._waiters.difference_update(waiting)
                    closing = False
            if ticket is not None:
                ticket.waiter = waiter
            # Set, then look (as CallTicket does): a cancel or a close that came first.
            if waiter is not None and (closing or (ticket is not None and ticket.cancelled)):
                waiter.cancel()

        scheduler = self.scheduler
        at = scheduler.now() + (deadline - time.monotonic())  # on the scheduler's clock
        try:
            slot = scheduler.acquire(ext.id, priority, at, on_wait=on_wait)
        except CallError:
            if ext._draining:  # woken by the host's shutdown: refused as the call says it
                return None
            raise
        return slot

    def _run(
        self, ext: Gated, command: str, value: Any, fuel: int | None, timeout_ms: int | None
    ) -> Any:
        held = self._held
        held.inside = True
        try:
            return ext.call(command, value, fuel=fuel, timeout_ms=timeout_ms)
        finally:
            held.inside = False
