"""Idle eviction: a host-wide cap on live instances, and an idle timeout.

Many extensions in one process are mostly idle, and each live instance holds its Store, its
linear memory and its memory maps (docs/density.md). Under an :class:`EvictionPolicy` the
host drops the instances of the least recently used idle extension when a new instance would
pass ``max_live_instances``, and those of every extension idle for ``idle_evict_s``; the
evicted extension stays admitted and Running, and its next call instantiates it again (start
function and handshake included) under that call's budget.

What eviction keeps and loses:

- kept: the extension, its lifecycle state, its grants, its durable data (storage, the
  journal), its brokers' per-extension state; a quarantined or revoked extension stays so
  (eviction never moves a lifecycle);
- lost: the guest's linear memory and globals. A guest must keep nothing it needs in memory
  across calls; it sees a new ``wasihost.hello``/``wasihost.welcome`` with a new runtime id.

Never evicted: an extension with a call in flight or an instance being built (checked under
its own lock, which every call takes to check an instance out).

Locks: the evictor's lock is a leaf. It is never held while an extension's lock is taken;
an extension freeing an instance (under its own lock) takes it to count the instance out.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ..core.errors import ConfigError
from ..core.lifecycle import ExtensionUnavailable

if TYPE_CHECKING:
    from ..core.serving import ExtensionView

# A host with more live instances than this reserves more address space than x86-64 gives a
# process (1 GiB each of 128 TiB), so no limit above it means anything.
MAX_LIVE_INSTANCES = 100_000
# An idle timeout under a second would evict between two calls of one burst; over a day is
# no timeout.
MIN_IDLE_EVICT_S = 1.0
MAX_IDLE_EVICT_S = 86_400.0
# How often the idle sweep runs, as a fraction of idle_evict_s: an extension is evicted
# between idle_evict_s and 1.25 x idle_evict_s after its last call.
SWEEP_FRACTION = 0.25
# What a caller refused for want of room should wait before trying again: about one short
# call, after which an instance is usually idle again.
HOST_FULL_RETRY_S = 0.05
# The C heap is trimmed (engine.density.trim_native_heap, ~10 ms) once this many instances
# have been evicted since the last trim: RSS follows evictions down without a trim per
# eviction.
TRIM_EVERY_EVICTIONS = 256


@attrs.frozen
class EvictionPolicy:
    """When a host drops idle extensions' instances (None: never for that reason)."""

    max_live_instances: int | None = None
    idle_evict_s: float | None = None

    def __attrs_post_init__(self) -> None:
        limit = self.max_live_instances
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_LIVE_INSTANCES
        ):
            raise ConfigError(f"max_live_instances must be an int in 1..{MAX_LIVE_INSTANCES}")
        idle = self.idle_evict_s
        if idle is not None and (
            isinstance(idle, bool)
            or not isinstance(idle, (int, float))
            or not MIN_IDLE_EVICT_S <= idle <= MAX_IDLE_EVICT_S
        ):
            raise ConfigError(
                f"idle_evict_s must be a number of seconds in "
                f"{MIN_IDLE_EVICT_S:g}..{MAX_IDLE_EVICT_S:g}"
            )


class HostFull(ExtensionUnavailable):
    """Every live instance of the host is in a call and ``max_live_instances`` is reached:
    nothing could be evicted to start this extension. Retry shortly, or raise the limit."""


@attrs.frozen
class EvictionStats:
    """Counts for operators."""

    live_instances: int
    max_live_instances: int | None
    evictions: int
    idle_evictions: int
    refusals: int


def evictor_for(
    eviction: EvictionPolicy | Evictor | None, trim: Callable[[], object]
) -> Evictor | None:
    """A Host's evictor: None without a policy; an Evictor given ready-made (a test's, on its
    own clock) is used as it is."""
    if eviction is None or isinstance(eviction, Evictor):
        return eviction
    if not isinstance(eviction, EvictionPolicy):
        raise ConfigError("eviction must be an EvictionPolicy (or an Evictor)")
    if eviction.max_live_instances is None and eviction.idle_evict_s is None:
        return None
    return Evictor(eviction, trim=trim)


class Room:
    """One instance's place under the cap, held from before it is built until it is freed;
    :meth:`release` is idempotent."""

    __slots__ = ("_evictor",)

    def __init__(self, evictor: Evictor) -> None:
        self._evictor: Evictor | None = evictor

    def release(self) -> None:
        evictor, self._evictor = self._evictor, None
        if evictor is not None:
            evictor._released()


