"""Reading a command-line input: a file, or ``-`` for this process's stdin, bounded."""

from __future__ import annotations

import sys

from ..packaging.regular_files import read_stream


def read_file_or_stdin(source: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``source`` (``-``: stdin), or None when there are more: a
    caller refuses an oversized input, it never truncates one. ``OSError`` passes through."""
    data = sys.stdin.buffer.read(limit + 1) if source == "-" else read_stream(source, limit)
    return data if len(data) <= limit else None
