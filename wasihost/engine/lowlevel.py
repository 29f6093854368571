"""The private libwasmtime entry points the adapter uses, and trap decoding.

Every private binding of wasmtime-py is taken here: prototypes of our own over ``ffi.dll``
(plain addresses in, plain addresses out) for the hot paths, and a check at import that the
pinned wasmtime has each symbol, failing with a ConfigError that names what is missing.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import wasmtime
from wasmtime import _bindings as raw
from wasmtime import _ffi as ffi

from ..core.errors import CallError, ConfigError, FailureClass

U32 = 0xFFFF_FFFF
U64 = 0xFFFF_FFFF_FFFF_FFFF

# A trap message is for the embedder's eyes; the first lines say what and where.
MAX_TRAP_MESSAGE_CHARS = 400


def installed_version() -> str:
    """The version of the wasmtime-py imported, read from the name of its ``.dist-info``
    directory beside it. ``importlib.metadata`` answers the same, but importing it (and the
    ``email`` package it pulls in) cost about 15 ms of every CLI start; it stays the answer for
    a layout with no single such directory."""
    site = os.path.dirname(os.path.dirname(wasmtime.__file__))
    prefix, suffix = "wasmtime-", ".dist-info"
    try:
        found = [
            name[len(prefix) : -len(suffix)]
            for name in os.listdir(site)
            if name.startswith(prefix) and name.endswith(suffix)
        ]
    except OSError:
        found = []
    if len(found) == 1:
        return found[0]
    import importlib.metadata

    return importlib.metadata.version("wasmtime")


WASMTIME_VERSION = installed_version()
# The private bindings below are those of this major; pyproject.toml pins it too.
WASMTIME_MAJOR = 50


def check_version(version: str) -> None:
    """Refuse any wasmtime-py but the pinned major, by name, before touching its bindings: an
    older or newer one may lack a symbol (an AttributeError deep in an import) or, worse, keep
    a symbol whose signature changed."""
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != WASMTIME_MAJOR:
        raise ConfigError(
            f"wasmtime {version} is installed; wasihost needs wasmtime {WASMTIME_MAJOR}.x "
            f"(pip install 'wasmtime>={WASMTIME_MAJOR},<{WASMTIME_MAJOR + 1}')"
        )


check_version(WASMTIME_VERSION)


# The same library, its functions called with the GIL held: for short calls whose arguments
# must not be freed by another thread mid-call (see NativeCall._refresh).
_GIL_DLL = ctypes.PyDLL(ffi.dll._name, handle=ffi.dll._handle)


def private_fn(name: str, restype: Any, *argtypes: Any, keep_gil: bool = False) -> Any:
    """Our own ctypes prototype for a libwasmtime symbol.

    ``dll[name]`` makes a new function object, so its plain ``c_void_p``/integer signature
    does not disturb wasmtime-py's own typed prototypes. Passing raw addresses skips ctypes'
    per-argument type checks and ``cast`` calls, which dominate a no-op call otherwise.
    ``keep_gil`` makes a call atomic with respect to other Python threads.
    """
    try:
        fn = (_GIL_DLL if keep_gil else ffi.dll)[name]
    except AttributeError:
        raise ConfigError(
            f"wasmtime {WASMTIME_VERSION} lacks {name}; wasihost needs the pinned wasmtime major"
        ) from None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


VP = ctypes.c_void_p

# The process's address space as one byte view, for the argument arrays wasmtime hands to host
# calls: struct reads them in place at the address wasmtime gives, where a ctypes object per
# call would cost about 0.1 µs. It grants nothing ctypes does not (from_address reaches any
# address too); it is only ever indexed at those arrays.
PROCESS_MEMORY = memoryview((ctypes.c_char * (1 << 62)).from_address(0)).cast("B")
call_unchecked = private_fn("wasmtime_func_call_unchecked", VP, VP, VP, VP, ctypes.c_size_t, VP)
# The same call keeping the GIL, for calls known to be short (Instance.call). Only sound with a
# ticker that needs no GIL (ticker.NativeTicker): else nothing could end the call at its
# deadline while it holds the GIL.
call_keeping_gil = private_fn(
    "wasmtime_func_call_unchecked", VP, VP, VP, VP, ctypes.c_size_t, VP, keep_gil=True
)
# With the GIL held: a Store is closed (from Python, holding the GIL) only after its memory's
# NativeCall was unbound, so a bound check followed by one of these calls cannot race a close.
memory_data = private_fn("wasmtime_memory_data", VP, VP, VP, keep_gil=True)
memory_data_size = private_fn("wasmtime_memory_data_size", ctypes.c_size_t, VP, VP, keep_gil=True)
# With the GIL held too: each only reads or writes the Store's fuel counter, and host calls
# settle their fuel debt with them. Releasing the GIL for so short a call costs more than the
# call (about 1 µs each), and hands the GIL to any thread waiting for it in the middle of a
# host call, which on a loaded machine may not give it back for a time slice.
set_fuel = private_fn("wasmtime_context_set_fuel", VP, VP, ctypes.c_uint64, keep_gil=True)
get_fuel = private_fn("wasmtime_context_get_fuel", VP, VP, VP, keep_gil=True)
# Kept too: it stores one integer. Releasing the GIL for it was one of three hand-offs of a
# command call, each a wake-up of another thread waiting for the GIL (see docs/engine.md).
set_epoch_deadline = private_fn(
    "wasmtime_context_set_epoch_deadline", None, VP, ctypes.c_uint64, keep_gil=True
)


def object_arg_fn(name: str, restype: Any, *, keep_gil: bool) -> Any:
    """A prototype with no ``argtypes``, for the per-call path of a command (Instance.call):
    every argument is a ctypes object made once per instance (a pointer or an array for an
    address, a ``c_size_t``/``c_uint64`` for a value), which ctypes passes as it is. With
    ``argtypes`` each argument goes through a converter call, and each integer through
    ``c_void_p``'s table lookup: about 0.8k instructions of a get_fuel's 2.7k. Nothing checks
    the arguments' types here, so only objects of exactly those kinds may be passed (a plain
    Python int would go as a C int). ``restype`` None where the result is never read: a
    simple result type costs another table lookup per call."""
    try:
        fn = (_GIL_DLL if keep_gil else ffi.dll)[name]
    except AttributeError:
        raise ConfigError(
            f"wasmtime {WASMTIME_VERSION} lacks {name}; wasihost needs the pinned wasmtime major"
        ) from None
    fn.restype = restype
    return fn


# The command path's own prototypes of the calls above (see object_arg_fn): the two crossings
# into the guest, and the fuel and deadline around them. set_fuel and get_fuel fail only on an
# engine without fuel, which wasihost never builds, and their result was never read.
command_call = object_arg_fn("wasmtime_func_call_unchecked", VP, keep_gil=False)
command_call_keeping_gil = object_arg_fn("wasmtime_func_call_unchecked", VP, keep_gil=True)
command_set_fuel = object_arg_fn("wasmtime_context_set_fuel", None, keep_gil=True)
command_get_fuel = object_arg_fn("wasmtime_context_get_fuel", None, keep_gil=True)
command_set_epoch_deadline = object_arg_fn(
    "wasmtime_context_set_epoch_deadline", None, keep_gil=True
)
error_new = private_fn("wasmtime_error_new", VP, ctypes.c_char_p)
# A Store on plain addresses (instance._Store): made with no host data and no finalizer, as
# wasmtime-py's Store makes one, its limits set whole, and freed. wasmtime-py's Store wraps each
# in a typed prototype and a Python object per pointer: about 3 µs of every instance.
store_new = private_fn("wasmtime_store_new", VP, VP, VP, VP)
store_context = private_fn("wasmtime_store_context", VP, VP, keep_gil=True)
store_delete = private_fn("wasmtime_store_delete", None, VP)
_I64 = ctypes.c_int64
store_limiter = private_fn("wasmtime_store_limiter", None, VP, _I64, _I64, _I64, _I64, _I64)
# Instantiation and its export look-ups on plain addresses (Instance.instantiate): wasmtime-py's
# typed prototypes convert each pointer argument (about a tenth of a start's engine time went
# to ctypes). instance_new runs the guest's start function, so it releases the GIL; an export
# look-up is a hash-map read, made with the GIL held.
instance_new = private_fn("wasmtime_instance_new", VP, VP, VP, VP, ctypes.c_size_t, VP, VP)
instance_export_get = private_fn(
    "wasmtime_instance_export_get",
    ctypes.c_bool,
    VP,
    VP,
    ctypes.c_char_p,
    ctypes.c_size_t,
    VP,
    keep_gil=True,
)
# wasmtime_error_t* (*)(wasmtime_context_t*, void* env, uint64_t* delta, uint8_t* update_kind)
EPOCH_CALLBACK = ctypes.CFUNCTYPE(
    VP, VP, VP, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint8)
)
# The last argument (a finalizer of env) is always NULL: env is a plain integer key.
store_epoch_deadline_callback = private_fn(
    "wasmtime_store_epoch_deadline_callback", None, VP, EPOCH_CALLBACK, VP, VP
)
UPDATE_DEADLINE_CONTINUE = 0

TRAP_CLASSES = {
    wasmtime.TrapCode.OUT_OF_FUEL: FailureClass.OUT_OF_FUEL,
    wasmtime.TrapCode.INTERRUPT: FailureClass.DEADLINE,
    wasmtime.TrapCode.STACK_OVERFLOW: FailureClass.STACK_OVERFLOW,
    # Rust's panic=abort and most language runtimes' abort() compile to `unreachable`.
    wasmtime.TrapCode.UNREACHABLE: FailureClass.PANIC,
}


# The traps after which the Store's fuel counter tells what the call burnt. Compiled code keeps
# the fuel it burns in a register and writes it back to the Store only before a call, a return
# or `unreachable`, and when it runs out; a trap raised anywhere else unwinds without writing
# it, so wasmtime_context_get_fuel then answers what was left at the last of those points,
# which a loop of no calls never passes. Measured with wasmtime 50 after a loop of 120M fuel:
# unreachable, out of fuel and stack overflow (raised on entering a function, after its
# caller wrote the counter back) reported it; a load or store out of bounds, a division by
# zero or its overflow, a bad float conversion, memory.fill and table.get out of bounds, and
# an error of the epoch callback (a deadline, an interrupt) reported only the 370 burnt before
# the loop. The same with signals_based_traps off: it is the unwinding that loses it, not the
# signal. A trap a host function makes has no code, and comes after the guest's call wrote
# the counter back.
FUEL_KEPT_TRAPS = frozenset(
    {
        wasmtime.TrapCode.OUT_OF_FUEL.value,
        wasmtime.TrapCode.UNREACHABLE.value,
        wasmtime.TrapCode.STACK_OVERFLOW.value,
    }
)
_trap_code = private_fn("wasmtime_trap_code", ctypes.c_bool, VP, VP)


def fuel_kept_by(trap_addr: int) -> bool:
    """Whether the Store's fuel counter is current after the trap at ``trap_addr`` (see
    FUEL_KEPT_TRAPS); the trap stays its owner's."""
    code = ctypes.c_uint8()
    if not _trap_code(trap_addr, ctypes.addressof(code)):
        return True  # made by a host function (new_trap): at a host call, counter written
    return code.value in FUEL_KEPT_TRAPS


