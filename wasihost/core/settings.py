"""Engine settings, validated before any of them reaches the engine.

Some wasmtime settings abort the whole process when out of range (a ``max_wasm_stack`` above
2 MiB is a Rust panic, uncatchable from Python), so every value is checked here, in pure code,
and an out-of-range value is a :class:`~wasihost.core.errors.ConfigError` naming it.
"""

from __future__ import annotations

import hashlib

import attrs

from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# wasmtime's own default; deep enough for Rust guests built with opt-level "s".
DEFAULT_MAX_WASM_STACK = 512 * KiB
# wasmtime panics (process abort) above 2 MiB on its default async stack; stay well under.
MAX_MAX_WASM_STACK = 1 * MiB
# Below this even a small Rust guest's start-up overflows.
MIN_MAX_WASM_STACK = 64 * KiB
# Each linear memory reserves this much address space up front. wasmtime's default (4 GiB)
# makes RLIMIT_AS and many instances per process impossible; 1 GiB is also the largest memory
# a manifest may ask for, so no memory ever has to move.
DEFAULT_MEMORY_RESERVATION = 1 * GiB
MIN_MEMORY_RESERVATION = 64 * KiB
MAX_MEMORY_RESERVATION = 4 * GiB
# With a reservation under 4 GiB, bounds checks are explicit; a small guard is then enough.
DEFAULT_MEMORY_GUARD_SIZE = 64 * KiB
MAX_MEMORY_GUARD_SIZE = 2 * GiB
# Copy-on-write initialisation maps a module's data image into each memory: it splits every
# linear memory into 4 memory maps instead of 2, and vm.max_map_count (65,530 by default) then
# caps a process at ~16,000 instances instead of ~32,000. Our guests' data images are a few KiB
# (fixtures: 3-16 KiB), which copying costs nothing measurable; benchmarks/bench_density.py:
# 2,000 echo extensions, same RSS and load time either way. An embedder running modules with
# large data images may turn it on.
DEFAULT_MEMORY_INIT_COW = False
# The pooling allocator (0: off, the on-demand allocator) reserves this many instance slots up
# front, each of memory_reservation plus its guard. Measured on 2,000 echo extensions: same
# RSS and load time as on-demand, the whole pool's address space taken at start, and the used
# slots' memory maps kept after close; so off by default. The cap bounds its reservation.
DEFAULT_POOLING_INSTANCES = 0
MAX_POOLING_INSTANCES = 100_000
# 10 ms: deadlines are honoured within one tick, and the watchdog wakes 100 times a second.
# benchmarks/bench_tick.py: with a busy Python thread every tick from 1 to 50 ms cost a
# spinning guest 1.0-1.3x, with no trend to buy by ticking less; latency grows with the tick
# and the idle watchdog's CPU with its rate (5% of a CPU at 1 ms, 0.7% at 10 ms).
DEFAULT_EPOCH_TICK_MS = 10
# A call keeps the GIL through its guest crossings when the instance's previous call of that
# command burnt less fuel than this (engine/instance.py, docs/engine.md). 20,000 fuel is about
# 20 µs of guest work here (fixtures/compute: ~1 fuel a ns): below it a release costs about as
# much as the guest's work on one thread, and with two threads each release hands the GIL over
# (a thread wake-up, tens of µs) for less overlap than that costs.
DEFAULT_KEEP_GIL_BELOW_FUEL = 20_000
MAX_KEEP_GIL_BELOW_FUEL = 10_000_000
MIN_EPOCH_TICK_MS = 1
MAX_EPOCH_TICK_MS = 1000

OPT_LEVELS = ("none", "speed", "speed_and_size")

