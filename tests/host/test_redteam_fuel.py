"""Red-team review, issue 28: what a guest's calls are charged, and for how long one call may
hold the GIL. A test guarding a fix failed on the code before it (checked by taking the fix
out); the others pin what held.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterator

import pytest

from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, guest_wat
from wasihost.core.budgets import BudgetPolicy
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.limits import Action, Resource
from wasihost.core.manifest import parse_manifest
from wasihost.core.settings import EngineSettings
from wasihost.engine import process
from wasihost.host.defaults import default_registry
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package
from wasihost.supervisor.governor import Throttled

# -- item 20: a trap that unwinds the guest's fuel counter is charged the whole budget --------

# The loop's iterations (six fuel each): 12M fuel, a few milliseconds of guest code, and no
# call, return or `unreachable` in it, so wasmtime never writes its fuel back to the Store.
BURN_ROUNDS = 2_000_000
BURN = (
    f"(local.set $i (i32.const {BURN_ROUNDS})) (loop $l "
    "(local.set $i (i32.sub (local.get $i) (i32.const 1))) (br_if $l (local.get $i)))"
)
BURNT = 6 * BURN_ROUNDS
FUEL_PER_CALL = 20_000_000
# Each call must be able to pay for the loop: the loop, and then how the call ends.
assert BURNT < FUEL_PER_CALL

# What a spare instance's start-up may add to the usage a call is seen to add (it is charged as
# it is made, in the background: extension.py).
SPARE_START = 100_000

# How each call ends after the loop. $i is 0 there: the division is by zero.
SIGNAL_TRAPS = {
    "load out of bounds": "(drop (i32.load (i32.const -4)))",
    "store out of bounds": "(i32.store (i32.const -4) (i32.const 1))",
    "division by zero": "(drop (i32.div_s (i32.const 1) (local.get $i)))",
    "division overflow": "(drop (i32.div_s (i32.const 0x80000000) (i32.sub (local.get $i) (i32.const 1))))",
    "bad conversion": "(drop (i32.trunc_f32_s (f32.div (f32.const 0) (f32.const 0))))",
    "memory.fill out of bounds": "(memory.fill (i32.const -10) (i32.const 0) (i32.const 100))",
    "table.get out of bounds": "(drop (table.get $t (i32.const 9)))",
    "call_indirect of null": "(drop (call_indirect $t (type $r) (i32.const 0)))",
}
EXTRA = """
  (type $r (func (result i32)))
  (table $t 2 funcref)
  (tag $thrown)
  (func $recurse (call $recurse))"""


def burner(end: str, *, start: bool = False) -> bytes:
    """A guest whose command (or, with ``start``, start function) burns BURNT fuel, then
    runs ``end``."""
    if start:
        extra = EXTRA + f"\n  (func $start (local $i i32) {BURN} {end}) (start $start)"
        return build(guest_wat(extra=extra))
    wat = guest_wat(f"{BURN} {end} (call $ok_null)", extra=EXTRA)
    # The command's loop counter: a local of wasihost_call.
    entry = "(param $in_len i32) (result i64)"
    return build(wat.replace(entry, f"{entry} (local $i i32)", 1))


@pytest.fixture(autouse=True)
def _fuel_claims_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --runtime=process the host also bills a child's CPU time beyond its fuel claim
    (process.FUEL_PER_CPU_NS, tested in test_process_runtime.py). These loops' millisecond is
    at that bill's allowance, and a fresh child's first call now and then takes a millisecond
    or two more (a stack overflow's unwinding, pages first touched), which the bill rightly
    charges: it is off here, so these tests pin what a call's fuel claim is charged."""
    monkeypatch.setattr(process, "FUEL_PER_CPU_NS", 0)


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h:
        yield h


def charged(ext: Extension) -> tuple[FailureClass | None, int]:
    """One call's outcome (None: it returned) and what the CPU budget was charged for it."""
    before = ext.usage().cpu_fuel_last_minute
    try:
        ext.call("run")
        failure = None
    except CallError as exc:
        failure = exc.failure
    return failure, ext.usage().cpu_fuel_last_minute - before


