"""args, environ, proc, sched and random entries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory
from ..core.status import GuestExit
from . import limits
from .errno import Errno
from .memio import write_strings
from .registry import FUEL_PER_BYTE, FUEL_PER_SEEDED_RANDOM_BYTE
from .state import WasiState


def _sizes(mem: GuestMemory, items: list[bytes], count_ptr: int, size_ptr: int) -> int:
    mem.write_u32(count_ptr, len(items))
    mem.write_u32(size_ptr, sum(len(i) + 1 for i in items))
    return Errno.SUCCESS


def args_sizes_get(st: WasiState, mem: GuestMemory, argc_ptr: int, size_ptr: int) -> int:
    return _sizes(mem, st.args, argc_ptr, size_ptr)


def args_get(st: WasiState, mem: GuestMemory, argv_ptr: int, buf_ptr: int) -> int:
    write_strings(mem, argv_ptr, buf_ptr, st.args)
    return Errno.SUCCESS


def environ_sizes_get(st: WasiState, mem: GuestMemory, count_ptr: int, size_ptr: int) -> int:
    return _sizes(mem, st.env, count_ptr, size_ptr)


def environ_get(st: WasiState, mem: GuestMemory, environ_ptr: int, buf_ptr: int) -> int:
    write_strings(mem, environ_ptr, buf_ptr, st.env)
    return Errno.SUCCESS


def proc_exit(st: WasiState, mem: GuestMemory, code: int) -> None:
    raise GuestExit(code)


def proc_raise(st: WasiState, mem: GuestMemory, signal: int) -> int:
    return Errno.NOSYS  # there are no signals to raise in a wasm instance


def sched_yield(st: WasiState, mem: GuestMemory) -> int:
    return Errno.SUCCESS  # one guest per instance: nothing to yield to


def random_get(st: WasiState, mem: GuestMemory, buf: int, length: int) -> int:
    if st.random is None:
        return Errno.NOTCAPABLE
    if length > limits.MAX_RANDOM_BYTES_PER_CALL:
        return Errno.INVAL
    mem.require_range(buf, length)  # the destination and the price before the bytes are made
    extra = length * FUEL_PER_SEEDED_RANDOM_BYTE if st.random_seeded else 0
    mem.require_fuel(length * FUEL_PER_BYTE + extra)
    mem.moved += extra // FUEL_PER_BYTE  # charged with the bytes moved
    mem.write(buf, st.random(length))
    return Errno.SUCCESS


HANDLERS: dict[str, Callable[..., Any]] = {
    "args_get": args_get,
    "args_sizes_get": args_sizes_get,
    "environ_get": environ_get,
    "environ_sizes_get": environ_sizes_get,
    "proc_exit": proc_exit,
    "proc_raise": proc_raise,
    "sched_yield": sched_yield,
    "random_get": random_get,
}
