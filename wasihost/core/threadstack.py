"""The stack of the threads the host starts to run guests on.

A guest runs on the native stack of the thread that enters it, and needs ``max_wasm_stack``
plus the host's margin left below its caller (engine/stack.py), more for guests nested through
host functions. Python starts every new thread with the process-wide ``threading.stack_size``,
which an embedder may have lowered for threads of its own (256 KiB is common): the host's call
threads, warm-spare threads, broker workers and shutdown-hook threads then got that size, and
every guest entered on them was refused with a ``ConfigError`` advising the embedder to raise
a setting that was not its threads' problem (issue 28, second red-team pass on item 21).
So those threads start with ``GUEST_THREAD_STACK``, or the process's setting where larger.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

GUEST_THREAD_STACK = 8 * 1024 * 1024
"""Python's own default thread stack on Linux (the usual ``ulimit -s``): a guest at the
largest ``max_wasm_stack`` (1 MiB) fits many times over, and guests nested through host
functions nest as deep as on the main thread."""

# threading.stack_size is one setting for the whole process: raised and put back under this
# lock, so that two of the host's threads starting at once do not put back each other's value.
# A thread the embedder starts meanwhile gets the larger stack, which costs it only address
# space.
_SETTING = threading.Lock()


@contextlib.contextmanager
def guest_thread_stack() -> Iterator[None]:
    """Around starting a thread that runs guests (``Thread.start``, or an executor's
    ``submit`` that may start one): it gets ``GUEST_THREAD_STACK`` of stack at least, whatever
    ``threading.stack_size`` the process has; the setting is put back after."""
    with _SETTING:
        before = threading.stack_size()
        if before >= GUEST_THREAD_STACK:
            yield
            return
        try:
            threading.stack_size(GUEST_THREAD_STACK)
        except (ValueError, RuntimeError):  # pragma: no cover - a platform that cannot set it
            yield  # its threads get the platform's size; an entry checks what it got
            return
        try:
            yield
        finally:
            threading.stack_size(before)
