"""Operator metrics across processes: a live host publishes its :meth:`Host.metrics` snapshot
into its state directory, and ``wasihost status --json`` (another process) reads it back.

A host with a state directory starts publishing once it admits an extension: every
:data:`METRICS_PUBLISH_S` seconds on a thread of its own, when asked (:meth:`Host.publish_metrics`)
and once more as it closes (marked closed). Each host has its own row, so an application's
host and the short-lived hosts of CLI runs on the same directory do not overwrite each other.
``status`` sums the snapshots of the hosts that are live (not closed, published within
:data:`LIVE_WITHIN_S`); with none live it shows the most recent snapshot; with none at all, what
the durable state says (states and crashes from the journal).

Counts only: lifecycle states, crash classes, restarts, quarantines, refusals, host-call
statuses and failures by class, scheduler waits and refusals. No extension's input, output,
data, log or message is in a snapshot.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.errors import WasihostError
from ..core.hostlog import host_logger

if TYPE_CHECKING:
    from ..store.state import StateStore

# A status reader sees counts at most this old: often enough to watch a host, rare enough that
# one small SQLite write every two seconds is nothing beside the host's own journal.
METRICS_PUBLISH_S = 2.0
# A host that has not published for five periods is taken for dead (killed, not closed): its
# snapshot is no longer added to the live ones.
LIVE_WITHIN_S = 5 * METRICS_PUBLISH_S
# What `status --json` always shows, at zero when nobody counted it. ``throttles`` (throttle
# actions fired), ``throttle_refusals``, ``throttle_delays`` (calls that waited for room) and
# ``budget_actions`` come from the per-extension budgets (governor.py).
TOP_LEVEL_COUNTS = (
    "throttles",
    "throttle_refusals",
    "throttle_delays",
    "quarantines",
    "restarts",
    "backoff_refusals",
)
TOP_LEVEL_MAPS = ("extensions_by_state", "crashes_by_class", "budget_actions")


class MetricsPublisher:
    """Writes one host's snapshots into its state directory (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        snapshot: Callable[[], dict[str, Any] | None],
        interval_s: float = METRICS_PUBLISH_S,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.host_id = secrets.token_hex(8)
        self._snapshot = snapshot
        # Other periodic work on the state directory, done on this thread before each
        # snapshot (the host's grant sync); its failure is logged, never stops publishing.
        self._tick = tick
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._published = False
        self._closed = False

    def start(self) -> None:
        """Start the periodic publishing (idempotent; a closed publisher stays closed)."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="wasihost-metrics", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        import sqlite3

        while not self._stop.wait(self._interval_s):
            if self._tick is not None:
                try:
                    self._tick()
                except (sqlite3.Error, WasihostError) as exc:
                    host_logger().warning("wasihost: periodic state work failed: %s", exc)
            if self._snapshot() is None:  # the host was dropped without close()
                return
            self.publish()

    def publish(self, *, closed: bool = False) -> bool:
        """Write the snapshot now; True if written. A host that never counted anything and
        never published writes nothing (a `wasihost status` run must not shadow a live
        host with its zeros)."""
        import sqlite3  # here: a host without a state directory never loads it

        snapshot = self._snapshot()
        with self._lock:
            if self._closed or snapshot is None:
                return False
            if not self._published and not _counts_anything(snapshot):
                return False
            try:
                self.store.publish_metrics(self.host_id, os.getpid(), snapshot, closed=closed)
            except (sqlite3.Error, WasihostError) as exc:  # metrics never break the host
                host_logger().warning("wasihost: metrics not published: %s", exc)
                return False
            self._published = True
            return True

    def close(self) -> None:
        """Stop publishing, after a last snapshot marked closed (before the state closes)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.publish(closed=True)
        with self._lock:
            self._closed = True


def _counts_anything(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value != 0
    if isinstance(value, Mapping):
        return any(_counts_anything(v) for k, v in value.items() if k != "max_concurrent_calls")
    return False


def merge(snapshots: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of several hosts' snapshots, count by count."""
    total: dict[str, Any] = {}
    for snapshot in snapshots:
        _add(total, snapshot)
    return total


def _add(total: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, Mapping):
            _add(total.setdefault(key, {}), value)
        elif isinstance(value, int) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


def status_metrics(store: StateStore, now_ns: int | None = None) -> dict[str, Any]:
    """The ``metrics`` object of ``wasihost status --json`` (see the module docstring)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    snapshots = store.metrics_snapshots()
    live = [
        s
        for s in snapshots
        if not s.closed and now_ns - s.published_at <= LIVE_WITHIN_S * 1_000_000_000
    ]
    published_at: int | None
    if live:
        source, counts = "live", merge([s.snapshot for s in live])
        published_at = live[0].published_at
    elif snapshots:
        source, counts = "last host", snapshots[0].snapshot
        published_at = snapshots[0].published_at
    else:
        crashes: dict[str, int] = {}
        for ext in store.extensions():
            for cls, n in store.crash_counts(ext).items():
                crashes[cls] = crashes.get(cls, 0) + n
        states = store.lifecycle_counts()
        counts = {
            "extensions_by_state": states,
            "crashes_by_class": dict(sorted(crashes.items())),
            "quarantines": states.get("quarantined", 0),
        }
        source, published_at = "state", None
    errors = counts.get("host_call_errors", {})
    out: dict[str, Any] = {
        "source": source,
        "live_hosts": len(live),
        "published_at_ns": published_at,
    }
    for key in TOP_LEVEL_MAPS:
        out[key] = dict(counts.get(key, {}))
    for key in TOP_LEVEL_COUNTS:
        out[key] = int(counts.get(key, 0))
    out["host_call_errors"] = {
        "statuses": dict(errors.get("statuses", {})),
        "failures": dict(errors.get("failures", {})),
    }
    out["scheduler"] = dict(counts.get("scheduler", {}))
    return out
