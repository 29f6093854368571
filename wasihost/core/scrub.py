"""Removing a secret's plaintext, and its common encodings, from bytes bound for a guest.

Pure. The http broker attaches a secret to a request as a header; a server that reflects
request headers (an echo endpoint, a debugging proxy, an error page quoting the request) would
hand it back. Before a response reaches guest memory every form listed here is replaced:

- the raw bytes, and their percent-encoding;
- hexadecimal, lowercase and uppercase;
- base64, standard and URL-safe alphabets, at each of the three byte alignments the secret can
  have inside a longer base64 text (``Basic`` credentials, a JWT, a JSON blob), so only the
  characters that depend on the secret's bits alone are matched; and broken into lines at any
  width (MIME's 76 characters, PEM's 64), as the line breaks are read past (below);
- the UTF-8 spelling of a secret holding bytes over 0x7f (sent as latin-1, one character
  per byte, and written back as UTF-8 by a server that decoded the header as text), and that
  spelling's own forms above;
- the secret as a JSON string writes it (every ``"``, ``\\`` and tab escaped: ``json.dumps``
  of the request's headers, as httpbin's ``/headers`` answers) and as a form encoder writes
  it (every space a ``+``);
- each of those with any of its characters escaped the way echoing servers escape text: a
  percent-escape in either case (whatever set of characters the encoder left alone: Python's
  ``quote`` keeps ``/``, JavaScript's ``encodeURIComponent`` keeps ``!'()*``), a JSON
  ``\\/`` or ``\\u00XX`` (PHP's ``json_encode`` writes every ``/`` of a token as ``\\/``), an
  HTML character reference (``&#47;``, ``&#x2F;``, ``&amp;``...); and hexadecimal in mixed
  case. The escapes are decoded one layer deep, so a doubly escaped secret is not found;
- each of those broken by line breaks (CR, LF, CRLF, and JSON's ``\\n``, ``\\r``, ``\\r\\n``),
  which the escaped view reads past: a MIME encoder (``base64.encodebytes``, an email body)
  wraps its base64 every 76 characters, and the secret inside came back whole for 19 of 26
  alignments (red-team 2026-12-01, issue 28 item 15); with the spaces or tabs after a break
  (a folded header line, indented lines);
- each of those split by blanks, spaces and tabs with or without raw line breaks, read past
  in a view of their own (lines joined by a space, columns of a dump: a form split so came
  back whole for up to 17 of 26 alignments, issue 28's red-team pass).

This is a second line: the first is that a secret travels only to the origins the operator
bound it to. A server that transforms the secret otherwise (reversed, encrypted) is trusted
with it by that binding, and nothing here can tell.
"""

from __future__ import annotations

import base64
import bisect
import re
import urllib.parse
from typing import Final

REDACTED: Final = b"[redacted]"
# Shorter forms than this would match ordinary text by chance and mangle it; the secrets the
# store holds are credentials (API tokens are 20 characters and more).
MIN_FORM_BYTES: Final = 4


