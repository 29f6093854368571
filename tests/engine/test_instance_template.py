"""What an instance takes from its compiled module instead of working it out again (issue 31,
instantiation from a template): the module's address, the import entries last linked to it,
and one block of what libwasmtime is handed by address. Through the real engine: instances
of one module stay independent, a link the module's imports do not match is refused however
many passed before, a failed instantiation leaves nothing for the next one, and a closed
instance is never entered again."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from tests.support.common import FIXTURES
from tests.support.guests import build, guest_wat, host_import
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.registry import AbiVersion, HostFunction
from wasihost.core.settings import EngineSettings
from wasihost.engine import BoundImport, Budget, CompiledModule, Instance, StoreLimits, WasmEngine
from wasihost.engine import instance as instance_module
from wasihost.host.defaults import default_registry

MiB = 1024 * 1024
LIMITS = StoreLimits(max_memory_bytes=4 * MiB, max_table_elements=100, fuel=10**7, timeout_ms=5000)
ENTRIES = default_registry().view(AbiVersion(1, 0)).entries
LOG: HostFunction = ENTRIES[("wasihost_v1", "log")]
RANDOM: HostFunction = ENTRIES[("wasihost_v1", "random_bytes")]

# A guest that counts its calls in a global, answers (count, the four bytes at 3000) and then
# keeps the first four bytes of its input at 3000, where a data segment put "seed". Its start
# function burns $spin iterations first (a global set by the data below: 0 here).
COUNTER = """
(module
  (memory (export "memory") 1)
  (global $n (mut i32) (i32.const 0))
  (data (i32.const 3000) "seed")
  (func $start
    (local $i i32)
    (local.set $i (i32.load (i32.const 3100)))
    (block $done (loop $spin
      (br_if $done (i32.eqz (local.get $i)))
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br $spin))))
  (start $start)
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasihost_call") (param $ptr i32) (param $cmd i32) (param $len i32) (result i64)
    (global.set $n (i32.add (global.get $n) (i32.const 1)))
    (i32.store (i32.const 2048) (i32.const 0))
    (i32.store (i32.const 2052) (global.get $n))
    (i32.store (i32.const 2056) (i32.load (i32.const 3000)))
    (if (i32.ge_u (local.get $len) (i32.const 4))
      (then (i32.store (i32.const 3000)
        (i32.load (i32.add (local.get $ptr) (local.get $cmd))))))
    (i64.const 0x000008000000000C))
  %s)
