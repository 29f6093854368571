from __future__ import annotations

import pytest

from wasihost.core.tokens import TOKEN_BYTES, InvalidToken, TokenIssuer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_token_is_bound_to_runtime_epoch_and_time() -> None:
    clock = FakeClock()
    issuer = TokenIssuer(key=b"k" * 32, clock=clock, ttl_ns=100)
    runtime = bytes(16)
    token = issuer.issue("org.x", runtime, 3)
    assert len(token) == TOKEN_BYTES
    issuer.verify(token, "org.x", runtime, 3)
    with pytest.raises(InvalidToken, match="epoch"):
        issuer.verify(token, "org.x", runtime, 4)
    with pytest.raises(InvalidToken, match="epoch"):
        issuer.verify(token, "org.x", b"\1" * 16, 3)
    with pytest.raises(InvalidToken, match="epoch"):
        issuer.verify(token, "org.y", runtime, 3)
    forged = token[:-1] + bytes([token[-1] ^ 1])
    with pytest.raises(InvalidToken):
        issuer.verify(forged, "org.x", runtime, 3)
    with pytest.raises(InvalidToken, match="malformed"):
        issuer.verify(token[:-2], "org.x", runtime, 3)
    clock.now += 100
    with pytest.raises(InvalidToken, match="expired"):
        issuer.verify(token, "org.x", runtime, 3)


def test_tokens_from_another_host_key_are_rejected() -> None:
    a, b = TokenIssuer(), TokenIssuer()
    token = a.issue("org.x", bytes(16), 1)
    with pytest.raises(InvalidToken):
        b.verify(token, "org.x", bytes(16), 1)
