"""The content record: one line per packed file, its SHA-256, its size and its path.

The record is canonical (one header line, then lines sorted by path, LF endings, ASCII), so
that one set of files has exactly one record, and the package digest, the SHA-256 of the
record, names the whole package.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Final

import attrs

from .names import UnsafeName, check_name

# The one record format this reader understands.
SCHEMA: Final = "wasihost-contents/1"
_LINE = re.compile(r"([0-9a-f]{64}) (0|[1-9][0-9]{0,10}) (\S+)")


class ContentsError(ValueError):
    """A content record that is not well formed; the message says where."""


@attrs.frozen
class Entry:
    sha256: str
    size: int


def render(files: Mapping[str, bytes]) -> bytes:
    """The canonical record of ``files`` (names already checked)."""
    lines = [SCHEMA]
    for name in sorted(files):
        data = files[name]
        lines.append(f"{hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    return ("\n".join(lines) + "\n").encode("ascii")


def parse(record: bytes) -> dict[str, Entry]:
    """The entries of a record; only the canonical form is accepted."""
    try:
        text = record.decode("ascii")
    except UnicodeDecodeError:
        raise ContentsError("the content record is not ASCII") from None
    if not text.endswith("\n"):
        raise ContentsError("the content record does not end with a newline")
    lines = text[:-1].split("\n")
    if lines[0] != SCHEMA:
        raise ContentsError(f"the content record does not start with {SCHEMA!r}")
    entries: dict[str, Entry] = {}
    previous = ""
    for number, line in enumerate(lines[1:], start=2):
        match = _LINE.fullmatch(line)
        if match is None:
            raise ContentsError(f"content record line {number} is not 'SHA256 SIZE PATH'")
        digest, size, name = match.groups()
        try:
            check_name(name)
        except UnsafeName as exc:
            raise ContentsError(f"content record line {number}: {exc}") from None
        if name <= previous:
            raise ContentsError(f"content record line {number}: paths are not sorted and unique")
        previous = name
        entries[name] = Entry(digest, int(size))
    return entries
