"""Fair-share scheduling of guest calls: a host-wide number of call slots, handed out by
priority class and, within a class, to the extension that has used least.

Pure: no engine, no I/O, an injectable clock. :class:`Scheduler` is the whole policy; the host
wires it to extension calls in :mod:`wasihost.host.call_gate`.

How a free slot is handed out when calls wait for one:

1. **Between classes, weighted fair queueing.** Each class has a virtual time: the slot time
   its calls held, divided by its weight (:data:`WEIGHTS`: interactive 16, background 4,
   maintenance 1). The slot goes to the class whose next call would finish first in that
   virtual time (its virtual time plus :data:`MIN_CHARGE_S` over its weight; a tie goes to
   the higher class). So under full contention interactive calls get about 16/21 of the slot
   time, background 4/21 and maintenance 1/21: a lower class is served less, never starved.
2. **Within a class, least use first.** Each extension's slot time in the class is counted;
   the waiter of the extension with the least goes first (its calls in arrival order).
3. **No credit for idling.** A class or extension that starts waiting again is lifted to the
   least use of those served before it, so time spent idle is not saved up to monopolise
   slots later; a hog stays above that floor until the others catch up.

Every grant is charged :data:`MIN_CHARGE_S` at once (so a burst of grants takes turns before
any call ends) and the rest of its held time when it is released.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import enum
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

import attrs

from ..core.errors import CallError, ConfigError, FailureClass, WasihostError

# The manifest's parser checks a claimed class against these names, without this module;
# Priority's members are the same names in the same order (``as``: exported from here too).
from ..core.manifest import PRIORITY_NAMES as PRIORITY_NAMES  # noqa: PLC0414


class Priority(enum.Enum):
    """A call's priority class, highest first."""

    INTERACTIVE = "interactive"
    BACKGROUND = "background"
    MAINTENANCE = "maintenance"

    # 0 for the highest class; a larger rank is a lower class. A plain attribute, set below:
    # every call reads it, and an enum's hash or property costs several times more.
    rank: int

    @classmethod
    def parse(cls, value: object) -> Priority:
        if isinstance(value, Priority):
            return value
        found = _BY_NAME.get(value) if isinstance(value, str) else None
        if found is None:
            names = ", ".join(m.value for m in cls)
            raise ConfigError(f"priority {value!r} is not one of {names}")
        return found


for _rank, _member in enumerate(Priority):
    _member.rank = _rank
_BY_NAME: Mapping[str, Priority] = MappingProxyType({p.value: p for p in Priority})

