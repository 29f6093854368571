"""The profile seam: native-convention entries, plain command modules, exit codes.

A toy profile stands in for WASI so the engine's native path is tested on its own.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.common import bare, native_entry
from tests.support.guests import build
from wasihost.core.errors import AdmissionError, CallError, FailureClass
from wasihost.core.guestmem import GuestMemory
from wasihost.core.registry import HostFunction, Profile
from wasihost.core.status import GuestExit
from wasihost.engine.native import SETTLE_FUEL
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

MODULE = "toy_preview1"


def entry(
    name: str, params: tuple[str, ...], results: tuple[str, ...], cap: str, denied: int | None = 76
) -> HostFunction:
    return native_entry(MODULE, name, params, results, cap, denied=denied)


PROFILE = Profile(
    name="toy",
    module=MODULE,
    functions=(
        entry("store_sum", ("i32", "i32", "i32"), ("i32",), "toy.math"),
        entry("peek", ("i32",), ("i64",), "toy.math"),
        entry("exit", ("i32",), (), "toy.core", denied=None),
    ),
)


class ToyBinding:
    instances = 0
    closed = 0

    def __init__(self, ext: Extension) -> None:
        ToyBinding.instances += 1

    def handler(self, e: HostFunction) -> Callable[..., Any]:
        def store_sum(mem: GuestMemory, a: int, b: int, out: int) -> int:
            mem.write_u32(out, a + b)
            return 0

        def peek(mem: GuestMemory, ptr: int) -> int:
            return mem.read_u64(ptr)

        def exit_(mem: GuestMemory, code: int) -> None:
            raise GuestExit(code)

        return {"store_sum": store_sum, "peek": peek, "exit": exit_}[e.name]

    def close(self) -> None:
        ToyBinding.closed += 1


CALL_SUM = "(drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64)))"


def command(body: str) -> bytes:
    return build(f"""(module
      (import "{MODULE}" "store_sum" (func $sum (param i32 i32 i32) (result i32)))
      (import "{MODULE}" "peek" (func $peek (param i32) (result i64)))
      (import "{MODULE}" "exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func (export "_start") {body}))""")


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(
        Policy(allow={"toy.math", "toy.core"}), cache_dir=None, profiles=[(PROFILE, ToyBinding)]
    ) as h:
        yield h


def test_command_runs_and_exits_with_its_code(host: Host) -> None:
    body = """(if (i32.ne (call $sum (i32.const 40) (i32.const 2) (i32.const 64)) (i32.const 0))
                (then unreachable))
              (call $exit (i32.load (i32.const 64)))"""
    ext = host.admit(bare(command(body)), grants=["toy.math", "toy.core"])
    assert ext.plan.is_command
    before = ToyBinding.closed
    assert ext.run_command() == 42
    assert ToyBinding.closed == before + 1  # profile state does not outlive the run
    assert ext.last_fuel_used > 0


def test_returning_from_start_is_exit_zero(host: Host) -> None:
    ext = host.admit(bare(command("")), grants=["toy.core"])
    assert ext.run_command() == 0


def test_ungranted_native_entry_answers_its_denied_value(host: Host) -> None:
    body = "(call $exit (call $sum (i32.const 1) (i32.const 2) (i32.const 64)))"
    ext = host.admit(bare(command(body)), grants=["toy.core"])
    assert ext.run_command() == 76


def test_ungranted_entry_without_denied_value_refuses_the_module(host: Host) -> None:
    with pytest.raises(AdmissionError, match="needs capability 'toy.core'"):
        host.admit(bare(command("")), grants=["toy.math"])


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("(drop (call $peek (i32.const 65530)))", "[65530, +8)"),
        # past the end of memory the guest grew after the host's view of it was made
        (
            """(drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64)))
               (drop (memory.grow (i32.const 1)))
               (drop (call $peek (i32.const 131070)))""",
            "[131070, +8)",
        ),
    ],
    ids=["first-page", "grown-page"],
)
def test_native_out_of_bounds_is_a_protocol_trap(host: Host, body: str, where: str) -> None:
    ext = host.admit(bare(command(body)), grants=["toy.math", "toy.core"])
    with pytest.raises(CallError) as info:
        ext.run_command()
    assert info.value.failure is FailureClass.PROTOCOL
    assert f"{where} outside guest memory" in info.value.message


def test_i64_results_keep_all_bits(host: Host) -> None:
    body = """(i64.store (i32.const 8) (i64.const -2))
              (call $exit (i32.wrap_i64 (i64.shr_u (call $peek (i32.const 8)) (i64.const 60))))"""
    ext = host.admit(bare(command(body)), grants=["toy.math", "toy.core"])
    assert ext.run_command() == 15


def test_command_modules_have_no_commands(host: Host) -> None:
    ext = host.admit(bare(command("")), grants=["toy.core"])
    with pytest.raises(Exception, match="plain command module"):
        ext.call("run")


def test_native_calls_are_charged_base_plus_bytes(host: Host) -> None:
    call = "(drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64)))"
    with_call = host.admit(bare(command(call * 10)), grants=["toy.math", "toy.core"])
    without = host.admit(bare(command("(nop)" * 10)), grants=["toy.math", "toy.core"])
    with_call.run_command()
    without.run_command()
    # 10 calls x (100 base + 4 bytes written x 1 per byte), beyond the wasm instructions
    assert with_call.last_fuel_used - without.last_fuel_used >= 10 * 104


