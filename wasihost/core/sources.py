"""Time and randomness as injectable sources: the clock broker and the WASI profile read the
host's clock through :class:`Clock`, and a seeded run draws from :class:`SeededRandom`.

Pure: a source is handed in (``Host(clock=...)``, a policy's seed); nothing here reads a
global but the system clock it wraps.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from typing import Protocol


class Clock(Protocol):
    """A time source; tests inject a fake one instead of sleeping."""

    def realtime_ns(self) -> int: ...

    def monotonic_ns(self) -> int: ...


class SystemClock:
    def realtime_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


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
