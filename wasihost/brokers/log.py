"""The log broker: the ``log`` entry appends a guest record to its extension's log, committed
through the grant table."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..extlog import (
    RECORD_OVERHEAD_BYTES,
    TRACE_LOGGING_LEVEL,
    ExtensionLog,
    Level,
    LogRecord,
    LogSink,
    to_logging,
)
from ..status import HostStatus, Status

if TYPE_CHECKING:
    from ..extension import Extension
    from ..registry import HostFunction

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "TRACE_LOGGING_LEVEL",
    "ExtensionLog",
    "Level",
    "LogBroker",
    "LogRecord",
    "LogSink",
    "log_handler",
    "to_logging",
]


Commit = Callable[[Callable[[], bool]], tuple[bool, bool | None]]
"""Runs an append if the caller's grant epoch still authorises it: (authorised, result)."""


def log_handler(log: ExtensionLog, commit: Commit | None = None) -> Callable[[Any, Any], Any]:
    """The ``log`` entry: ``[level, message]`` -> null.

    ``commit`` wraps the append so the grant epoch is checked at commit time: a record
    authorised before a revocation is never appended after it.
    """

    def handle(call: Any, request: Any) -> None:
        if (
            not isinstance(request, list)
            or len(request) != 2
            or not isinstance(request[0], int)
            or isinstance(request[0], bool)
            or not isinstance(request[1], str)
        ):
            raise HostStatus(Status.INVALID_ARGUMENT)
        try:
            level = Level(request[0])
        except ValueError:
            raise HostStatus(Status.INVALID_ARGUMENT) from None
        message = request[1]

        def append() -> bool:
            return log.append(level, message)

        if commit is None:
            ok: bool | None = append()
        else:
            authorised, ok = commit(append)
            if not authorised:
                raise HostStatus(Status.DENIED)
        if not ok:
            raise HostStatus(Status.QUOTA_EXCEEDED)

    return handle


class LogBroker:
    """Serves ``log``: appends to the extension's own log (or the embedder's sink), each record
    committed through the grant table under the call's epoch."""

    name = "log"
    functions = ("wasihost_v1.log",)
    capabilities = frozenset({"log"})

    def open(self, ext: Extension) -> Extension:
        return ext

    def handler(self, entry: HostFunction, state: Extension) -> Callable[[Any, Any], Any]:
        ext = state
        capability = entry.capability

        def commit(action: Callable[[], bool]) -> tuple[bool, bool | None]:
            return ext.commit(capability, action)

        return log_handler(ext.log, commit)

    def close(self, state: Extension) -> None:
        pass  # the log is the extension's: it outlives the broker's use of it
