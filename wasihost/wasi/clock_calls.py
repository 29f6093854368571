"""Clock entries and poll_oneoff.

poll_oneoff never keeps the host thread past the call's deadline (``mem.deadline``), and waits
in ``mem.sleep``, which the host's interrupt wakes. When the
earliest subscription is due later than that, it waits until the deadline and then ends the
call with class ``deadline`` (:class:`~wasihost.core.status.GuestDeadline`), exactly as the engine's
epoch interrupt ends a guest that computes past it. It never claims a clock fired early.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory
from ..core.status import GuestDeadline
from . import limits
from .abi import (
    EVENT,
    R_FD_READ,
    R_FD_WRITE,
    SUB_CLOCK,
    SUB_FD,
    SUB_HEAD,
    SUBCLOCK_ABSTIME,
    SUBSCRIPTION_SIZE,
    EventType,
)
from .errno import Errno, WasiError
from .fds import Descriptor, HostDescriptor, StdinDescriptor
from .registry import FUEL_PER_BYTE, FUEL_TO_WAIT
from .state import WasiState

_EVENT_RW_HANGUP = 1


def clock_res_get(st: WasiState, mem: GuestMemory, clock_id: int, out: int) -> int:
    mem.write_u64(out, st.clocks.resolution(clock_id))
    return Errno.SUCCESS


def clock_time_get(st: WasiState, mem: GuestMemory, clock_id: int, precision: int, out: int) -> int:
    # ``precision`` is a hint; every reading is already as coarse as the profile allows.
    mem.write_u64(out, st.clocks.now(clock_id))
    return Errno.SUCCESS


def _fd_event(st: WasiState, desc: Descriptor | None, kind: int) -> tuple[int, int, int]:
    """(error, nbytes, flags) for an fd subscription: our descriptors never block."""
    if desc is None:
        return Errno.BADF, 0, 0
    if kind == EventType.FD_READ:
        if not desc.rights_base & R_FD_READ:
            return Errno.BADF, 0, 0
        if isinstance(desc, StdinDescriptor):
            authorised, left = st.stdin_read(lambda: len(desc.data) - desc.pos)
            if not authorised or left is None:
                return Errno.NOTCAPABLE, 0, 0
            return Errno.SUCCESS, left, 0 if left else _EVENT_RW_HANGUP
        if isinstance(desc, HostDescriptor) and not desc.is_dir:
            fd = desc.fd
            authorised, unread = st.fs_read(
                lambda: os.fstat(fd).st_size - os.lseek(fd, 0, os.SEEK_CUR)
            )
            if not authorised or unread is None:
                return Errno.NOTCAPABLE, 0, 0
            return Errno.SUCCESS, max(0, unread), 0
        return Errno.BADF, 0, 0
    if not desc.rights_base & R_FD_WRITE:
        return Errno.BADF, 0, 0
    return Errno.SUCCESS, 0, 0


def poll_oneoff(
    st: WasiState, mem: GuestMemory, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int
) -> int:
    if nsubs == 0 or nsubs > limits.MAX_POLL_SUBSCRIPTIONS:
        return Errno.INVAL
    mem.require_range(out_ptr, nsubs * EVENT.size)
    mem.require_fuel(nsubs * (SUBSCRIPTION_SIZE + EVENT.size) * FUEL_PER_BYTE)
    raw = mem.read(in_ptr, nsubs * SUBSCRIPTION_SIZE)
    ready: list[tuple[int, int, int, int, int]] = []  # userdata, errno, type, nbytes, flags
    clocks: list[tuple[int, int]] = []  # due in ns from now, userdata
    for i in range(nsubs):
        base = i * SUBSCRIPTION_SIZE
        userdata, tag = SUB_HEAD.unpack_from(raw, base)
        if tag == EventType.CLOCK:
            clock_id, timeout, _precision, flags = SUB_CLOCK.unpack_from(raw, base + 16)
            try:
                due = st.clocks.due_in_ns(clock_id, timeout, bool(flags & SUBCLOCK_ABSTIME))
            except WasiError as exc:
                ready.append((userdata, exc.errno, tag, 0, 0))
                continue
            clocks.append((due, userdata))
        elif tag in (EventType.FD_READ, EventType.FD_WRITE):
            (fd,) = SUB_FD.unpack_from(raw, base + 16)
            err, nbytes, flags = _fd_event(st, st.fds.get(fd), tag)
            ready.append((userdata, err, tag, nbytes, flags))
        else:
            return Errno.INVAL
    if not ready:
        # Only clocks: wait for the earliest, but never past the call's deadline.
        wait_ns = min(due for due, _ in clocks)
        if wait_ns > 0:
            mem.require_fuel(FUEL_TO_WAIT)  # never a wait on credit
            # mem.sleep, not time.sleep: the host's interrupt (a disable, a revocation) wakes
            # it and ends the call at once instead of at its deadline.
            left = mem.deadline - time.monotonic()
            if wait_ns / 1e9 > left:
                mem.sleep(left)
                raise GuestDeadline
            mem.sleep(wait_ns / 1e9)
        ready = [(u, Errno.SUCCESS, EventType.CLOCK, 0, 0) for due, u in clocks if due <= wait_ns]
    else:
        ready += [(u, Errno.SUCCESS, EventType.CLOCK, 0, 0) for due, u in clocks if due <= 0]
    out = b"".join(EVENT.pack(*event) for event in ready)
    mem.write(out_ptr, out)
    mem.write_u32(nevents_ptr, len(ready))
    return Errno.SUCCESS


HANDLERS: dict[str, Callable[..., Any]] = {
    "clock_res_get": clock_res_get,
    "clock_time_get": clock_time_get,
    "poll_oneoff": poll_oneoff,
}
