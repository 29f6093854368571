"""Removing a secret's plaintext, and its common encodings, from bytes bound for a guest.

Pure. The http broker attaches a secret to a request as a header; a server that reflects
request headers (an echo endpoint, a debugging proxy, an error page quoting the request) would
hand it back. Before a response reaches guest memory every form listed here is replaced:

- the raw bytes, and their percent-encoding;
- hexadecimal, lowercase and uppercase;
- base64, standard and URL-safe alphabets, at each of the three byte alignments the secret can
  have inside a longer base64 text (``Basic`` credentials, a JWT, a JSON blob), so only the
  characters that depend on the secret's bits alone are matched.

This is a second line: the first is that a secret travels only to the origins the operator
bound it to. A server that transforms the secret otherwise (reversed, encrypted) is trusted
with it by that binding, and nothing here can tell.
"""

from __future__ import annotations

import base64
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


def secret_forms(secret: bytes) -> list[bytes]:
    """Every encoded form of ``secret`` to remove, longest first (so a form that contains
    another is replaced whole)."""
    forms = {secret, secret.hex().encode(), secret.hex().upper().encode()}
    forms.add(urllib.parse.quote_from_bytes(secret, safe="").encode())
    for core in _base64_cores(secret):
        forms.add(core)
        forms.add(core.translate(bytes.maketrans(b"+/", b"-_")))
    return sorted((f for f in forms if len(f) >= MIN_FORM_BYTES), key=len, reverse=True)


def scrub(data: bytes, forms: list[bytes]) -> bytes:
    """``data`` with every occurrence of each form replaced by :data:`REDACTED`."""
    for form in forms:
        if form in data:
            data = data.replace(form, REDACTED)
    return data


def scrub_text(text: str, forms: list[bytes]) -> str:
    """The same for a header name or value (decoded as latin-1, one character per byte)."""
    data = text.encode("latin-1", errors="replace")
    cleaned = scrub(data, forms)
    return text if cleaned == data else cleaned.decode("latin-1")
