"""The snapshots a host hands its operator: crash records, a quarantine report, the host's
metrics, one extension's usage beside its budget, and the host-call error counts.

Frozen records, built only when something crashed or an operator asks (``Host.metrics``,
``Host.usage``, ``Host.quarantine_report``): a plain run never defines them (issue 12 section 4).
The modules that make them still export them (``wasihost.supervisor.supervision.Metrics``,
``wasihost.supervisor.governor.Usage``, ``wasihost.supervisor.hostcall_metrics.HostCallErrors``
...).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ..core.budgets import ResourceBudget
    from ..core.errors import CrashClass


@attrs.frozen
class CrashRecord:
    at: float  # wall-clock time, for operators
    crash_class: CrashClass
    failure: str
    message: str


@attrs.frozen
class QuarantineReport:
    """What an operator reads about a quarantined extension."""

    extension: str
    why: str
    crashes: tuple[CrashRecord, ...]
    what_remains: str
    what_to_do: str


@attrs.frozen
class Metrics:
    """A snapshot for operators: counts only, nothing about what extensions process."""

    extensions_by_state: Mapping[str, int]
    crashes_by_class: Mapping[str, int]
    restarts: int
    quarantines: int
    backoff_refusals: int
    # budgets: rate-budget actions fired by action (warn, throttle, pause, terminate), and
    # calls or requests refused while over a budget (governor.py; Host.metrics fills them).
    budget_actions: Mapping[str, int] = attrs.field(factory=lambda: MappingProxyType({}))
    throttle_refusals: int = 0
    # budgets: calls that waited for room under the delay throttle mode.
    throttle_delays: int = 0
    # Filled by Host.metrics (wasihost.supervisor.hostcall_metrics,
    # wasihost.supervisor.scheduling): host-call
    # statuses answered and call-ending failures, each by class; the call scheduler's counts
    # (empty without a scheduler).
    host_call_errors: Mapping[str, Mapping[str, int]] = attrs.field(
        factory=lambda: MappingProxyType({"statuses": {}, "failures": {}})
    )
    scheduler: Mapping[str, object] = attrs.field(factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, object]:
        return {
            "extensions_by_state": dict(self.extensions_by_state),
            "crashes_by_class": dict(self.crashes_by_class),
            "restarts": self.restarts,
            "quarantines": self.quarantines,
            "backoff_refusals": self.backoff_refusals,
            "budget_actions": dict(self.budget_actions),
            # Throttle actions fired: what `wasihost status` shows as `throttles`.
            "throttles": self.budget_actions.get("throttle", 0),
            "throttle_refusals": self.throttle_refusals,
            "throttle_delays": self.throttle_delays,
            "host_call_errors": {k: dict(v) for k, v in self.host_call_errors.items()},
            "scheduler": dict(self.scheduler),
        }


@attrs.frozen
class Usage:
    """One extension's usage now, beside its budget: a frozen snapshot, counts only.

    The rates are over their sliding windows; the levels are what the brokers hold for it now
    (None: the extension has not used that broker, or it reports no level)."""

    extension: str
    budget: ResourceBudget
    cpu_fuel_last_minute: int
    network_bytes_last_hour: int
    fuel_last_call: int
    calls_in_flight: int
    storage_bytes: int | None
    open_handles: int | None
    background_jobs: int | None
    event_queue_depth: int | None
    # Actions fired for this extension since it was first admitted, by action name.
    actions_fired: Mapping[str, int]
    # Calls and requests refused while a rate was over its budget or a level cooled off.
    refusals: int
    # Calls that waited for room (ThrottleMode.DELAY), whatever came of the wait.
    delays: int
    # Set while calls are refused by a rate budget: when to try again.
    retry_after_s: float | None

    def to_json(self) -> dict[str, object]:
        out = attrs.asdict(self, recurse=False)
        out["budget"] = self.budget.to_json()
        out["actions_fired"] = dict(self.actions_fired)
        return out


@attrs.frozen
class HostCallErrors:
    """A snapshot: statuses answered and call-ending failures, each by class."""

    statuses: Mapping[str, int]
    failures: Mapping[str, int]

    def to_json(self) -> dict[str, object]:
        return {"statuses": dict(self.statuses), "failures": dict(self.failures)}
