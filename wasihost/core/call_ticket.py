"""A call in flight as its caller sees it from another thread: the handle that cancels that
call, and no other, whatever phase it is in (waiting for a slot or room, starting an
instance, running guest code)."""

from __future__ import annotations

import threading
from typing import Protocol


class Cancellable(Protocol):
    """What a cancel stops: the instance running the call (``engine.Instance``: its guest
    traps at the next epoch tick) or the call's wait for a host call slot
    (``supervisor.scheduling.Waiter``)."""

    def cancel(self) -> None: ...


class Wakeable(Protocol):
    """The extension a ticket's call is of (``host.extension.Extension``): a cancel wakes its
    calls waiting for a free instance, so that the cancelled one stops waiting."""

    def wake_waiters(self) -> None: ...


class CallTicket:
    """One call in flight, as its caller sees it from another thread: :meth:`cancel` stops
    that call's instance (and no other) at its next epoch tick, or the call before it starts.
    Used by :meth:`Extension.acall` for a cancelled task, and by the jobs broker, whose runs
    also cap linear memory through it (``memory_cap``: the command may grow memory to at most
    that; its start-up, if it needs a new instance, has the extension's own limit)."""

    __slots__ = ("_ext", "_lock", "cancelled", "delay_wake", "instance", "memory_cap", "waiter")

    def __init__(self, ext: Wakeable, memory_cap: int | None = None) -> None:
        self._ext = ext
        self.cancelled = False
        self.memory_cap = memory_cap
        self.instance: Cancellable | None = None
        # attach, detach and cancel's look at the instance, atomically: a cancel that comes
        # after the call gave its instance back must not reach that instance, now idle in the
        # pool or another call's.
        self._lock = threading.Lock()
        # Scheduling hook (wasihost.host.call_gate): the call's wait for a host call slot, if any.
        self.waiter: Cancellable | None = None
        # budgets: the call's wait for room (ThrottleMode.DELAY), if it waits.
        self.delay_wake: threading.Event | None = None

    def attach(self, instance: Cancellable) -> None:
        with self._lock:
            self.instance = instance
            if self.cancelled:
                instance.cancel()

    def detach(self) -> None:
        """The call is over with its instance (before the instance goes back to the pool): a
        later cancel stops nothing. One that came before stopped it, and it is dropped."""
        with self._lock:
            self.instance = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            instance = self.instance
            if instance is not None:
                instance.cancel()
        waiter = self.waiter
        if waiter is not None:  # scheduling hook: stop waiting for a host call slot
            waiter.cancel()
        wake = self.delay_wake
        if wake is not None:  # budgets: stop waiting for room
            wake.set()
        self._ext.wake_waiters()


class _CallState:
    """One thread's view of an extension: the grant epoch of its call in flight (host calls
    and commits check it) and what its last call burnt."""

    __slots__ = ("deadline", "epoch", "fuel", "ticket")

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.fuel: int | None = None
        # Handed from call_cancellable to call (consumed at once).
        self.ticket: CallTicket | None = None
        self.deadline: float | None = None


class _CallLocal(threading.local):
    # One thread-local lookup per call, then plain attributes: a threading.local attribute
    # costs several times a slot's, and a no-op call would notice a handful of them.
    def __init__(self) -> None:
        self.state = _CallState()
