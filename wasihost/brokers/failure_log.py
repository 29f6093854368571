"""How often a background failure (a job's run, an event's delivery) goes to the host's log:
the guest decides how often its code fails, so a line per failure would let it write to the
operator's log at its own rate (32 failing jobs wrote 32 warnings a second, red-team
2026-12-01). The broker's own statistics still count every failure."""

from __future__ import annotations

from typing import Final

# At most one line per job or subscription per this many seconds, saying how many failures
# were not logged since the last.
FAILURE_LOG_INTERVAL_S: Final = 60.0


class FailureLogGate:
    """When one job's or subscription's next failure may be logged. Not thread-safe: called
    under its broker's lock."""

    __slots__ = ("_after", "_quiet")

    def __init__(self) -> None:
        self._after = float("-inf")
        self._quiet = 0

    def due(self, now: float) -> int | None:
        """The failures not logged since the last line, if this one is to be logged at ``now``
        (the next then waits the interval); None if not (it is counted for that line)."""
        if now >= self._after:
            quiet, self._quiet = self._quiet, 0
            self._after = now + FAILURE_LOG_INTERVAL_S
            return quiet
        self._quiet += 1
        return None