@pytest.mark.parametrize("end", SIGNAL_TRAPS.values(), ids=SIGNAL_TRAPS.keys())
def test_a_trap_that_loses_the_fuel_counter_is_charged_the_whole_budget(
    host: Host, end: str
) -> None:
    ext = host.admit(bare(burner(end)), grants=(), fuel=FUEL_PER_CALL)
    failure, fuel = charged(ext)
    assert failure is FailureClass.TRAP
    # Before the fix: 370 (the handshake and the call's set-up), the loop's 12M unseen.
    assert ext.last_fuel_used == FUEL_PER_CALL
    assert FUEL_PER_CALL <= fuel < FUEL_PER_CALL + SPARE_START


def test_a_start_function_that_traps_so_is_charged_the_whole_budget(host: Host) -> None:
    end = SIGNAL_TRAPS["load out of bounds"]
    ext = host.admit(bare(burner(end, start=True)), grants=(), fuel=FUEL_PER_CALL)
    failure, fuel = charged(ext)
    assert failure is FailureClass.TRAP
    assert FUEL_PER_CALL <= fuel < FUEL_PER_CALL + SPARE_START


def test_a_call_ended_at_its_deadline_in_guest_code_is_charged_the_whole_budget(
    host: Host,
) -> None:
    # The callback that ends it runs between two of the loop's iterations, whose fuel is in a
    # register: it is lost as the call unwinds. The fuel is ample for the 100 ms it may run.
    fuel = 50_000_000_000
    wasm = build(guest_wat("(loop $forever (br $forever)) (call $ok_null)"))
    ext = host.admit(bare(wasm), grants=(), fuel=fuel, timeout_ms=100)
    failure, used = charged(ext)
    assert failure is FailureClass.DEADLINE
    assert fuel <= used < fuel + SPARE_START  # before the fix: 370


@pytest.mark.parametrize(
    ("end", "failure"),
    [
        ("unreachable", FailureClass.PANIC),
        ("(call $recurse)", FailureClass.STACK_OVERFLOW),
        # wasmtime 50 runs the exceptions proposal: an uncaught throw ends the call with a
        # trap of no code, taken as a host function's, and the throw is a call into the
        # runtime, before which the counter is written (pinned: else it would escape).
        ("(throw $thrown)", FailureClass.TRAP),
        ("", None),
    ],
    ids=["unreachable", "stack overflow", "uncaught exception", "return"],
)
def test_a_call_whose_fuel_wasmtime_kept_is_charged_what_it_burnt(
    host: Host, end: str, failure: FailureClass | None
) -> None:
    # Pinned: these write the counter back first (lowlevel.FUEL_KEPT_TRAPS), so the call pays
    # its own fuel, not the whole budget.
    ext = host.admit(bare(burner(end)), grants=(), fuel=FUEL_PER_CALL)
    outcome, fuel = charged(ext)
    assert outcome is failure
    assert BURNT < fuel < BURNT + SPARE_START


def calls_until_throttled(ext: Extension, most: int = 10) -> int:
    """Call until the CPU budget throttles; the number of the refused call."""
    for calls in range(1, most + 1):
        try:
            ext.call("run")
        except Throttled:
            return calls
        except CallError as exc:
            assert exc.failure is FailureClass.TRAP
    raise AssertionError(f"{most} calls and not throttled")


def test_trapping_does_not_escape_the_per_minute_cpu_budget() -> None:
    # The attack: burn most of a call's fuel, then trap out of bounds. An honest guest
    # burning the same is throttled once its fourth call crossed the budget; the trapping one
    # was charged 370 a call and never throttled.
    budgets = BudgetPolicy(
        cpu_fuel_per_minute=BURNT * 7 // 2,
        actions={Resource.CPU_FUEL_PER_MINUTE: Action.THROTTLE},
    )
    with Host(Policy(allow=ALL_CAPS, budgets=budgets), cache_dir=None) as host:
        honest = host.admit(bare(burner("")), grants=(), fuel=FUEL_PER_CALL)
        trapping = host.admit(
            bare(burner(SIGNAL_TRAPS["load out of bounds"])), grants=(), fuel=FUEL_PER_CALL
        )
        assert calls_until_throttled(honest) == 5  # the fourth call crossed the budget
        assert calls_until_throttled(trapping) <= 5


# -- item 22: one bulk memory instruction keeps the GIL at most once per module ---------------

