"""WASI preview1 error numbers, and the one mapping from host ``OSError`` to them.

Handlers answer a guest with an :class:`Errno` (returned, or raised as :class:`WasiError`); a
host exception text never reaches the guest.
"""

from __future__ import annotations

import enum
import errno as host_errno


class Errno(enum.IntEnum):
    """``$errno`` of wasi_snapshot_preview1, with the spec's numbering (never renumbered)."""

    SUCCESS = 0
    TOOBIG = 1  # E2BIG
    ACCES = 2
    ADDRINUSE = 3
    ADDRNOTAVAIL = 4
    AFNOSUPPORT = 5
    AGAIN = 6
    ALREADY = 7
    BADF = 8
    BADMSG = 9
    BUSY = 10
    CANCELED = 11
    CHILD = 12
    CONNABORTED = 13
    CONNREFUSED = 14
    CONNRESET = 15
    DEADLK = 16
    DESTADDRREQ = 17
    DOM = 18
    DQUOT = 19
    EXIST = 20
    FAULT = 21
    FBIG = 22
    HOSTUNREACH = 23
    IDRM = 24
    ILSEQ = 25
    INPROGRESS = 26
    INTR = 27
    INVAL = 28
    IO = 29
    ISCONN = 30
    ISDIR = 31
    LOOP = 32
    MFILE = 33
    MLINK = 34
    MSGSIZE = 35
    MULTIHOP = 36
    NAMETOOLONG = 37
    NETDOWN = 38
    NETRESET = 39
    NETUNREACH = 40
    NFILE = 41
    NOBUFS = 42
    NODEV = 43
    NOENT = 44
    NOEXEC = 45
    NOLCK = 46
    NOLINK = 47
    NOMEM = 48
    NOMSG = 49
    NOPROTOOPT = 50
    NOSPC = 51
    NOSYS = 52
    NOTCONN = 53
    NOTDIR = 54
    NOTEMPTY = 55
    NOTRECOVERABLE = 56
    NOTSOCK = 57
    NOTSUP = 58
    NOTTY = 59
    NXIO = 60
    OVERFLOW = 61
    OWNERDEAD = 62
    PERM = 63
    PIPE = 64
    PROTO = 65
    PROTONOSUPPORT = 66
    PROTOTYPE = 67
    RANGE = 68
    ROFS = 69
    SPIPE = 70
    SRCH = 71
    STALE = 72
    TIMEDOUT = 73
    TXTBSY = 74
    XDEV = 75
    NOTCAPABLE = 76

    @property
    def spec_name(self) -> str:
        """The witx name (``2big`` cannot be a Python identifier)."""
        return "2big" if self is Errno.TOOBIG else self.name.lower()


class WasiError(Exception):
    """Raised inside a handler to answer the guest with ``errno``; never leaves the profile."""

    def __init__(self, errno: Errno) -> None:
        super().__init__(errno.name)
        self.errno = errno


def _host_table() -> dict[int, Errno]:
    # Host errno names that share a preview1 name map by name; the rest are spelled out.
    table: dict[int, Errno] = {}
    for member in Errno:
        code = getattr(host_errno, "E" + member.name, None)
        if isinstance(code, int):
            table[code] = member
    table[host_errno.E2BIG] = Errno.TOOBIG
    table[host_errno.EWOULDBLOCK] = Errno.AGAIN
    table[host_errno.EOPNOTSUPP] = Errno.NOTSUP
    return table


_FROM_HOST = _host_table()


def from_oserror(exc: OSError) -> Errno:
    """The preview1 errno for a host failure; anything unmapped is ``IO`` (never leaks text)."""
    if exc.errno is None:
        return Errno.IO
    return _FROM_HOST.get(exc.errno, Errno.IO)
