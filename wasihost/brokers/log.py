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
from ..status import Status, StatusAnswer

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


Commit = Callable[..., tuple[bool, Any]]
"""``commit(action, *args)``: runs ``action(*args)`` if the caller's grant epoch still
authorises it, under the grant table's lock: (authorised, result). See
:meth:`wasihost.extension.Extension.committer`."""

# Levels by their code: the request's level indexes this after a range check (constructing the
# enum from an int, and catching its ValueError, cost more than the rest of the shape check).
_LEVELS = tuple(sorted(Level, key=int))
assert [int(level) for level in _LEVELS] == list(range(len(_LEVELS)))
# Answered rather than raised: a full log answers QUOTA_EXCEEDED to every later record, and an
# exception per call would cost as much as the call.
_INVALID_ARGUMENT = StatusAnswer.of(Status.INVALID_ARGUMENT)
_DENIED = StatusAnswer.of(Status.DENIED)
_QUOTA_EXCEEDED = StatusAnswer.of(Status.QUOTA_EXCEEDED)


def log_handler(log: ExtensionLog, commit: Commit | None = None) -> Callable[[Any, Any], Any]:
    """The ``log`` entry: ``[level, message]`` -> null.

    ``commit`` wraps the append so the grant epoch is checked at commit time: a record
    authorised before a revocation is never appended after it.
    """
    append = log.append
    levels = _LEVELS
    n_levels = len(levels)

    def handle(call: Any, request: Any) -> Any:
        if not isinstance(request, list) or len(request) != 2:
            return _INVALID_ARGUMENT
        level, message = request
        if (
            not isinstance(level, int)
            or isinstance(level, bool)
            or not 0 <= level < n_levels
            or not isinstance(message, str)
        ):
            return _INVALID_ARGUMENT
        if commit is None:
            ok = append(levels[level], message)
        else:
            authorised, ok = commit(append, levels[level], message)
            if not authorised:
                return _DENIED
        return None if ok else _QUOTA_EXCEEDED

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
        return log_handler(ext.log, ext.committer(entry.capability))

    def close(self, state: Extension) -> None:
        pass  # the log is the extension's: it outlives the broker's use of it
