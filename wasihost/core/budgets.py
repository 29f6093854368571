"""Per-extension resource budgets over time, and what crossing one does: pure bookkeeping.

An extension's :class:`ResourceBudget` is its manifest's request intersected with the host's
:class:`BudgetPolicy` (each number the smaller of the two). Seven of its resources are
levels that a static limit holds (fuel per call, memory, storage bytes, open handles,
background jobs, event-queue depth, concurrent calls: the engine or a broker refuses past
them, and reports the refusal here). Two are rates, accounted here over a sliding window:
**CPU fuel per minute** and **network bytes per hour**. Crossing any of them fires the
policy's :class:`Action` for it: ``warn``, ``throttle``, ``pause`` or ``terminate``
(docs/budgets.md says what each does). Under ``throttle`` a call is refused with a retry hint
or, in :attr:`ThrottleMode.DELAY`, waits for room (bounded).

No engine, no I/O, an injectable clock: :class:`Account` answers what a charge or a call
means, and :mod:`wasihost.supervisor.governor` applies the answer to a running extension.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import attrs

from . import limits
from .errors import ConfigError

# Defined beside the limits, so that a crossing's record (budget_crossing) names them without
# importing this module; exported from here too (``as``: an explicit re-export, for mypy).
from .limits import Action as Action  # noqa: PLC0414
from .limits import Resource as Resource  # noqa: PLC0414
from .limits import ThrottleMode as ThrottleMode  # noqa: PLC0414
from .manifest import DEFAULT_HTTP_BYTES_PER_HOUR, Manifest, Resources

if TYPE_CHECKING:
    from .budget_crossing import Crossing


def __getattr__(name: str) -> Any:
    # Made when a budget is crossed, defined there (issue 12 section 4); exported here too.
    if name == "Crossing":
        from .budget_crossing import Crossing

        return Crossing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The two rate budgets and the length of their windows.
CPU_WINDOW_S: Final = 60.0
NETWORK_WINDOW_S: Final = 3600.0
WINDOWS: Final[Mapping[Resource, float]] = MappingProxyType(
    {Resource.CPU_FUEL_PER_MINUTE: CPU_WINDOW_S, Resource.NETWORK_BYTES_PER_HOUR: NETWORK_WINDOW_S}
)
RATES: Final = tuple(WINDOWS)
# The seven levels: a static limit refuses past each (the engine, the pool or a broker), and
# the refusal is reported to the governor, which fires the level's action.
LEVELS: Final = tuple(r for r in Resource if r not in WINDOWS)
# Waits are rounded up by this much: a clock moved on by a retry hint has surely reached it,
# whatever the float arithmetic of bucket boundaries.
WAIT_MARGIN_S: Final = 1e-6
# Each window slides in 60 buckets (a second of the minute, a minute of the hour): memory per
# extension stays bounded whatever it does, and the budget frees itself a bucket at a time
# instead of all at once on the hour.
WINDOW_BUCKETS: Final = 60

# The host's ceiling on network bytes an hour: by default no lower than the most a manifest
# may ask (manifest.MAX_HTTP_BYTES_PER_HOUR, 1 GiB), so the manifest's own [http]
# bytes_per_hour (16 MiB unless it says otherwise) is what applies.
DEFAULT_NETWORK_BYTES_PER_HOUR: Final = 1024 * 1024 * 1024
MIN_NETWORK_BYTES_PER_HOUR: Final = 1
# 64 GiB an hour is about 150 Mbit/s sustained: a plugin that needs more is not a plugin.
MAX_NETWORK_BYTES_PER_HOUR: Final = 64 * 1024 * 1024 * 1024
# Both rates throttle by default: an extension over its budget waits, and nothing is lost.
DEFAULT_ACTION: Final = Action.THROTTLE
# The levels warn by default: their static limits already refuse what is past them (as they
# did before levels fired actions), and the crossing is journaled and counted on top.
DEFAULT_LEVEL_ACTION: Final = Action.WARN
# How long a level's crossing lasts as an episode: under throttle (and terminate) the
# extension's calls are refused (or delayed) this long; under any action, further crossings
# of that level within it fire nothing more, so a guest retrying a refused write in a loop
# makes one journal line, not thousands. Ten seconds: long enough for a well-behaved guest's
# caller to notice and back off, short enough that an honest mistake (a full store, a burst
# of events) costs little.
LEVEL_COOL_OFF_S: Final = 10.0
# Refusing stays the default: a delayed call holds its caller's thread (for acall, one of the
# host's call threads) while it waits, which an embedder should choose knowingly, and every
# caller written against Throttled keeps working.
DEFAULT_THROTTLE_MODE: Final = ThrottleMode.REFUSE
# The longest a call may wait for room under ThrottleMode.DELAY, whatever its deadline: half a
# minute covers a CPU window's oldest buckets leaving (one a second) and a level's cool-off,
# and no interactive caller should be held longer; past it the call is refused with the hint.
MAX_THROTTLE_DELAY_S: Final = 30.0


def _rate_in(low: int, high: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(_: object, attribute: attrs.Attribute[int], value: int) -> None:
        if type(value) is not int or not low <= value <= high:
            raise ConfigError(f"{attribute.name} must be an int in {low}..{high}, got {value!r}")

    return check


def _actions(value: Mapping[Any, Any]) -> Mapping[Resource, Action]:
    actions = dict.fromkeys(RATES, DEFAULT_ACTION)
    actions.update(dict.fromkeys(LEVELS, DEFAULT_LEVEL_ACTION))
    if not isinstance(value, Mapping):
        # dict() of a string or a list of names fails deep in Python, or reads it as pairs.
        raise ConfigError(
            f"budget actions must be a mapping of resource to action, not {type(value).__name__}"
        )
    for key, action in dict(value).items():
        try:
            resource = Resource(key) if isinstance(key, str) else key
            chosen = Action(action) if isinstance(action, str) else action
        except ValueError:
            raise ConfigError(f"budget action {key!r}={action!r}: unknown name") from None
        if not isinstance(resource, Resource) or not isinstance(chosen, Action):
            raise ConfigError(
                f"budget action {key!r}={action!r}: a resource "
                f"({', '.join(r.value for r in Resource)}) takes one of "
                f"{', '.join(a.value for a in Action)}"
            )
        actions[resource] = chosen
    return MappingProxyType(actions)


def _throttle_mode(value: object) -> ThrottleMode:
    try:
        return ThrottleMode(value)
    except ValueError:
        raise ConfigError(
            f"throttle mode {value!r}: one of {', '.join(m.value for m in ThrottleMode)}"
        ) from None


def stricter_mode(policy: ThrottleMode, requested: ThrottleMode | None) -> ThrottleMode:
    """The intersection of the host's throttle mode and a manifest's request: a call waits
    only if both allow it (a silent manifest follows the host)."""
    if requested is ThrottleMode.REFUSE:
        return ThrottleMode.REFUSE
    return policy


@attrs.frozen
class BudgetPolicy:
    """The host's side of the budgets: a ceiling on each rate, the action each resource's
    crossing fires, and what ``throttle`` does to a call. ``actions`` maps a resource (its
    :class:`Resource` or its name) to an :class:`Action` (or its name); a rate not named keeps
    :data:`DEFAULT_ACTION`, a level :data:`DEFAULT_LEVEL_ACTION`. ``throttle_mode``
    (:class:`ThrottleMode` or its name) is :data:`DEFAULT_THROTTLE_MODE` unless set."""

    cpu_fuel_per_minute: int = attrs.field(
        default=limits.DEFAULT_CPU_FUEL_PER_MINUTE,
        validator=_rate_in(limits.MIN_CPU_FUEL_PER_MINUTE, limits.MAX_CPU_FUEL_PER_MINUTE),
    )
    network_bytes_per_hour: int = attrs.field(
        default=DEFAULT_NETWORK_BYTES_PER_HOUR,
        validator=_rate_in(MIN_NETWORK_BYTES_PER_HOUR, MAX_NETWORK_BYTES_PER_HOUR),
    )
    actions: Mapping[Resource, Action] = attrs.field(
        converter=_actions, factory=dict, eq=False, hash=False
    )
    throttle_mode: ThrottleMode = attrs.field(
        default=DEFAULT_THROTTLE_MODE, converter=_throttle_mode
    )


@attrs.frozen
class ResourceBudget:
    """One extension's budget: every number is min(manifest request, host policy).

    ``None`` for a level the extension has no use of (no ``[jobs]``, no ``[events]``)."""

    fuel_per_call: int
    cpu_fuel_per_minute: int
    memory_bytes: int
    storage_bytes: int
    network_bytes_per_hour: int
    open_handles: int
    background_jobs: int | None
    event_queue_depth: int | None
    concurrent_calls: int
    actions: Mapping[Resource, Action] = attrs.field(eq=False, hash=False)
    throttle_mode: ThrottleMode = DEFAULT_THROTTLE_MODE

    def limit(self, resource: Resource) -> int | None:
        value: int | None = getattr(self, resource.value)
        return value

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {r.value: self.limit(r) for r in Resource}
        out["actions"] = {r.value: a.value for r, a in self.actions.items()}
        out["throttle_mode"] = self.throttle_mode.value
        return out


class Window:
    """A count over the last ``window_s`` seconds, in :data:`WINDOW_BUCKETS` buckets kept
    oldest first (so sliding is O(1) per charge). Not locked: its :class:`Account` is."""

    __slots__ = ("_buckets", "_span", "total")

    def __init__(self, window_s: float) -> None:
        self._span = window_s / WINDOW_BUCKETS
        # [bucket index, amount], oldest first; at most WINDOW_BUCKETS of them.
        self._buckets: collections.deque[list[int]] = collections.deque()
        self.total = 0

    def _slide(self, now: float) -> int:
        index = int(now // self._span)
        buckets = self._buckets
        while buckets and buckets[0][0] <= index - WINDOW_BUCKETS:
            self.total -= buckets.popleft()[1]
        return index

    def add(self, now: float, amount: int) -> int:
        index = self._slide(now)
        buckets = self._buckets
        # A clock that went back (it never should) counts into the newest bucket: the usage
        # then stays in the window longer, never shorter.
        if buckets and buckets[-1][0] >= index:
            buckets[-1][1] += amount
        else:
            buckets.append([index, amount])
        self.total += amount
        return self.total

    def used(self, now: float) -> int:
        self._slide(now)
        return self.total

    def empty_after(self, now: float) -> float:
        """Seconds until nothing counted so far is left in the window (0 if nothing is)."""
        self._slide(now)
        if not self.total:
            return 0.0
        # The newest bucket leaves once the window's current bucket is WINDOW_BUCKETS past it.
        return max(0.0, (self._buckets[-1][0] + WINDOW_BUCKETS) * self._span - now)

    def bucket(self, now: float) -> int:
        """The index of the bucket :meth:`add` counts into now (for :meth:`remove_from`)."""
        return self._slide(now)

    def remove_from(self, now: float, index: int, amount: int) -> None:
        """Take ``amount`` back from the bucket ``index`` it was added to (never below zero;
        nothing if that bucket has left the window): a refund lands where its charge did, so
        the bytes leave the window when they would have."""
        self._slide(now)
        for bucket in self._buckets:
            if bucket[0] == index:
                taken = min(amount, bucket[1])
                bucket[1] -= taken
                self.total -= taken
                return

    def remove(self, now: float, amount: int) -> None:
        """Take ``amount`` back, newest bucket first (never below zero)."""
        self._slide(now)
        for bucket in reversed(self._buckets):
            if amount <= 0:
                break
            taken = min(amount, bucket[1])
            bucket[1] -= taken
            self.total -= taken
            amount -= taken

    def wait_for(self, now: float, limit: int, extra: int = 0) -> float:
        """Seconds until ``used + extra <= limit`` (0 if already): buckets leave the window
        oldest first. ``extra`` beyond the limit itself never fits: a whole window."""
        self._slide(now)
        if self.total + extra <= limit:
            return 0.0
        if extra > limit:
            return self._span * WINDOW_BUCKETS
        left = self.total
        for key, amount in self._buckets:
            left -= amount
            if left + extra <= limit:
                # The bucket leaves when the window's newest bucket is WINDOW_BUCKETS past it;
                # a microsecond more so that a clock advanced by the answer is surely there.
                return max(0.0, (key + WINDOW_BUCKETS) * self._span - now) + WAIT_MARGIN_S
        return self._span * WINDOW_BUCKETS  # not reached: the last bucket empties the window


class Account:
    """One extension's rate accounting against its budget; thread-safe, clock injected.

    :meth:`charge` counts usage and says when it crosses the budget (the first crossing of an
    episode fires the action; an episode ends when the usage is back within the budget);
    :meth:`admit_call` says whether a call may start while a rate is over its budget."""

    def __init__(self, budget: ResourceBudget, clock: Callable[[], float]) -> None:
        self.budget = budget
        self._clock = clock
        self._lock = threading.Lock()
        self._windows = {r: Window(w) for r, w in WINDOWS.items()}
        self._over = dict.fromkeys(RATES, False)
        # _over's CPU entry, as a plain attribute for add_fuel (an enum-keyed lookup costs a
        # tenth of a microsecond, on every call).
        self._cpu_over = False
        self.fired: dict[Action, int] = dict.fromkeys(Action, 0)
        self.refusals = 0
        # Calls that waited for room under ThrottleMode.DELAY (whatever came of the wait).
        self.delays = 0
        # The episode of each level crossed lately: (until, crossing), on the clock.
        self._cool: dict[Resource, tuple[float, Crossing]] = {}
        # For add_fuel, on every call: the CPU window and its limit, looked up once.
        self._cpu = self._windows[Resource.CPU_FUEL_PER_MINUTE]
        self._cpu_limit = budget.cpu_fuel_per_minute

    def _set_over(self, resource: Resource, over: bool) -> None:
        self._over[resource] = over
        if resource is Resource.CPU_FUEL_PER_MINUTE:
            self._cpu_over = over

    def rebudget(self, budget: ResourceBudget) -> None:
        """A new budget (a policy update): the usage so far counts against it."""
        with self._lock:
            self.budget = budget
            self._cpu_limit = budget.cpu_fuel_per_minute

    def add_fuel(self, amount: int) -> Crossing | None:
        """:meth:`charge` of a call's burnt fuel, on every call: the common case (the same
        bucket as the last charge, within the budget, no episode going on) costs one lock and
        a few additions. A bucket is only ever made by a charge that slid the window to it
        first, so while the newest bucket is the current one nothing has left the window."""
        window = self._cpu
        index = int(self._clock() // window._span)
        # acquire/release rather than ``with``: the context manager is measurable per call.
        lock = self._lock
        lock.acquire()
        try:
            buckets = window._buckets
            if buckets and buckets[-1][0] == index and not self._cpu_over and amount >= 0:
                total = window.total + amount
                if total <= self._cpu_limit:
                    buckets[-1][1] += amount
                    window.total = total
                    return None
        finally:
            lock.release()
        return self.charge(Resource.CPU_FUEL_PER_MINUTE, amount)

    def used(self, resource: Resource) -> int:
        with self._lock:
            return self._windows[resource].used(self._clock())

    def charge(
        self, resource: Resource, amount: int, *, refusable: bool = False
    ) -> Crossing | None:
        """Count ``amount`` of a rate. ``refusable``: it is not spent yet (a request about to
        be sent), so under any action but ``warn`` a charge that would cross is refused and
        not counted. Otherwise (fuel already burnt, bytes already received) it is counted,
        and the crossing reported. Returns None while within the budget."""
        if amount < 0:
            raise ValueError("a charge is never negative")
        limit: int = getattr(self.budget, resource.value)
        action = self.budget.actions[resource]
        with self._lock:
            now = self._clock()
            window = self._windows[resource]
            used = window.used(now)
            if used + amount <= limit:
                window.add(now, amount)
                self._set_over(resource, False)
                return None
            refused = refusable and action is not Action.WARN
            # A new episode: none is going on, or this charge is what takes the usage from
            # within the budget to over it (the window may have emptied since the last one).
            fired = not self._over[resource] or (not refused and used <= limit)
            if not refused:
                used = window.add(now, amount)
            self._set_over(resource, True)
            if fired:
                self.fired[action] += 1
            if refused:
                self.refusals += 1
            wait = window.wait_for(now, limit, amount if refused else 0)
            from .budget_crossing import Crossing

            return Crossing(resource, action, used, limit, wait, fired, refused)

    def take(self, resource: Resource, amount: int) -> tuple[int, int, Crossing | None]:
        """Count up to ``amount`` of a rate about to be spent a part at a time (a response's
        bytes, before each read), as much as is left: one step under the lock, so spenders at
        once share what is left instead of each spending, then being charged (four responses
        in flight read 3-4x the host's network budget before one was charged over it: issue
        28's follow-up to item 14). Returns what was counted, the bucket it went to (for
        :meth:`refund_from`) and, when nothing is left, the Crossing (refused: the caller
        stops; its action fires as :meth:`charge`'s would). Under ``warn`` nothing is refused:
        all of ``amount`` is counted, as :meth:`charge` counts it."""
        if amount < 0:
            raise ValueError("a charge is never negative")
        action = self.budget.actions[resource]
        if action is Action.WARN:
            with self._lock:
                index = self._windows[resource].bucket(self._clock())
            return amount, index, self.charge(resource, amount)
        limit: int = getattr(self.budget, resource.value)
        with self._lock:
            now = self._clock()
            window = self._windows[resource]
            used = window.used(now)
            index = window.bucket(now)
            granted = max(0, min(amount, limit - used))
            if granted or not amount:
                window.add(now, granted)
                self._set_over(resource, False)
                return granted, index, None
            fired = not self._over[resource]
            self._set_over(resource, True)
            if fired:
                self.fired[action] += 1
            self.refusals += 1
            wait = window.wait_for(now, limit, 1)
            from .budget_crossing import Crossing

            return 0, index, Crossing(resource, action, used, limit, wait, fired, True)

    def refund_from(self, resource: Resource, amount: int, index: int) -> None:
        """Give back ``amount`` of a :meth:`take` that was not spent, into its bucket."""
        with self._lock:
            self._windows[resource].remove_from(self._clock(), index, amount)

    def refund(self, resource: Resource, amount: int) -> None:
        """Take back a charge that bought nothing (a request then refused elsewhere)."""
        with self._lock:
            self._windows[resource].remove(self._clock(), amount)

    def wait(self) -> float | None:
        """While calls are refused (the CPU rate over budget, or a level's cool-off, under
        ``throttle`` or ``terminate``): seconds until they are admitted again; else None.
        Counts nothing."""
        resource = Resource.CPU_FUEL_PER_MINUTE
        refusing = (Action.THROTTLE, Action.TERMINATE)
        with self._lock:
            now = self._clock()
            waits = [
                until - now + WAIT_MARGIN_S
                for r, (until, _) in self._cool.items()
                if now < until and self.budget.actions[r] in refusing
            ]
            if self.budget.actions[resource] in refusing:
                window = self._windows[resource]
                limit = self.budget.cpu_fuel_per_minute
                if window.used(now) > limit:
                    waits.append(window.wait_for(now, limit))
            return max(waits) if waits else None

    def admit_call(self, *, count: bool = True) -> Crossing | None:
        """Before a call: None while the CPU rate is within its budget and no level's
        cool-off refuses calls. Over the rate, the Crossing: ``refused`` under ``throttle`` or
        ``terminate`` (it says until when); ``fired`` if no episode was going on (a lowered
        budget put the usage over without a charge crossing it), so that the action fires
        before the call, not after. Within a level's cool-off under ``throttle`` or
        ``terminate``, that level's Crossing, refused until the cool-off ends. Network bytes
        are refused where they are spent, request by request (:meth:`charge`), not here.
        ``count``: a refusal is counted now (not when the caller may wait instead: it counts
        with :meth:`count_refusal` if the wait gives up)."""
        resource = Resource.CPU_FUEL_PER_MINUTE
        with self._lock:
            now = self._clock()
            window = self._windows[resource]
            limit = self.budget.cpu_fuel_per_minute
            used = window.used(now)
            if used <= limit:
                self._set_over(resource, False)
                return self._cooling(now, count) if self._cool else None
            action = self.budget.actions[resource]
            fired = not self._over[resource]
            if fired:
                self._set_over(resource, True)
                self.fired[action] += 1
            refused = action in (Action.THROTTLE, Action.TERMINATE)
            if refused and count:
                self.refusals += 1
            if not (fired or refused):
                return self._cooling(now, count) if self._cool else None
            wait = window.wait_for(now, limit)
            from .budget_crossing import Crossing

            return Crossing(resource, action, used, limit, wait, fired, refused)

    def _cooling(self, now: float, count: bool) -> Crossing | None:
        """Lock held: the level cool-off that refuses calls now (the longest), if any; the
        episodes that are over are forgotten."""
        refusing: Crossing | None = None
        for resource, (until, crossing) in list(self._cool.items()):
            if now >= until:
                del self._cool[resource]
            elif self.budget.actions[resource] in (Action.THROTTLE, Action.TERMINATE):
                left = until - now + WAIT_MARGIN_S
                if refusing is None or left > refusing.retry_after_s:
                    refusing = attrs.evolve(
                        crossing, retry_after_s=left, fired=False, refused=True
                    )
        if refusing is not None and count:
            self.refusals += 1
        return refusing

    def level_crossed(
        self, resource: Resource, used: int, limit: int, refusal: str
    ) -> Crossing | None:
        """A level's static limit refused something (``refusal`` says what). The first
        crossing of an episode fires the level's action and starts its cool-off
        (:data:`LEVEL_COOL_OFF_S`); a crossing within it returns None (nothing more fires)."""
        if resource in WINDOWS:
            raise ValueError(f"{resource.value} is a rate: charge it")
        with self._lock:
            now = self._clock()
            episode = self._cool.get(resource)
            if episode is not None and now < episode[0]:
                return None
            action = self.budget.actions[resource]
            from .budget_crossing import Crossing

            crossing = Crossing(
                resource, action, used, limit, LEVEL_COOL_OFF_S, True, False, refusal
            )
            self._cool[resource] = (now + LEVEL_COOL_OFF_S, crossing)
            self.fired[action] += 1
            return crossing

    def count_refusal(self) -> None:
        """A call that waited for room (ThrottleMode.DELAY) and was refused after all."""
        with self._lock:
            self.refusals += 1

    def count_delay(self) -> None:
        with self._lock:
            self.delays += 1

    def empty_after(self) -> float:
        """Seconds until every window is empty and every level's cool-off over (0 if they
        are): from then on this account counts nothing a new one would not (its action counts
        aside)."""
        with self._lock:
            now = self._clock()
            cooling = max((until - now for until, _ in self._cool.values()), default=0.0)
            return max(cooling, *(w.empty_after(now) for w in self._windows.values()))

    def over(self, resource: Resource) -> bool:
        with self._lock:
            return self._over[resource]


def budget_for(
    resources: Resources, manifest: Manifest | None, policy: BudgetPolicy, open_handles: int
) -> ResourceBudget:
    """An extension's budget: its (already policy-capped) resources, its manifest's
    ``[http]``, ``[jobs]``, ``[events]`` and ``[budget]`` requests, each rate lowered to the
    host's ceiling and the throttle mode the stricter of the two. ``open_handles`` is the
    files broker's fixed limit."""
    http = manifest.http.bytes_per_hour if manifest is not None else DEFAULT_HTTP_BYTES_PER_HOUR
    jobs = manifest.jobs if manifest is not None else None
    events = manifest.events if manifest is not None else None
    return ResourceBudget(
        fuel_per_call=resources.fuel_per_call,
        cpu_fuel_per_minute=min(resources.cpu_fuel_per_minute, policy.cpu_fuel_per_minute),
        memory_bytes=resources.max_memory_bytes,
        storage_bytes=resources.storage_max_bytes,
        network_bytes_per_hour=min(http, policy.network_bytes_per_hour),
        open_handles=open_handles,
        background_jobs=jobs.max_jobs if jobs is not None else None,
        event_queue_depth=events.queue_depth if events is not None else None,
        concurrent_calls=resources.max_concurrency,
        actions=policy.actions,
        throttle_mode=stricter_mode(
            policy.throttle_mode,
            ThrottleMode(manifest.throttle) if manifest is not None and manifest.throttle else None,
        ),
    )
