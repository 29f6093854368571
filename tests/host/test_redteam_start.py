"""Red-team review of the Compile and Start-and-handshake phases: hostile modules, handshake
answers and start-ups, run through the real engine. Each test here failed on the code before
the fix it names (see the branch's history)."""

from __future__ import annotations

import time

import pytest
import wasmtime

from tests.support.common import bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import AdmissionError, CallError, FailureClass
from wasihost.core.wasmbin import MAX_DECLARED, WasmFormatError, read_header
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

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


# -- compile: the module-header scanner ---------------------------------------------------


def _leb(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _section(section_id: int, body: bytes, size: bytes | None = None) -> bytes:
    return bytes([section_id]) + (size if size is not None else _leb(len(body))) + body


MODULE_HEAD = b"\x00asm\x01\x00\x00\x00" + _section(0, b"\x0cwasihost_abi1.0")
ONE_TYPE = _section(1, b"\x01\x60\x00\x00")  # one type: () -> ()
ONE_MEMORY = b"\x01\x00\x01"  # one memory of 1 page


def test_repeated_import_sections_are_refused_before_they_pile_up() -> None:
    """Hole: the scanner read every import section it met and kept them all. wasmtime refuses
    a repeated section, but the scan came first: 40 import sections of MAX_DECLARED (100,000)
    empty-named imports, a 16 MiB module, took 22 s of CPU and 1.3 GiB to scan, then built an
    AdmissionError of four million problems. Fix: a known section may appear once, in the
    spec's order, as wasmtime reads it; so each list the scan keeps is bounded by one
    section's count."""
    imports = _section(2, _leb(MAX_DECLARED) + b"\x00\x00\x00\x00" * MAX_DECLARED)
    wasm = MODULE_HEAD + ONE_TYPE + imports * 40
    assert len(wasm) > 16_000_000
    with Host(cache_dir=None) as host:
        started = time.process_time()
        with pytest.raises(AdmissionError) as refused:
            host.admit(bare(wasm))
        assert time.process_time() - started < 2.0  # was 22 s
    assert list(refused.value.problems) == [
        "not a valid module: section 2 is repeated or out of order"
    ]


MALFORMED = {
    # Each was read by the scanner as a module wasmtime then refused (or worse, see above).
    "memory section twice": _section(5, ONE_MEMORY) * 2,
    "types after imports": _section(2, b"\x00") + ONE_TYPE,
    "bytes past a memory section's entries": _section(5, ONE_MEMORY + b"\x00"),
    "6-byte LEB section size": _section(5, ONE_MEMORY, size=b"\x83\x80\x80\x80\x80\x00"),
    "6-byte LEB count": _section(5, b"\x81\x80\x80\x80\x80\x00\x00\x01"),
    "start section of two functions": _section(8, b"\x00\x00"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_the_scanner_refuses_what_wasmtime_refuses(case: str) -> None:
    """The scanner and wasmtime read the same bytes the same way: what wasmtime will not
    parse, the scanner does not vouch for either, so no module reaches admission read one way
    by the scanner and another by the engine."""
    wasm = MODULE_HEAD + MALFORMED[case]
    with pytest.raises(wasmtime.WasmtimeError):
        wasmtime.Module(wasmtime.Engine(), wasm)
    with pytest.raises(WasmFormatError):
        read_header(wasm)
    with Host(cache_dir=None) as host, pytest.raises(AdmissionError) as refused:
        host.admit(bare(wasm))
    assert refused.value.problems[0].startswith("not a valid module: ")
