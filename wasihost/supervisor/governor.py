"""The resource governor: each extension's budgets applied to the running extension.

:mod:`wasihost.core.budgets` keeps the accounts (pure); this module opens one per extension id,
charges it from the call path (fuel) and the http broker (bytes), hears from the engine, the
pool and the brokers when a level's static limit refused something (:meth:`Governor.level_crossed`),
and applies the action a crossing fires: ``warn`` journals and counts it; ``throttle`` refuses
what would consume more (a call, while the CPU rate is over or a level cools off; a request,
while the bytes would not fit) with a retry hint, or lets the call wait for room in
``ThrottleMode.DELAY`` (:meth:`Governor.wait_for_room`), and moves the lifecycle to Throttled
until then; ``pause`` pauses the extension until the operator resumes it; ``terminate`` stops
every call in flight (class ``out_of_fuel``, so the extension crashes as ``resource_limit``
and its restart policy decides) and refuses restarts while the rate is over or the level
cools off.

No engine import: it reaches instances only through the extension.
"""

from __future__ import annotations

import heapq
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..core.budgets import (
    MAX_THROTTLE_DELAY_S,
    Account,
    Action,
    BudgetPolicy,
    Resource,
    ResourceBudget,
    ThrottleMode,
    budget_for,
)
from ..core.errors import CallError, ConfigError, FailureClass
from ..core.lifecycle import Event, ExtensionUnavailable, State
from ..core.limits import MAX_OPEN_FILES
from ..core.status import GuestInterrupted, HostStatus, Status

if TYPE_CHECKING:
    from ..core.budget_crossing import Crossing
    from ..core.call_ticket import CallTicket
    from ..core.serving import ExtensionView
    from .reports import Usage


def __getattr__(name: str) -> Any:
    # Usage is made when an operator asks (Host.usage): defined there, exported here too.
    if name == "Usage":
        from .reports import Usage

        return Usage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# What waits for room under ThrottleMode.DELAY: ``sleep(seconds, wake)`` returns once
# ``seconds`` have passed on the governor's clock or ``wake`` is set, whichever comes first.
Sleep = Callable[[float, threading.Event], object]


def _sleep(seconds: float, wake: threading.Event) -> None:
    wake.wait(seconds)


# The levels a broker may report through its optional ``usage(state)`` hook.
LEVELS = frozenset(
    {
        Resource.STORAGE_BYTES.value,
        Resource.OPEN_HANDLES.value,
        Resource.BACKGROUND_JOBS.value,
        Resource.EVENT_QUEUE_DEPTH.value,
    }
)


def _open_handles_limit() -> int:
    """The files broker's fixed number of open handles per extension."""
    return MAX_OPEN_FILES


class Throttled(ExtensionUnavailable):
    """A call refused because its extension is over a rate budget (``throttle`` or
    ``terminate``): not the caller's fault; ``retry_after_s`` says when the window has room."""

    def __init__(self, extension: str, state: State, crossing: Crossing) -> None:
        super().__init__(
            extension, state, crossing.describe(), retry_after_s=crossing.retry_after_s
        )
        self.resource = crossing.resource
        self.crossing = crossing

    @property
    def error_class(self) -> str:
        return "throttled"


class Delayed(Throttled):
    """Internal: a call over its budget under ``ThrottleMode.DELAY``. The call path catches it
    (outside every lock) and waits for room (:meth:`Governor.wait_for_room`); nothing is
    counted as a refusal until that wait gives up."""


class DelayState:
    """One call's wait for room: when it began (governor clock), the extension's wake-up
    generation when the call last checked it, and whether a wake-up left the extension in a
    state other than running or throttled (a stop, pause, quarantine), after which the call
    waits no more."""

    __slots__ = ("generation", "since", "woken")

    def __init__(self) -> None:
        self.since: float | None = None
        self.generation = 0
        self.woken = False


