"""The clocks a guest sees under its clock profile: which exist, how coarse, from what origin."""

from __future__ import annotations

from ..core.sources import Clock
from . import limits
from .abi import Clock as ClockId
from .config import ClockProfile
from .errno import Errno, WasiError

# Where the guest's monotonic clock starts: one second, so even the first coarse reading is > 0.
MONOTONIC_START_NS = 1_000_000_000


class GuestClocks:
    """Clock readings for one instance, or none at all (``profile`` None: not provided/granted).

    Monotonic and cputime clocks count from the instance's start, so they say nothing about the
    host's uptime or its other work; every reading is rounded down to the profile's resolution.
    Monotonic readings start at ``MONOTONIC_START_NS`` rather than zero: code that treats a zero
    timestamp as "unset" keeps working even under the one-second anonymous resolution.

    The cputime clocks (standard profile only) read as the monotonic clock: the instance's
    elapsed time, an upper bound of its CPU time. The host's own accounting cannot serve them:
    the process's CPU time counts every thread's work (other extensions' too, a side channel
    between tenants), and a thread's counts whatever that thread did before, for any instance
    (called from another thread than the one that made it, it went backwards and wrapped).
    """

    def __init__(self, profile: ClockProfile | None, source: Clock, resolution_ns: int) -> None:
        self.profile = profile
        self.source = source
        self.resolution_ns = (
            limits.ANONYMOUS_CLOCK_RESOLUTION_NS
            if profile is ClockProfile.ANONYMOUS
            else resolution_ns
        )
        self._mono_origin = source.monotonic_ns() - MONOTONIC_START_NS

    @property
    def available(self) -> bool:
        return self.profile is not None

    def _check(self, clock_id: int) -> None:
        if self.profile is None:
            raise WasiError(Errno.NOTCAPABLE)
        if clock_id > ClockId.THREAD_CPUTIME:
            raise WasiError(Errno.INVAL)
        if self.profile is ClockProfile.ANONYMOUS and clock_id >= ClockId.PROCESS_CPUTIME:
            raise WasiError(Errno.INVAL)  # no cputime clocks: they time the host's work

    def resolution(self, clock_id: int) -> int:
        self._check(clock_id)
        return self.resolution_ns

    def raw(self, clock_id: int) -> int:
        """Uncoarsened reading of an existing clock, in the guest's origin."""
        if clock_id == ClockId.REALTIME:
            return self.source.realtime_ns()
        # Monotonic, and the cputime clocks as it (see the class's doc).
        return self.source.monotonic_ns() - self._mono_origin

    def now(self, clock_id: int) -> int:
        self._check(clock_id)
        value = self.raw(clock_id)
        return value - value % self.resolution_ns

    def due_in_ns(self, clock_id: int, timeout: int, absolute: bool) -> int:
        """Nanoseconds from now until a poll subscription on ``clock_id`` is due (<= 0: due).

        Only realtime and monotonic can be waited on: a cputime deadline has no wall-clock
        meaning (INVAL, as for an unknown clock).
        """
        self._check(clock_id)
        if clock_id not in (ClockId.REALTIME, ClockId.MONOTONIC):
            raise WasiError(Errno.INVAL)
        if not absolute:
            return timeout
        # Against the reading the guest may see, not the exact clock: otherwise a subscription
        # beside an always-ready descriptor (no wait) says whether any instant has passed, a
        # clock as fine as the host's. Waiting from the coarse reading never wakes early.
        return timeout - self.now(clock_id)
