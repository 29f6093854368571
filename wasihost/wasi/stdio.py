"""Where a guest's stdout and stderr go when they do not go to the caller: the extension log,
one record per line."""

from __future__ import annotations

from ..core.extlog import ExtensionLog, Level
from . import limits


class LogLines:
    """A byte-stream sink that appends one :class:`ExtensionLog` record per line.

    A partial line waits for its newline (or for :meth:`flush` at the end of the run); a line
    longer than ``MAX_LOG_LINE_BYTES`` is cut into records of that size so the pending buffer
    stays bounded. Bytes that are not UTF-8 are replaced, never rejected: the guest's write
    succeeds whatever it wrote. A full log drops records (the log counts them); the write still
    succeeds, because the log is diagnostics, not a channel the guest can rely on.
    """

    def __init__(self, log: ExtensionLog, level: Level, source: str) -> None:
        self._log = log
        self._level = level
        self._source = source
        self._pending = bytearray()

    def __call__(self, data: bytes) -> None:
        pending = self._pending
        pending += data
        if b"\n" in data:
            *lines, rest = bytes(pending).split(b"\n")
            pending[:] = rest
            for line in lines:
                self._emit(line)
        while len(pending) > limits.MAX_LOG_LINE_BYTES:
            self._emit(bytes(pending[: limits.MAX_LOG_LINE_BYTES]))
            del pending[: limits.MAX_LOG_LINE_BYTES]

    def _emit(self, line: bytes) -> None:
        while len(line) > limits.MAX_LOG_LINE_BYTES:
            self._log.append(
                self._level,
                line[: limits.MAX_LOG_LINE_BYTES].decode("utf-8", "replace"),
                self._source,
            )
            line = line[limits.MAX_LOG_LINE_BYTES :]
        self._log.append(self._level, line.decode("utf-8", "replace"), self._source)

    def flush(self) -> None:
        """Emit a last line that has no newline."""
        if self._pending:
            line = bytes(self._pending)
            self._pending.clear()
            self._emit(line)
