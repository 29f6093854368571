"""The clock broker: realtime and monotonic clocks, coarsened to the policy's resolution."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.serving import refuse_any_scope
from ..core.sources import Clock, SystemClock
from ..core.status import HostStatus, Status

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

# The clock and its system source moved to core.sources (the WASI profile reads them too, and
# the profile sits below the brokers); their old home keeps the names.
__all__ = ["Clock", "ClockBroker", "SystemClock", "clock_handler"]


def clock_handler(clock: Clock, resolution_ns: int) -> Callable[[Any, Any], Any]:
    """The ``clock_now`` entry: ``"realtime" | "monotonic"`` -> nanoseconds, rounded down."""

    def handle(call: Any, request: Any) -> int:
        if request == "realtime":
            now = clock.realtime_ns()
        elif request == "monotonic":
            now = clock.monotonic_ns()
        else:
            raise HostStatus(Status.INVALID_ARGUMENT)
        return now - now % resolution_ns

    return handle


class ClockBroker:
    """Serves ``clock_now`` from the host's clock (``Host(clock=...)``), at the resolution the
    policy grants when the instance starts."""

    name = "clock"
    functions = ("wasihost_v1.clock_now",)
    capabilities = frozenset({"clock"})


    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        refuse_any_scope(capability, scope)
    def open(self, ext: ExtensionView) -> ExtensionView:
        return ext

    def handler(self, entry: HostFunction, state: ExtensionView) -> Callable[[Any, Any], Any]:
        return clock_handler(state.host.clock, state.host.policy.clock_resolution_ns)

    def close(self, state: ExtensionView) -> None:
        pass
