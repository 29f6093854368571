"""The policy every benchmark host runs under."""

from __future__ import annotations

from collections.abc import Iterable

from ..core.budgets import BudgetPolicy
from ..core.limits import Action, Resource
from ..host.policy import Policy

# A benchmark measures calls, not governance. Simple wasm runs at about 1e10 fuel a second on
# the 2-core machine, so the default CPU budget (6e10 fuel a sliding minute) is spent within
# seconds by the 1 MiB echo or the compute loop, and its throttle refused the rest of the run
# ("error: throttled" half-way through the call-cost section). Under this policy a crossing is
# still counted, and warned of once per episode, but refuses nothing: the accounting a real
# host pays stays in every measured call.
BENCH_BUDGETS = BudgetPolicy(actions={Resource.CPU_FUEL_PER_MINUTE: Action.WARN})


def bench_policy(allow: Iterable[str] = ()) -> Policy:
    """A policy that grants ``allow`` and lets no CPU budget crossing refuse a call."""
    return Policy(allow=set(allow), budgets=BENCH_BUDGETS)
