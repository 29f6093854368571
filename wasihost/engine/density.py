"""What many instances in one process cost: the pooling allocator's configuration, and giving
freed native memory back to the system.

See docs/density.md for the measurements behind each choice.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import cast

import wasmtime
from wasmtime import _bindings as raw

from ..core.limits import MAX_MAX_TABLE_ELEMENTS
from ..core.settings import EngineSettings

# A guest has one memory and one table (StoreLimits in instance.py); the pool's slots need no
# more, and each one more would multiply its reservation.
POOL_MEMORIES_PER_MODULE = 1
POOL_TABLES_PER_MODULE = 1
# Slots kept warm (their maps and pages kept) after their instance is freed: none, so that
# closing an instance gives its memory back, as the on-demand allocator does.
POOL_UNUSED_WARM_SLOTS = 0


def use_pooling_allocator(config: wasmtime.Config, settings: EngineSettings) -> None:
    """Configure ``config`` for wasmtime's pooling allocator: ``settings.pooling_instances``
    slots, each able to hold the largest memory (``memory_reservation``) and table
    (``MAX_MAX_TABLE_ELEMENTS``) any extension may be granted, so that pooling refuses nothing
    the on-demand allocator accepts. wasmtime-py has no public API for it: the C API's
    ``wasmtime_pooling_allocation_*`` functions, through its private bindings."""
    slots = settings.pooling_instances
    pool = raw.wasmtime_pooling_allocation_config_new()
    try:
        raw.wasmtime_pooling_allocation_config_total_core_instances_set(pool, slots)
        raw.wasmtime_pooling_allocation_config_total_memories_set(pool, slots)
        raw.wasmtime_pooling_allocation_config_total_tables_set(pool, slots)
        raw.wasmtime_pooling_allocation_config_total_stacks_set(pool, 0)  # no async stacks
        raw.wasmtime_pooling_allocation_config_max_memories_per_module_set(
            pool, POOL_MEMORIES_PER_MODULE
        )
        raw.wasmtime_pooling_allocation_config_max_tables_per_module_set(
            pool, POOL_TABLES_PER_MODULE
        )
        raw.wasmtime_pooling_allocation_config_max_memory_size_set(
            pool, settings.memory_reservation
        )
        raw.wasmtime_pooling_allocation_config_table_elements_set(pool, MAX_MAX_TABLE_ELEMENTS)
        raw.wasmtime_pooling_allocation_config_max_unused_warm_slots_set(
            pool, POOL_UNUSED_WARM_SLOTS
        )
        raw.wasmtime_pooling_allocation_strategy_set(config.ptr(), pool)
    finally:
        raw.wasmtime_pooling_allocation_config_delete(pool)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once; None on a C library without it."""
    try:
        # The process's own symbols, libc's among them (as stack.py binds its calls):
        # ctypes.util.find_library("c") runs ldconfig in a subprocess, 10-30 ms that every
        # `wasihost run` paid when its host closed.
        found = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:  # pragma: no cover - a platform without dlopen(NULL)
        return None
    if found is None:
        return None
    found.argtypes = [ctypes.c_size_t]
    found.restype = ctypes.c_int
    return cast("Callable[[int], int]", found)


def trim_native_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``); False where
    there is no such call. wasmtime frees a Store's memory into the C heap, which keeps it
    (only its top is returned on its own): after 2,000 extensions close, a third of their RSS.
    It walks the whole heap (~10 ms after 2,000 closes), so callers batch it."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
