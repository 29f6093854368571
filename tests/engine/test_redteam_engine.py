"""Red-team review of the Call phase's engine limits (docs/security.md, "Call"): hostile guests
that follow the ABI attack fuel, the deadline, memory, tables, the wasm stack and trap
containment through the real engine. A test guarding a fix failed on the code before it
(checked by taking the fix out once); the others pin an attack that held.

Calls that could kill the process run in a child process, so a regression shows as a failed
test, not a dead pytest.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.common import ALL_CAPS, bare, run_child
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h:
        yield h


def failure_of(ext: object, command: str = "run") -> CallError:
    with pytest.raises(CallError) as info:
        ext.call(command)  # type: ignore[attr-defined]
    return info.value


def trap_unless(expr: str, want: int) -> str:
    """WAT: trap (``unreachable``) unless the i32 ``expr`` equals ``want``."""
    return f"(if (i32.ne {expr} (i32.const {want})) (then unreachable))"


# -- the wasm stack, across guests nested through host functions ------------------------------

# Each guest recurses DEPTH frames (about a third of the default 512 KiB max_wasm_stack) and
# calls an embedder function at the bottom, which calls the next extension: LEVELS of them
# need far more than the 8 MiB of the child's main thread.
NESTED = """
import json, sys, threading
sys.path.insert(0, ".")
from tests.support.common import bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

DEPTH, LEVELS = 3000, 64
LOCALS = " ".join(f"(local $l{i} i64)" for i in range(16))
TOUCH = " ".join(
    f"(local.set $l{i} (i64.extend_i32_u (local.get $d)))" for i in range(16))
SUM = "(i64.const 0)"
for i in range(16):
    SUM = f"(i64.add {SUM} (local.get $l{i}))"
WASM = build(guest_wat(
    f"(drop (call $down (i32.const {DEPTH}))) (call $ok_null)",
    imports='(import "myapp_v1" "next" (func $next (param i32 i32 i32 i32) (result i32)))'
    '(@custom "wasihost_abi.myapp" "1.0")',
    extra=f'''
(func $down (param $d i32) (result i64) {LOCALS} {TOUCH}
  (if (i32.eqz (local.get $d))
    (then (drop (call $next (i32.const 8000) (i32.const 1) (i32.const 9000) (i32.const 64)))
          (return (i64.const 1))))
  (i64.add (call $down (i32.sub (local.get $d) (i32.const 1))) {SUM}))
(data (i32.const 8000) "\\\\f6")''',
))
level = threading.local()
refused = []
with Host(Policy(allow={"myapp.read"}), cache_dir=None) as host:
    @host.function("myapp.next", capability="myapp.read", max_request_bytes=16,
                   max_response_bytes=16, fuel_base=100, fuel_per_byte=1)
    def next_level(ctx, request):
        depth = getattr(level, "depth", 0) + 1
        level.depth = depth
        try:
            if depth < limit[0]:
                try:
                    exts[depth].call("run")
                except CallError as exc:
                    if exc.failure.value == "stack_overflow" and not refused:
                        refused.append(depth)
                    raise
        finally:
            level.depth = depth - 1
        return None

    exts = [host.admit(bare(WASM), grants=["myapp.read"], fuel=10**10) for _ in range(LEVELS)]
    limit = [LEVELS]
    try:
        exts[0].call("run")
        outcome = "ok"
    except CallError as exc:
        outcome = exc.failure.value
    limit[0] = 3  # a shallow chain still works afterwards, on fresh instances
    after = [exts[0].call("run") for _ in range(3)]
    print(json.dumps({"outcome": outcome, "refused_at": refused, "after": after}))
