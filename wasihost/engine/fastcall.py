"""Which call path the engine runs a command on: the compiled one or ctypes.

``wasihost.engine._fastcall`` (``_fastcall.c``, built by ``pip install`` where a C compiler is
there) runs a whole command call (fuel, deadline, ``wasihost_alloc``, the copy in,
``wasihost_call``, the bounds of the answer, the copy out, the fuel left) as one crossing from
Python, where the ctypes path makes five. It calls libwasmtime through addresses this module
takes from the library wasmtime-py loaded, and its declarations of wasmtime's C types are
those of the versions in :data:`DECLARED_FOR`: under any other wasmtime it is not used.

:data:`FAST` is the extension's ``command`` function, bound, or None; :data:`PATH` says which
path is active and :data:`WHY` why (``wasihost doctor`` prints both). ``WASIHOST_FASTCALL=0``
in the environment turns the compiled path off (CI runs the whole suite both ways).
"""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Callable
from typing import Any

from wasmtime import _ffi as ffi

from .lowlevel import WASMTIME_VERSION

ENV = "WASIHOST_FASTCALL"
# The wasmtime-py versions whose libwasmtime C API _fastcall.c's declarations were checked
# against (wasmtime/func.h, store.h, memory.h of the same release).
DECLARED_FOR = frozenset({"50.0.0", "50.0.1"})
COMPILED = "compiled"
CTYPES = "ctypes"

# The libwasmtime functions _fastcall.c calls, in bind()'s order.
_SYMBOLS = (
    "wasmtime_func_call_unchecked",
    "wasmtime_context_set_fuel",
    "wasmtime_context_get_fuel",
    "wasmtime_context_set_epoch_deadline",
    "wasmtime_memory_data",
    "wasmtime_memory_data_size",
    "wasmtime_trap_new",
)


def _load() -> tuple[Any, str, str]:
    """(the bound extension module, or None; the path; why)."""
    if os.environ.get(ENV, "1") == "0":
        return None, CTYPES, f"{ENV}=0 in the environment"
    try:
        # By name: a compiled module has no source for the layer checks to read, and an import
        # statement of it reads, to them, as one of this package's __init__ (a cycle).
        extension = importlib.import_module(f"{__package__}._fastcall")
        bind = extension.bind
    except ImportError as exc:
        return None, CTYPES, f"the C extension is not built ({exc}): install with a C compiler"
    if WASMTIME_VERSION not in DECLARED_FOR:
        return (
            None,
            CTYPES,
            f"wasmtime {WASMTIME_VERSION} is not a version the C extension was declared for "
            f"({', '.join(sorted(DECLARED_FOR))})",
        )
    try:
        addresses = [ctypes.cast(ffi.dll[name], ctypes.c_void_p).value for name in _SYMBOLS]
        bind(*addresses, ctypes.sizeof(ffi.wasmtime_val_raw_t))
    except (AttributeError, ValueError, TypeError) as exc:
        return None, CTYPES, f"the C extension cannot bind libwasmtime ({exc})"
    return extension, COMPILED, f"wasmtime {WASMTIME_VERSION}"


_EXTENSION, PATH, WHY = _load()
FAST: Callable[..., Any] | None = None if _EXTENSION is None else _EXTENSION.command
# The host-call trampolines (docs/engine.md "Host-call trampolines"): the addresses of the two
# C callbacks an import is made with (0 without the extension: the ctypes callback then),
# the C type of a native entry, and whether this thread is inside a host call (None without).
HOST_TRAMPOLINE: int = 0 if _EXTENSION is None else _EXTENSION.HOST_TRAMPOLINE
NATIVE_TRAMPOLINE: int = 0 if _EXTENSION is None else _EXTENSION.NATIVE_TRAMPOLINE
NATIVE_ENTRY: Any = None if _EXTENSION is None else _EXTENSION.NativeEntry
IN_HOST_CALL: Callable[[], bool] | None = (
    None if _EXTENSION is None else _EXTENSION.in_host_call
)
# wait_flag(flag, ns, signal=None): a short wait without the GIL for another thread's hand-over
# (host/acall.py, host/callworkers.py); None without the extension (they then sleep and wake).
WAIT_FLAG: Callable[..., bool] | None = None if _EXTENSION is None else _EXTENSION.wait_flag
# The codes command() answers first (_fastcall.c).
DONE, ENGINE_FAILED, BAD_BLOCK, BAD_RESPONSE = 0, 1, 2, 3
