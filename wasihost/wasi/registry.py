"""The WASI preview1 profile as registry entries: all 46 functions, each with its capability,
the errno it answers when not granted, its per-call limits and its fuel price.

This table is the source of truth; ``abi/wasi/registry.json`` is generated from it and a test
holds them equal. Regenerate with::

    python -c "from wasihost.wasi.registry import render_json as r; print(r(), end='')" \
        > abi/wasi/registry.json
"""

from __future__ import annotations

import json
from typing import Any, Final

from ..core.registry import CORE_CAPABILITY, AbiVersion, HostFunction, Profile
from . import limits
from .abi import DIRENT, EVENT, SUBSCRIPTION_SIZE
from .errno import Errno

MODULE: Final = "wasi_snapshot_preview1"
PROFILE_NAME: Final = "wasi"
# The profile's own revision: bumped when an entry's capability, limits or price change.
PROFILE_VERSION: Final = AbiVersion(1, 1)  # 1.1: sock_* became core (NOTSOCK, not BADF)

CAP_STDIO: Final = "wasi.stdio"
CAP_ARGS: Final = "wasi.args"
CAP_ENV: Final = "wasi.env"
CAP_CLOCK: Final = "wasi.clock"
CAP_RANDOM: Final = "wasi.random"
CAP_FS_READ: Final = "wasi.fs.read"
CAP_FS_WRITE: Final = "wasi.fs.write"
CAP_SOCKETS: Final = "wasi.sockets"
# Capabilities the profile declares that no entry carries: wasi.stdio is checked by the binding
# (stdio reaches the caller instead of the extension's log, and stdin is readable); wasi.sockets
# is reserved for socket descriptors, which this profile never creates. The sock_* entries are
# core, because what they answer depends only on the descriptor named (BADF for none, NOTSOCK
# for a file), which reveals nothing.
BINDING_CAPABILITIES: Final = (CAP_STDIO, CAP_SOCKETS)

# Fuel prices. A host call costs the host microseconds (thousands of wasm instructions), so even
# the cheapest entry is priced well above one instruction; bytes moved cost one unit each, as a
# wasm memory.copy would.
FUEL_TRIVIAL: Final = 100  # table lookups and constant answers
FUEL_FD: Final = 300  # one system call on a descriptor
FUEL_POLL: Final = 500  # parses subscriptions and may wait
FUEL_PATH: Final = 2000  # walks a path component by component: several system calls
FUEL_PER_BYTE: Final = 1
# A path call's base price covers a walk of this many components; each further one (an openat
# and an fstat: one descriptor call's work) is charged FUEL_PER_WALK_STEP before it is walked.
# Without it a 4096-component walk (a symlink chain) cost its flat base: ~12 ms of host time.
# The step's price is the files broker's (the same walk): a step costs the host about 2 us of
# CPU and guest code runs at about 0.09 ns a unit (benchmarks/bench_hostcall_prices.py), so
# 4,000 units keep a walk within about 10x of guest code; at 300 (FUEL_FD) a chain walk was
# ~12 ns of host CPU a unit, about 130x.
WALK_STEPS_IN_BASE: Final = 8
FUEL_PER_WALK_STEP: Final = 4_000
# Each entry of a directory snapshot (fd_readdir at cookie 0): read, typed, sorted and kept,
# about 1.7 us of host time; charged before each batch is read. Without it one fd_readdir
# re-read a directory of 100,000 entries (~0.2 s) for the base price.
FUEL_PER_DIR_ENTRY: Final = 100
# Each byte of the seeded random stream (HMAC-SHA256 in counter mode, ~190 ns a byte in
# Python) on top of FUEL_PER_BYTE: priced like the profile's other host work (~0.1-0.15 units
# per ns), where 1 unit a byte let 1 MiB cost ~0.19 s of host time for about a million units.
FUEL_PER_SEEDED_RANDOM_BYTE: Final = 25
# Each log record a write to stdout/stderr makes when they go to the extension's log (one a
# line, and one per 4 KiB of a longer one): about a microsecond of host time each, or an
# embedder's log sink call. At one unit a byte, 1 MiB of newlines made a million records
# (~1 s of host time) for about two million units.
FUEL_PER_LOG_RECORD: Final = 100
# What a budget must still hold for poll_oneoff to wait: its price, plus the 100,000 units host
# calls may otherwise owe before the engine checks the budget (SETTLE_FUEL in engine/native.py,
# below which a fuel check answers yes without looking). Without it a guest with 50 units left
# slept until its deadline (up to ten minutes) on credit.
FUEL_TO_WAIT: Final = 100_000 + FUEL_POLL

