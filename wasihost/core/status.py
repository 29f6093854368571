"""ABI status codes returned to guests; a test holds them equal to the registry JSON."""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """Codes a host function returns (negated) to a guest. Never reused or renumbered."""

    OK = 0
    DENIED = 1
    INVALID_ARGUMENT = 2
    PAYLOAD_TOO_LARGE = 3
    BUFFER_TOO_SMALL = 4
    QUOTA_EXCEEDED = 5
    UNAVAILABLE = 6
    INTERNAL = 7
    NOT_FOUND = 8
    UNSUPPORTED = 9


class HostStatus(Exception):
    """Raised by a broker to answer the guest with a status code instead of a response."""

    def __init__(self, status: Status) -> None:
        # Exception.__init__ is not called (``args`` stays ``(status,)``, as the constructor set
        # it) and the name is made only if the text is asked for: a broker may raise one per
        # host call, and those two steps were more than half the cost of raising it.
        self.status = status

    def __str__(self) -> str:
        return self.status.name


class StatusAnswer:
    """A status a handler returns instead of raising :class:`HostStatus`: the guest gets the
    same answer, without an exception per call (raising and catching one costs about a
    microsecond, a sixth of a whole host call). For answers on a hot path, such as a full log's
    ``QUOTA_EXCEEDED`` to every record. One shared instance per status:
    ``StatusAnswer.of(Status.QUOTA_EXCEEDED)``."""

    __slots__ = ("result", "status")

    def __init__(self, status: Status) -> None:
        if not isinstance(status, Status) or status is Status.OK:
            raise ValueError(f"a StatusAnswer is a Status other than OK, not {status!r}")
        self.status = status
        # What the cbor convention writes for it: the negated code.
        self.result = -int(status)

    @staticmethod
    def of(status: Status) -> StatusAnswer:
        """The shared answer of ``status`` (any but OK)."""
        try:
            return _STATUS_ANSWERS[status]
        except KeyError:
            raise ValueError(f"a StatusAnswer is a Status other than OK, not {status!r}") from None

    def __repr__(self) -> str:
        return f"StatusAnswer({self.status.name})"


_STATUS_ANSWERS: dict[Status, StatusAnswer] = {
    status: StatusAnswer(status) for status in Status if status is not Status.OK
}


class GuestAbort(Exception):
    """Raised by the ``abort`` broker: the guest ends its current call as a panic."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnreadableRequest:
    """Handed to an entry that never returns (``abort``) in place of a request the host could
    not read: outside memory, over the entry's limit, or not well-formed CBOR."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnreadableRequest({self.reason!r})"


class GuestFault(Exception):
    """A native broker touched guest memory outside its bounds on the guest's say-so."""


class GuestDeadline(Exception):
    """Raised by a native broker that would have to wait past the call's deadline (WASI's
    ``poll_oneoff``): the call ends with class ``deadline``, as the epoch interrupt would."""


class GuestInterrupted(Exception):
    """Raised by a native broker whose wait was woken by the host's interrupt (an emergency
    disable or a revocation): the call ends as the epoch interrupt would end it."""


class GuestOutOfFuel(Exception):
    """Raised before work proportional to a guest-declared length (a broker's
    ``GuestMemory.require_fuel``, or a bulk copy) when the call's budget cannot pay for it:
    the call ends with class ``out_of_fuel``, nothing done."""


class GuestExit(Exception):
    """Raised by ``proc_exit``: the guest ends its run with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}")
        self.code = code


class HostFunctionFailed(Exception):
    """An embedder's host function raised something other than :class:`HostStatus`: the call
    ends with class ``host_error``; what it raised went to the ``wasihost`` logger only."""
