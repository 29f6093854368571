"""Ctrl-C while a guest runs on the main thread: deferred out of host callbacks, never lost.

Python runs a signal's handler on the main thread at the next bytecode boundary. While a guest
runs, that boundary is the entry of one of our ctypes callbacks (an epoch tick, a host call),
before its ``try``: the default handler's ``KeyboardInterrupt`` would escape the callback, ctypes
would print "Exception ignored" and hand libwasmtime an unset return value, which it reads as
"no trap". The host call is skipped and the guest carries on with a made-up result, or runs on
to its deadline.

So, once, from the main thread, the engine chains its own SIGINT handler in front of the one it
finds. While one of the callbacks libwasmtime calls is on the main thread's stack, the handler
raises nothing: it marks the Instance running that guest, whose callbacks then trap the guest
at once and whose call ends with class ``interrupted``. Anywhere else it hands the signal to the
previous handler, so Ctrl-C outside a guest behaves as it did (``KeyboardInterrupt``).

An embedder that installs its own SIGINT handler afterwards replaces this one; its handler then
runs at callback entry as before (see docs/engine.md).
"""

from __future__ import annotations

import signal
import threading
from types import CodeType, FrameType
from typing import Any, Protocol

# How far up the main thread's stack to look for the callback and the Instance entry point.
# Host callbacks call brokers, which call the codec and the OS: a few dozen frames at most.
MAX_FRAMES_SEARCHED = 200


class Interruptible(Protocol):
    def interrupt_by_signal(self) -> None: ...


CALLBACK_CODES: set[CodeType] = set()
"""Code of every Python function libwasmtime calls directly (epoch tick, host-call dispatch):
an exception escaping one of them would be swallowed by ctypes."""

ENTRY_CODES: dict[CodeType, str] = {}
"""Code of each Instance method that enters the guest, with the name of its ``self`` local."""

_lock = threading.Lock()
# The handler found at install (None: not installed yet; False: nothing to chain to).
_state: dict[str, Any] = {"previous": None}


def install() -> None:
    """Chain the handler in front of the current SIGINT handler; on the main thread, once.

    Nothing is installed if SIGINT is ignored or left to the OS (no Python handler runs then).
    """
    if _state["previous"] is not None or threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if _state["previous"] is not None:
            return
        current = signal.getsignal(signal.SIGINT)
        if current is _on_sigint or not callable(current):
            _state["previous"] = False
            return
        _state["previous"] = current
        signal.signal(signal.SIGINT, _on_sigint)


def installed() -> bool:
    return signal.getsignal(signal.SIGINT) is _on_sigint


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    target = guest_under(frame)
    if target is not None:
        target.interrupt_by_signal()
        return
    previous = _state["previous"]
    if callable(previous):
        previous(signum, frame)
    else:  # pragma: no cover - only if the handler was installed by hand
        raise KeyboardInterrupt


def guest_under(frame: FrameType | None) -> Interruptible | None:
    """The Instance whose guest called the callback on this stack, if a callback is on it."""
    in_callback = False
    for _ in range(MAX_FRAMES_SEARCHED):
        if frame is None:
            break
        code = frame.f_code
        if code in CALLBACK_CODES:
            in_callback = True
        elif in_callback and code in ENTRY_CODES:
            owner = frame.f_locals.get(ENTRY_CODES[code])
            interrupt = getattr(owner, "interrupt_by_signal", None)
            return owner if callable(interrupt) else None
        frame = frame.f_back
    return None