_PTR: Final = 4  # an out-pointer target (u32 / size)
_U64: Final = 8
_IOVECS: Final = limits.MAX_IOVECS * 8
_PATH: Final = limits.MAX_PATH_BYTES
_IO: Final = limits.MAX_IO_BYTES_PER_CALL
_READDIR: Final = limits.MAX_DIR_ENTRIES * (DIRENT.size + limits.MAX_NAME_BYTES)
_SUBS: Final = limits.MAX_POLL_SUBSCRIPTIONS * SUBSCRIPTION_SIZE
_EVENTS: Final = limits.MAX_POLL_SUBSCRIPTIONS * EVENT.size + _PTR

# name, params, capability, denied errno, fuel base, max bytes read, max bytes written, doc.
# Denied errnos: without wasi.fs.write every mount is read-only to the guest, so writes answer
# ROFS; without wasi.fs.read the guest holds no descriptor that could serve the
# call, so BADF; clocks and random have no descriptor and answer NOTCAPABLE.
# Every function returns an errno (i32) except proc_exit, which does not return.
_TABLE: Final[tuple[tuple[str, str, str, Errno | None, int, int, int, str], ...]] = (
    ("args_get", "i32 i32", CAP_ARGS, Errno.SUCCESS, FUEL_TRIVIAL, 0,
     limits.MAX_ARGS_BYTES * 2, "argv pointers and strings; ungranted: nothing (argc was 0)"),
    ("args_sizes_get", "i32 i32", CORE_CAPABILITY, Errno.SUCCESS, FUEL_TRIVIAL, 0, 2 * _PTR,
     "argc and argv bytes; 0/0 unless wasi.args is granted"),
    ("environ_get", "i32 i32", CAP_ENV, Errno.SUCCESS, FUEL_TRIVIAL, 0,
     limits.MAX_ENV_BYTES * 2, "environment pointers and K=V strings; ungranted: nothing"),
    ("environ_sizes_get", "i32 i32", CORE_CAPABILITY, Errno.SUCCESS, FUEL_TRIVIAL, 0, 2 * _PTR,
     "environment count and bytes; 0/0 unless wasi.env is granted"),
    ("clock_res_get", "i32 i32", CAP_CLOCK, Errno.NOTCAPABLE, FUEL_TRIVIAL, 0, _U64,
     "resolution of a clock under the clock profile"),
    ("clock_time_get", "i32 i64 i32", CAP_CLOCK, Errno.NOTCAPABLE, FUEL_TRIVIAL, 0, _U64,
     "time of a clock, rounded down to the profile's resolution"),
    ("fd_advise", "i32 i64 i64 i32", CAP_FS_READ, Errno.BADF, FUEL_FD, 0, 0,
     "advice on a file's access pattern"),
    ("fd_allocate", "i32 i64 i64", CAP_FS_WRITE, Errno.ROFS, FUEL_FD, 0, 0,
     "reserve file space, up to the file size limit"),
    ("fd_close", "i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, 0, 0, "close a descriptor"),
    ("fd_datasync", "i32", CAP_FS_READ, Errno.BADF, FUEL_FD, 0, 0, "sync a file's data"),
    ("fd_fdstat_get", "i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_TRIVIAL, 0, 24,
     "type, flags and rights of a descriptor"),
    ("fd_fdstat_set_flags", "i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, 0, 0,
     "set APPEND or NONBLOCK"),
    ("fd_fdstat_set_rights", "i32 i64 i64", CORE_CAPABILITY, Errno.BADF, FUEL_TRIVIAL, 0, 0,
     "drop rights of a descriptor (never add)"),
    ("fd_filestat_get", "i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, 0, 64,
     "attributes of an open file"),
    ("fd_filestat_set_size", "i32 i64", CAP_FS_WRITE, Errno.ROFS, FUEL_FD, 0, 0,
     "truncate or extend a file, up to the file size limit"),
    ("fd_filestat_set_times", "i32 i64 i64 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_FD, 0, 0,
     "set access and modification times of an open file"),
    ("fd_pread", "i32 i32 i32 i64 i32", CAP_FS_READ, Errno.BADF, FUEL_FD, _IOVECS, _IO + _PTR,
     "read at an offset"),
    ("fd_prestat_get", "i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_TRIVIAL, 0, 8,
     "describe a preopened mount; BADF past the last one ends libc's preopen scan"),
    ("fd_prestat_dir_name", "i32 i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_TRIVIAL, 0, _PATH,
     "guest path of a preopened mount"),
    ("fd_pwrite", "i32 i32 i32 i64 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_FD, _IOVECS + _IO, _PTR,
     "write at an offset"),
    ("fd_read", "i32 i32 i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, _IOVECS, _IO + _PTR,
     "read from stdin or an open file"),
    ("fd_readdir", "i32 i32 i32 i64 i32", CAP_FS_READ, Errno.BADF, FUEL_FD, 0, _READDIR + _PTR,
     "directory entries from a cookie on"),
    ("fd_renumber", "i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, 0, 0,
     "move a descriptor onto another number"),
    ("fd_seek", "i32 i64 i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, 0, _U64,
     "move a file's offset"),
    ("fd_sync", "i32", CAP_FS_READ, Errno.BADF, FUEL_FD, 0, 0, "sync a file's data and metadata"),
    ("fd_tell", "i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, 0, _U64,
     "a file's current offset"),
    ("fd_write", "i32 i32 i32 i32", CORE_CAPABILITY, Errno.BADF, FUEL_FD, _IOVECS + _IO, _PTR,
     "write to stdout/stderr (the log, or the caller with wasi.stdio) or an open file"),
    ("path_create_directory", "i32 i32 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_PATH, _PATH, 0,
     "create a directory"),
    ("path_filestat_get", "i32 i32 i32 i32 i32", CAP_FS_READ, Errno.BADF, FUEL_PATH, _PATH, 64,
     "attributes of a file by path"),
    ("path_filestat_set_times", "i32 i32 i32 i32 i64 i64 i32", CAP_FS_WRITE, Errno.ROFS,
     FUEL_PATH, _PATH, 0, "set times of a file by path"),
    ("path_link", "i32 i32 i32 i32 i32 i32 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_PATH, 2 * _PATH,
     0, "hard link within one mount"),
    ("path_open", "i32 i32 i32 i32 i32 i64 i64 i32 i32", CAP_FS_READ, Errno.BADF, FUEL_PATH,
     _PATH, _PTR, "open a file or directory inside a mount (writing needs a writable mount)"),
    ("path_readlink", "i32 i32 i32 i32 i32 i32", CAP_FS_READ, Errno.BADF, FUEL_PATH, _PATH,
     _PATH + _PTR, "contents of a symbolic link"),
    ("path_remove_directory", "i32 i32 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_PATH, _PATH, 0,
     "remove an empty directory"),
    ("path_rename", "i32 i32 i32 i32 i32 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_PATH, 2 * _PATH, 0,
     "rename within one mount"),
    ("path_symlink", "i32 i32 i32 i32 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_PATH, 2 * _PATH, 0,
     "create a symbolic link (relative target only)"),
    ("path_unlink_file", "i32 i32 i32", CAP_FS_WRITE, Errno.ROFS, FUEL_PATH, _PATH, 0,
     "remove a file or symbolic link"),
    ("poll_oneoff", "i32 i32 i32 i32", CORE_CAPABILITY, Errno.NOTCAPABLE, FUEL_POLL, _SUBS,
     _EVENTS, "wait for clocks (needs wasi.clock) or descriptors, never past the deadline"),
    ("proc_exit", "i32", CORE_CAPABILITY, None, FUEL_TRIVIAL, 0, 0,
     "end the run with an exit code"),
    ("proc_raise", "i32", CORE_CAPABILITY, Errno.NOSYS, FUEL_TRIVIAL, 0, 0,
     "signals do not exist here: NOSYS"),
    ("sched_yield", "", CORE_CAPABILITY, Errno.SUCCESS, FUEL_TRIVIAL, 0, 0, "a no-op"),
    ("random_get", "i32 i32", CAP_RANDOM, Errno.NOTCAPABLE, FUEL_FD, 0,
     limits.MAX_RANDOM_BYTES_PER_CALL, "random bytes: OS CSPRNG, or a seeded stream"),
    ("sock_accept", "i32 i32 i32", CORE_CAPABILITY, Errno.NOTSOCK, FUEL_FD, 0, _PTR,
     "no socket descriptors exist here: BADF (none) or NOTSOCK"),
    ("sock_recv", "i32 i32 i32 i32 i32 i32", CORE_CAPABILITY, Errno.NOTSOCK, FUEL_FD, 0, 0,
     "no socket descriptors exist here: BADF (none) or NOTSOCK"),
    ("sock_send", "i32 i32 i32 i32 i32", CORE_CAPABILITY, Errno.NOTSOCK, FUEL_FD, 0, 0,
     "no socket descriptors exist here: BADF (none) or NOTSOCK"),
    ("sock_shutdown", "i32 i32", CORE_CAPABILITY, Errno.NOTSOCK, FUEL_FD, 0, 0,
     "no socket descriptors exist here: BADF (none) or NOTSOCK"),
)  # fmt: skip

# poll_oneoff and random_get can take a while (waiting; large buffers); everything else is one
# or a few system calls.
_BLOCKING: Final = frozenset({"poll_oneoff"})


def _entry(row: tuple[str, str, str, Errno | None, int, int, int, str]) -> HostFunction:
    name, params, capability, denied, fuel, max_read, max_written, doc = row
    return HostFunction(
        module=MODULE,
        name=name,
        capability=capability,
        since=PROFILE_VERSION,
        params=tuple(params.split()),
        results=() if name == "proc_exit" else ("i32",),
        max_request_bytes=max_read,
        max_response_bytes=max_written,
        fuel_base=fuel,
        fuel_per_byte=FUEL_PER_BYTE,
        blocking=name in _BLOCKING,
        doc=doc,
        convention="native",
        denied_result=None if denied is None else int(denied),
    )


FUNCTIONS: Final = tuple(_entry(row) for row in _TABLE)
FUNCTIONS_BY_NAME: Final = {f.name: f for f in FUNCTIONS}

PROFILE: Final = Profile(
    name=PROFILE_NAME,
    module=MODULE,
    functions=FUNCTIONS,
    command_export="_start",
    capabilities=BINDING_CAPABILITIES,
)

CAPABILITIES: Final = tuple(
    sorted({f.capability for f in FUNCTIONS} - {CORE_CAPABILITY} | set(BINDING_CAPABILITIES))
)


def registry_json() -> dict[str, Any]:
    """The machine-readable table, as committed in ``abi/wasi/registry.json``."""
    return {
        "profile": PROFILE_NAME,
        "version": str(PROFILE_VERSION),
        "import_module": MODULE,
        "command_export": PROFILE.command_export,
        "capabilities": list(CAPABILITIES),
        "binding_capabilities": list(BINDING_CAPABILITIES),
        "errno": {e.spec_name: int(e) for e in Errno},
        "functions": [f.to_json() for f in FUNCTIONS],
    }


def render_json() -> str:
    return json.dumps(registry_json(), indent=2) + "\n"