def _base64_cores(secret: bytes) -> list[bytes]:
    """For each alignment of ``secret`` in a byte stream, the run of base64 characters whose
    6 bits all come from ``secret``: the same in any base64 text that contains it there."""
    cores = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret + b"\0\0")
        start_bit, end_bit = 8 * shift, 8 * (shift + len(secret))
        first = -(-start_bit // 6)  # the first character starting at or after the secret
        last = end_bit // 6  # characters ending at or before the secret's end
        if last > first:
            cores.append(encoded[first:last])
    return cores


def _json_spelling(text: bytes) -> bytes:
    """``text`` as a JSON string's body writes it: each backslash, double quote and tab
    escaped (the only characters of a header value JSON escapes besides those over 0x7f)."""
    return text.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\t", b"\\t")


def secret_forms(secret: bytes) -> list[bytes]:
    """Every encoded form of ``secret`` to remove, longest first (so a form that contains
    another is replaced whole)."""
    spellings = [secret]
    if not secret.isascii():
        # A header travels as latin-1; a server that decodes it as text and writes it back
        # (a JSON echo with ensure_ascii off, a form encoder) spells each byte over 0x7f as
        # two bytes of UTF-8 (red-team 2026-12-01: caf\xe9... came back as caf\xc3\xa9...).
        spellings.append(secret.decode("latin-1").encode("utf-8"))
    forms: set[bytes] = set()
    for spelling in spellings:
        # Every JSON encoder writes a '"', a backslash or a tab of the text escaped (and the
        # bytes over 0x7f as \\u00XX, which the second view decodes): a password holding one,
        # reflected by a JSON echo, came back whole but for a backslash (red-team 2026-12-01).
        forms.add(_json_spelling(spelling))
        if b" " in spelling:
            # A form encoder (urlencode, a query string) writes a space as '+' and percent-
            # escapes the rest, which the second view decodes: a password with a space came
            # back as pass+word (red-team 2026-12-01).
            forms.add(spelling.replace(b" ", b"+"))
        forms |= {spelling, spelling.hex().encode(), spelling.hex().upper().encode()}
        forms.add(urllib.parse.quote_from_bytes(spelling, safe="").encode())
        for core in _base64_cores(spelling):
            forms.add(core)
            forms.add(core.translate(bytes.maketrans(b"+/", b"-_")))
    return sorted((f for f in forms if len(f) >= MIN_FORM_BYTES), key=len, reverse=True)


class Unscrubbable(Exception):
    """Replacing the forms left one in place (a secret inside the marker itself, or one the
    marker and its neighbours spell again): the bytes cannot be made clean and must not be
    handed on."""


# One escaped byte, as echoing servers write it (see the module's doc): percent, JSON's \\uXXXX
# (a byte only below 0x100) and \\/, HTML's numeric and named references. JSON's \\", \\\\ and \\t
# and a form encoding's '+' for a space are spellings of the secret instead (secret_forms): a
# JSON or form encoder writes every such character so, and decoded here they would hide a real
# backslash or '+' written among other escapes.
_ESCAPE: Final = re.compile(
    rb"%([0-9a-fA-F]{2})"
    rb"|\\u00([0-9a-fA-F]{2})"
    rb"|\\(/)"
    rb"|&#0*([0-9]{1,3});"
    rb"|&#[xX]0*([0-9a-fA-F]{1,2});"
    rb"|&(amp|lt|gt|quot|apos);"
)
# The same, reading a JSON string's escaped backslash (\\\\) as one unit left as it is: the
# '\\/' of '\\\\/' is no escaped '/' there, and in JSON's spelling of a secret ending in a
# backslash followed by '/' (red-team 2026-12-01) only this view finds it. A third view, not a
# change of the second: an encoder escaping '/' but not '\\' is read right by the second.
_JSON_BACKSLASH: Final = rb"|(?P<backslash>\\\\)"
# A line break, raw or JSON-escaped, read as nothing: encoders wrap long base64 (and hex) text
# in lines (MIME every 76 characters), and a secret's form must be found across them. Views of
# their own, beside those that keep line breaks: a secret holding a line break (the store
# takes any bytes) is found only where its break is kept.
_LINE_BREAK: Final = rb"|(?P<line_break>(?:\r\n|\r|\n|\\r\\n|\\r|\\n)[ \t]*)"
_ESCAPE_JSON: Final = re.compile(_ESCAPE.pattern + _JSON_BACKSLASH)
_ESCAPE_UNWRAPPED: Final = re.compile(_ESCAPE.pattern + _LINE_BREAK)
_ESCAPE_JSON_UNWRAPPED: Final = re.compile(_ESCAPE.pattern + _JSON_BACKSLASH + _LINE_BREAK)
_LINE_BREAK_MARKS: Final = (b"\r", b"\n", b"\\r", b"\\n")
# Blanks (spaces, tabs, raw line breaks), read as nothing in a view of their own: base64 (or
# hex) split by spaces or tabs rather than line breaks, or by both (a folded header, lines
# joined by a space, indented lines, columns of a dump). Plain, without the escapes.
_BLANK_BYTES: Final = b" \t\r\n"
_BLANKS: Final = re.compile(rb"[ \t\r\n]+")
_NAMED: Final = {b"amp": b"&", b"lt": b"<", b"gt": b">", b"quot": b'"', b"apos": b"'"}
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")


def _unescaped(
    data: bytes, escape: re.Pattern[bytes] = _ESCAPE
) -> tuple[bytes, list[int], list[int]]:
    """``data`` with each ``escape`` decoded to its byte, and a map back: a decoded index ``i``
    is at ``orig[k] + i - dec[k]`` of ``data``, ``k`` the last breakpoint with ``dec[k] <= i``."""
    out = bytearray()
    dec, orig = [0], [0]
    last = 0
    for match in escape.finditer(data):
        hex_text = match.group(1) or match.group(2) or match.group(5)
        if hex_text is not None:
            byte = bytes([int(hex_text, 16)])
        elif match.group(3) is not None:
            byte = b"/"
        elif match.lastgroup == "line_break":
            byte = b""
        elif match.lastgroup == "backslash":
            byte = match.group("backslash")  # an escaped backslash, kept whole
        elif match.group(4) is not None:
            number = int(match.group(4))
            if number > 0xFF:
                continue  # not a byte: left as it is
            byte = bytes([number])
        else:
            byte = _NAMED[match.group(6)]
        start, end = match.span()
        out += data[last:start]
        dec.append(len(out))
        orig.append(start)
        out += byte
        dec.append(len(out))
        orig.append(end)
        last = end
    out += data[last:]
    return bytes(out), dec, orig


def _without_blanks(data: bytes) -> tuple[bytes, list[int], list[int]]:
    """``data`` without its runs of spaces and tabs, with the map back of :func:`_unescaped`
    (each run a breakpoint pair, as a line break read as nothing is)."""
    spans = [m.span() for m in _BLANKS.finditer(data)]
    dec, orig = [0], [0]
    removed = 0
    for start, end in spans:
        dec.append(start - removed)
        orig.append(start)
        dec.append(start - removed)
        orig.append(end)
        removed += end - start
    return data.translate(None, _BLANK_BYTES), dec, orig


def _spans(text: bytes, forms: list[bytes]) -> list[tuple[int, int]]:
    """Where a form occurs in ``text``; a form of hexadecimal digits in either case."""
    lowered = text.lower()
    spans = []
    for form in forms:
        hex_form = all(b in _HEX for b in form)
        haystack, needle = (lowered, form.lower()) if hex_form else (text, form)
        at = haystack.find(needle)
        while at >= 0:
            spans.append((at, at + len(needle)))
            at = haystack.find(needle, at + 1)
    return spans


def _occurrences(data: bytes, forms: list[bytes]) -> list[tuple[int, int]]:
    """Where a form occurs in ``data``, as written or with escapes decoded, merged and sorted."""
    spans = _spans(data, forms)
    json_backslash = b"\\\\" in data
    views = [_ESCAPE, _ESCAPE_JSON] if json_backslash else [_ESCAPE]
    if any(mark in data for mark in _LINE_BREAK_MARKS):
        views.append(_ESCAPE_UNWRAPPED)
        if json_backslash:
            views.append(_ESCAPE_JSON_UNWRAPPED)
    unescaped = [_unescaped(data, escape) for escape in views]
    if (b" " in data or b"\t" in data) and _spans(data.translate(None, _BLANK_BYTES), forms):
        # The map back is made only where a form was found (a Python step per run of blanks:
        # 100 ms a MiB of prose, against about 2 ms for the look).
        unescaped.append(_without_blanks(data))
    for decoded, dec, orig in unescaped:
        if len(dec) > 1:
            for start, end in _spans(decoded, forms):
                k = bisect.bisect_right(dec, start) - 1
                first = orig[k] + start - dec[k]
                # The end at the first breakpoint there: a line break read as nothing right
                # after the form is not part of it (the redaction keeps the lines apart).
                k = bisect.bisect_left(dec, end)
                if k == len(dec) or dec[k] != end:
                    k -= 1
                spans.append((first, orig[k] + end - dec[k]))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def scrub(data: bytes, forms: list[bytes]) -> bytes:
    """``data`` with every occurrence of each form, escaped or not, replaced by
    :data:`REDACTED`; raises :class:`Unscrubbable` if one still occurs afterwards."""
    if not forms:
        return data
    spans = _occurrences(data, forms)
    if not spans:
        return data
    out = bytearray()
    last = 0
    for start, end in spans:
        out += data[last:start]
        out += REDACTED
        last = end
    out += data[last:]
    if _occurrences(bytes(out), forms):
        raise Unscrubbable
    return bytes(out)


def scrub_text(text: str, forms: list[bytes]) -> str:
    """The same for a header name or value (decoded as latin-1, one character per byte)."""
    data = text.encode("latin-1", errors="replace")
    cleaned = scrub(data, forms)
    return text if cleaned == data else cleaned.decode("latin-1")