# The share of contended slot time of each class is its weight over the sum of the weights of
# the classes waiting: 16:4:1 gives interactive callers (people waiting on a screen) about 76%,
# background work (events, jobs) about 19% and maintenance about 5%, so background work still
# makes progress under an interactive flood and maintenance is never starved.
WEIGHTS: Mapping[Priority, int] = MappingProxyType(
    {Priority.INTERACTIVE: 16, Priority.BACKGROUND: 4, Priority.MAINTENANCE: 1}
)
# What every grant costs at least, in seconds of slot time: about the cost of a short call
# with its host calls. Calls shorter than this are counted as this long, so a flood of
# no-op calls takes turns like any other, and a grant is charged before its call ends.
MIN_CHARGE_S = 0.001
# Slot time is counted in whole nanoseconds and virtual time in nanoseconds times the least
# common multiple of the weights over the class's weight: integers, so equal shares compare
# equal (a tie goes to the higher class) instead of by a rounding error.
_MIN_CHARGE_NS = round(MIN_CHARGE_S * 1e9)
_SCALE = math.lcm(*WEIGHTS.values())
_STRIDE: Mapping[Priority, int] = MappingProxyType({p: _SCALE // w for p, w in WEIGHTS.items()})
# The most call slots a host may have: far more than any machine has cores to run guests on.
MAX_CONCURRENT_CALLS = 4096
# The retry hint of a refusal: at least a millisecond (anything shorter is a busy loop) and
# at most ten seconds (a hint longer than that is a guess about the far future).
MIN_RETRY_AFTER_S = 0.001
MAX_RETRY_AFTER_S = 10.0
# The retry hint follows the recent slot hold times with this smoothing factor per release.
HOLD_SMOOTHING = 0.2


def lower(a: Priority, b: Priority) -> Priority:
    """The lower of two classes (a call never runs above its extension's class)."""
    return a if a.rank >= b.rank else b


# The class of the calls made in this context, when it is lower than their extensions' own
# (None: the extension's class). Thread-local in effect: each thread starts in its own context.
# The host's call gate (wasihost.host.call_gate) reads it; it lives here so that the brokers'
# dispatchers, below the host, can set it.
_CALLS_AS: contextvars.ContextVar[Priority | None] = contextvars.ContextVar(
    "wasihost_calls_as", default=None
)


@contextlib.contextmanager
def calls_as(priority: Priority | str) -> Iterator[None]:
    """Run the calls made in this block at most in class ``priority``::

    with calls_as("maintenance"):
        ext.call("reindex")
    """
    token = _CALLS_AS.set(Priority.parse(priority))
    try:
        yield
    finally:
        _CALLS_AS.reset(token)


def run_calls_as(priority: Priority) -> None:
    """For a worker thread that does one kind of work for its whole life (the brokers'
    dispatchers): its calls run at most in class ``priority``."""
    _CALLS_AS.set(priority)


class HostBusy(WasihostError):
    """Every call slot of the host stayed taken until the call's deadline: the call never
    started. Not the extension's fault; ``retry_after_s`` says when a slot is likely free."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.hint = f"retry in {retry_after_s:.3f} s, or raise the host's max_concurrent_calls"

    @property
    def error_class(self) -> str:
        return "busy"


class Slot:
    """One call slot, held by one call from its grant until :meth:`Scheduler.release`."""

    __slots__ = ("extension", "granted_at", "priority", "queued", "released")

    def __init__(self, extension: str, priority: Priority, granted_at: float, queued: bool) -> None:
        self.extension = extension
        self.priority = priority
        self.granted_at = granted_at
        # Whether it was granted after a wait in the queue (not at once).
        self.queued = queued
        self.released = False


class Waiter:
    """A call waiting for a slot. :meth:`cancel` (any thread) wakes it to give up."""

    __slots__ = ("cancelled", "event", "extension", "notify", "priority", "seq", "slot")

    def __init__(self, extension: str, priority: Priority, seq: int) -> None:
        self.extension = extension
        self.priority = priority
        self.seq = seq
        self.slot: Slot | None = None
        self.cancelled = False
        self.event = threading.Event()
        # Told (with no lock held) after the event is set, for a waiter that waits on an
        # event loop rather than on the event (an acall: wasihost.host.aio). Set it, then look at
        # ``slot`` and ``cancelled``: a grant or cancel may have come first.
        self.notify: Callable[[], None] | None = None

    def cancel(self) -> None:
        self.cancelled = True
        self.event.set()
        notify = self.notify
        if notify is not None:
            notify()


@attrs.frozen
class SchedulerStats:
    """Counts for operators: nothing about what the calls carry."""

    max_concurrent_calls: int
    running: int
    waiting: int
    granted: int
    waited: int
    refused: int
    cancelled: int
    waited_by_class: Mapping[str, int]
    refused_by_class: Mapping[str, int]

    def to_json(self) -> dict[str, object]:
        return {
            "max_concurrent_calls": self.max_concurrent_calls,
            "running": self.running,
            "waiting": self.waiting,
            "granted": self.granted,
            "waited": self.waited,
            "refused": self.refused,
            "cancelled": self.cancelled,
            "waited_by_class": dict(self.waited_by_class),
            "refused_by_class": dict(self.refused_by_class),
        }


class _Class:
    """One priority class: its virtual time, its waiting extensions (each a FIFO of its
    waiters), their use of the class, and the use floor a returning extension is lifted to."""

    __slots__ = ("floor", "priority", "queues", "refused", "stride", "used", "vtime", "waited")

    def __init__(self, priority: Priority) -> None:
        self.priority = priority
        self.stride = _STRIDE[priority]
        self.waited = 0
        self.refused = 0
        self.vtime = 0
        self.floor = 0
        self.queues: dict[str, collections.deque[Waiter]] = {}
        self.used: dict[str, int] = {}


class Scheduler:
    """At most ``max_concurrent_calls`` calls hold a slot at once; waiters get freed slots by
    class weight and fair share (see the module docstring).

    ``ceiling`` is the highest class any extension may claim (an operator's cap on manifests:
    ``Priority.BACKGROUND`` makes every manifest's ``interactive`` a ``background``);
    :meth:`assign` sets one extension's class outright."""

    def __init__(
        self,
        max_concurrent_calls: int,
        *,
        ceiling: Priority | str = Priority.INTERACTIVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (
            isinstance(max_concurrent_calls, bool)
            or not isinstance(max_concurrent_calls, int)
            or not 1 <= max_concurrent_calls <= MAX_CONCURRENT_CALLS
        ):
            raise ConfigError(
                f"max_concurrent_calls={max_concurrent_calls!r} must be an int in "
                f"1..{MAX_CONCURRENT_CALLS}"
            )
        self.max_concurrent_calls = max_concurrent_calls
        self.ceiling = Priority.parse(ceiling)
        self._clock = clock
        self._lock = threading.Lock()
        self._free = max_concurrent_calls
        # Indexed by rank.
        self._classes = tuple(_Class(p) for p in Priority)
        self._class_floor = 0
        self._waiting = 0
        self._seq = 0
        self._assigned: dict[str, Priority] = {}
        self._hold_estimate = MIN_CHARGE_S
        self._granted = 0
        self._cancelled = 0

    def now(self) -> float:
        """This scheduler's clock (deadlines given to :meth:`acquire` are on it)."""
        return self._clock()

    # -- classes -------------------------------------------------------------------------------

    def assign(self, extension: str, priority: Priority | str | None) -> None:
        """The operator's word on ``extension``'s class (any class, above the ceiling too);
        None returns it to its manifest's claim under the ceiling."""
        with self._lock:
            if priority is None:
                self._assigned.pop(extension, None)
            else:
                self._assigned[extension] = Priority.parse(priority)

    def forget(self, extension: str) -> None:
        """``extension``'s last extension closed: its use is forgotten (if admitted again it
        starts at each class's floor, as one back from idle does). Waiters it still has keep
        theirs. The operator's :meth:`assign` is kept."""
        with self._lock:
            for cls in self._classes:
                if extension not in cls.queues:
                    cls.used.pop(extension, None)

    def class_of(self, extension: str, claimed: Priority) -> Priority:
        """The class ``extension``'s calls run in: the operator's assignment, else its claim
        capped by the ceiling."""
        assigned = self._assigned.get(extension)
        return assigned if assigned is not None else lower(claimed, self.ceiling)

    # -- the core, without blocking ----------------------------------------------------------------

    def try_acquire(self, extension: str, priority: Priority) -> Slot | None:
        """A slot if one is free now, else None (nothing queued): the uncontended path."""
        with self._lock:
            if self._free <= 0:
                return None
            self._free -= 1
            return self._charge(extension, priority, queued=False)

    def request(self, extension: str, priority: Priority) -> Waiter:
        """Ask for a slot: the waiter comes back granted (``waiter.slot``) when one is free,
        else queued until :meth:`release` hands it one or :meth:`withdraw` takes it back."""
        with self._lock:
            self._seq += 1
            waiter = Waiter(extension, priority, self._seq)
            if self._free > 0:
                self._free -= 1
                waiter.slot = self._charge(extension, priority, queued=False)
                return waiter
            cls = self._classes[priority.rank]
            if not cls.queues:
                # Back from idle: no saved-up credit against the classes served meanwhile.
                cls.vtime = max(cls.vtime, self._class_floor)
            queue = cls.queues.get(extension)
            if queue is None:
                queue = cls.queues[extension] = collections.deque()
                cls.used[extension] = max(cls.used.get(extension, 0), cls.floor)
            queue.append(waiter)
            self._waiting += 1
            return waiter

    def withdraw(self, waiter: Waiter, *, refused: bool = False) -> bool:
        """Take a waiter out of the queue: True if it was still waiting (it never gets a
        slot), False if it holds one already (its caller must use or release it)."""
        with self._lock:
            if waiter.slot is not None:
                return False
            cls = self._classes[waiter.priority.rank]
            queue = cls.queues.get(waiter.extension)
            if queue is not None and waiter in queue:  # counted once, however often asked
                queue.remove(waiter)
                self._waiting -= 1
                if not queue:
                    self._leave(cls, waiter.extension)
                if refused:
                    cls.refused += 1
                else:
                    self._cancelled += 1
            return True

    def release(self, slot: Slot) -> None:
        """The call holding ``slot`` ended: charge its time and hand the slot to the next
        waiter, if any. Idempotent."""
        now = self._clock()
        with self._lock:
            if slot.released:
                return
            slot.released = True
            held = max(0.0, now - slot.granted_at)
            self._hold_estimate += HOLD_SMOOTHING * (held - self._hold_estimate)
            extra = max(0, round(held * 1e9) - _MIN_CHARGE_NS)
            cls = self._classes[slot.priority.rank]
            cls.vtime += extra * cls.stride
            if slot.extension in cls.used:
                cls.used[slot.extension] += extra
            else:
                # Its use was forgotten at the floor (it had nothing queued): it comes back
                # there, plus what this call held above its first charge.
                cls.used[slot.extension] = cls.floor + extra
            self._prune(cls, slot.extension)
            nxt = self._next() if self._waiting else None
            if nxt is None:
                self._free += 1
            else:
                nxt.slot = self._charge(nxt.extension, nxt.priority, queued=True)
                nxt.event.set()
        if nxt is not None and nxt.notify is not None:
            nxt.notify()

    def _charge(self, extension: str, priority: Priority, *, queued: bool) -> Slot:
        """Caller holds the lock and has taken a slot: charge the grant, make the slot."""
        cls = self._classes[priority.rank]
        cls.vtime += _MIN_CHARGE_NS * cls.stride
        cls.used[extension] = cls.used.get(extension, cls.floor) + _MIN_CHARGE_NS
        self._granted += 1
        if queued:
            cls.waited += 1
        return Slot(extension, priority, self._clock(), queued)

    def _next(self) -> Waiter | None:
        """Caller holds the lock: pop the waiter the next free slot goes to."""
        best: tuple[int, int] | None = None
        chosen: _Class | None = None
        for cls in self._classes:
            if not cls.queues:
                continue
            tag = (cls.vtime + _MIN_CHARGE_NS * cls.stride, cls.priority.rank)
            if best is None or tag < best:
                best, chosen = tag, cls
        if chosen is None:
            return None
        cls = chosen
        self._class_floor = max(self._class_floor, cls.vtime)
        extension = min(cls.queues, key=lambda e: (cls.used[e], cls.queues[e][0].seq))
        cls.floor = max(cls.floor, cls.used[extension])
        queue = cls.queues[extension]
        waiter = queue.popleft()
        self._waiting -= 1
        if not queue:
            self._leave(cls, extension)
        return waiter

    def _leave(self, cls: _Class, extension: str) -> None:
        """Caller holds the lock: ``extension`` has nothing more queued in ``cls``."""
        del cls.queues[extension]
        self._prune(cls, extension)

    @staticmethod
    def _prune(queue: _Class, extension: str) -> None:
        # Use at or below the floor would be lifted to it on return anyway: forgetting it keeps
        # the table as small as the extensions that are ahead of the others.
        if extension not in queue.queues and queue.used.get(extension, 0) <= queue.floor:
            queue.used.pop(extension, None)

    # -- blocking ----------------------------------------------------------------------------------

    def acquire(
        self,
        extension: str,
        priority: Priority,
        deadline: float,
        *,
        on_wait: Callable[[Waiter | None], None] | None = None,
    ) -> Slot:
        """Block until a slot is granted; raise :class:`HostBusy` at ``deadline`` (on this
        scheduler's clock) or ``CallError(cancelled)`` once the waiter is cancelled. Neither
        leaves a slot taken. ``on_wait`` is told the waiter before the wait (so that another
        thread can cancel it) and None after."""
        slot = self.try_acquire(extension, priority)
        if slot is not None:
            return slot
        waiter = self.request(extension, priority)
        slot = waiter.slot
        if slot is not None:
            return slot
        if on_wait is not None:
            on_wait(waiter)
        try:
            while True:
                if waiter.slot is None and waiter.cancelled and self.withdraw(waiter):
                    raise CallError(FailureClass.CANCELLED, "cancelled while waiting for a slot")
                slot = waiter.slot
                if slot is not None:
                    if waiter.cancelled:
                        self.release(slot)
                        raise CallError(
                            FailureClass.CANCELLED, "cancelled while waiting for a slot"
                        )
                    return slot
                left = deadline - self._clock()
                if left <= 0 and self.withdraw(waiter, refused=True):
                    raise self.busy(extension, priority)
                waiter.event.wait(max(0.0, left))
        except BaseException:
            # Interrupted in the wait (KeyboardInterrupt): never leave a slot behind.
            if not self.withdraw(waiter) and waiter.slot is not None:
                self.release(waiter.slot)
            raise
        finally:
            if on_wait is not None:
                on_wait(None)

    def busy(self, extension: str, priority: Priority) -> HostBusy:
        """The refusal of a call of ``extension`` that waited for a slot until its deadline."""
        with self._lock:
            running = self.max_concurrent_calls - self._free
            waiting = self._waiting
            ahead = waiting + 1
            retry = self._hold_estimate * ahead / self.max_concurrent_calls
        retry = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, retry))
        return HostBusy(
            f"no call slot for {extension} ({priority.value}) before the call's deadline: "
            f"{running} of {self.max_concurrent_calls} slots in calls, {waiting} waiting",
            retry,
        )

    # -- for operators -----------------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        with self._lock:
            return SchedulerStats(
                max_concurrent_calls=self.max_concurrent_calls,
                running=self.max_concurrent_calls - self._free,
                waiting=self._waiting,
                granted=self._granted,
                waited=sum(c.waited for c in self._classes),
                refused=sum(c.refused for c in self._classes),
                cancelled=self._cancelled,
                waited_by_class=MappingProxyType(
                    {c.priority.value: c.waited for c in self._classes if c.waited}
                ),
                refused_by_class=MappingProxyType(
                    {c.priority.value: c.refused for c in self._classes if c.refused}
                ),
            )
