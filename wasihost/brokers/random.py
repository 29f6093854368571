"""The random broker: OS CSPRNG bytes, or a seeded deterministic stream for reproducible runs."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections.abc import Callable
from typing import Any

from ..status import HostStatus, Status

# One call's worth; the registry's response limit (4099) is this plus CBOR framing.
MAX_RANDOM_BYTES_PER_CALL = 4096


class SeededRandom:
    """HMAC-SHA256 in counter mode: reproducible given the seed, and not guessable without it."""

    def __init__(self, seed: bytes) -> None:
        self._key = seed
        self._counter = 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> bytes:
        out = bytearray()
        with self._lock:
            while len(out) < n:
                block = self._counter.to_bytes(8, "big")
                out += hmac.new(self._key, block, hashlib.sha256).digest()
                self._counter += 1
        return bytes(out[:n])


def random_handler(source: Callable[[int], bytes] = os.urandom) -> Callable[[Any], Any]:
    """The ``random_bytes`` entry: ``uint n`` (0..4096) -> ``n`` bytes."""

    def handle(request: Any) -> bytes:
        if (
            not isinstance(request, int)
            or isinstance(request, bool)
            or not 0 <= request <= MAX_RANDOM_BYTES_PER_CALL
        ):
            raise HostStatus(Status.INVALID_ARGUMENT)
        return source(request)

    return handle
