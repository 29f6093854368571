"""The ``core`` capability: ABI plumbing every guest holds (``abort``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.extlog import ExtensionLog, Level
from ..core.status import GuestAbort, UnreadableRequest

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

# A panic message is for a human reading the log; the first 512 characters say it.
MAX_PANIC_MESSAGE_CHARS = 512

# What the panic says when the guest's message is not text: the guest still ends its call
# (abort never returns), and the host never echoes bytes it could not decode.
MALFORMED_MESSAGE = "(malformed abort message)"
NO_MESSAGE = "guest aborted"


def panic_message(request: Any) -> str:
    """The message an ``abort`` request carries, truncated, or a placeholder saying why not."""
    if isinstance(request, str):
        return request[:MAX_PANIC_MESSAGE_CHARS]
    if request is None:
        return NO_MESSAGE
    if isinstance(request, UnreadableRequest):
        return f"(unreadable abort message: {request.reason})"
    return MALFORMED_MESSAGE


def abort_handler(log: ExtensionLog) -> Callable[[Any, Any], Any]:
    """The ``abort`` entry: record the message and end the call as a panic, whatever the
    request (the registry marks it ``never_returns``)."""

    def handle(call: Any, request: Any) -> None:
        message = panic_message(request)
        log.append(Level.ERROR, f"panic: {message}", source="host")
        raise GuestAbort(message)

    return handle


class CoreBroker:
    """Serves ``abort``, the ``core`` plumbing every guest holds: the panic goes to the
    extension's log and the call ends."""

    name = "core"
    functions = ("wasihost_v1.abort",)
    capabilities = frozenset({"core"})

    def open(self, ext: ExtensionView) -> ExtensionLog:
        return ext.log

    def handler(self, entry: HostFunction, state: ExtensionLog) -> Callable[[Any, Any], Any]:
        return abort_handler(state)

    def close(self, state: ExtensionLog) -> None:
        pass
