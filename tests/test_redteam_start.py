"""Red-team review of the Compile and Start-and-handshake phases: hostile modules, handshake
answers and start-ups, run through the real engine. Each test here failed on the code before
the fix it names (see the branch's history)."""

from __future__ import annotations

import pytest
from conftest import bare
from guests import build, guest_wat

from wasihost.errors import CallError, FailureClass
from wasihost.policy import Policy
from wasihost.runtime import Host

SPARE_WAIT_S = 10.0
# The welcome request's bytes up to the head of its "granted" array: a map(4) head, the key
# "runtime_id" and 16 bytes, the key "granted" (the host's codec keeps this order).
GRANTED_HEAD_AT = 1 + 11 + 17 + 8
EMPTY_ARRAY = 0x80


def _welcome_spins_when_nothing_is_granted() -> bytes:
    """A guest whose ``wasihost.welcome`` spins (until its fuel is gone) when the grant it is
    told is empty, and answers ready otherwise: its first start succeeds, and a start after
    its grant was downgraded to nothing burns a whole budget and fails."""
    wat = guest_wat()
    welcome = "(if (i32.eq (local.get $cmd_len) (i32.const 16))"
    spin = f"""(if (i32.and (i32.eq (local.get $cmd_len) (i32.const 16))
                 (i32.eq (i32.load8_u (i32.add (i32.add (local.get $ptr) (local.get $cmd_len))
                                               (i32.const {GRANTED_HEAD_AT})))
                         (i32.const {EMPTY_ARRAY})))
      (then (loop $spin (br $spin))))
    """
    assert wat.count(welcome) == 1
    return build(wat.replace(welcome, spin + welcome))


def test_a_warm_spare_that_fails_its_start_up_still_pays_its_fuel() -> None:
    """Hole: a warm spare's start-up fuel was counted against the extension's CPU budget only
    when its handshake succeeded. A guest whose spare spins through a whole call's fuel and
    then fails (out of fuel, a trap, a failed welcome) got that CPU for free, on a host thread,
    once per crash. Fix: the spare's fuel is counted however its start-up ends."""
    fuel = 20_000_000
    with Host(Policy(allow=frozenset({"log"})), cache_dir=None) as host:
        ext = host.admit(bare(_welcome_spins_when_nothing_is_granted()), grants=["log"], fuel=fuel)
        assert ext.call("x") is None
        host.revoke(ext.id, "log")  # a downgrade in place: the instance keeps serving
        assert ext.call("x") is None
        before = ext.usage().cpu_fuel_last_minute
        with pytest.raises(CallError) as info:
            ext.call("x", fuel=1)  # a crash: a warm spare is made for the next call
        assert info.value.failure is FailureClass.OUT_OF_FUEL
        assert not ext.wait_for_spare(SPARE_WAIT_S)  # its welcome spun out of fuel
        assert any("warm spare" in step and "failed" in detail for step, detail in ext.steps)
        assert ext.usage().cpu_fuel_last_minute - before >= fuel
