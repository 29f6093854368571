"""One budget per embedder call: the start function, the handshake and the command draw from
the same fuel and the same wall-clock deadline (issue: budgets that stacked per phase)."""

from __future__ import annotations

import time

import pytest

from tests.support.common import bare
from tests.support.guests import HEAP_START, build, guest_wat
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.runtime import Extension, Host

# Four phases run on a first call: start function, hello, welcome, command.
PHASES = 4


def burn_fn(iterations: int) -> str:
    return f"""
  (func $burn
    (local $n i32)
    (local.set $n (i32.const {iterations}))
    (loop $l
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n))))"""


def burning_guest(iterations: int, *, command: str = "(call $ok_null)") -> bytes:
    """Every phase burns ``iterations`` loop turns: the start function, and wasihost_alloc,
    which the host calls before hello, before welcome and before the command."""
    alloc = f"""
  (func (export "wasihost_alloc") (param $n i32) (result i32)
    (call $burn)
    (global.set $heap (i32.const {HEAP_START}))
    (global.get $heap))"""
    extra = burn_fn(iterations) + "\n  (func $init (call $burn))\n  (start $init)"
    return build(guest_wat(command, alloc=alloc, extra=extra))


def phase_fuel(host: Host) -> int:
    """What one burning phase costs, measured on a call after start-up."""
    ext = host.admit(bare(burning_guest(100_000)), grants=(), fuel=100_000_000)
    ext.call("run")  # starts it
    ext.call("run")
    one = ext.last_fuel_used
    ext.close()
    return one


def test_first_call_reports_the_fuel_of_every_phase(host: Host) -> None:
    one = phase_fuel(host)
    ext = host.admit(bare(burning_guest(100_000)), grants=(), fuel=100_000_000)
    ext.call("run")
    first = ext.last_fuel_used
    ext.call("run")
    assert ext.last_fuel_used == one
    # Before: the first call reported only its command phase (== one).
    assert first >= PHASES * one - PHASES * 100


def test_start_up_and_command_share_one_fuel_budget(host: Host) -> None:
    one = phase_fuel(host)
    # Enough for any single phase, not for all four together.
    fuel = 3 * one
    ext = host.admit(bare(burning_guest(100_000)), grants=(), fuel=fuel)
    with pytest.raises(CallError) as info:
        ext.call("run")
    assert info.value.failure is FailureClass.OUT_OF_FUEL
    assert ext.last_fuel_used <= fuel + 10_000  # never more than the budget (plus unpaid debt)


def test_start_up_and_command_share_one_deadline(host: Host) -> None:
    # Calibrate a phase of about 0.3 s on this machine, whatever its load.
    probe: Extension = host.admit(bare(burning_guest(2_000_000)), grants=(), fuel=10**10)
    probe.call("run")
    started = time.monotonic()
    probe.call("run")
    per_turn = max(1e-10, (time.monotonic() - started) / 2_000_000)
    turns = min(2**31 - 1, int(0.3 / per_turn))
    spin = "(loop $forever (br $forever)) (call $ok_null)"
    ext = host.admit(
        bare(burning_guest(turns, command=spin)), grants=(), fuel=10**11, timeout_ms=1000
    )
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("run")
    elapsed = time.monotonic() - started
    assert info.value.failure is FailureClass.DEADLINE
    # Before: about 0.9 s of start-up, then a fresh 1 s for the command.
    assert elapsed < 1.4, elapsed
