"""The compiled call path (issue 31, engine/_fastcall.c): one crossing per command call, which
must answer exactly what the ctypes path answers. Each test runs a real guest through both
paths (the compiled one, then ``instance.FAST`` set to None), and compares everything a caller
sees: the status, the body, the fuel, or the failure's class and message."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.guests import HEAP_START, build, guest_wat
from wasihost.core.errors import CallError
from wasihost.engine import fastcall
from wasihost.engine import instance as instance_module
from wasihost.engine.instance import Budget, Instance, StoreLimits
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

MEMORY_BYTES = 2 * 65536
# A payload of this many bytes (with the one-byte command name) makes the guest's
# wasihost_alloc answer the case's block instead of a real one.
BAD_ALLOC_TOTAL = 77


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow={"log"}), cache_dir=None) as h:
        yield h


def test_the_compiled_path_is_active_where_it_can_be() -> None:
    """Built wherever a C compiler is (pip install -e . builds it), and used unless turned
    off or the wasmtime is not one it was declared for: the doctor says which."""
    built = importlib.util.find_spec("wasihost.engine._fastcall") is not None
    if shutil.which("cc") or shutil.which("gcc"):
        assert built, "a C compiler is here, but pip install did not build the C extension"
    if os.environ.get(fastcall.ENV) == "0":
        assert fastcall.PATH == fastcall.CTYPES and fastcall.FAST is None
    elif built:
        assert fastcall.PATH == fastcall.COMPILED, fastcall.WHY
        assert fastcall.FAST is not None


def _guest(block: int, resp_ptr: int, resp_len: int, status: int, fuel_burn: int = 0) -> bytes:
    """A guest whose alloc answers ``block`` for a call of BAD_ALLOC_TOTAL bytes (a real block
    otherwise), and whose command writes ``status`` at ``resp_ptr`` (where it fits) after
    burning ``fuel_burn`` loop turns, and answers (``resp_ptr``, ``resp_len``)."""
    alloc = f"""
  (func (export "wasihost_alloc") (param $n i32) (result i32)
    (local $p i32)
    (if (i32.eq (local.get $n) (i32.const {BAD_ALLOC_TOTAL}))
      (then (return (i32.const {block}))))
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (i32.and (i32.add (local.get $n) (i32.const 7)) (i32.const -8))))
    (local.get $p))"""
    write = (
        f"(i32.store (i32.const {resp_ptr}) (i32.const {status}))"
        if resp_ptr + 4 <= MEMORY_BYTES
        else ""
    )
    body = f"""
    (local.set $ptr (i32.const {fuel_burn}))
    (block $done (loop $burn
      (br_if $done (i32.eqz (local.get $ptr)))
      (local.set $ptr (i32.sub (local.get $ptr) (i32.const 1)))
      (br $burn)))
    {write}
    (call $packed (i32.const {resp_ptr}) (i32.const {resp_len}))"""
    return build(guest_wat(body, alloc=alloc))


def _outcome(inst: Instance, payload: bytes, compiled: bool, max_output: int) -> tuple[Any, ...]:
    saved = instance_module.FAST
    instance_module.FAST = saved if compiled else None
    try:
        result = inst.call(b"x", payload, max_output)
    except CallError as exc:
        return ("failed", exc.failure, exc.message, inst.last_call_fuel)
    finally:
        instance_module.FAST = saved
    return ("answered", result.status, bytes(result.body), result.fuel_used, inst.last_call_fuel)


def _instance(host: Host, wasm: bytes, max_memory_bytes: int = MEMORY_BYTES) -> Instance:
    """A started instance of ``wasm`` on the host's engine, with no import: the engine's own
    path, under the Extension."""
    limits = StoreLimits(
        max_memory_bytes=max_memory_bytes, max_table_elements=100, fuel=10_000_000, timeout_ms=5000
    )
    inst = host.engine.new_instance(host.engine.compile(wasm), [], lambda entry: True, limits)
    inst.instantiate(Budget(limits.fuel, limits.timeout_ms))
    return inst


# The edges of every bound the read of an answer checks, and some plain values.
EDGE_PTRS = [0, 4, 8, HEAP_START, MEMORY_BYTES - 8, MEMORY_BYTES - 4, MEMORY_BYTES, 2**32 - 4]
EDGE_LENS = [0, 3, 4, 5, 12, 200, 65540, MEMORY_BYTES, 2**32 - 1]


def _cases() -> list[tuple[int, int, int, int, bool]]:
    rng = random.Random(31)
    cases = [
        (HEAP_START, ptr, length, rng.getrandbits(32), False)
        for ptr in EDGE_PTRS
        for length in EDGE_LENS
    ]
    for block in (0, 1, HEAP_START, MEMORY_BYTES - BAD_ALLOC_TOTAL, MEMORY_BYTES - 76, 2**32 - 1):
        cases.append((block, 4096, 12, 0, True))
    for _ in range(40):
        cases.append(
            (
                rng.choice([0, 8, HEAP_START, MEMORY_BYTES - 64, rng.getrandbits(32)]),
                rng.choice([*EDGE_PTRS, rng.getrandbits(17), rng.getrandbits(32)]),
                rng.choice([*EDGE_LENS, rng.getrandbits(8), rng.getrandbits(32)]),
                rng.getrandbits(32),
                rng.random() < 0.3,
            )
        )
    return cases


@pytest.mark.skipif(fastcall.FAST is None, reason=f"the compiled path is off: {fastcall.WHY}")
@pytest.mark.parametrize(("block", "resp_ptr", "resp_len", "status", "bad_alloc"), _cases())
def test_both_paths_answer_alike(
    host: Host, block: int, resp_ptr: int, resp_len: int, status: int, bad_alloc: bool
) -> None:
    """Random and edge (ptr, len, status) answers, and bad blocks from wasihost_alloc: the
    compiled path gives exactly the ctypes path's result or failure, fuel included."""
    wasm = _guest(block, resp_ptr, resp_len, status, fuel_burn=37)
    payload = bytes(BAD_ALLOC_TOTAL - 1) if bad_alloc else b"payload"
    for max_output in (8, 65536):
        answers = [
            _outcome(_instance(host, wasm), payload, compiled, max_output)
            for compiled in (True, False)
        ]
        assert answers[0] == answers[1], (max_output, answers)


