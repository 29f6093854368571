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
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Protocol

# How far up the main thread's stack to look for the callback and the Instance entry point.
# Host callbacks call brokers, which call the codec and the OS: a few dozen frames at most.
MAX_FRAMES_SEARCHED = 200


class Interruptible(Protocol):
    def interrupt_by_signal(self) -> None: ...

    def stop_by_exception(self, exc: BaseException) -> None: ...


CALLBACK_CODES: set[CodeType] = set()
"""Code of every Python function libwasmtime calls directly (epoch tick, host-call dispatch):
an exception escaping one of them would be swallowed by ctypes."""

ENTRY_CODES: dict[CodeType, str] = {}
"""Code of each Instance method that enters the guest, with the name of its ``self`` local."""

_lock = threading.Lock()
# The handler found at install (None: not installed yet; False: nothing to chain to), and the
# unraisable hook found when ours was chained in front of it.
_state: dict[str, Any] = {"previous": None, "unraisable": None}


def install_unraisable_hook() -> None:
    """Chain a ``sys.unraisablehook`` that notices exceptions escaping our callbacks; once.

    Another exception can still arrive before a callback's ``try``: a RecursionError when the
    embedder calls from near the recursion limit, an exception another signal's handler
    raises, one sent with ``PyThreadState_SetAsyncExc``. ctypes then reports it here, before
    it returns to libwasmtime with an unset value. The hook stops the Instance whose callback
    it was, so the call fails instead of carrying on silently (the callback's own return value
    is beyond reach: see docs/engine.md for what that leaves).
    """
    if _state["unraisable"] is not None:
        return
    with _lock:
        if _state["unraisable"] is None:
            _state["unraisable"] = sys.unraisablehook
            sys.unraisablehook = _on_unraisable


def _on_unraisable(unraisable: Any) -> None:
    try:
        code = getattr(unraisable.object, "__code__", None)
        if code in CALLBACK_CODES and unraisable.exc_value is not None:
            owner = _entry_owner(sys._getframe())
            if owner is not None:
                owner.stop_by_exception(unraisable.exc_value)
    except BaseException:  # noqa: S110 - e.g. no recursion headroom left at all: report as is
        pass
    _state["unraisable"](unraisable)


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
    for _ in range(MAX_FRAMES_SEARCHED):
        if frame is None:
            break
        if frame.f_code in CALLBACK_CODES:
            return _entry_owner(frame)
        frame = frame.f_back
    return None


def _entry_owner(frame: FrameType | None) -> Interruptible | None:
    """The Instance of the nearest guest entry point at or above ``frame``."""
    for _ in range(MAX_FRAMES_SEARCHED):
        if frame is None:
            break
        name = ENTRY_CODES.get(frame.f_code)
        if name is not None:
            owner = frame.f_locals.get(name)
            return owner if callable(getattr(owner, "stop_by_exception", None)) else None
        frame = frame.f_back
    return None
