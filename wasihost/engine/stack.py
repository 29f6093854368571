"""The calling thread's stack, checked where a guest is about to be entered.

Guest code runs on the caller's native stack, and wasmtime stops a runaway recursion only at
``max_wasm_stack`` below the point where the guest was entered. If less than that (plus the
host's own frames, ``STACK_MARGIN``) is left of the thread's stack at that point, the real stack
overflows first and the process dies of SIGSEGV instead of the guest trapping with
``stack_overflow``. So before each entry the stack pointer is compared with the lowest address
of the thread's stack (glibc's ``getcontext`` and ``pthread_getattr_np``), and an entry with
too little left below it is refused, before its guest runs:

- a thread whose whole stack is smaller than the need can never run a guest: ``ConfigError``,
  naming the ``threading.stack_size`` to use;
- a stack pointer outside the thread's stack (a coroutine library's own stack) is refused
  with ``ConfigError``: what is left of such a stack cannot be read;
- a caller already deep in its stack fails the call with ``stack_overflow``. Its frames may be
  Python's own (450 C-level Python frames on a 768 KiB thread were SIGSEGV before, red-team
  issue 28) or guests nested through host functions: an embedder function that calls an
  extension enters the next guest below the first one's deepest frame, where wasmtime grants a
  whole ``max_wasm_stack`` again (24 levels of recursing guests killed the host with SIGSEGV on
  an 8 MiB main thread, red-team 2026-12-01).

The bounds are read once per thread; the stack pointer at every entry (one ``getcontext``, a
few tenths of a microsecond: it saves the signal mask with a system call).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

from ..core.errors import CallError, ConfigError, FailureClass

KiB = 1024

STACK_MARGIN = 256 * KiB
"""Stack the host needs below the point of entry besides the guest's ``max_wasm_stack``:
ctypes' and wasmtime's trampolines, and a host call made at the guest's deepest point (a ctypes
callback, the interpreter, a broker, the codec). At 512 KiB of guest stack a 768 KiB thread ran
the recursion fixture to ``stack_overflow`` with host calls at full depth; 256 KiB threads
crashed."""

ENTRY_HEADROOM = 64 * KiB
"""What a thread's own frames above a guest's entry take, rounded up, for the size the
``ConfigError`` advises: the thread's start, its TLS and a caller calling an extension
directly took 7 KiB."""

# pthread_attr_t is 56 bytes on 64-bit glibc; room to spare.
_ATTR_BYTES = 128

# Where glibc's getcontext stores the stack pointer in a ucontext_t, by machine: x86_64 keeps
# it in uc_mcontext.gregs[REG_RSP] (40 + 15 * 8), aarch64 in uc_mcontext.sp (after uc_sigmask,
# 16-aligned: 176 + 8 + 31 * 8). The buffer is larger than either ucontext_t (968 and 4,560
# bytes).
_SP_OFFSETS = {"x86_64": 160, "aarch64": 432}
_CONTEXT_WORDS = 1024

UNKNOWN = 1 << 62
"""The size assumed where the stack's bounds cannot be read (not glibc): the check then
passes."""


def _bind_bounds() -> tuple[Any, Any, Any, Any] | None:
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


_PTHREAD = _bind_bounds()


def current_stack_bounds() -> tuple[int, int]:
    """The lowest usable address of the calling thread's stack and its size in bytes (0 and
    UNKNOWN where they cannot be read)."""
    if _PTHREAD is None:  # pragma: no cover - not glibc
        return 0, UNKNOWN
    self_, getattr_np, getstack, destroy = _PTHREAD
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    if getattr_np(self_(), attr) != 0:
        return 0, UNKNOWN  # pragma: no cover
    try:
        addr = ctypes.c_void_p()
        size = ctypes.c_size_t()
        if getstack(attr, ctypes.byref(addr), ctypes.byref(size)) != 0:
            return 0, UNKNOWN  # pragma: no cover
        return int(addr.value or 0), int(size.value)
    finally:
        destroy(attr)


def _leave_as_it_is(context: Any) -> None:
    """Where the stack pointer cannot be read: the word keeps the top of the stack, so the
    whole stack is compared, as before the pointer was read."""


def _bind_context() -> tuple[Callable[[Any], None], int] | None:
    """glibc's ``getcontext`` with the GIL held (0.4 to 1 µs here, and releasing
    the GIL would hand it to another thread), and the word of its buffer that holds the stack
    pointer; None where either is unknown or the pointer read is not inside the stack."""
    if _PTHREAD is None:
        return None  # pragma: no cover - not glibc
    offset = _SP_OFFSETS.get(os.uname().machine)
    if offset is None:
        return None  # pragma: no cover - another machine
    try:
        getcontext = ctypes.PyDLL(None).getcontext
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return None
    # No argtypes, no result: the buffer is passed as it is, the result never read (it fails
    # only on a bad signal mask, which it only reads).
    getcontext.restype = None
    word = offset // 8
    context = (ctypes.c_uint64 * _CONTEXT_WORDS)()
    getcontext(context)
    low, size = current_stack_bounds()
    if not low < context[word] <= low + size:
        return None  # pragma: no cover - a ucontext_t laid out otherwise
    return getcontext, word


_CONTEXT = _bind_context()
GET_CONTEXT: Callable[[Any], None] = _CONTEXT[0] if _CONTEXT else _leave_as_it_is
"""Fills a thread's context buffer (``THREAD_STACK.context``) with its registers."""
SP_WORD = _CONTEXT[1] if _CONTEXT else 0
"""The word of the context buffer that holds the stack pointer after ``GET_CONTEXT``."""