class Evictor:
    """Counts a host's live instances and evicts idle extensions under an
    :class:`EvictionPolicy`. ``clock`` (seconds, monotonic) is injectable for tests."""

    def __init__(
        self,
        policy: EvictionPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], object] | None = None,
        sweeper: bool = True,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._trim = trim
        self._lock = threading.Lock()
        self._live = 0
        # Extensions with live instances, least recently used first, with when each was last
        # used and that use's number (see _evict). An extension enters at the end of its
        # first call and leaves when evicted or closed.
        self._used: collections.OrderedDict[ExtensionView, tuple[float, int]] = (
            collections.OrderedDict()
        )
        self._uses = 0
        self._evictions = 0
        self._idle_evictions = 0
        self._refusals = 0
        self._since_trim = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if sweeper and policy.idle_evict_s is not None:
            # The thread holds the evictor weakly: a host dropped without close() (and the
            # extensions its evictor lists) is still collected, and its finalizer stops it.
            self._thread = threading.Thread(
                target=_sweep_loop,
                args=(weakref.ref(self), self._stop, policy.idle_evict_s * SWEEP_FRACTION),
                name="wasihost-evict",
                daemon=True,
            )
            weakref.finalize(self, self._stop.set)
            self._thread.start()

    # -- hooks called by Extension ---------------------------------------------------------

    def make_room(self, ext: ExtensionView) -> Room:
        """Before ``ext`` builds an instance: its place under ``max_live_instances``, made by
        evicting the least recently used idle extensions (never ``ext``) if needed; a
        :class:`HostFull` if every other live instance is in a call."""
        limit = self.policy.max_live_instances
        while True:
            with self._lock:
                if limit is None or self._live < limit:
                    self._live += 1
                    return Room(self)
                candidates = [e for e in self._used if e is not ext]
            if not self._evict_first(ext, candidates):
                with self._lock:
                    self._refusals += 1
                raise HostFull(
                    ext.id,
                    ext.lifecycle.state,
                    f"the host runs max_live_instances={limit} instances and every one is in a "
                    "call",
                    retry_after_s=HOST_FULL_RETRY_S,
                )

    def touch(self, ext: ExtensionView) -> None:
        """A call of ``ext`` ended: it is now the most recently used."""
        now = self._clock()
        with self._lock:
            self._uses += 1
            used = self._used
            used[ext] = (now, self._uses)
            used.move_to_end(ext)

    def forget(self, ext: ExtensionView) -> None:
        """``ext`` closed: its instances are freed by its close, and it is never a victim."""
        with self._lock:
            self._used.pop(ext, None)

    def _released(self) -> None:
        with self._lock:
            self._live -= 1

    # -- eviction -------------------------------------------------------------------------

    def _evict_first(self, ext: ExtensionView, candidates: list[ExtensionView]) -> bool:
        """Evict the first of ``candidates`` (least recently used first) that is idle; True
        once there is room for ``ext``'s instance (a victim freed one, or another call's
        instance went meanwhile)."""
        limit = self.policy.max_live_instances
        for victim in candidates:
            if self._evict(victim):
                return True
            with self._lock:
                if limit is None or self._live < limit:
                    return True
        return False

    def _evict(self, victim: ExtensionView, *, idle: bool = False) -> bool:
        with self._lock:
            seen = self._used.get(victim)
        dropped = victim.evict()
        if dropped is None:
            return False  # in a call: not a victim now
        trim = None
        with self._lock:
            if self._used.get(victim) == seen:
                # Not used since: nothing of it is live now, so it leaves the order. One
                # called meanwhile (a new instance, the call's end put it back) stays, or
                # that instance would never be evicted again (red-team 2026-12-01).
                self._used.pop(victim, None)
            if not dropped:
                return False  # nothing live (a crash dropped it): it only leaves the order
            self._evictions += 1
            self._idle_evictions += idle
            self._since_trim += 1
            if self._since_trim >= TRIM_EVERY_EVICTIONS:
                self._since_trim = 0
                trim = self._trim
        if trim is not None:
            trim()
        return True

    def sweep(self) -> int:
        """Evict every extension idle for ``idle_evict_s`` or more (by the clock); returns
        how many were evicted. Runs on its own thread every quarter of ``idle_evict_s``; an
        embedder or a test may call it too."""
        idle_s = self.policy.idle_evict_s
        if idle_s is None:
            return 0
        cutoff = self._clock() - idle_s
        with self._lock:
            stale = []
            for ext, (used, _) in self._used.items():
                if used > cutoff:
                    break  # ordered by last use: the rest are more recent
                stale.append(ext)
        return sum(self._evict(ext, idle=True) for ext in stale)

    # -- for operators --------------------------------------------------------------------

    @property
    def live_instances(self) -> int:
        return self._live

    def stats(self) -> EvictionStats:
        with self._lock:
            return EvictionStats(
                live_instances=self._live,
                max_live_instances=self.policy.max_live_instances,
                evictions=self._evictions,
                idle_evictions=self._idle_evictions,
                refusals=self._refusals,
            )

    def close(self) -> None:
        self._stop.set()


def _sweep_loop(ref: weakref.ref[Evictor], stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        evictor = ref()
        if evictor is None:
            return
        evictor.sweep()
        del evictor