# The compile budget of one module (engine/compiler.py). The biggest honest modules we know
# (a few MB of Rust) compile in a few seconds of CPU and a few hundred MB; the shape limits
# bound the worst admitted module at ~16 MiB of code (docs/engine.md has the measurements).
DEFAULT_COMPILE_CPU_SECONDS = 30
MAX_COMPILE_CPU_SECONDS = 3600
# Wall clock covers the worker's start-up (~0.1-0.2 s) and a loaded machine.
DEFAULT_COMPILE_TIMEOUT_SECONDS = 60
MAX_COMPILE_TIMEOUT_SECONDS = 3600
# RLIMIT_AS of the worker: address space, not RSS. A worker that imported wasmtime and built
# its engine has ~185 MB mapped before it compiles anything (with MALLOC_ARENA_MAX=2), hence
# the floor; ordinary modules peak at ~200-400 MB, the worst admitted shapes measured at
# ~1 GB (docs/engine.md).
DEFAULT_COMPILE_MEMORY_BYTES = 2 * GiB
MIN_COMPILE_MEMORY_BYTES = 256 * MiB
MAX_COMPILE_MEMORY_BYTES = 64 * GiB
# Modules up to this size compile in-process: a worker costs ~0.15 s to start, more than the
# compile of a small module, and the worst admitted shapes of this size compile in-process in
# well under a second and ~100 MB (docs/engine.md). 0 sends every compile to a worker.
DEFAULT_COMPILE_IN_PROCESS_MAX_BYTES = 64 * KiB
MAX_COMPILE_IN_PROCESS_MAX_BYTES = 1 * MiB


def _in_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"engine setting {name}={value!r} outside {low}..{high}")


@attrs.frozen
class EngineSettings:
    """The engine-wide configuration; part of every compiled-module cache key."""

    max_wasm_stack: int = DEFAULT_MAX_WASM_STACK
    memory_reservation: int = DEFAULT_MEMORY_RESERVATION
    memory_guard_size: int = DEFAULT_MEMORY_GUARD_SIZE
    epoch_tick_ms: int = DEFAULT_EPOCH_TICK_MS
    keep_gil_below_fuel: int = DEFAULT_KEEP_GIL_BELOW_FUEL
    memory_init_cow: bool = DEFAULT_MEMORY_INIT_COW
    pooling_instances: int = DEFAULT_POOLING_INSTANCES
    opt_level: str = "speed"
    parallel_compilation: bool = True
    compile_cpu_seconds: int = DEFAULT_COMPILE_CPU_SECONDS
    compile_timeout_seconds: int = DEFAULT_COMPILE_TIMEOUT_SECONDS
    compile_memory_bytes: int = DEFAULT_COMPILE_MEMORY_BYTES
    compile_in_process_max_bytes: int = DEFAULT_COMPILE_IN_PROCESS_MAX_BYTES

    def __attrs_post_init__(self) -> None:
        _in_range("max_wasm_stack", self.max_wasm_stack, MIN_MAX_WASM_STACK, MAX_MAX_WASM_STACK)
        _in_range(
            "memory_reservation",
            self.memory_reservation,
            MIN_MEMORY_RESERVATION,
            MAX_MEMORY_RESERVATION,
        )
        _in_range("memory_guard_size", self.memory_guard_size, 0, MAX_MEMORY_GUARD_SIZE)
        _in_range("epoch_tick_ms", self.epoch_tick_ms, MIN_EPOCH_TICK_MS, MAX_EPOCH_TICK_MS)
        _in_range("keep_gil_below_fuel", self.keep_gil_below_fuel, 0, MAX_KEEP_GIL_BELOW_FUEL)
        _in_range("compile_cpu_seconds", self.compile_cpu_seconds, 1, MAX_COMPILE_CPU_SECONDS)
        _in_range(
            "compile_timeout_seconds",
            self.compile_timeout_seconds,
            1,
            MAX_COMPILE_TIMEOUT_SECONDS,
        )
        _in_range(
            "compile_memory_bytes",
            self.compile_memory_bytes,
            MIN_COMPILE_MEMORY_BYTES,
            MAX_COMPILE_MEMORY_BYTES,
        )
        _in_range(
            "compile_in_process_max_bytes",
            self.compile_in_process_max_bytes,
            0,
            MAX_COMPILE_IN_PROCESS_MAX_BYTES,
        )
        if self.opt_level not in OPT_LEVELS:
            raise ConfigError(f"engine setting opt_level={self.opt_level!r} not in {OPT_LEVELS}")
        if not isinstance(self.parallel_compilation, bool):
            raise ConfigError("engine setting parallel_compilation must be a bool")
        if not isinstance(self.memory_init_cow, bool):
            raise ConfigError("engine setting memory_init_cow must be a bool")
        _in_range("pooling_instances", self.pooling_instances, 0, MAX_POOLING_INSTANCES)

    def fingerprint(self) -> str:
        """What compiled code depends on (the tick and the compile budget do not)."""
        text = (
            f"stack={self.max_wasm_stack};res={self.memory_reservation};"
            f"guard={self.memory_guard_size};opt={self.opt_level};fuel=1;epoch=1;move=0;"
            f"cow={int(self.memory_init_cow)}"
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]
