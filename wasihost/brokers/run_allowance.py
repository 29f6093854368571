"""A background job run's own network allowance (``[jobs] max_network_bytes``).

The jobs broker runs a job's command on one of its threads, and every host call that command
makes runs on that same thread: so the allowance of the run in progress is kept per thread,
and the http broker finds it there. It is keyed by the extension too, so that a command of
another extension called from inside the run (an embedder's host function may do that) is not
charged to it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NetworkAllowance:
    """Bytes a run may still send and receive, over all its http requests.

    Every byte is taken from it before it moves: a request's bytes whole before it is sent
    (:meth:`reserve`), a response's as each read from the socket asks for them (:meth:`take`,
    the read never given more room than is left). So a run never reads past its allowance,
    whatever the server sends, and two exchanges of one run (one the guest gave up on, still
    ending, and the next) cannot both spend what is left."""

    __slots__ = ("_lock", "extension", "left")

    def __init__(self, extension: str, limit: int) -> None:
        self.extension = extension
        self.left = limit
        # Received bytes are taken on the http broker's exchange thread while the run's
        # thread waits: one lock keeps the count exact either way.
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes whole if they are left (True), or nothing (False)."""
        with self._lock:
            if n > self.left:
                return False
            self.left -= n
            return True

    def take(self, n: int) -> tuple[int, int]:
        """Take up to ``n`` bytes: as many as are left, at most ``n`` (0: none left); with a
        token (always 0) as the http broker's other read budgets give one."""
        with self._lock:
            granted = min(n, self.left)
            self.left -= granted
            return granted, 0

    def refund(self, n: int, token: int = 0) -> None:
        """Give back bytes taken that did not move (a refused request, a short read)."""
        with self._lock:
            self.left += n


class _Current(threading.local):
    def __init__(self) -> None:
        self.allowance: NetworkAllowance | None = None


_CURRENT = _Current()


def current(extension: str) -> NetworkAllowance | None:
    """The allowance of ``extension``'s job run in progress on this thread, if any."""
    allowance = _CURRENT.allowance
    if allowance is not None and allowance.extension == extension:
        return allowance
    return None


@contextmanager
def running(allowance: NetworkAllowance | None) -> Iterator[None]:
    """``allowance`` is the current one on this thread for the ``with`` block (None: none)."""
    outer = _CURRENT.allowance
    _CURRENT.allowance = allowance
    try:
        yield
    finally:
        _CURRENT.allowance = outer
