"""What ticks an engine's epoch: a POSIX timer that needs no Python, or a Python thread.

Per-call deadlines are epoch deadlines (see instance.py), so something must increment the
engine's epoch while guest code runs. A Python thread can, but only while it can get the GIL:
it forces every guest call to release the GIL, and a call short enough for the release and
re-acquisition to cost more than the guest's own work (most small calls: docs/engine.md) pays
that hand-off twice, and worse when two threads call at once.

:class:`NativeTicker` asks the C library instead: ``timer_create`` with ``SIGEV_THREAD``
runs a C function on a thread of the C library at each expiry, and that function is
libwasmtime's own ``wasmtime_engine_increment_epoch``, whose one pointer argument is exactly
what the timer hands its function. No Python runs at a tick, so the deadline holds while the
thread running a guest keeps the GIL, which is what lets short calls keep it
(``Instance.call``). Where the C library lacks the call (not Linux), :class:`ThreadTicker`
ticks from Python as before and calls always release the GIL.

Lifetime. A timer's function may already be on its way when ``timer_delete`` returns, so a
stopped ticker keeps its Engine alive for ``RETIRE_GRACE_S`` more (the increment it may still
run must find the engine there), and at interpreter exit every ticker is stopped and its Engine
deliberately never freed. A forked child inherits no timer: each running ticker arms a new one
in the child.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import time
import weakref
from typing import Any, Protocol

import wasmtime
from wasmtime import _ffi as ffi

# An expiry's thread is started by the C library's helper thread as the timer fires; it then
# runs one atomic increment. A second is thousands of times what that takes on a loaded
# machine; the retired engines of a host that closed are freed at the next stop after it.
RETIRE_GRACE_S = 5.0

_SIGEV_THREAD = 2
_CLOCK_MONOTONIC = 1


class _SigVal(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]


class _SigevThread(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("attribute", ctypes.c_void_p)]


class _SigevUnion(ctypes.Union):
    # The kernel's sigevent is 64 bytes: 16 of header, 48 of this union.
    _fields_ = [("pad", ctypes.c_int * 12), ("tid", ctypes.c_int), ("thread", _SigevThread)]


class _SigEvent(ctypes.Structure):
    _fields_ = [
        ("value", _SigVal),
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("un", _SigevUnion),
    ]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


def _timer_calls() -> tuple[Any, Any, Any] | None:
    """``timer_create``, ``timer_settime`` and ``timer_delete`` of the C library, typed; None
    where it has not all three or the layout above is not the platform's."""
    if os.name != "posix" or ctypes.sizeof(_SigEvent) != 64:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime, delete = libc.timer_create, libc.timer_settime, libc.timer_delete
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.POINTER(_SigEvent), ctypes.POINTER(ctypes.c_void_p)]
    create.restype = ctypes.c_int
    settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_ITimerSpec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    delete.argtypes = [ctypes.c_void_p]
    delete.restype = ctypes.c_int
    return create, settime, delete


_TIMER = _timer_calls()
_INCREMENT_EPOCH = ctypes.cast(ffi.dll.wasmtime_engine_increment_epoch, ctypes.c_void_p).value


class Ticker(Protocol):
    gil_free: bool
    """True if ticks need no Python: a guest call may then keep the GIL and still be stopped
    at its deadline."""

    def ensure_running(self) -> None: ...

    def stop(self) -> None: ...