class _ThreadStack(threading.local):
    # This thread's getcontext buffer; None until the thread's stack bounds are read.
    context: Any = None
    low = 0  # the lowest usable address of this thread's stack
    size = -1  # its size in bytes


THREAD_STACK = _ThreadStack()


def read_thread_stack(needed: int) -> Any:
    """Read the calling thread's stack bounds (once per thread, at its first guest entry) and
    return its context buffer; a ``ConfigError`` on a thread whose whole stack is smaller than
    ``needed``, which no guest can ever be entered on."""
    stack = THREAD_STACK
    low, size = current_stack_bounds()
    if size < needed:
        raise ConfigError(
            f"the calling thread's stack is {size // KiB} KiB; running a guest needs "
            f"{needed // KiB} KiB below its caller's frames (the engine's max_wasm_stack plus "
            f"{STACK_MARGIN // KiB} KiB for the host): call from a thread started after "
            f"threading.stack_size({needed + ENTRY_HEADROOM}) or larger"
        )
    context = (ctypes.c_uint64 * _CONTEXT_WORDS)()
    # The top of the stack, which the word keeps where GET_CONTEXT cannot read the pointer.
    context[SP_WORD] = low + size if size != UNKNOWN else UNKNOWN
    stack.low, stack.size, stack.context = low, size, context
    return context


def refuse_entry(needed: int, left: int) -> CallError | ConfigError:
    """The ``stack_overflow`` of an entry with only ``left`` bytes of stack below it; the
    ``ConfigError`` of one whose stack pointer is not on the thread's stack at all."""
    size = THREAD_STACK.size
    if not 0 <= left <= size:
        # A stack of the caller's making (a coroutine library's makecontext/swapcontext, a
        # C extension's): its bounds cannot be read, so what is left of it is unknown. Above
        # the thread's stack it passed the check as if larger than the whole stack, and on a
        # 192 KiB one the guest's recursion killed the process with SIGSEGV (issue 28,
        # second red-team pass on item 21).
        return ConfigError(
            "the guest would be entered on a stack that is not the calling thread's own (a "
            "coroutine's, made by makecontext or a C extension): how much of it is left "
            "cannot be known, and a guest may overflow it; call from the thread's own stack "
            "(a plain thread, or asyncio with acall)"
        )
    # A thread this caller's frames would leave enough on, rounded up to 64 KiB.
    enough = -(-(size + needed - left) // (64 * KiB)) * 64 * KiB
    refusal = CallError(
        FailureClass.STACK_OVERFLOW,
        f"{left // KiB} KiB of this thread's {size // KiB} KiB stack are left where the guest "
        f"would be entered, and it needs {needed // KiB} KiB: the caller's frames (deep "
        f"recursion, or guests nested through host functions) hold the rest; call from a "
        f"shallower point, or from a thread started after threading.stack_size({enough})",
    )
    # The caller's depth, not the guest's doing: no fuel burnt, nothing of the guest's harmed.
    refusal.before_entry = True
    return refusal


def check_stack_here(needed: int) -> None:
    """Refuse to enter a guest with fewer than ``needed`` bytes of stack below the caller:
    ``ConfigError`` on a thread too small for any guest, ``stack_overflow`` where the caller's
    frames leave too little. Call it from the frame that enters the guest (Python-to-Python
    calls take no native stack, so the pointer read here is the caller's)."""
    context = THREAD_STACK.context
    if context is None:
        context = read_thread_stack(needed)
    GET_CONTEXT(context)
    left = context[SP_WORD] - THREAD_STACK.low
    if left < needed or left > THREAD_STACK.size:
        raise refuse_entry(needed, left)
