"""Default resource limits of an extension and the range a manifest may move each one within.

Pure constants (and the resource governor's enums, at the end): the manifest parser, the policy
and the engine all read them from here, so one number is never spelled twice. Each
``DEFAULT_*`` is what an extension gets when its manifest is silent; ``MIN_*``/``MAX_*`` bound
what a manifest may ask for.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from typing import Final, NamedTuple

from .errors import ConfigError

# Instructions a call may burn. Shopify Functions allow 11M instructions per run: 10M is the same
# order and a round number.
DEFAULT_FUEL_PER_CALL: Final = 10_000_000
# Zero fuel could not even enter the guest.
MIN_FUEL_PER_CALL: Final = 1
# About ten seconds of simple wasm at full speed (a tight loop burns 0.7-1.2e10 fuel a second
# on the 2-core machine, docs/budgets.md): longer work belongs behind a deadline, not more fuel.
# At 1e10 a call ran out of fuel in 1.4 s, before a deadline of a few seconds could end it.
MAX_FUEL_PER_CALL: Final = 100_000_000_000

# 16 MiB of linear memory: Shopify allows 10 MB, and wasm grows in 64 KiB pages.
DEFAULT_MAX_MEMORY_BYTES: Final = 16 * 1024 * 1024
# One wasm page: a module that declares a memory needs at least that.
MIN_MAX_MEMORY_BYTES: Final = 64 * 1024
# 1 GiB caps the host's resident memory per instance well below wasm32's 4 GiB address space.
MAX_MAX_MEMORY_BYTES: Final = 1024 * 1024 * 1024
# A plain WASI command (a whole program, not a plugin answering calls) may grow its memory to
# the most any extension may have: 1 GiB. Command-line programs size their memory by their
# input (a JSON formatter holds the document several times over, SQLite its page cache), and the
# extension default of 16 MiB made malloc return NULL for a 1.4 MB document. wasmtime's CLI
# allows all of wasm32's 4 GiB; 1 GiB is what the host reserves for every memory
# (settings.DEFAULT_MEMORY_RESERVATION, which memories never move past), so it is the most a
# memory here can reach without changing the engine's settings, and it still bounds what one
# runaway program takes of the host. ``WasiOptions.max_memory_bytes`` (``--max-memory``) and
# policy ceilings lower it.
DEFAULT_COMMAND_MAX_MEMORY_BYTES: Final = MAX_MAX_MEMORY_BYTES

# One second of wall clock per call: interactive callers wait on it.
DEFAULT_TIMEOUT_MS: Final = 1000
# The deadline is checked per epoch tick, so anything below 1 ms cannot be honoured anyway.
MIN_TIMEOUT_MS: Final = 1
# Ten minutes: longer work is a batch job, not an extension call.
MAX_TIMEOUT_MS: Final = 600_000

# What `wasihost wasi` gives a program run from the command line when no flag says otherwise:
# the most a run may have. A program's work follows its input, and the extension defaults (10M
# fuel, one second, sized for a plugin answering calls) ended a program printing 300,000 lines
# out of fuel in half a second. The fuel still bounds its CPU (seconds for ordinary code; a bare
# branch loop, which burns about 1e9 fuel a CPU second, ran 94 s) and the deadline, ten minutes,
# bounds the run whatever it does; a user who started it can stop it.
# An embedder running a command through the library chooses its own (``Host.admit(fuel=,
# timeout_ms=)``): a program run inside an application is that application's call.
DEFAULT_COMMAND_LINE_FUEL: Final = MAX_FUEL_PER_CALL
DEFAULT_COMMAND_LINE_TIMEOUT_MS: Final = MAX_TIMEOUT_MS

# 128 KiB of command input, Shopify Functions' input limit.
DEFAULT_MAX_INPUT_BYTES: Final = 128 * 1024
# A CBOR item is at least one byte.
MIN_MAX_INPUT_BYTES: Final = 1
# 16 MiB: input is copied into guest memory per call, so it must fit with room to spare.
MAX_MAX_INPUT_BYTES: Final = 16 * 1024 * 1024

# 64 KiB of command output: answers are meant to be small, and the host copies them out.
DEFAULT_MAX_OUTPUT_BYTES: Final = 64 * 1024
# A CBOR item is at least one byte.
MIN_MAX_OUTPUT_BYTES: Final = 1
# 16 MiB, the same bound as input: the host holds the copy in its own memory.
MAX_MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024

# The price of the host's copies of a command's payload: fuel per byte of the input written
# into guest memory, and again per byte of the output read back. One, as a guest pays for its
# own copy (wasmtime charges memory.copy a fuel a byte) and as every host function's bytes cost
# (registry.MIN_FUEL_PER_BYTE): a 1 MiB echo then costs about 4.2M of the default 10M (1M in,
# 1M out, and the guest's own two copies), where its CBOR form burnt 15M.
COMMAND_FUEL_PER_BYTE: Final = 1

# 64 KiB of log ring per extension: enough for diagnostics, too little to exhaust the host.
DEFAULT_MAX_LOG_BYTES: Final = 64 * 1024
# Zero turns logging off (records are dropped with QUOTA_EXCEEDED).
MIN_MAX_LOG_BYTES: Final = 0
# 16 MiB: the ring lives in host memory for the extension's whole lifetime.
MAX_MAX_LOG_BYTES: Final = 16 * 1024 * 1024

# 10,000 table elements covers the indirect-call tables of ordinary Rust and C guests.
DEFAULT_MAX_TABLE_ELEMENTS: Final = 10_000
# Zero: a guest without indirect calls needs no table.
MIN_MAX_TABLE_ELEMENTS: Final = 0
# One million elements is several MiB of host memory per instance; more is an attack, not code.
MAX_MAX_TABLE_ELEMENTS: Final = 1_000_000

# 1 MiB of key-value storage (keys plus values) per extension namespace: settings, caches and
# small documents of a plugin, and a thousand extensions' quotas still fit in a GiB of disk.
# SQLite's own overhead comes on top, per key (docs/storage.md): up to about 3 MiB a namespace
# of the default 10,000 small keys under long ids (measured 2.8 MiB for 80 KB counted).
DEFAULT_STORAGE_MAX_BYTES: Final = 1024 * 1024
# Zero: the extension may read an (empty) store but never write one.
MIN_STORAGE_MAX_BYTES: Final = 0
# 1 GiB: one SQLite file serves every extension of a host; more belongs in the application's
# own database.
MAX_STORAGE_MAX_BYTES: Final = 1024 * 1024 * 1024

# 10,000 keys per namespace: one full listing is 100 pages of the ABI's 100-key limit.
DEFAULT_STORAGE_MAX_OBJECTS: Final = 10_000
# Zero: no key may be written.
MIN_STORAGE_MAX_OBJECTS: Final = 0
# One million keys: each costs an index entry of up to 256 bytes in the host's database.
MAX_STORAGE_MAX_OBJECTS: Final = 1_000_000
# One instance per extension: calls on it are serialised, as they always were, and an
# extension costs one Store (1 GiB of address space, a few memory maps) unless it asks for more.
DEFAULT_MAX_CONCURRENCY: Final = 1
# At least one call must be able to run.
MIN_MAX_CONCURRENCY: Final = 1
# Each concurrent call holds its own instance (its own linear memory, up to max_memory_bytes,
# and its own 1 GiB reservation); 64 is far more parallelism than a host has cores, and keeps
# one extension from reserving more than 64 GiB of address space or 64 x its memory.
MAX_MAX_CONCURRENCY: Final = 64
# Fuel an extension may burn within a sliding minute, all its calls together (the resource
# governor, wasihost/core/budgets.py): about six seconds of one core a minute, as simple wasm runs
# at roughly 1e10 fuel a second here (docs/budgets.md). An extension that keeps a core busy
# meets it within seconds; one doing interactive work never does.
DEFAULT_CPU_FUEL_PER_MINUTE: Final = 60_000_000_000
# One fuel: zero would refuse an extension everything, which is revocation's job.
MIN_CPU_FUEL_PER_MINUTE: Final = 1
# 64 cores for the whole minute (MAX_MAX_CONCURRENCY instances at full speed): more is not a
# budget.
MAX_CPU_FUEL_PER_MINUTE: Final = 64 * DEFAULT_CPU_FUEL_PER_MINUTE


class ResourceBound(NamedTuple):
    """The default and the inclusive range of one ``[resources]`` field.

    A named tuple, not an ``attrs`` class: this module is on every start-up path, and a
    read-only triple of ints does not need the ~0.5 ms of generated code (issue 12 section 4)."""

    minimum: int
    default: int
    maximum: int


# Keyed by the manifest field name, in the order the manifest documents them; read-only, since
# every module shares this one table.
RESOURCE_BOUNDS: Final[Mapping[str, ResourceBound]] = types.MappingProxyType(
    {
        "fuel_per_call": ResourceBound(MIN_FUEL_PER_CALL, DEFAULT_FUEL_PER_CALL, MAX_FUEL_PER_CALL),
        "max_memory_bytes": ResourceBound(
            MIN_MAX_MEMORY_BYTES, DEFAULT_MAX_MEMORY_BYTES, MAX_MAX_MEMORY_BYTES
        ),
        "timeout_ms": ResourceBound(MIN_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS),
        "max_input_bytes": ResourceBound(
            MIN_MAX_INPUT_BYTES, DEFAULT_MAX_INPUT_BYTES, MAX_MAX_INPUT_BYTES
        ),
        "max_output_bytes": ResourceBound(
            MIN_MAX_OUTPUT_BYTES, DEFAULT_MAX_OUTPUT_BYTES, MAX_MAX_OUTPUT_BYTES
        ),
        "max_log_bytes": ResourceBound(MIN_MAX_LOG_BYTES, DEFAULT_MAX_LOG_BYTES, MAX_MAX_LOG_BYTES),
        "max_table_elements": ResourceBound(
            MIN_MAX_TABLE_ELEMENTS, DEFAULT_MAX_TABLE_ELEMENTS, MAX_MAX_TABLE_ELEMENTS
        ),
        "storage_max_bytes": ResourceBound(
            MIN_STORAGE_MAX_BYTES, DEFAULT_STORAGE_MAX_BYTES, MAX_STORAGE_MAX_BYTES
        ),
        "storage_max_objects": ResourceBound(
            MIN_STORAGE_MAX_OBJECTS, DEFAULT_STORAGE_MAX_OBJECTS, MAX_STORAGE_MAX_OBJECTS
        ),
        "max_concurrency": ResourceBound(
            MIN_MAX_CONCURRENCY, DEFAULT_MAX_CONCURRENCY, MAX_MAX_CONCURRENCY
        ),
        # budgets: the rate the resource governor accounts (docs/budgets.md).
        "cpu_fuel_per_minute": ResourceBound(
            MIN_CPU_FUEL_PER_MINUTE, DEFAULT_CPU_FUEL_PER_MINUTE, MAX_CPU_FUEL_PER_MINUTE
        ),
    }
)


def lowered(name: str, value: int | None, ceiling: int, key: str) -> int:
    """A per-call budget (``fuel`` or ``timeout_ms`` of one call): ``ceiling``, what the
    extension was admitted with (its ``key``), unless the caller lowered it to ``value``;
    a ``ConfigError`` for anything but an int in 1..ceiling."""
    if value is None:
        return ceiling
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
        raise ConfigError(
            f"{name}={value!r}: a per-call {name} must be an int in 1..{ceiling}, this "
            f"extension's {key} (raise it in the manifest, Host.load({name}=...) or the policy)"
        )
    return value


# Open handles of one extension in the files broker (temporary files included): each is a host
# file descriptor, and the host process has about a thousand of those for every extension it
# runs. Here, not in brokers/files.py, so that the budgets read it without importing the broker.
MAX_OPEN_FILES: Final = 16

# What a subscription's queue does when full, unless the manifest's [events] says otherwise
# (manifest.OVERFLOW_POLICIES lists the choices; docs/events.md defines each).
DEFAULT_OVERFLOW: Final = "drop"
# Events queued per subscription before its overflow policy applies: enough to ride out a
# burst, small enough that a stalled consumer holds little (the broker also caps the bytes).
DEFAULT_QUEUE_DEPTH: Final = 64

# Restart budgets an operator can mean (a BoundedRetry restart policy, the supervisor's): up to
# a thousand restarts over up to a day.
MAX_RESTARTS: Final = 1000
MAX_WINDOW_S: Final = 86_400.0


# The resource governor's vocabulary (wasihost.core.budgets accounts the budgets, and
# re-exports these): here, so that the record of a crossing (core.budget_crossing), which the
# budgets make, names them without importing the budgets.
class Resource(enum.Enum):
    """What a budget bounds; the values are the names the snapshot and the journal use."""

    FUEL_PER_CALL = "fuel_per_call"
    CPU_FUEL_PER_MINUTE = "cpu_fuel_per_minute"
    MEMORY_BYTES = "memory_bytes"
    STORAGE_BYTES = "storage_bytes"
    NETWORK_BYTES_PER_HOUR = "network_bytes_per_hour"
    OPEN_HANDLES = "open_handles"
    BACKGROUND_JOBS = "background_jobs"
    EVENT_QUEUE_DEPTH = "event_queue_depth"
    CONCURRENT_CALLS = "concurrent_calls"


class Action(enum.Enum):
    """What crossing a budget does, from mildest to hardest."""

    # Journal it and count it; nothing is refused.
    WARN = "warn"
    # Refuse what would consume more until the window has room again (a level: for
    # budgets.LEVEL_COOL_OFF_S), with a retry hint; or, in ThrottleMode.DELAY, let a call
    # wait for it.
    THROTTLE = "throttle"
    # Refuse every call until the operator resumes the extension.
    PAUSE = "pause"
    # Stop every call in flight; the extension crashes (class resource_limit) and may not
    # restart until the window has room (a level: for budgets.LEVEL_COOL_OFF_S).
    TERMINATE = "terminate"


class ThrottleMode(enum.Enum):
    """What ``throttle`` does to a call made while its extension is throttled."""

    # Refused at once with Throttled and its retry hint: the caller decides what to do.
    REFUSE = "refuse"
    # Waits for room, with no lock held, at most until the call's own deadline and
    # MAX_THROTTLE_DELAY_S; refused as under REFUSE if room would come later than that.
    DELAY = "delay"