class ThreadTicker:
    """Ticks from a Python thread; guest calls must release the GIL for it to run.

    The thread refers to the wasmtime Engine only, never to the WasmEngine owning it, so a
    dropped WasmEngine is collected and its finalizer stops the thread.
    """

    gil_free = False

    def __init__(self, engine: wasmtime.Engine, tick_ms: int) -> None:
        self._engine = engine
        self._tick = tick_ms / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure_running(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wasihost-epoch", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            self._engine.increment_epoch()

    def stop(self) -> None:
        self._stop.set()


# Every NativeTicker with a live timer (stopped at exit), every NativeTicker (their locks are
# new in a forked child), and engines whose timers were deleted less than RETIRE_GRACE_S ago,
# with when.
_RUNNING: weakref.WeakSet[NativeTicker] = weakref.WeakSet()
_ALL: weakref.WeakSet[NativeTicker] = weakref.WeakSet()
_RETIRED: list[tuple[float, wasmtime.Engine]] = []
_REGISTRY_LOCK = threading.Lock()
# Set once the exit hook ran: an engine stopped after it (by a finalizer) is never freed.
_EXITING: list[bool] = []
# Set in a forked child (see _after_fork_in_child).
_FORKED_CHILD: list[bool] = []
# What a forked child keeps in GIL_WANTED.
FORKED_CHILD_TICKS = "a forked child ticks from Python"

GIL_WANTED: set[object] = set()
"""While not empty, no call keeps the GIL (Instance.call): someone needs it back promptly.
An Instance is in it while its thread runs guest code with the GIL released: once its guest
returns that thread waits for the GIL, which a loop of short calls keeping it would give up
only at the interpreter's switch interval (5 ms) instead of at its next crossing. A forked
child is in it for good (its ticks need the GIL). ``set.add`` and ``discard`` are single
operations under the GIL, safe from every thread."""


class NativeTicker:
    """Ticks with a POSIX timer whose expiry runs ``wasmtime_engine_increment_epoch`` on a C
    library thread: no Python and no GIL at any tick (see the module docstring)."""

    gil_free = True

    def __init__(self, engine: wasmtime.Engine, tick_ms: int) -> None:
        self._engine = engine
        self._tick_ms = tick_ms
        self._timer: int | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._fallback: ThreadTicker | None = None  # ticking in a forked child
        with _REGISTRY_LOCK:
            _ALL.add(self)

    def ensure_running(self) -> None:
        if self._timer is not None or self._fallback is not None:
            return
        with self._lock:
            if self._timer is not None or self._fallback is not None or self._stopped:
                return
            if _FORKED_CHILD:  # made before a fork, first used after it
                self._fallback = ThreadTicker(self._engine, self._tick_ms)
                self._fallback.ensure_running()
                return
            self._timer = self._arm()
            with _REGISTRY_LOCK:
                _RUNNING.add(self)

    def _arm(self) -> int:
        assert _TIMER is not None
        create, settime, delete = _TIMER
        event = _SigEvent()
        event.notify = _SIGEV_THREAD
        event.value.sival_ptr = ctypes.cast(self._engine.ptr(), ctypes.c_void_p).value
        event.un.thread.function = _INCREMENT_EPOCH
        timer = ctypes.c_void_p()
        if create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create for the epoch ticker failed")
        seconds, ms = divmod(self._tick_ms, 1000)
        period = _TimeSpec(seconds, ms * 1_000_000)
        if settime(timer, 0, ctypes.byref(_ITimerSpec(period, period)), None) != 0:
            errno = ctypes.get_errno()
            delete(timer)
            raise OSError(errno, "timer_settime for the epoch ticker failed")
        return timer.value or 0

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._fallback is not None:
                self._fallback.stop()
            timer, self._timer = self._timer, None
            if timer is None:
                return
            assert _TIMER is not None
            _TIMER[2](timer)
            now = time.monotonic()
            with _REGISTRY_LOCK:
                _RUNNING.discard(self)
                # Free the engines retired long enough ago; keep this one for the grace.
                _RETIRED[:] = [(t, e) for t, e in _RETIRED if now - t < RETIRE_GRACE_S]
                _RETIRED.append((now, self._engine))
                if _EXITING:
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._engine))

    def _tick_from_python_in_child(self) -> None:
        """After fork: the child inherits no timer, and must not make one (see
        ``_after_fork_in_child``); if the parent's ran, a Python thread ticks instead, and one
        first used in the child starts one then (``ensure_running``)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        running = self._timer is not None and not self._stopped
        self._timer = None  # the parent's: nothing to delete here, ever
        if running:
            self._fallback = ThreadTicker(self._engine, self._tick_ms)
            self._fallback.ensure_running()


def _stop_all_at_exit() -> None:
    """Delete every timer, and keep every engine they tick (and the retired ones) alive past
    interpreter teardown: an increment already on its way must not meet a freed engine."""
    with _REGISTRY_LOCK:
        _EXITING.append(True)
        running = list(_RUNNING)
    for ticker in running:
        ticker.stop()
    with _REGISTRY_LOCK:
        for _, engine in _RETIRED:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(engine))


def _after_fork_in_child() -> None:
    """A forked child never touches a POSIX timer: the C library's helper thread may have held
    its list lock at the fork (it does at every expiry), and ``timer_create`` or
    ``timer_delete`` in the child would then wait for it forever (seen about once in twenty
    forks under load). Every engine of the child ticks from Python, the running ones at once,
    and since those ticks need the GIL, no call of the child keeps it."""
    global _REGISTRY_LOCK  # noqa: PLW0603
    _REGISTRY_LOCK = threading.Lock()  # another thread may have held it at the fork
    _FORKED_CHILD.append(True)
    GIL_WANTED.add(FORKED_CHILD_TICKS)
    for ticker in list(_ALL):
        _RUNNING.discard(ticker)
        ticker._tick_from_python_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
# Registered at import, so it runs after the engines' own finalizers at exit (atexit is last in,
# first out): what they retire is kept too.
atexit.register(_stop_all_at_exit)


def in_forked_child() -> bool:
    """True in a child forked from a process that imported this module: its ticks need the
    GIL, and what threads of the parent did (wasmtime's compile threads) is not there."""
    return bool(_FORKED_CHILD)


def native_ticks_available() -> bool:
    return _TIMER is not None and _INCREMENT_EPOCH is not None and not _FORKED_CHILD


def make_ticker(engine: wasmtime.Engine, tick_ms: int, *, native: bool = True) -> Ticker:
    """The GIL-free ticker where the platform has one (and ``native``), else the thread."""
    if native and native_ticks_available():
        return NativeTicker(engine, tick_ms)
    return ThreadTicker(engine, tick_ms)
