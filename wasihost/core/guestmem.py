"""The view of guest memory that native-convention brokers (WASI) get: a Protocol, so brokers
stay free of the engine and their tests can use :class:`BytearrayMemory`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from .status import GuestFault, GuestInterrupted, GuestOutOfFuel


class GuestMemory(Protocol):
    """Bounds-checked access to the calling guest's linear memory during one host call.

    No view of memory is ever handed out: what a broker reads is a copy, so nothing it keeps
    can reach memory after the instance is gone.

    Every method raises :class:`~wasihost.core.status.GuestFault` for a range outside memory;
    ``deadline`` is the ``time.monotonic()`` value by which the call must return.
    """

    deadline: float
    moved: int
    """Bytes copied in or out during this host call; the engine charges them."""

    def size(self) -> int: ...

    def read(self, ptr: int, length: int) -> bytes: ...

    def write(self, ptr: int, data: bytes) -> None: ...

    def read_u32(self, ptr: int) -> int: ...

    def read_iovec(self, ptr: int, cap: int) -> bytes:
        """The bytes the iovec at ``ptr`` points to, at most ``cap`` of them."""
        ...

    def take_iovec(self, ptr: int, cap: int, count_ptr: int) -> bytes:
        """``read_iovec(ptr, cap)``, with the number of bytes taken written as a u32 at
        ``count_ptr``; both checked before it returns (a one-iovec write in one call)."""
        ...

    def read_u32_pair(self, ptr: int) -> tuple[int, int]:
        """Two consecutive little-endian u32s (an iovec): one access instead of two."""
        ...

    def read_u64(self, ptr: int) -> int: ...

    def write_u32(self, ptr: int, value: int) -> None: ...

    def write_u64(self, ptr: int, value: int) -> None: ...

    def require_range(self, ptr: int, length: int) -> None:
        """Fault unless the range lies inside memory; nothing is copied or counted. A broker
        checks a destination with it before the work that fills it."""
        ...

    def require_fuel(self, units: int) -> None:
        """Raise :class:`~wasihost.core.status.GuestOutOfFuel` if the call's budget cannot pay
        ``units`` more: asked before work proportional to a guest-declared length."""
        ...

    def charge(self, units: int) -> None:
        """Pay ``units`` fuel for the next step of work, before doing it (a path component, a
        key listed): raises :class:`~wasihost.core.status.GuestOutOfFuel` if the budget cannot pay,
        so a guest out of fuel stops the work part-way."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait, or raise :class:`~wasihost.core.status.GuestInterrupted` as soon as the host
        interrupts the instance. Blocking brokers wait here, never in ``time.sleep``."""
        ...


class WriteRoute:
    """A native write entry's handler with a shortcut for its commonest call: one iovec to a
    byte sink (WASI's ``fd_write`` of a line to stdout).

    The entry takes ``(fd, iovs, iovs_len, count_ptr)`` and answers an i32. ``sinks`` is a
    live table its owner keeps in step with its descriptors: fd -> the sink a one-iovec write
    to that fd goes to. For such a call the engine copies the iovec at ``iovs`` (at most
    ``cap`` bytes; both ranges checked first, the count written at ``count_ptr``), passes it to
    the sink and answers ``ok``, or ``answer(exc)`` when the sink raises one of ``answered``;
    every other call goes to ``handler``, which serves them all the same way. The shortcut saves
    the handler's Python frame and its descriptor checks on a path taken once per printed line;
    a table lookup needs no frame of its own.
    """

    __slots__ = ("answer", "answered", "cap", "handler", "ok", "sinks")

    def __init__(
        self,
        handler: Callable[..., int],
        sinks: dict[int, Callable[[bytes], object]],
        cap: int,
        ok: int,
        answered: tuple[type[BaseException], ...],
        answer: Callable[[Any], int],
    ) -> None:
        self.handler = handler
        self.sinks = sinks
        self.cap = cap
        self.ok = ok
        self.answered = answered
        self.answer = answer

    def __call__(self, mem: GuestMemory, *args: int) -> int:
        return self.handler(mem, *args)


class BytearrayMemory:
    """A :class:`GuestMemory` over a bytearray, for broker tests without an engine."""

    def __init__(self, size: int, deadline: float = float("inf"), fuel: int | None = None) -> None:
        self.data = bytearray(size)
        self.deadline = deadline
        self.moved = 0
        self.fuel = fuel  # None: an unlimited budget
        self.wakeup = threading.Event()

    def size(self) -> int:
        return len(self.data)

    def _check(self, ptr: int, length: int) -> None:
        if ptr < 0 or length < 0 or ptr + length > len(self.data):
            raise GuestFault(f"[{ptr}, +{length}) outside guest memory")
        self.moved += length

    def read(self, ptr: int, length: int) -> bytes:
        self._check(ptr, length)
        return bytes(self.data[ptr : ptr + length])

    def write(self, ptr: int, data: bytes) -> None:
        self._check(ptr, len(data))
        self.data[ptr : ptr + len(data)] = data

    def read_u32(self, ptr: int) -> int:
        return int.from_bytes(self.read(ptr, 4), "little")

    def read_iovec(self, ptr: int, cap: int) -> bytes:
        buf, length = self.read_u32_pair(ptr)
        return self.read(buf, min(length, cap))

    def take_iovec(self, ptr: int, cap: int, count_ptr: int) -> bytes:
        data = self.read_iovec(ptr, cap)
        self.write_u32(count_ptr, len(data))
        return data

    def read_u32_pair(self, ptr: int) -> tuple[int, int]:
        data = self.read(ptr, 8)
        return int.from_bytes(data[:4], "little"), int.from_bytes(data[4:], "little")

    def read_u64(self, ptr: int) -> int:
        return int.from_bytes(self.read(ptr, 8), "little")

    def write_u32(self, ptr: int, value: int) -> None:
        self.write(ptr, (value & 0xFFFF_FFFF).to_bytes(4, "little"))

    def write_u64(self, ptr: int, value: int) -> None:
        self.write(ptr, (value & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))

    def require_range(self, ptr: int, length: int) -> None:
        if ptr < 0 or length < 0 or ptr + length > len(self.data):
            raise GuestFault(f"[{ptr}, +{length}) outside guest memory")

    def require_fuel(self, units: int) -> None:
        if self.fuel is not None and units > self.fuel:
            raise GuestOutOfFuel(f"{units} fuel units for the work asked")

    def charge(self, units: int) -> None:
        """The step's units join what the call has moved (at one unit a byte), checked first
        against ``fuel`` as the engine's charge checks the Store."""
        self.require_fuel(self.moved + units)
        self.moved += units

    def sleep(self, seconds: float) -> None:
        if self.wakeup.wait(max(seconds, 0.0)):
            raise GuestInterrupted