@pytest.mark.skipif(fastcall.FAST is None, reason=f"the compiled path is off: {fastcall.WHY}")
@pytest.mark.parametrize(
    ("body", "fuel"),
    [
        ("(unreachable)", 10_000_000),  # a trap that keeps the fuel counter
        ("(drop (i32.load (i32.const -1))) (call $ok_null)", 10_000_000),  # one that loses it
        ("(drop (i32.div_u (i32.const 1) (i32.const 0))) (call $ok_null)", 10_000_000),
        ("(loop $l (br $l)) (call $ok_null)", 200_000),  # out of fuel
        ("(call $ok_null)", 10_000_000),
    ],
)
def test_traps_fail_alike_and_charge_alike(host: Host, body: str, fuel: int) -> None:
    """Every way a call ends charges the same fuel on both paths: a trap that unwound the
    fuel counter forfeits the call's fuel on the compiled path too."""
    wasm = build(guest_wat(body))
    answers = []
    for compiled in (True, False):
        inst = _instance(host, wasm)
        saved = instance_module.FAST
        instance_module.FAST = saved if compiled else None
        try:
            try:
                result = inst.call(b"x", b"", 1024, Budget(fuel, 5000))
                answers.append(("answered", result.status, bytes(result.body), inst.last_call_fuel))
            except CallError as exc:
                answers.append(("failed", exc.failure, exc.message, inst.last_call_fuel))
        finally:
            instance_module.FAST = saved
    assert answers[0] == answers[1], answers


@pytest.mark.skipif(fastcall.FAST is None, reason=f"the compiled path is off: {fastcall.WHY}")
def test_a_memory_grown_during_the_call_is_read_again(host: Host) -> None:
    """The guest grows its memory in wasihost_alloc (the block lies in the new page) and again
    in wasihost_call (the answer lies in the next new page): both paths see the memory as it
    is after each step, not as it was."""
    grown = MEMORY_BYTES  # the first byte of the page each grow adds
    alloc = f"""
  (func (export "wasihost_alloc") (param $n i32) (result i32)
    (if (i32.eq (local.get $n) (i32.const {BAD_ALLOC_TOTAL}))
      (then (drop (memory.grow (i32.const 1))) (return (i32.const {grown}))))
    (i32.const {HEAP_START}))"""
    body = f"""
    (drop (memory.grow (i32.const 1)))
    (i32.store (i32.const {grown + 65536}) (i32.const 7))
    (i64.store (i32.const {grown + 65536 + 4}) (i64.const 0x0102030405060708))
    (call $packed (i32.const {grown + 65536}) (i32.const 12))"""
    wasm = build(guest_wat(body, alloc=alloc, memory='(memory (export "memory") 2 8)'))
    answers = [
        _outcome(_instance(host, wasm, 8 * 65536), bytes(BAD_ALLOC_TOTAL - 1), compiled, 1024)
        for compiled in (True, False)
    ]
    assert answers[0] == answers[1], answers
    assert answers[0][:3] == ("answered", 7, (0x0102030405060708).to_bytes(8, "little"))
