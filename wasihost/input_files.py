"""Reading a command-line input: a file, or ``-`` for this process's stdin, bounded."""

from __future__ import annotations

import sys

from .regular_files import read_regular


def read_file_or_stdin(source: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``source`` (``-``: stdin), or None when there are more: a
    caller refuses an oversized input, it never truncates one. ``OSError`` passes through."""
    if source == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        data = read_regular(source, limit, follow=True)
    return data if len(data) <= limit else None
