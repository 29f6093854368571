"""Text from a guest or a package, made safe to print on the operator's terminal."""

from __future__ import annotations

import re

# C0 and C1 controls and DEL: a guest's log line, trap message (wasm function names come from
# the module), export or import name, or error text could otherwise move the cursor, rewrite the
# operator's terminal or start a line of its own. Also the Unicode line and paragraph
# separators and the bidirectional formatting characters, which can make a line read
# differently from what it holds (an export name that shows as another one).
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe to print on one terminal line: those characters shown as ``\\xNN`` or
    ``\\uNNNN``."""
    return _UNSAFE.sub(_escape, text)
