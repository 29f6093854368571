"""Signals while a guest runs on the main thread: deferred out of host callbacks, never lost.

Python runs a signal's handler on the main thread at the next bytecode boundary. While a guest
runs, that boundary is the entry of one of our callbacks (an epoch tick, a host call), before
its ``try``: an exception the handler raises (the default SIGINT handler's
``KeyboardInterrupt``, a SIGTERM handler's ``SystemExit``) would escape the callback. Through a
ctypes callback (the epoch tick, and host calls without the C extension) ctypes prints
"Exception ignored" and hands libwasmtime an unset return value, which it reads as "no trap"
(the host call is skipped, the guest carries on with a made-up result, or runs on to its
deadline) or as a pointer to free (the process aborts); the C trampolines of ``_fastcall.c``
answer a trap instead, but the guest's call must still end for the right reason.

So the engine wraps, from the main thread, every Python-level signal handler it finds. While
one of the callbacks libwasmtime calls is on the main thread's stack, the wrapper raises
nothing. Ctrl-C under Python's default handler marks the Instance running that guest, whose
callbacks then trap the guest at once, and the call ends with class ``interrupted``. Any other
handler is queued on that Instance and runs as the call returns, where what it raises is safe
(the guest is not stopped for it: a SIGCHLD handler must not end calls; the call's deadline
bounds the wait). Anywhere else the wrapper calls the handler at once, as before (Ctrl-C
outside a guest is the usual ``KeyboardInterrupt``).

Handlers are wrapped at the first instantiation on the main thread, and SIGINT, SIGTERM and
a few other common ones again at each later one; a handler installed in between for another
signal is not wrapped, and what it raises at a callback's entry is left to the unraisable hook
below (see docs/engine.md).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Protocol

from .fastcall import IN_HOST_CALL, NATIVE_ENTRY

# How far up the main thread's stack to look for the callback and the Instance entry point.
# Host callbacks call brokers, which call the codec and the OS: a few dozen frames at most.
MAX_FRAMES_SEARCHED = 200


Handler = Callable[[int, FrameType | None], Any]


class Interruptible(Protocol):
    def interrupt_by_signal(self) -> None: ...

    def defer_signal(self, handler: Handler, signum: int) -> None: ...

    def stop_by_exception(self, exc: BaseException) -> None: ...


CALLBACK_CODES: set[CodeType] = set()
"""Code of every Python function libwasmtime calls directly (epoch tick, host-call dispatch):
an exception escaping one of them would be swallowed by ctypes."""

ENTRY_CODES: dict[CodeType, str] = {}
"""Code of each Instance method that enters the guest, with the name of its ``self`` local."""

# Signals whose handlers are re-checked (and wrapped if new) at every instantiation on the main
# thread; all signals are scanned once, at the first. Read with the C-level getsignal, which
# skips signal.getsignal's enum conversion (about 2 µs a signal, most of an instantiation's
# re-check).
RECHECKED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)

_getsignal: Callable[[int], Any] = getattr(signal, "_signal").getsignal  # noqa: B009

_lock = threading.Lock()
# Whether all signals were scanned yet, and the unraisable hook found when ours was chained in
# front of it.
_state: dict[str, Any] = {"scanned": False, "unraisable": None}
_WRAPPED = "_wasihost_defers"


def install_unraisable_hook() -> None:
    """Chain a ``sys.unraisablehook`` that notices exceptions escaping our callbacks; once.

    Signal handlers are deferred (above), but an exception can still arrive before a
    callback's ``try``: from a handler installed after the engine wrapped them, a RecursionError
    when the embedder calls from near the recursion limit, one sent with
    ``PyThreadState_SetAsyncExc``. ctypes reports it here, before it returns to libwasmtime
    with an unset value. The hook stops the Instance whose callback it was, so the call fails
    instead of carrying on silently; the callback's own return value is beyond reach, and may
    crash the process (see docs/engine.md).
    """
    if _state["unraisable"] is not None:
        return
    with _lock:
        if _state["unraisable"] is None:
            _state["unraisable"] = sys.unraisablehook
            sys.unraisablehook = _on_unraisable


def _on_unraisable(unraisable: Any) -> None:
    try:
        culprit = unraisable.object
        code = getattr(culprit, "__code__", None)
        ours = code in CALLBACK_CODES or (
            NATIVE_ENTRY is not None and type(culprit) is NATIVE_ENTRY
        )
        if ours and unraisable.exc_value is not None:
            owner = _entry_owner(sys._getframe())
            if owner is not None:
                owner.stop_by_exception(unraisable.exc_value)
    except BaseException:  # noqa: S110 - e.g. no recursion headroom left at all: report as is
        pass
    _state["unraisable"](unraisable)


def install() -> None:
    """Wrap the Python-level signal handlers (see the module docstring); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        signals = RECHECKED_SIGNALS if _state["scanned"] else tuple(signal.valid_signals())
        _state["scanned"] = True
        for signum in signals:
            current = _getsignal(signum)
            if callable(current) and not getattr(current, _WRAPPED, False):
                with contextlib.suppress(OSError, ValueError):  # not settable: leave it
                    signal.signal(signum, _deferring(current))


def installed(signum: int = signal.SIGINT) -> bool:
    return bool(getattr(signal.getsignal(signum), _WRAPPED, False))


def _deferring(handler: Handler) -> Handler:
    def deferring(signum: int, frame: FrameType | None) -> Any:
        target = guest_under(frame)
        if target is None:
            return handler(signum, frame)
        if signum == signal.SIGINT and handler is signal.default_int_handler:
            target.interrupt_by_signal()
        else:
            target.defer_signal(handler, signum)
        return None

    setattr(deferring, _WRAPPED, True)
    return deferring


def guest_under(frame: FrameType | None) -> Interruptible | None:
    """The Instance whose guest called the callback on this stack, if a callback is on it."""
    if IN_HOST_CALL is not None and IN_HOST_CALL():
        # A native entry's handler runs with no frame of the engine's above it (the C
        # trampoline called it): the thread's host-call depth says a guest is under it.
        return _entry_owner(frame)
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