# A 1 ms tick, so that a fill of FILL_BYTES (3-20 ms measured here on touched pages, 120-240 ms
# on fresh ones) runs well past one; the reviewer's 512 MiB fills at the 10 ms tick were the
# same attack, slower.
TICK_MS = 1
FILL_BYTES = 128 * 1024 * 1024
FILL_AT = 1024 * 1024
FILL_PAGES = (FILL_AT + FILL_BYTES) // 65536
# "fill" with CBOR false returns at once (seen short: its next call keeps the GIL); with CBOR
# true it grows memory to FILL_PAGES once and fills FILL_BYTES of it in one instruction.
FILL_BODY = f"""
    (if (i32.eq (i32.load8_u (i32.add (local.get $ptr) (local.get $cmd_len))) (i32.const 0xf5))
      (then
        (if (i32.lt_u (memory.size) (i32.const {FILL_PAGES}))
          (then (drop (memory.grow (i32.sub (i32.const {FILL_PAGES}) (memory.size))))))
        (memory.fill (i32.const {FILL_AT}) (i32.const 7) (i32.const {FILL_BYTES}))))
    (call $ok_null)"""
FILL_MANIFEST = f"""[extension]
schema = "wasihost-manifest/1"
id = "org.test.fill"
version = "0.1.0"
abi = "1.0"
module = "m.wasm"

[resources]
max_memory_bytes = {FILL_PAGES * 65536}
fuel_per_call = {2 * FILL_BYTES}

[commands]
fill = {{}}
"""


def _fill_package() -> Package:
    """The fill command's package: a short call or one long memory.fill, by its argument."""
    wasm = build(
        guest_wat(
            FILL_BODY,
            hello={"id": "org.test.fill", "version": "0.1.0", "abi": "1.0", "features": []},
        )
    )
    manifest = parse_manifest(FILL_MANIFEST, default_registry().capabilities())
    return Package("fill", manifest, wasm, hashlib.sha256(wasm).hexdigest())


@pytest.mark.in_process
def test_a_bulk_instruction_holds_the_gil_for_one_call_of_its_module_at_most() -> None:
    # The attack: a command alternates a short call (trusted: its next call keeps the GIL)
    # with one memory.fill far longer than a tick. A single instruction meets at most one
    # tick, and trust was withdrawn only after two, so every fill kept the GIL (the reviewer:
    # 5 of 10 calls, other threads stalled 20-365 ms each). A call that kept the GIL for
    # longer than a tick now withdraws its module's trust: the first fill is the last.
    package, settings = _fill_package(), EngineSettings(epoch_tick_ms=TICK_MS)
    with Host(Policy(), cache_dir=None, settings=settings) as host:
        assert host.engine.keep_gil_below_fuel > 0  # the native ticker is there (Linux)
        ext = host.admit(package)
        ext.call("fill", False)
        (instance,) = ext._instances()
        assert instance.keeps_gil(b"fill")  # seen short: the first fill keeps the GIL
        fills_keeping_the_gil = []
        for _ in range(5):
            ext.call("fill", True)
            fills_keeping_the_gil.append(instance.kept_gil)
            ext.call("fill", False)
        # Before the fix: all 5. (The first is 0 too if a tick of the short calls' already
        # withdrew the trust, which a loaded machine may do at a 1 ms tick.)
        assert sum(fills_keeping_the_gil) <= 1, fills_keeping_the_gil
        assert not any(fills_keeping_the_gil[1:])
        # Withdrawn from the module: a fresh instance does not keep it either.
        ext.stop()
        ext.call("fill", False)
        (instance,) = ext._instances()
        assert not instance.keeps_gil(b"fill")


@pytest.mark.in_process
def test_the_withdrawn_gil_trust_stays_withdrawn_when_the_same_bytes_are_admitted_again() -> None:
    # Break (issue 28, second pass on item 22): the trust lived on the CompiledModule, which
    # goes once no extension holds it; the same bytes admitted again after a close (or
    # compiled again after the module cache let them go) got a new one, trusted: its next
    # fill kept the GIL again, one per re-admission. Now the engine keeps the digests whose
    # trust was withdrawn, and a module made again for them starts without it.
    package, settings = _fill_package(), EngineSettings(epoch_tick_ms=TICK_MS)
    with Host(Policy(), cache_dir=None, settings=settings) as host:
        ext = host.admit(package)
        for fill in (False, True, False):
            ext.call("fill", fill)
        (instance,) = ext._instances()
        assert not instance.keeps_gil(b"fill")  # the fill ran past a tick: withdrawn
        ext.close()
        del ext, instance
        gc.collect()  # the CompiledModule goes with its last extension
        again = host.admit(package)
        again.call("fill", False)
        (instance,) = again._instances()
        assert not instance.keeps_gil(b"fill")
        again.call("fill", True)
        assert not instance.kept_gil
