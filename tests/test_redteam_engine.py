"""Red-team review of the Call phase's engine limits (docs/security.md, "Call"): hostile guests
that follow the ABI attack fuel, the deadline, memory, tables, the wasm stack and trap
containment through the real engine. A test guarding a fix failed on the code before it
(checked by taking the fix out once); the others pin an attack that held.

Calls that could kill the process run in a child process, so a regression shows as a failed
test, not a dead pytest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ALL_CAPS, run_child

from wasihost.errors import CallError
from wasihost.policy import Policy
from wasihost.runtime import Host


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
sys.path.insert(0, "tests")
from conftest import bare
from guests import build, guest_wat
from wasihost.errors import CallError
from wasihost.policy import Policy
from wasihost.runtime import Host

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


def test_guests_nested_through_host_functions_cannot_overflow_the_threads_stack() -> None:
    # Break (red-team 2026-12-01): the stack check compared the thread's whole stack with one
    # guest's need (max_wasm_stack + STACK_MARGIN), and wasmtime bounds each Store's wasm
    # stack from where that Store is entered. A guest that recursed and then called an
    # embedder function calling the next extension (or itself, under max_concurrency) got a
    # fresh 512 KiB at every level: 24 levels of 492 KiB killed the host with SIGSEGV. Now
    # every guest entered on a thread takes its share of the thread's stack until it leaves,
    # and an entry the rest cannot hold fails as stack_overflow before the guest runs.
    report, _ = run_child(NESTED)
    assert report["outcome"] == "host_error"  # the embedder function raised the refusal
    assert report["refused_at"] and 2 <= report["refused_at"][0] < 64
    assert report["after"] == [None, None, None]