def trap_failure(trap_ptr: Any) -> CallError:
    trap = wasmtime.Trap._from_ptr(trap_ptr)
    code = trap.trap_code
    message = short_message(trap.message)
    return CallError(
        TRAP_CLASSES.get(code, FailureClass.TRAP) if code else FailureClass.TRAP, message
    )


def short_message(message: str) -> str:
    """The cause and the innermost wasm frame of an engine message, on one bounded line.

    wasmtime formats traps as "error while executing at wasm backtrace: <frames> Caused by:
    <cause>"; the cause says what, the first frame says where.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    cause = lines[-1]
    if "Caused by:" in lines:
        cause = " ".join(lines[lines.index("Caused by:") + 1 :])
    frame = next((line for line in lines if line[:1].isdigit() and ":" in line), None)
    text = f"{cause} (at {frame.split(':', 1)[1].strip()})" if frame else cause
    return text[:MAX_TRAP_MESSAGE_CHARS]


def new_trap(message: str) -> int:
    data = message.encode()
    trap = raw._wasmtime_trap_new(data, len(data))
    return ctypes.cast(trap, ctypes.c_void_p).value or 0


def check_private_bindings() -> None:
    """Fail at import, by name, if the pinned wasmtime-py lacks a typed binding we use.

    The C symbols behind our own prototypes are checked by :func:`private_fn` as they are
    bound; this covers the wasmtime-py wrappers taken as they are.
    """
    needed = [
        "_wasmtime_instance_new",
        "_wasmtime_instance_export_get",
        "_wasmtime_trap_new",
        "wasmtime_global_get",
        "wasm_trap_delete",
        "wasmtime_error_delete",
    ]
    missing = [name for name in needed if not hasattr(raw, name)]
    if missing:
        raise ConfigError(
            f"wasmtime {WASMTIME_VERSION} lacks {', '.join(missing)}; "
            "wasihost needs the pinned wasmtime major"
        )


check_private_bindings()