"""


def counter(spin: int = 0) -> bytes:
    # WAT strings take two hex digits after a backslash.
    raw = struct.pack("<I", spin)
    extra = '(data (i32.const 3100) "' + "".join(f"\\{b:02x}" for b in raw) + '")'
    return build(COUNTER % extra)


@pytest.fixture
def engine() -> Iterator[WasmEngine]:
    engine = WasmEngine(EngineSettings(), cache_dir=None)
    yield engine
    engine.close()


def started(engine: WasmEngine, module: CompiledModule, imports: list[BoundImport]) -> Instance:
    inst = engine.new_instance(module, imports, lambda entry: True, LIMITS)
    inst.instantiate(Budget(LIMITS.fuel, LIMITS.timeout_ms))
    return inst


def answer(inst: Instance, payload: bytes = b"") -> tuple[int, bytes]:
    with inst.lock:
        result = inst.call(b"x", payload, 64)
    assert result.status == 0
    count, kept = struct.unpack("<I4s", result.body)
    return count, kept


def test_instances_of_one_module_keep_their_own_state(engine: WasmEngine) -> None:
    module = engine.compile(counter())
    first, second = started(engine, module, []), started(engine, module, [])
    assert answer(first, b"AAAA") == (1, b"seed")
    assert answer(first, b"BBBB") == (2, b"AAAA")
    # The second has its own globals and its own copy of the data, untouched by the first.
    assert answer(second, b"CCCC") == (1, b"seed")
    assert first.fuel_used > second.fuel_used > 0  # two calls against one
    fuel = second.fuel_used
    first.close()
    assert answer(second) == (2, b"CCCC")
    assert second.fuel_used > fuel
    # An instance made after others wrote and closed starts from the module, as the first.
    third = started(engine, module, [])
    assert answer(third) == (1, b"seed")
    for inst in (second, third):
        inst.close()


def test_the_compiled_path_and_the_ctypes_path_use_the_same_block(engine: WasmEngine) -> None:
    module = engine.compile(counter())
    inst = started(engine, module, [])
    saved = instance_module.FAST
    try:
        assert answer(inst, b"1111") == (1, b"seed")
        instance_module.FAST = None  # the ctypes path makes its views of the block now
        assert answer(inst, b"2222") == (2, b"1111")
        instance_module.FAST = saved
        assert answer(inst) == (3, b"2222")
    finally:
        instance_module.FAST = saved
        inst.close()


def test_a_link_the_modules_imports_do_not_match_is_refused_after_any_number_passed(
    engine: WasmEngine,
) -> None:
    wasm = build(guest_wat(imports=host_import("log") + host_import("random_bytes", "rnd")))
    module = engine.compile(wasm)

    def handler(call: object, request: object) -> None:
        return None

    good = [BoundImport(LOG, handler), BoundImport(RANDOM, handler)]
    for _ in range(3):
        started(engine, module, good).close()
    for wrong in (
        [BoundImport(RANDOM, handler), BoundImport(LOG, handler)],  # the same, reordered
        [BoundImport(LOG, handler)],  # one missing
        [],  # none
        [*good, BoundImport(LOG, handler)],  # one too many
    ):
        with pytest.raises(CallError) as refused:
            engine.new_instance(module, wrong, lambda entry: True, LIMITS)
        assert refused.value.failure is FailureClass.ADMISSION
        assert "disagree on imports" in refused.value.message
    started(engine, module, good).close()  # and the right ones still link


def test_a_module_without_imports_refuses_any(engine: WasmEngine) -> None:
    module = engine.compile(counter())
    started(engine, module, []).close()
    with pytest.raises(CallError, match="disagree on imports"):
        engine.new_instance(module, [BoundImport(LOG, lambda c, r: None)], lambda e: True, LIMITS)


def test_a_failed_instantiation_leaves_nothing_to_the_next_instance(engine: WasmEngine) -> None:
    module = engine.compile(counter(spin=100_000))
    failed = engine.new_instance(module, [], lambda entry: True, LIMITS)
    with pytest.raises(CallError) as out:
        failed.instantiate(Budget(100_000, 5000))  # the start function runs out of fuel
    assert out.value.failure is FailureClass.OUT_OF_FUEL
    assert failed.closed and failed.last_call_fuel == 100_000
    # The next instance of the module starts with a clean trap slot and its own fuel.
    inst = started(engine, module, [])
    assert answer(inst) == (1, b"seed")
    inst.close()


def test_a_closed_instance_is_never_entered_again(engine: WasmEngine) -> None:
    module = engine.compile(counter())
    inst = started(engine, module, [])
    answer(inst)
    inst.close()
    assert inst.closed
    with pytest.raises(CallError, match="instance is closed"):
        inst.call(b"x", b"", 64)
    with pytest.raises(CallError, match="closed or already started"):
        inst.instantiate(Budget(LIMITS.fuel, LIMITS.timeout_ms))
    assert inst.refused_memory_bytes() is None
    assert inst.memory_bytes() is None
    inst.close()  # idempotent
    unstarted = engine.new_instance(module, [], lambda entry: True, LIMITS)
    unstarted.close()
    with pytest.raises(CallError, match="closed or already started"):
        unstarted.instantiate(Budget(LIMITS.fuel, LIMITS.timeout_ms))


def test_instances_of_a_real_fixture_answer_independently(engine: WasmEngine) -> None:
    """fixtures/echo (Rust, one import) through the ABI's reserved commands and echo."""
    import cbor2

    from wasihost.core.codec import encode

    module = engine.compile((FIXTURES / "echo" / "echo.wasm").read_bytes())
    abort = ENTRIES[("wasihost_v1", "abort")]
    instances = [started(engine, module, [BoundImport(abort, lambda c, r: None)]) for _ in range(3)]
    for i, inst in enumerate(instances):
        with inst.lock:
            result = inst.call(b"echo", encode({"n": i}), 4096)
        assert result.status == 0 and cbor2.loads(result.body) == {"n": i}
    instances[1].close()
    for i in (0, 2):
        with instances[i].lock:
            result = instances[i].call(b"echo", encode([i]), 4096)
        assert cbor2.loads(result.body) == [i]
        instances[i].close()


def test_a_store_is_freed_once_by_close_or_by_collection(
    engine: WasmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Store is the instance's own (instance._Store, on its address): close() frees it
    once; a second close(), a cap after it and the collection of the closed instance free
    nothing again; an instance dropped without close() frees its Store when collected."""
    import gc

    freed: list[int] = []
    delete = instance_module.store_delete

    def counted(address: int) -> None:
        freed.append(address)
        delete(address)

    gc.collect()  # other tests' dropped instances free their Stores first, not counted below
    monkeypatch.setattr(instance_module, "store_delete", counted)
    module = engine.compile(counter())
    inst = started(engine, module, [])
    address = inst._store.address
    inst.close()
    assert freed.count(address) == 1 and inst._store.address == 0
    inst.close()
    inst.cap_memory(64 * 1024)  # a closed instance's cap touches nothing
    with pytest.raises(ValueError, match="already closed"):
        inst._store.set_limits(1, 1, 1, 1, 1)
    seen = len(freed)
    del inst
    gc.collect()
    assert address not in freed[seen:]
    dropped = started(engine, module, [])
    answer(dropped)
    address, seen = dropped._store.address, len(freed)
    del dropped
    gc.collect()
    assert freed[seen:].count(address) == 1
