"""The clock broker: realtime and monotonic clocks, coarsened to the policy's resolution."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from ..status import HostStatus, Status


class Clock(Protocol):
    """A time source; tests inject a fake one instead of sleeping."""

    def realtime_ns(self) -> int: ...

    def monotonic_ns(self) -> int: ...


class SystemClock:
    def realtime_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


def clock_handler(clock: Clock, resolution_ns: int) -> Callable[[Any], Any]:
    """The ``clock_now`` entry: ``"realtime" | "monotonic"`` -> nanoseconds, rounded down."""

    def handle(request: Any) -> int:
        if request == "realtime":
            now = clock.realtime_ns()
        elif request == "monotonic":
            now = clock.monotonic_ns()
        else:
            raise HostStatus(Status.INVALID_ARGUMENT)
        return now - now % resolution_ns

    return handle
