"""Capability tokens: opaque, short-lived, bound to one runtime and one grant epoch.

The host hands a guest a token in the handshake's welcome. A broker that takes a token back
(jobs and events will) verifies it against the caller's *current* runtime id and grant epoch,
so a token outlives neither a restart nor a grant change, and expires on its own regardless.
Pure: the key and the clock are injected.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable

from .errors import WasihostError

TOKEN_VERSION = 1
# Five minutes: long enough for a job handed to the host and polled back, short enough that a
# leaked token is stale before anyone can use it elsewhere.
DEFAULT_TOKEN_TTL_NS = 5 * 60 * 1_000_000_000
# 128 bits of HMAC-SHA256 is the usual truncation for authentication tags.
MAC_BYTES = 16
NONCE_BYTES = 8
TOKEN_BYTES = 1 + 8 + NONCE_BYTES + MAC_BYTES


class InvalidToken(WasihostError):
    """The token is malformed, forged, expired, or bound to another runtime or epoch."""

    @property
    def error_class(self) -> str:
        return "denied"


class TokenIssuer:
    def __init__(
        self,
        key: bytes | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        ttl_ns: int = DEFAULT_TOKEN_TTL_NS,
    ) -> None:
        key = key if key is not None else secrets.token_bytes(32)
        # Keyed once and copied per token: keying HMAC-SHA256 anew (OpenSSL fetching the
        # digest, hashing both pads) is most of its cost for a 60-byte message, and every
        # instance start issues a token.
        self._keyed = hmac.new(key, digestmod="sha256")
        self._clock = clock
        self.ttl_ns = ttl_ns

    def _mac(self, head: bytes, extension: str, runtime_id: bytes, epoch: int) -> bytes:
        message = b"".join([head, extension.encode(), b"\0", runtime_id, epoch.to_bytes(8, "big")])
        mac = self._keyed.copy()
        mac.update(message)
        return mac.digest()[:MAC_BYTES]

    def issue(self, extension: str, runtime_id: bytes, epoch: int) -> bytes:
        expiry = self._clock() + self.ttl_ns
        head = bytes([TOKEN_VERSION]) + expiry.to_bytes(8, "big") + secrets.token_bytes(NONCE_BYTES)
        return head + self._mac(head, extension, runtime_id, epoch)

    def verify(self, token: bytes, extension: str, runtime_id: bytes, epoch: int) -> None:
        """Return if valid for exactly this runtime and epoch; raise :class:`InvalidToken`."""
        if not isinstance(token, bytes) or len(token) != TOKEN_BYTES or token[0] != TOKEN_VERSION:
            raise InvalidToken("malformed capability token")
        head, mac = token[:-MAC_BYTES], token[-MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(head, extension, runtime_id, epoch)):
            raise InvalidToken("capability token does not match this runtime and grant epoch")
        if int.from_bytes(head[1:9], "big") <= self._clock():
            raise InvalidToken("capability token expired")
