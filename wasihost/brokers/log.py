"""The log broker: the ``log`` entry appends a guest record to its extension's log, committed
through the grant table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.extlog import (
    RECORD_OVERHEAD_BYTES,
    TRACE_LOGGING_LEVEL,
    ExtensionLog,
    Level,
    LogRecord,
    LogSink,
    to_logging,
)
from ..core.serving import refuse_any_scope
from ..core.status import Status, StatusAnswer

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "TRACE_LOGGING_LEVEL",
    "ExtensionLog",
    "Level",
    "LogBroker",
    "LogRecord",
    "LogSink",
    "log_handler",
    "native_log_handler",
    "to_logging",
]


Commit = Callable[..., tuple[bool, Any]]
"""``commit(action, *args)``: runs ``action(*args)`` if the caller's grant epoch still
authorises it, under the grant table's lock: (authorised, result). See
:meth:`wasihost.host.extension.Extension.committer`."""

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


# The answers of ABI 2.0's native ``log``, as the i32 it returns: 0 or a negated status.
_NATIVE_OK = 0
_NATIVE_INVALID = -int(Status.INVALID_ARGUMENT)
_NATIVE_TOO_LARGE = -int(Status.PAYLOAD_TOO_LARGE)
_NATIVE_DENIED = -int(Status.DENIED)
_NATIVE_QUOTA = -int(Status.QUOTA_EXCEEDED)


def native_log_handler(
    log: ExtensionLog, max_message_bytes: int, commit: Commit | None = None
) -> Callable[[Any, int, int, int], int]:
    """ABI 2.0's ``log(level, msg_ptr, msg_len) -> i32``: the message is raw UTF-8 in guest
    memory, no CBOR. The checks, in order: the range lies in memory (else the guest traps with
    class ``protocol``, as for any v1 entry), ``msg_len`` is within ``max_message_bytes``
    (``-PAYLOAD_TOO_LARGE``, nothing read), the level is 0..4 and the bytes are UTF-8
    (``-INVALID_ARGUMENT``); then the append commits through the grant table (``-DENIED`` if
    revoked meanwhile, ``-QUOTA_EXCEEDED`` over the log budget)."""
    append = log.append
    levels = _LEVELS
    n_levels = len(levels)

    def handle(call: Any, level: int, ptr: int, length: int) -> int:
        # The engine passes i32 arguments as unsigned 32-bit ints: no negative values here.
        call.require_range(ptr, length)
        if length > max_message_bytes:
            return _NATIVE_TOO_LARGE
        if level >= n_levels:
            return _NATIVE_INVALID
        try:
            message = call.read(ptr, length).decode("utf-8", "strict")
        except UnicodeDecodeError:
            return _NATIVE_INVALID
        if commit is None:
            ok = append(levels[level], message)
        else:
            authorised, ok = commit(append, levels[level], message)
            if not authorised:
                return _NATIVE_DENIED
        return _NATIVE_OK if ok else _NATIVE_QUOTA

    return handle


class LogBroker:
    """Serves ``log``: appends to the extension's own log (or the embedder's sink), each record
    committed through the grant table under the call's epoch."""

    name = "log"
    functions = ("wasihost_v1.log",)
    capabilities = frozenset({"log"})
    # ABI 2.0 changed ``log`` to the native convention: this broker serves it too (carried
    # over from ``wasihost_v1.log`` by the host, see HostFunctions.add_broker).
    conventions = frozenset({"cbor", "native"})


    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        refuse_any_scope(capability, scope)
    def open(self, ext: ExtensionView) -> ExtensionView:
        return ext

    def handler(self, entry: HostFunction, state: ExtensionView) -> Callable[..., Any]:
        ext = state
        if entry.convention == "native":
            return native_log_handler(
                ext.log, entry.max_request_bytes, ext.committer(entry.capability)
            )
        return log_handler(ext.log, ext.committer(entry.capability))

    def close(self, state: ExtensionView) -> None:
        pass  # the log is the extension's: it outlives the broker's use of it
