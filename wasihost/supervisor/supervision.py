"""Crash containment: crash records, restart policies with backoff, quarantine, metrics.

Every failure that discards an instance (a trap, a panic, a resource limit, a protocol
violation, a host-call failure), and every failed start, is a crash of its extension: the host
keeps running, other extensions are untouched, and the extension's restart policy decides what
happens next:

- :class:`Never`: the first crash quarantines it;
- :class:`OnCrash` (the default, as before supervision existed): the next call restarts it,
  however often it crashes;
- :class:`BoundedRetry`: at most ``max_restarts`` restarts within ``window_s``, the first at
  once and each later one after an exponential backoff (a call during the backoff is refused
  as unavailable, with the time left); the crash that would need one more restart quarantines
  it.

A quarantined extension stays admitted (and installed) but runs nothing until the operator
releases it (:meth:`Host.release`) or updates or removes it; :meth:`Supervisor.report` says why,
what data remains and what to do. Pure bookkeeping: no engine, no I/O, an injectable clock.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from ..core.errors import ConfigError, FailureClass

# Defined in the core (the crash records name them, and the restart policies' bounds), and
# exported here too (``as``: an explicit re-export, for mypy).
from ..core.errors import CrashClass as CrashClass  # noqa: PLC0414
from ..core.errors import crash_class as crash_class  # noqa: PLC0414
from ..core.limits import MAX_RESTARTS as MAX_RESTARTS  # noqa: PLC0414
from ..core.limits import MAX_WINDOW_S as MAX_WINDOW_S  # noqa: PLC0414

if TYPE_CHECKING:
    from .reports import CrashRecord, Metrics, QuarantineReport
    from .restart_policies import BoundedRetry, Never

# Defined where they are made (a crash, an operator's question, a policy an embedder sets), and
# exported here too: a plain run never defines them (issue 12 section 4).
_ELSEWHERE = {
    "CrashRecord": "wasihost.supervisor.reports",
    "Metrics": "wasihost.supervisor.reports",
    "QuarantineReport": "wasihost.supervisor.reports",
    "BoundedRetry": "wasihost.supervisor.restart_policies",
    "Never": "wasihost.supervisor.restart_policies",
}


def __getattr__(name: str) -> Any:
    if name == "RestartPolicy":
        from .restart_policies import BoundedRetry, Never

        return Never | OnCrash | BoundedRetry
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


# A crash-looping extension must not grow the host's memory: the last 100 crashes say why.
MAX_CRASH_RECORDS = 100
# A crash message is for an operator's screen: the first line of an error, not a novel.
MAX_CRASH_MESSAGE_CHARS = 300
@attrs.frozen
class OnCrash:
    """Restart on the next call, every time (no budget: for extensions the operator watches)."""


if TYPE_CHECKING:
    RestartPolicy: TypeAlias = Never | OnCrash | BoundedRetry


class BackingOff(Exception):
    """A restart asked for too soon after a crash; ``retry_after_s`` says when to ask again."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"restarting after a crash: retry in {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s


class _History:
    __slots__ = ("crashes", "not_before", "pending", "quarantined", "restarts")

    def __init__(self) -> None:
        self.crashes: collections.deque[CrashRecord] = collections.deque(maxlen=MAX_CRASH_RECORDS)
        self.restarts: collections.deque[float] = collections.deque(maxlen=MAX_RESTARTS + 1)
        self.not_before = float("-inf")
        self.quarantined: str | None = None
        # A crash not yet followed by a start: the next start, whatever state it leaves
        # (failed, or stopped by the operator or a grant change), is a restart after a crash
        # and counts against the budget (red-team 2026-12-01: from stopped it counted not).
        self.pending = False


class Supervisor:
    """A host's crash bookkeeping and restart decisions, per extension id."""

    def __init__(
        self,
        default: RestartPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.default: RestartPolicy = default if default is not None else OnCrash()
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._policies: dict[str, RestartPolicy] = {}
        self._history: dict[str, _History] = {}
        # Ids whose last extension closed while their history was still needed (a restart
        # window not yet passed): swept by each close.
        self._closed: set[str] = set()
        self._crash_counts: collections.Counter[CrashClass] = collections.Counter()
        self._restarts = 0
        self._quarantines = 0
        self._refusals = 0

    def set_policy(self, extension: str, policy: RestartPolicy) -> None:
        from .restart_policies import BoundedRetry, Never

        if not isinstance(policy, Never | OnCrash | BoundedRetry):
            raise ConfigError(f"restart policy {policy!r} is not Never, OnCrash or BoundedRetry")
        with self._lock:
            self._policies[extension] = policy

    def policy(self, extension: str) -> RestartPolicy:
        with self._lock:
            return self._policies.get(extension, self.default)

    def _of(self, extension: str) -> _History:
        found = self._history.get(extension)
        if found is None:
            found = self._history[extension] = _History()
        return found

    def on_crash(self, extension: str, failure: FailureClass, message: str) -> str | None:
        """Record a crash; return why the extension must now be quarantined, or None if it
        may restart (after its backoff)."""
        from .reports import CrashRecord
        from .restart_policies import BoundedRetry, Never

        now = self._clock()
        record = CrashRecord(
            self._wall(), crash_class(failure), failure.value, message[:MAX_CRASH_MESSAGE_CHARS]
        )
        with self._lock:
            policy = self._policies.get(extension, self.default)
            history = self._of(extension)
            history.crashes.append(record)
            history.pending = True
            self._crash_counts[record.crash_class] += 1
            if history.quarantined is not None:
                # Already quarantined (a call of the same generation that was still in flight
                # when another's crash quarantined it): a crash to record, not a second
                # quarantine (red-team 2026-12-01: two calls crashing at once counted two).
                return history.quarantined
            verdict: str | None = None
            if isinstance(policy, Never):
                verdict = f"crashed ({record.crash_class.value}); its restart policy is Never"
            elif isinstance(policy, BoundedRetry):
                while history.restarts and history.restarts[0] <= now - policy.window_s:
                    history.restarts.popleft()
                if len(history.restarts) >= policy.max_restarts:
                    verdict = (
                        f"crashed again ({record.crash_class.value}) after "
                        f"{len(history.restarts)} restarts within {policy.window_s:g} s "
                        f"(its budget is {policy.max_restarts})"
                    )
                else:
                    history.not_before = now + policy.backoff(len(history.restarts))
            if verdict is not None:
                history.quarantined = verdict
                self._quarantines += 1
            return verdict

    def check_backoff(self, extension: str) -> None:
        """Before a restart (from failed or stopped: a stop does not end a backoff): raise
        :class:`BackingOff` if it is too soon after the last crash."""
        now = self._clock()
        with self._lock:
            # Read, not made: every start from stopped asks, and one that never crashed keeps
            # no history.
            history = self._history.get(extension)
            if history is not None and now < history.not_before:
                self._refusals += 1
                raise BackingOff(history.not_before - now)

    def restarted(self, extension: str) -> None:
        """A restart began (counted once, by the call that moved the lifecycle): if a crash
        came before it (and no start since), it counts against the budget. A start after an
        operator's stop, or after a start-up the caller cancelled, follows no crash: it
        counts not."""
        now = self._clock()
        with self._lock:
            history = self._history.get(extension)
            if history is None or not history.pending:
                return
            history.pending = False
            history.restarts.append(now)
            self._restarts += 1

    def closed(self, extension: str) -> None:
        """The last extension of this id closed. Its crash records go (they serve the
        quarantine report of an admitted extension); what a re-admission within the restart
        window must not escape stays (the restart times and the backoff), until that window
        has passed: then the id's history goes too, as do those of other closed ids whose
        window has passed. Without this every id that ever crashed kept up to
        MAX_CRASH_RECORDS records for the host's life."""
        with self._lock:
            history = self._history.get(extension)
            if history is None and not self._closed:
                return  # never crashed: nothing kept (and no policy module to import)
        from .restart_policies import BoundedRetry

        now = self._clock()
        with self._lock:
            history = self._history.get(extension)
            if history is not None:
                history.crashes.clear()
                history.quarantined = None
                self._closed.add(extension)
            for name in list(self._closed):
                found = self._history.get(name)
                if found is None:
                    self._closed.discard(name)
                    continue
                policy = self._policies.get(name, self.default)
                window = policy.window_s if isinstance(policy, BoundedRetry) else 0.0
                while found.restarts and found.restarts[0] <= now - window:
                    found.restarts.popleft()
                if not found.restarts and now >= found.not_before:
                    del self._history[name]
                    self._closed.discard(name)

    def opened(self, extension: str) -> None:
        """An extension of this id is admitted again: its history is its own from now on."""
        with self._lock:
            self._closed.discard(extension)

    def release(self, extension: str) -> None:
        """The operator let a quarantined extension out: its restart budget starts afresh."""
        with self._lock:
            history = self._of(extension)
            history.restarts.clear()
            history.not_before = float("-inf")
            history.quarantined = None
            history.pending = False

    def crashes(self, extension: str) -> tuple[CrashRecord, ...]:
        with self._lock:
            history = self._history.get(extension)
            return tuple(history.crashes) if history is not None else ()

    def report(self, extension: str, what_remains: str, what_to_do: str) -> QuarantineReport:
        with self._lock:
            history = self._history.get(extension)
            why = history.quarantined if history is not None else None
            crashes = tuple(history.crashes) if history is not None else ()
        from .reports import QuarantineReport

        return QuarantineReport(
            extension, why or "not quarantined by its supervisor", crashes, what_remains, what_to_do
        )

    def metrics(self, states: Mapping[str, int]) -> Metrics:
        from .reports import Metrics

        with self._lock:
            return Metrics(
                MappingProxyType(dict(states)),
                MappingProxyType(
                    {
                        c.value: n
                        for c, n in sorted(self._crash_counts.items(), key=lambda i: i[0].value)
                    }
                ),
                self._restarts,
                self._quarantines,
                self._refusals,
            )
