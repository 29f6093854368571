"""The engine adapter: the only module of wasihost that imports ``wasmtime``.

It owns everything that touches native handles: the shared Engine and its epoch watchdog, the
compiled-module cache, Stores with their limits, linking admitted imports to host functions,
the fast call path, and the mapping of every engine failure to a :class:`FailureClass`.

Two wasmtime-py behaviours shape it (see DESIGN.md): the generic ``Func.__call__`` converts
every value on every call (tens of µs), and its host-call trampoline keeps the last exception
in a module global shared by all threads. So calls go through ``wasmtime_func_call_unchecked``
on arrays built once per instance, and host functions through our own unchecked callbacks
whose failures land in a slot owned by the instance (used by one thread at a time, under the
instance lock). Every private binding used is imported here and nowhere else.
"""

from __future__ import annotations

from .cache import ModuleCache
from .hostcalls import BoundImport
from .instance import Budget, CallResult, CompiledModule, Instance, StoreLimits
from .native import NativeCall
from .wasm_engine import WasmEngine

__all__ = [
    "BoundImport",
    "Budget",
    "CallResult",
    "CompiledModule",
    "Instance",
    "ModuleCache",
    "NativeCall",
    "StoreLimits",
    "WasmEngine",
]