def test_native_calls_run_out_of_fuel(host: Host) -> None:
    loop = "(loop $l (drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64))) (br $l))"
    ext = host.admit(bare(command(loop)), grants=["toy.math", "toy.core"], fuel=50_000)
    with pytest.raises(CallError) as info:
        ext.run_command()
    assert info.value.failure is FailureClass.OUT_OF_FUEL


def test_host_call_fuel_is_exact_at_the_boundary(host: Host) -> None:
    # Native calls charge a Python-side debt settled at the end of the run: the run must still
    # fail with exactly one unit less than it uses, and pass with exactly what it uses.
    body = "(drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64)))" * 5
    probe = host.admit(bare(command(body)), grants=["toy.math", "toy.core"], fuel=1_000_000)
    probe.run_command()
    used = probe.last_fuel_used
    enough = host.admit(bare(command(body)), grants=["toy.math", "toy.core"], fuel=used)
    assert enough.run_command() == 0
    assert enough.last_fuel_used == used
    short = host.admit(bare(command(body)), grants=["toy.math", "toy.core"], fuel=used - 1)
    with pytest.raises(CallError) as info:
        short.run_command()
    assert info.value.failure is FailureClass.OUT_OF_FUEL


def test_work_done_on_unpaid_fuel_is_bounded(host: Host) -> None:
    calls: list[int] = []
    original = ToyBinding.handler

    def counting(self: ToyBinding, e: HostFunction) -> Callable[..., Any]:
        inner = original(self, e)

        def counted(mem: GuestMemory, *args: int) -> Any:
            calls.append(1)
            return inner(mem, *args)

        return counted

    loop = "(loop $l (drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64))) (br $l))"
    fuel = 50_000
    ToyBinding.handler = counting  # type: ignore[method-assign]
    try:
        ext = host.admit(bare(command(loop)), grants=["toy.math", "toy.core"], fuel=fuel)
        with pytest.raises(CallError) as info:
            ext.run_command()
    finally:
        ToyBinding.handler = original  # type: ignore[method-assign]
    assert info.value.failure is FailureClass.OUT_OF_FUEL
    price = 100 + 4  # base + 4 bytes written
    assert len(calls) >= fuel // (price + 20)  # the loop's own instructions cost a few units
    assert len(calls) <= (fuel + SETTLE_FUEL) // price + 1


def test_native_calls_see_memory_the_guest_grew_after_an_earlier_call(host: Host) -> None:
    # The first call builds the memory view at one page; the guest then grows to two and asks
    # for an address in the new page, which the view must pick up rather than fault on.
    body = """(drop (call $sum (i32.const 1) (i32.const 2) (i32.const 64)))
              (drop (memory.grow (i32.const 1)))
              (i64.store (i32.const 70000) (i64.const 0x1122334455667788))
              (if (i64.ne (call $peek (i32.const 70000)) (i64.const 0x1122334455667788))
                (then unreachable))
              (call $exit (i32.const 7))"""
    ext = host.admit(bare(command(body)), grants=["toy.math", "toy.core"])
    assert ext.run_command() == 7


def test_native_calls_work_from_a_start_function(host: Host) -> None:
    # Before instantiation returns the memory export is unresolved: the call looks it up.
    wasm = build(f"""(module
      (import "{MODULE}" "store_sum" (func $sum (param i32 i32 i32) (result i32)))
      (import "{MODULE}" "exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func $init (drop (call $sum (i32.const 30) (i32.const 12) (i32.const 128))))
      (start $init)
      (func (export "_start") (call $exit (i32.load (i32.const 128)))))""")
    ext = host.admit(bare(wasm), grants=["toy.math", "toy.core"])
    assert ext.run_command() == 42


@pytest.mark.in_process
def test_host_function_callbacks_go_with_their_store(host: Host) -> None:
    # Each import of each instance has its own C callback, owned by the Instance with its
    # Store: once an instance is closed and dropped, nothing (no module-level table) keeps it,
    # its callbacks or its brokers alive.
    alive: list[weakref.ref[Any]] = []
    ext: Extension | None = None

    def sized(mem: GuestMemory, a: int, b: int, out: int) -> int:
        assert ext is not None
        (instance,) = ext._instances()  # a plain command's run: the instance being run
        alive.append(weakref.ref(instance))
        alive.extend(weakref.ref(cb) for cb in instance._callbacks)
        return 0

    original = ToyBinding.handler
    ToyBinding.handler = lambda self, e: sized if e.name == "store_sum" else original(self, e)  # type: ignore[method-assign]
    try:
        ext = host.admit(bare(command(CALL_SUM)), grants=["toy.math", "toy.core"])
        for _ in range(20):
            ext.run_command()
    finally:
        ToyBinding.handler = original  # type: ignore[method-assign]
    assert len(alive) == 20 * 4  # each run's instance and its three imports' callbacks
    gc.collect()
    assert [ref for ref in alive if ref() is not None] == []
