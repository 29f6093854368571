"""The calling thread's stack, checked before a guest runs on it.

Guest code runs on the caller's native stack, and wasmtime stops a runaway recursion only at
``max_wasm_stack``. A thread whose whole stack is smaller than that (``threading.stack_size``
of 256 or 512 KiB) overflows the real stack first, and the process dies of SIGSEGV instead of
the guest trapping with ``stack_overflow``. So each thread's stack size is read once (glibc's
``pthread_getattr_np``) and a call is refused, with a clear error, on a thread too small for
the engine's ``max_wasm_stack`` plus the host's own frames.

wasmtime bounds a Store's wasm stack from where that Store is entered, so a guest that calls a
host function which calls another guest (an embedder function calling an extension, perhaps
its own under ``max_concurrency``) gets a whole ``max_wasm_stack`` again, below the first
one's. Each guest entered on a thread therefore holds its share of the thread's stack until it
leaves (``THREAD_STACK.room``), and an entry the rest cannot hold is refused as
``stack_overflow`` before its guest runs: 24 levels of recursing guests killed the host with
SIGSEGV on an 8 MiB main thread before (red-team 2026-12-01).
"""

from __future__ import annotations

import ctypes
import threading

from ..errors import CallError, ConfigError, FailureClass

KiB = 1024

STACK_MARGIN = 256 * KiB
"""Stack the host needs besides the guest's ``max_wasm_stack``: the Python frames that entered
the guest, wasmtime's trampolines, and a host call made at the guest's deepest point (a ctypes
callback, the interpreter, a broker, the codec). At 512 KiB of guest stack a 768 KiB thread ran
the recursion fixture to ``stack_overflow`` with host calls at full depth; 256 KiB threads
crashed, which is what this check exists to refuse."""

# pthread_attr_t is 56 bytes on 64-bit glibc; room to spare.
_ATTR_BYTES = 128

UNKNOWN = 1 << 62
"""The size assumed where it cannot be read (not glibc): the check then passes, as before."""


def _bind() -> tuple[object, object, object, object] | None:
    try:
        # The process's own symbols, libc's among them: ctypes.util.find_library("c") would
        # run ldconfig in a subprocess, about 30 ms of every start-up.
        libc = ctypes.CDLL(None)
        self_ = libc.pthread_self
        getattr_np = libc.pthread_getattr_np
        getstack = libc.pthread_attr_getstack
        destroy = libc.pthread_attr_destroy
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return None
    self_.restype = ctypes.c_ulong
    self_.argtypes = []
    getattr_np.restype = ctypes.c_int
    getattr_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    getstack.restype = ctypes.c_int
    getstack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    destroy.restype = ctypes.c_int
    destroy.argtypes = [ctypes.c_void_p]
    return self_, getattr_np, getstack, destroy


_PTHREAD = _bind()


def current_stack_size() -> int:
    """The size of the calling thread's stack in bytes (UNKNOWN if it cannot be read)."""
    if _PTHREAD is None:  # pragma: no cover - not glibc
        return UNKNOWN
    self_, getattr_np, getstack, destroy = _PTHREAD
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    if getattr_np(self_(), attr) != 0:  # type: ignore[operator]
        return UNKNOWN  # pragma: no cover
    try:
        addr = ctypes.c_void_p()
        size = ctypes.c_size_t()
        if getstack(attr, ctypes.byref(addr), ctypes.byref(size)) != 0:  # type: ignore[operator]
            return UNKNOWN  # pragma: no cover
        return int(size.value)
    finally:
        destroy(attr)  # type: ignore[operator]


class _ThreadStack(threading.local):
    size = -1  # not read yet on this thread
    # What is left of ``size`` for a guest entered now: the size less ``needed`` for each
    # guest in flight on this thread (nested through host functions); -1 until ``size`` is read.
    room = -1


THREAD_STACK = _ThreadStack()


def check_thread_stack(needed: int) -> int:
    """The stack this thread has left for guests (at least ``needed``), or a refusal to enter
    one: a ``ConfigError`` on a thread whose whole stack is smaller than ``needed``, a
    ``stack_overflow`` CallError where guests nested through host functions already hold too
    much of it. The size is read once per thread (callers test ``THREAD_STACK.room < needed``
    first, inline, and take ``needed`` from ``room`` while their guest runs)."""
    size = THREAD_STACK.size
    if size < 0:
        size = THREAD_STACK.size = current_stack_size()
        THREAD_STACK.room = size
    room = THREAD_STACK.room
    if size < needed:
        raise ConfigError(
            f"the calling thread's stack is {size // KiB} KiB; running a guest needs "
            f"{needed // KiB} KiB (the engine's max_wasm_stack plus {STACK_MARGIN // KiB} KiB "
            f"for the host): call from a thread started after "
            f"threading.stack_size({needed}) or larger"
        )
    if room < needed:
        raise CallError(
            FailureClass.STACK_OVERFLOW,
            f"guests nested through host functions hold {(size - room) // KiB} KiB of this "
            f"thread's {size // KiB} KiB stack; another needs {needed // KiB} KiB",
        )
    return room