class Governor:
    """A host's rate budgets: one :class:`~wasihost.core.budgets.Account` per extension id (an
    update or a restart does not reset it), the actions applied, the counts for operators.

    Once no extension of an id is open, its account is kept while its windows hold usage or a
    level's cool-off runs (a close and re-admission does not reset either), and dropped when
    they are over: at the close, or later by :meth:`prune` (which :meth:`open` and
    :meth:`close` run).

    ``clock`` (monotonic seconds) drives every window and cool-off, and ``sleep`` every wait for
    room (``sleep(seconds, wake)``, see :data:`Sleep`): tests inject both and never sleep.
    ``set_policy(id, BudgetPolicy(...))`` gives one extension its own host-side ceilings and
    actions instead of the host policy's ``budgets``."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, sleep: Sleep = _sleep
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._delays = 0
        self._lock = threading.Lock()
        self._accounts: dict[str, Account] = {}
        self._policies: dict[str, BudgetPolicy] = {}
        # The live extension of each id, so that a new policy for one applies at once.
        self._live: dict[str, weakref.ref[ExtensionView]] = {}
        self._fired: dict[Action, int] = dict.fromkeys(Action, 0)
        self._refusals = 0
        # [density] Accounts of closed ids that still hold usage: (when to look again, id),
        # soonest first. At most one entry per close within the longest window (an hour).
        self._retired: list[tuple[float, str]] = []

    # -- configuration --------------------------------------------------------------------

    def set_policy(self, extension: str, policy: BudgetPolicy) -> None:
        if not isinstance(policy, BudgetPolicy):
            raise ConfigError(f"budget policy {policy!r} is not a BudgetPolicy")
        with self._lock:
            self._policies[extension] = policy
            live = self._live.get(extension)
        ext = live() if live is not None else None
        if ext is not None:
            self.rebudget(ext)

    def _budget(self, ext: ExtensionView) -> ResourceBudget:
        with self._lock:
            policy = self._policies.get(ext.id)
        if policy is None:
            policy = ext.host.policy.budgets
        return budget_for(ext.resources, ext.manifest, policy, _open_handles_limit())

    def open(self, ext: ExtensionView) -> Account:
        """The account of ``ext``'s id (made on its first admission), on its current budget."""
        budget = self._budget(ext)
        with self._lock:
            if self._retired:
                self._prune_locked()
            self._live[ext.id] = weakref.ref(ext)
            account = self._accounts.get(ext.id)
            if account is None:
                account = self._accounts[ext.id] = Account(budget, self._clock)
                return account
        account.rebudget(budget)
        return account

    def close(self, ext: ExtensionView) -> None:
        """``ext`` closed. Unless another extension of its id is open, its account goes now if
        its windows are empty, else once they are (:meth:`prune`)."""
        account = ext.account
        empty_after = account.empty_after()
        with self._lock:
            live = self._live.get(ext.id)
            if live is not None and live() not in (ext, None):
                return  # the id's account is another open extension's now
            self._live.pop(ext.id, None)
            if self._accounts.get(ext.id) is account:
                if empty_after <= 0:
                    del self._accounts[ext.id]
                else:
                    heapq.heappush(self._retired, (self._clock() + empty_after, ext.id))
            if self._retired:
                self._prune_locked()

    def prune(self) -> int:
        """Drop the accounts of closed ids whose windows have emptied; returns how many."""
        with self._lock:
            return self._prune_locked()

    def _prune_locked(self) -> int:
        retired = self._retired
        now = self._clock()
        dropped = 0
        while retired and retired[0][0] <= now:
            _, extension = heapq.heappop(retired)
            account = self._accounts.get(extension)
            live = self._live.get(extension)
            if account is None or (live is not None and live() is not None):
                continue  # dropped already, or open again (its close looks again)
            empty_after = account.empty_after()
            if empty_after <= 0:
                del self._accounts[extension]
                dropped += 1
            else:  # used again and closed again since: its last close's entry is later
                heapq.heappush(retired, (now + empty_after, extension))
        return dropped

    def rebudget(self, ext: ExtensionView) -> None:
        """The extension's resources or the host's policy changed: its next call meets the
        new budget (a lower one may already be crossed)."""
        self.open(ext)
        ext.recheck()

    # -- charging -------------------------------------------------------------------------

    def charge(
        self, ext: ExtensionView, resource: Resource, amount: int, *, refusable: bool = False
    ) -> Crossing | None:
        """Count ``amount`` against ``ext``'s budget and apply what a crossing fires."""
        crossing = ext.account.charge(resource, amount, refusable=refusable)
        if crossing is not None:
            self._crossed(ext, crossing)
        return crossing

    def fuel_crossed(self, ext: ExtensionView, crossing: Crossing) -> CallError | None:
        """A call's fuel crossed the CPU budget (``Account.add_fuel``): apply the action.
        Under ``terminate`` the calls in flight are stopped, and the failure the crossing call
        ends with is returned (its caller raises it)."""
        self._crossed(ext, crossing)
        if crossing.fired and crossing.action is Action.TERMINATE:
            return _termination(crossing)
        return None

    def charge_request(self, ext: ExtensionView, amount: int) -> None:
        """The bytes of a request about to be sent: counted, or refused (raises the status
        the guest gets, or stops the call under ``terminate``)."""
        crossing = self.charge(ext, Resource.NETWORK_BYTES_PER_HOUR, amount, refusable=True)
        if crossing is not None and crossing.refused:
            if crossing.action is Action.TERMINATE and crossing.fired:
                raise GuestInterrupted
            raise HostStatus(Status.QUOTA_EXCEEDED)

    def take_received(self, ext: ExtensionView, amount: int) -> tuple[int, int]:
        """Bytes about to be read from a response's socket: counted before the read, as many
        as the budget has left (``Account.take``; under ``warn``, all of them), so responses
        in flight at once share what is left. 0 when it has none left, under any action but
        ``warn``: the crossing's action is applied, and the response is not handed over.
        Returns the bytes counted and their bucket, for :meth:`refund_received`."""
        granted, index, crossing = ext.account.take(Resource.NETWORK_BYTES_PER_HOUR, amount)
        if crossing is not None:
            self._crossed(ext, crossing)
        return granted, index

    def refund_received(self, ext: ExtensionView, amount: int, index: int) -> None:
        """Bytes of :meth:`take_received` that were not read, given back into their bucket."""
        ext.account.refund_from(Resource.NETWORK_BYTES_PER_HOUR, amount, index)

    def refund(self, ext: ExtensionView, resource: Resource, amount: int) -> None:
        """Bytes charged for a request that was then not sent."""
        ext.account.refund(resource, amount)

    def check_call(self, ext: ExtensionView) -> None:
        """Before a call (``ext``'s lock held): refuse it while its CPU rate is over budget,
        or a level cools off, under ``throttle`` or ``terminate`` (in ``ThrottleMode.DELAY``,
        raise :class:`Delayed` for the call path to wait instead); once back within, a
        throttled extension resumes."""
        account = ext.account
        delay = account.budget.throttle_mode is ThrottleMode.DELAY
        crossing = account.admit_call(count=not delay)
        if crossing is not None and not crossing.refused:
            # warn or pause fired on the CPU rate: applied now; a level's cool-off may still
            # refuse the call (the rate's episode is marked, so this asks only that).
            self._crossed(ext, crossing, locked=True)
            crossing = account.admit_call(count=not delay)
        if crossing is not None:
            self._crossed(ext, crossing, locked=True, count_refusal=not delay)
            if crossing.refused:
                if delay and crossing.action is Action.THROTTLE:
                    raise Delayed(ext.id, ext.lifecycle.state, crossing)
                if delay:  # terminate never waits: its refusal is counted here
                    self._refused(ext)
                raise Throttled(ext.id, ext.lifecycle.state, crossing)
            return  # warn: admitted; pause: the lifecycle refuses it
        if ext.lifecycle.state is State.THROTTLED:
            ext.lifecycle.try_fire(Event.RESUME, "back within its budget")

    def _refused(self, ext: ExtensionView) -> None:
        ext.account.count_refusal()
        with self._lock:
            self._refusals += 1

    def refuse(self, ext: ExtensionView, delayed: Delayed) -> Throttled:
        """A :class:`Delayed` call that will not wait after all: counted, and the refusal it
        raises instead."""
        self._refused(ext)
        return Throttled(ext.id, ext.lifecycle.state, delayed.crossing)

    def wait_for_room(
        self,
        ext: ExtensionView,
        delayed: Delayed,
        deadline: float,
        ticket: CallTicket | None,
        state: DelayState,
    ) -> None:
        """Wait (no lock held) for the room ``delayed`` says will come, then return for the
        call to check again. ``deadline`` is the call's, on ``time.monotonic()``. Raises the
        refusal (:class:`Throttled`) instead when room would come after the call's deadline
        or :data:`MAX_THROTTLE_DELAY_S` of waiting in all, or when a wake-up (a cancel,
        close, stop, pause, revocation, shutdown) already ended an earlier wait of this call;
        ``cancelled`` when the caller gave up."""
        if ticket is not None and ticket.cancelled:
            raise CallError(FailureClass.CANCELLED, "cancelled by the caller")
        now = self._clock()
        since = now if state.since is None else state.since
        left = min(MAX_THROTTLE_DELAY_S - (now - since), deadline - time.monotonic())
        if state.woken or delayed.crossing.retry_after_s > left:
            raise self.refuse(ext, delayed)
        if state.since is None:  # the call's first wait: it counts as one delayed call
            state.since = now
            ext.account.count_delay()
            with self._lock:
                self._delays += 1
        wake = ext.delay_wake(state.generation)
        if ticket is not None:
            ticket.delay_wake = wake  # set, then look: cancel() does the reverse
        try:
            if ticket is None or not ticket.cancelled:
                self._sleep(delayed.crossing.retry_after_s, wake)
        finally:
            ext.delay_done(wake)
            if ticket is not None:
                ticket.delay_wake = None
        if ticket is not None and ticket.cancelled:
            raise CallError(FailureClass.CANCELLED, "cancelled by the caller")
        # Woken by a change that leaves the extension throttled or running (another call
        # resumed it, a new crossing): check again and wait on if need be. Any other state
        # (stopped, paused, quarantined...) ends the wait: the next check refuses.
        state.woken = wake.is_set() and ext.lifecycle.state not in _WAITING_STATES

    def level_crossed(
        self,
        ext: ExtensionView,
        resource: Resource,
        used: int,
        limit: int,
        refusal: str,
        *,
        in_call: bool,
        ending: bool = False,
    ) -> None:
        """A level's static limit refused something of ``ext`` (``refusal`` says what, as
        counts): the level's action fires, once per episode (budgets.LEVEL_COOL_OFF_S).
        ``in_call``: reported from a host function of a call on this thread, which under
        ``terminate`` ends at once (raises GuestInterrupted). ``ending``: the call that hit
        the limit fails and crashes the extension anyway (out of fuel, memory), so
        ``terminate`` has nothing more to end. Otherwise ``terminate`` with no call in flight
        crashes the extension here (class resource_limit)."""
        crossing = ext.account.level_crossed(resource, used, limit, refusal)
        if crossing is None:
            return
        busy = self._crossed(ext, crossing)
        if crossing.action is Action.TERMINATE:
            if in_call:
                raise GuestInterrupted
            if not ending and not busy:
                ext.terminate(_termination(crossing))

    def _crossed(
        self,
        ext: ExtensionView,
        crossing: Crossing,
        *,
        locked: bool = False,
        count_refusal: bool = True,
    ) -> int:
        """Apply a crossing's action (``locked``: the caller holds ``ext``'s pool lock);
        under ``terminate``, how many calls in flight it stopped."""
        with self._lock:
            if crossing.refused and count_refusal:
                self._refusals += 1
            if crossing.fired:
                self._fired[crossing.action] += 1
        if not crossing.fired:
            return 0
        reason = crossing.describe()
        ext.host.journal(ext.id, "budget", reason)
        action = crossing.action
        if action is Action.THROTTLE:
            # Network bytes throttle request by request; the others refuse (or delay) calls.
            if crossing.resource is not Resource.NETWORK_BYTES_PER_HOUR:
                ext.lifecycle.try_fire(Event.THROTTLE, reason)
                ext.recheck()
        elif action is Action.PAUSE:
            ext.lifecycle.try_fire(Event.PAUSE, reason)
            ext.recheck()
        elif action is Action.TERMINATE:
            stopped = ext.stop_calls(_termination(crossing), locked=locked)
            ext.recheck()
            return stopped
        return 0

    # -- reading --------------------------------------------------------------------------

    def usage(
        self,
        ext: ExtensionView,
        calls_in_flight: int,
        broker_states: Iterable[tuple[Any, Any]],
    ) -> Usage:
        account = ext.account
        levels: dict[str, int] = {}
        for broker, state in broker_states:
            report = getattr(broker, "usage", None)
            if report is not None:
                for key, value in report(state).items():
                    if key in LEVELS and type(value) is int:
                        levels[key] = value
        waiting = account.wait()
        from .reports import Usage

        return Usage(
            extension=ext.id,
            budget=account.budget,
            cpu_fuel_last_minute=account.used(Resource.CPU_FUEL_PER_MINUTE),
            network_bytes_last_hour=account.used(Resource.NETWORK_BYTES_PER_HOUR),
            fuel_last_call=ext.last_fuel_used,
            calls_in_flight=calls_in_flight,
            storage_bytes=levels.get(Resource.STORAGE_BYTES.value),
            open_handles=levels.get(Resource.OPEN_HANDLES.value),
            background_jobs=levels.get(Resource.BACKGROUND_JOBS.value),
            event_queue_depth=levels.get(Resource.EVENT_QUEUE_DEPTH.value),
            actions_fired=MappingProxyType({a.value: n for a, n in account.fired.items()}),
            refusals=account.refusals,
            delays=account.delays,
            retry_after_s=waiting,
        )

    def counts(self) -> tuple[Mapping[str, int], int]:
        """For the operator metrics: actions fired by name, and refusals, host-wide."""
        with self._lock:
            return (
                MappingProxyType({a.value: n for a, n in self._fired.items()}),
                self._refusals,
            )

    def delays(self) -> int:
        """For the operator metrics: calls that waited for room, host-wide."""
        with self._lock:
            return self._delays


# The states in which a woken call may go on waiting for room.
_WAITING_STATES = frozenset({State.RUNNING, State.THROTTLED})

# How the governor's terminate failures begin: the call path tells them from a guest's own
# fuel running out (which is a level crossing of fuel_per_call) by it.
TERMINATED_PREFIX = "terminated: "


def _termination(crossing: Crossing) -> CallError:
    return CallError(FailureClass.OUT_OF_FUEL, f"{TERMINATED_PREFIX}{crossing.describe()}")
