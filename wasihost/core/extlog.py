"""The extension's log: a bounded, per-extension record buffer, or the embedder's sink.

A facility of every extension, not a broker: the ``log`` broker appends the guest's records to
it, ``abort`` its panic, the WASI profile its stdout and stderr.
"""

from __future__ import annotations

import enum
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from .hostlog import host_logger
from .terminal import printable


class Level(enum.IntEnum):
    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


# Per-record overhead charged against the budget, so a flood of empty records is bounded too:
# what a buffered record holds in the host's heap besides its text's characters, so that
# max_log_bytes bounds the host memory the log takes. Measured with tracemalloc: the LogRecord
# (with its GC header), its time stamp (an int), its slot in the list and the text's str header
# (49 bytes for ASCII) come to about 166 bytes. At 32, a log of max_log_bytes 16 MiB held 58.5
# MiB of empty records and 79 MiB of one- and two-character ones (red-team 2026-12-01).
RECORD_OVERHEAD_BYTES = 168
# The header of an ASCII str (sys.getsizeof("")), already in RECORD_OVERHEAD_BYTES: a text's
# characters take sys.getsizeof(text) less this in the host's heap.
_STR_HEADER_BYTES = sys.getsizeof("")


@attrs.frozen
class LogRecord:
    level: Level
    message: str
    time_ns: int
    source: str = "guest"

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level.name.lower(), "message": self.message, "source": self.source}


_RECORD_FIELDS = ("level", "message", "time_ns", "source")
# _record fills exactly these: a field added to LogRecord must be added there too.
assert tuple(field.name for field in attrs.fields(LogRecord)) == _RECORD_FIELDS
_set_level, _set_message, _set_time_ns, _set_source = (
    LogRecord.__dict__[field].__set__ for field in _RECORD_FIELDS
)


def _record(level: Level, message: str, time_ns: int, source: str) -> LogRecord:
    """``LogRecord(level, message, time_ns, source)`` at host-call speed: the frozen class's
    ``__init__`` goes through ``object.__setattr__`` once per field, a quarter of a log call's
    host-side cost; its slots are filled here directly, before anyone holds the record."""
    record = object.__new__(LogRecord)
    _set_level(record, level)
    _set_message(record, message)
    _set_time_ns(record, time_ns)
    _set_source(record, source)
    return record


LogSink = Callable[[str, LogRecord], None]
"""Where an embedder wants extension logs: called with the extension id and each record."""

# Python logging has no TRACE; 5 sits below DEBUG (10) as TRACE does in most libraries.
TRACE_LOGGING_LEVEL = 5
# logging's own DEBUG, INFO, WARNING and ERROR (fixed by the standard library, checked by
# tests/test_startup.py), written out so that this module need not import logging.
_LOGGING_LEVELS = {
    Level.TRACE: TRACE_LOGGING_LEVEL,
    Level.DEBUG: 10,
    Level.INFO: 20,
    Level.WARN: 30,
    Level.ERROR: 40,
}


def to_logging(extension: str, record: LogRecord) -> None:
    """A :data:`LogSink` for Python's ``logging``: the logger is named after the extension id,
    and the record's source (``guest``, ``host``, ``stdout``...) is an ``extra`` field.

    The message is logged with control characters, line separators and bidirectional
    overrides escaped (:func:`~wasihost.core.terminal.printable`): logging's handlers write lines,
    and a guest's newline would start one of its choosing, a forged record of another
    extension or of the host (red-team 2026-12-01). The exact text is the
    ``wasihost_message`` extra field, for a handler that writes structured records."""
    import logging  # here: only an embedder that chose this sink pays for the import

    logging.getLogger(extension).log(
        _LOGGING_LEVELS[record.level],
        "%s",
        printable(record.message),
        extra={
            "wasihost_source": record.source,
            "wasihost_time_ns": record.time_ns,
            "wasihost_message": record.message,
        },
    )


class ExtensionLog:
    """Records of one extension, at most ``max_bytes`` of them until the embedder drains it.

    A full log drops new records and counts them, rather than evicting old ones: the first
    records are usually the ones that explain what went wrong.

    With a ``sink``, records are handed to it as they commit and nothing is buffered. The sink
    runs on the guest's thread, inside the host call (under the extension's grant lock, so that
    nothing is delivered after a revocation returns): it should be quick. A sink that raises
    loses that record, counted in ``sink_errors``; the guest is not told.
    """

    def __init__(
        self,
        max_bytes: int,
        clock: Callable[[], int] = time.time_ns,
        sink: Callable[[LogRecord], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._sink = sink
        self._records: list[LogRecord] = []
        self._used = 0
        self.dropped = 0
        self.sink_errors = 0
        self._lock = threading.Lock()

    def append(self, level: Level, message: str, source: str = "guest") -> bool:
        if self._sink is not None:
            try:
                self._sink(_record(level, message, self._clock(), source))
            except Exception:
                self.sink_errors += 1
                host_logger().exception("log sink failed; record lost")
            return True
        # Its UTF-8 size, or what its characters take in the host's heap if that is more (a
        # str holds every character at the width of its widest: one emoji makes 4 bytes of
        # each ASCII character, which UTF-8 counts as 1). For ASCII text (most log lines) both
        # are its length, read without encoding a copy.
        size = (
            len(message)
            if message.isascii()
            else max(len(message.encode()), sys.getsizeof(message) - _STR_HEADER_BYTES)
        )
        cost = size + RECORD_OVERHEAD_BYTES
        with self._lock:
            if self._used + cost > self.max_bytes:
                self.dropped += 1
                return False
            self._used += cost
            self._records.append(_record(level, message, self._clock(), source))
            return True

    @property
    def records(self) -> tuple[LogRecord, ...]:
        with self._lock:
            return tuple(self._records)

    def drain(self) -> list[LogRecord]:
        with self._lock:
            out, self._records, self._used = self._records, [], 0
            return out