"""


@pytest.mark.in_process
def test_guests_nested_through_host_functions_cannot_overflow_the_threads_stack() -> None:
    # Break (red-team 2026-12-01): the stack check compared the thread's whole stack with one
    # guest's need (max_wasm_stack + STACK_MARGIN), and wasmtime bounds each Store's wasm
    # stack from where that Store is entered. A guest that recursed and then called an
    # embedder function calling the next extension (or itself, under max_concurrency) got a
    # fresh 512 KiB at every level: 24 levels of 492 KiB killed the host with SIGSEGV. Now
    # (since issue 28 item 21) every entry compares the stack pointer with the thread's stack
    # bounds, and one with too little left below it fails as stack_overflow before the guest
    # runs (at level 52 here).
    report, _ = run_child(NESTED)
    assert report["outcome"] == "host_error"  # the embedder function raised the refusal
    assert report["refused_at"] and 2 <= report["refused_at"][0] < 64
    assert report["after"] == [None, None, None]


# -- memory and tables: the limits hold at their exact edges (held; pinned) -------------------

# The default limits of a bare module: 16 MiB (256 pages) of memory, 10,000 table elements.
PAGES = 256
ELEMENTS = 10_000
MEMORY_AND_TABLE_EDGES = (
    # growth to exactly the limit is served, one page more and wrapping deltas are refused
    trap_unless(f"(memory.grow (i32.const {PAGES - 2}))", 2)
    + trap_unless("(memory.grow (i32.const 1))", -1)
    + trap_unless("(memory.grow (i32.const -1))", -1)
    + trap_unless("(memory.grow (i32.const 65536))", -1)
    + trap_unless("(memory.size)", PAGES)
    # a declared maximum far above the limit does not lift it; nor does a table's
    + trap_unless(f"(table.grow $t (ref.null func) (i32.const {ELEMENTS - 1}))", 1)
    + trap_unless("(table.grow $t (ref.null func) (i32.const 1))", -1)
    + trap_unless("(table.grow $t (ref.null func) (i32.const -1))", -1)
    + "(call $ok_null)"
)


def test_memory_and_table_growth_stop_exactly_at_the_limits(host: Host) -> None:
    wasm = build(
        guest_wat(
            MEMORY_AND_TABLE_EDGES,
            memory='(memory (export "memory") 2 65536)',
            extra="(table $t 1 1000000 funcref)",
        )
    )
    ext = host.admit(bare(wasm), grants=())
    assert ext.call("run") is None


@pytest.mark.parametrize(
    ("extra", "body"),
    [
        # bulk operations across the end of memory trap before writing
        ("", "(memory.fill (i32.const 131000) (i32.const 1) (i32.const 1000))"),
        ("", "(memory.fill (i32.const 0) (i32.const 1) (i32.const -1))"),
        ("", "(memory.copy (i32.const 131000) (i32.const 0) (i32.const 1000))"),
        # indirect calls out of bounds, to a null element and of the wrong type
        (
            "(type $r (func (result i64))) (table $t 1 funcref)",
            "(drop (call_indirect (type $r) (i32.const 7)))",
        ),
        (
            "(type $r (func (result i64))) (table $t 1 funcref)",
            "(drop (call_indirect (type $r) (i32.const 0)))",
        ),
        (
            "(type $r (func (result i64))) (table $t 1 funcref) (elem (i32.const 0) func $packed)",
            "(drop (call_indirect (type $r) (i32.const 0)))",
        ),
        # arithmetic traps
        ("", "(drop (i32.div_s (i32.const 1) (i32.const 0)))"),
        ("", "(drop (i32.div_s (i32.const 0x80000000) (i32.const -1)))"),
        ("", "(drop (i32.trunc_f32_s (f32.const nan)))"),
        # segments past the memory's or the table's end fail instantiation
        ('(data (i32.const 200000) "x")', ""),
        ("(table $t 1 funcref) (elem (i32.const 5) func $ok_null)", ""),
    ],
)
def test_bad_accesses_are_traps_and_the_next_call_is_served_by_a_fresh_instance(
    host: Host, extra: str, body: str
) -> None:
    # The guest counts its calls in a global: a fresh instance starts again from zero.
    count = "(global.set $n (i32.add (global.get $n) (i32.const 1)))"
    wasm = build(
        guest_wat(
            f"{count} (if (i32.eq (global.get $n) (i32.const 2)) (then {body} {body}))"
            + trap_unless("(global.get $n)", 1)
            + "(call $ok_null)",
            extra=extra + " (global $n (mut i32) (i32.const 0))",
        )
    )
    ext = host.admit(bare(wasm), grants=())
    other = host.admit(bare(build(guest_wat())), grants=())
    if body:
        assert ext.call("run") is None
        assert failure_of(ext).failure is FailureClass.TRAP  # the second call's bad access
        assert ext.call("run") is None  # n is 1 again: a fresh instance, nothing kept
    else:
        assert failure_of(ext).failure is FailureClass.TRAP  # instantiation itself
    assert other.call("run") is None


# -- fuel: one bulk instruction is charged after it ran, and still ends the call ---------------


def test_a_bulk_fill_past_the_fuel_budget_ends_out_of_fuel(host: Host) -> None:
    # Held, with a documented overrun (docs/engine.md): a memory.fill is charged its fuel a
    # byte after it has run, so 8 MiB run on a 1,000,000 budget, but the call still ends
    # out_of_fuel charged the whole budget; a loop of them cannot go on.
    fill = "(memory.fill (i32.const 131072) (i32.const 7) (i32.const 8388608))"
    body = f"(drop (memory.grow (i32.const 128))) (loop $l {fill} (br $l)) (call $ok_null)"
    ext = host.admit(bare(build(guest_wat(body))), grants=(), fuel=1_000_000)
    assert failure_of(ext).failure is FailureClass.OUT_OF_FUEL
    assert ext.last_fuel_used == 1_000_000


# -- containment: a thousand traps keep no memory, descriptor or thread ------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_thousand_traps_keep_no_memory_descriptor_or_thread(host: Host) -> None:
    # Held: measured 1,000 panics in 0.83 s, RSS +80 KiB, descriptors and threads unchanged.
    crashing = host.admit(bare(build(guest_wat("unreachable"))), grants=())
    other = host.admit(bare(build(guest_wat())), grants=())
    for _ in range(100):  # warm up: allocator arenas, caches, the supervisor's records
        failure_of(crashing)
    gc.collect()
    rss, fds = _rss_bytes(), len(os.listdir("/proc/self/fd"))
    threads = {t.ident for t in threading.enumerate()}
    for _ in range(1000):
        assert failure_of(crashing).failure is FailureClass.PANIC
    gc.collect()
    assert _rss_bytes() - rss < 32 * 1024 * 1024  # per trap: under 32 KiB, with room to spare
    # Under the process runtime each trap ends a child, and a warm spare child may be starting
    # on a host thread at this moment (its sockets and pipe open): it settles within moments.
    # A leak would not.
    settle = time.monotonic() + 10.0
    while len(os.listdir("/proc/self/fd")) > fds and time.monotonic() < settle:
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/fd")) <= fds
    # The host's call-thread pool starts its threads lazily (warm spares start on them): any
    # other new thread would be a leak.
    new = [t.name for t in threading.enumerate() if t.ident not in threads]
    assert all(name.startswith("wasihost-call-") for name in new), new
    assert other.call("run") is None
