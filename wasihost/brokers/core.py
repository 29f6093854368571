"""The ``core`` capability: ABI plumbing every guest holds (``abort``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..status import GuestAbort
from .log import ExtensionLog, Level

# A panic message is for a human reading the log; the first 512 characters say it.
MAX_PANIC_MESSAGE_CHARS = 512


def abort_handler(log: ExtensionLog) -> Callable[[Any], Any]:
    """The ``abort`` entry: record the message and end the call as a panic."""

    def handle(request: Any) -> None:
        message = request if isinstance(request, str) else "guest aborted"
        message = message[:MAX_PANIC_MESSAGE_CHARS]
        log.append(Level.ERROR, f"panic: {message}", source="host")
        raise GuestAbort(message)

    return handle
