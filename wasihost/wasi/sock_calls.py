"""Socket entries. This profile never creates a socket descriptor (no preopened sockets), so
each call answers as preview1 does for a descriptor that is not a socket: BADF for an unknown
one, NOTSOCK for any other. Both are true whatever the grant and reveal nothing beyond what
``fd_fdstat_get`` tells anyone, so the entries are core (``wasi.sockets`` is reserved for the
socket descriptors a later revision may grant)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.guestmem import GuestMemory
from .errno import Errno
from .state import WasiState


def _not_a_socket(st: WasiState, fd: int) -> int:
    return Errno.BADF if st.fds.get(fd) is None else Errno.NOTSOCK


def sock_accept(st: WasiState, mem: GuestMemory, fd: int, flags: int, fd_out: int) -> int:
    return _not_a_socket(st, fd)


def sock_recv(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    ri_data: int,
    ri_data_len: int,
    ri_flags: int,
    ro_datalen: int,
    ro_flags: int,
) -> int:
    return _not_a_socket(st, fd)


def sock_send(
    st: WasiState,
    mem: GuestMemory,
    fd: int,
    si_data: int,
    si_data_len: int,
    si_flags: int,
    so_datalen: int,
) -> int:
    return _not_a_socket(st, fd)


def sock_shutdown(st: WasiState, mem: GuestMemory, fd: int, how: int) -> int:
    return _not_a_socket(st, fd)


HANDLERS: dict[str, Callable[..., Any]] = {
    "sock_accept": sock_accept,
    "sock_recv": sock_recv,
    "sock_send": sock_send,
    "sock_shutdown": sock_shutdown,
}
