"""What a budget crossing met: the record an :class:`~wasihost.core.budgets.Account` hands the
governor when a rate goes over its budget or a level's limit refuses something.

Here, not in :mod:`wasihost.core.budgets`, so that a host whose extensions stay within their budgets
(a plain run) does not define it at start-up (issue 12 section 4); ``wasihost.core.budgets`` still
exports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from .limits import Action, Resource


@attrs.frozen
class Crossing:
    """What one charge (or one call's admission) met: a rate over its budget.

    ``fired``: this is the first crossing of an episode (the usage was within the budget
    before): the action fires now. ``refused``: nothing was counted; the caller refuses what
    it was about to do. ``retry_after_s``: when the window will have room again."""

    resource: Resource
    action: Action
    used: int
    limit: int
    retry_after_s: float
    fired: bool
    refused: bool
    # A level's crossing: what its static limit refused (``used`` is then what was in use
    # or asked for, as far as the refusing part knows it; ``limit`` the limit).
    refusal: str | None = None

    def describe(self) -> str:
        if self.refusal is not None:
            return (
                f"{self.resource.value} limit {self.limit} reached: {self.refusal} "
                f"(action {self.action.value}; cool-off {self.retry_after_s:.3f} s)"
            )
        return (
            f"{self.resource.value} budget crossed: {self.used} of {self.limit} "
            f"(action {self.action.value}; room again in {self.retry_after_s:.3f} s)"
        )
