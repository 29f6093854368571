"""A differential test of growprobe: a module and its rewrite validate alike, run alike (traps,
results, memory sizes, globals), and where a grow was refused the probe's global holds exactly
the pages it asked for. Generated modules mix what may shift the probe's indices or hide its
grows (imported globals, functions and memory, a start function, element segments with
ref.func, call_indirect, a data count section, tail calls, exceptions, a second memory, grows
in dead code and loops); every fixture and WASI testsuite module is checked too.

The suite runs a bounded number of examples; ``WASIHOST_GROWPROBE_EXAMPLES=N`` runs N (the
attack of 2026-12-06 ran 3,000 and every module of the corpora)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.wasi import LIBC, ROOT, validates
from tests.support.wasi_testsuite import SUITE
from wasihost.core.growprobe import GROW_REFUSED_EXPORT, probe_refused_grows
from wasihost.core.wasmbin import Limits, WasmFormatError, read_header, read_u32

EXAMPLES = int(os.environ.get("WASIHOST_GROWPROBE_EXAMPLES", "60"))
PAGE = 65536
_ENGINE = wasmtime.Engine()

# Deltas a grow asks for: nothing, a little, past any limit, and the unsigned extremes.
DELTAS = (0, 1, 2, 3, 17, 100, 65536, 0x7FFF_FFFF, 0xFFFF_FFFF)
# What a generated module may have beside its grows.
FEATURES = ("imports", "imported_memory", "start", "exceptions", "memory1", "datacount", "tail",
            "trap", "own_globals")  # fmt: skip


def _grow(delta: int) -> str:
    """A grow of memory 0 the guest accounts for itself: its result folded into $sum, and a
    refusal's asked-for pages into $ask (what the probe's global must then hold)."""
    const = f"(i32.const {delta - (1 << 32) if delta >= 1 << 31 else delta})"
    return f"""
      (local.set $b (memory.size))
      (local.set $r (memory.grow {const}))
      (if (i32.eq (local.get $r) (i32.const -1))
        (then (global.set $ask (i64.add (i64.extend_i32_u (local.get $b))
                                        (i64.extend_i32_u {const})))))
      (global.set $sum (i64.add (i64.mul (global.get $sum) (i64.const 31))
                                (i64.extend_i32_s (local.get $r))))"""


@st.composite
def statements(draw: st.DrawFn, index: int, functions: int, features: frozenset[str]) -> str:
    kinds = ["grow", "grow", "dead", "loop", "global", "size"]
    if index + 1 < functions:
        kinds += ["call", "indirect"]
    if "imports" in features:
        kinds += ["host", "imported_global"]
    if "exceptions" in features:
        kinds.append("try")
    if "memory1" in features:
        kinds.append("grow1")
    if "datacount" in features:
        kinds.append("init")
    kind = draw(st.sampled_from(kinds))
    delta = draw(st.sampled_from(DELTAS))
    callee = draw(st.integers(index + 1, functions - 1)) if index + 1 < functions else 0
    if kind == "grow":
        return _grow(delta)
    if kind == "dead":  # validated, never run: its grow must not be recorded
        return f"(block $dead (br $dead) {_grow(delta)})"
    if kind == "loop":
        times = draw(st.integers(1, 4))
        return f"""(local.set $i (i32.const {times}))
          (loop $again {_grow(delta)}
            (br_if $again (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))"""
    if kind == "global":
        return "(global.set $own (i64.add (global.get $own) (i64.const 1)))"
    if kind == "size":
        return "(global.set $sum (i64.add (global.get $sum) (i64.extend_i32_u (memory.size))))"
    if kind == "call":
        return f"(drop (call $f{callee} (i32.const {delta & 0xFF})))"
    if kind == "indirect":
        return f"(drop (call_indirect (type $t) (i32.const 1) (i32.const {callee})))"
    if kind == "host":
        return "(drop (call $host (i32.const 5)))"
    if kind == "imported_global":
        return "(global.set $imported (i64.add (global.get $imported) (global.get $seven)))"
    if kind == "try":
        return f"(block $caught (try_table (catch $tag $caught) {_grow(delta)} (throw $tag)))"
    if kind == "grow1":
        return f"""(global.set $sum (i64.add (global.get $sum)
          (i64.extend_i32_s (memory.grow $m1 (i32.const {delta & 3})))))"""
    return "(memory.init $passive (i32.const 0) (i32.const 0) (i32.const 1))"


@st.composite
def modules(draw: st.DrawFn) -> tuple[str, int]:
    """A command's WAT and the memory limit (pages) its store runs under."""
    features = frozenset(draw(st.sets(st.sampled_from(FEATURES))))
    functions = draw(st.integers(1, 4))
    minimum = draw(st.integers(0, 3))
    maximum = draw(st.sampled_from(["", str(minimum + 2), str(minimum + 40)]))
    parts = []
    if "imports" in features:
        parts += [
            '(import "env" "seven" (global $seven i64))',
            '(import "env" "imported" (global $imported (mut i64)))',
            '(import "env" "host" (func $host (param i32) (result i32)))',
        ]
    if "imported_memory" in features:
        parts.append(f'(import "env" "memory" (memory {minimum} {maximum}))')
    else:
        parts.append(f'(memory (export "memory") {minimum} {maximum})')
    if "memory1" in features:
        parts.append("(memory $m1 1 3)")
    if "own_globals" in features:
        parts.append("(global $g0 (mut i32) (i32.const 1)) (global $g1 f64 (f64.const 2))")
    parts += [
        "(type $t (func (param i32) (result i32)))",
        '(global $sum (export "sum") (mut i64) (i64.const 0))',
        '(global $ask (export "ask") (mut i64) (i64.const 0))',
        '(global $own (export "own") (mut i64) (i64.const 0))',
        f"(table {functions} funcref)",
        f"(elem (i32.const 0) func {' '.join(f'$f{i}' for i in range(functions))})",
    ]
    if "exceptions" in features:
        parts.append("(tag $tag)")
    if "datacount" in features:
        parts.append('(data $passive "x")')
    body_locals = "(local $b i32) (local $r i32) (local $i i32)"
    for index in range(functions):
        body = draw(st.lists(statements(index, functions, features), max_size=6))
        tail = "(local.get $r)"
        if "tail" in features and index + 1 < functions:
            tail = f"(return_call $f{index + 1} (local.get $r))"
        parts.append(
            f"(func $f{index} (param $p i32) (result i32) {body_locals} {' '.join(body)} {tail})"
        )
    start_body = draw(st.lists(statements(functions, functions, features), max_size=3))
    ending = "unreachable" if "trap" in features else ""
    parts.append(
        f'(func (export "_start") {body_locals} {" ".join(start_body)} '
        f"(drop (call $f0 (i32.const 0))) {ending})"
    )
    if "start" in features:
        parts.append(f"(func $init {body_locals} {_grow(draw(st.sampled_from(DELTAS)))})")
        parts.append("(start $init)")
    limit = draw(st.integers(1, 48))
    return f"(module {' '.join(parts)})", limit


def _run(wasm: bytes, limit_pages: int, memory_limits: Limits) -> dict[str, object]:
    """Instantiate and run ``_start`` under a memory limit; what the host can observe."""
    store = wasmtime.Store(_ENGINE)
    store.set_limits(memory_size=limit_pages * PAGE)
    linker = wasmtime.Linker(_ENGINE)
    linker.define(
        store,
        "env",
        "seven",
        wasmtime.Global(store, wasmtime.GlobalType(wasmtime.ValType.i64(), False), 7),
    )
    imported = wasmtime.Global(store, wasmtime.GlobalType(wasmtime.ValType.i64(), True), 0)
    linker.define(store, "env", "imported", imported)
    linker.define_func(
        "env", "host", wasmtime.FuncType([wasmtime.ValType.i32()], [wasmtime.ValType.i32()]),
        lambda value: value,
    )  # fmt: skip
    memory = wasmtime.Memory(
        store,
        wasmtime.MemoryType(wasmtime.Limits(memory_limits.minimum, memory_limits.maximum)),
    )
    linker.define(store, "env", "memory", memory)
    outcome: dict[str, object] = {}
    try:
        instance = linker.instantiate(store, wasmtime.Module(_ENGINE, wasm))
        exports = instance.exports(store)
        start = exports["_start"]
        assert isinstance(start, wasmtime.Func)
        start(store)
        outcome["trap"] = None
    except wasmtime.Trap as trap:
        outcome["trap"] = trap.trap_code
        exports = instance.exports(store)
    for name in ("sum", "ask", "own", GROW_REFUSED_EXPORT):
        value = exports.get(name)
        outcome[name] = value.value(store) if isinstance(value, wasmtime.Global) else None
    own_memory = exports.get("memory")
    outcome["pages"] = (own_memory if isinstance(own_memory, wasmtime.Memory) else memory).size(
        store
    )
    outcome["imported"] = imported.value(store)
    return outcome


def _differ(wat: str, limit_pages: int) -> None:
    wasm = bytes(wasmtime.wat2wasm(wat))
    assert validates(wasm), wat
    header = read_header(wasm)
    probed = probe_refused_grows(wasm, header, validates)
    assert validates(probed), wat
    memory = (header.imported_memories or header.memories)[0]
    limit_pages = max(limit_pages, memory.minimum)
    before = _run(wasm, limit_pages, memory)
    after = _run(probed, limit_pages, memory)
    recorded = after.pop(GROW_REFUSED_EXPORT)
    assert before.pop(GROW_REFUSED_EXPORT) is None
    assert after == before, wat
    if probed != wasm:
        assert recorded == before["ask"], wat  # exactly the pages the last refusal asked for


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)  # fmt: skip
@given(modules())
def test_a_probed_module_runs_as_its_original(case: tuple[str, int]) -> None:
    _differ(*case)


def _index_spaces(wasm: bytes) -> tuple[int, int]:
    """How many functions and globals ``wasm`` has, imported ones included: the next free
    indices, which the probe's function and global take."""
    header = read_header(wasm)
    functions = sum(1 for i in header.imports if i.kind == "func")
    globals_ = sum(1 for i in header.imports if i.kind == "global")
    pos = 8
    while pos < len(wasm):
        section, (size, start) = wasm[pos], read_u32(wasm, pos + 1)
        if section == 3:
            functions += read_u32(wasm, start)[0]
        elif section == 6:
            globals_ += read_u32(wasm, start)[0]
        pos = start + size
    return functions, globals_


def _naming_past_the_end(wat: str, how: str) -> bytes:
    """``wat`` whose _start also names the next free function or global index (a module
    that does not validate)."""
    functions, globals_ = _index_spaces(bytes(wasmtime.wat2wasm(wat)))
    stray = {
        "call": f"(drop (call {functions} (i32.const 0)))",
        "global.set": f"(global.set {globals_} (i64.const 123456))",
        "global.get": f"(drop (global.get {globals_}))",
        "ref.func": f"(drop (ref.func {functions}))",
    }[how]
    entry = '(func (export "_start") (local $b i32) (local $r i32) (local $i i32)'
    return bytes(wasmtime.wat2wasm(wat.replace(entry, f"{entry} {stray}")))


@settings(max_examples=EXAMPLES, deadline=None)
@given(modules(), st.sampled_from(["call", "global.set", "global.get", "ref.func"]))
def test_a_module_naming_the_next_free_index_stays_refused(case: tuple[str, int], how: str) -> None:
    """The probe's function and global take the next free indices: a module naming them is
    invalid, and must stay so once rewritten (before, it compiled, a global.set of the
    probe's global forging a refusal)."""
    wasm = _naming_past_the_end(case[0], how)
    assert not validates(wasm)
    assert not validates(probe_refused_grows(wasm, read_header(wasm), validates))


@settings(max_examples=EXAMPLES, deadline=None)
@given(modules(), st.data())
def test_a_damaged_module_is_refused_alike(case: tuple[str, int], data: st.DataObject) -> None:
    """Bytes of a module changed at random: the rewrite validates iff the original does, and
    the probe never raises whatever the bytes."""
    wasm = bytearray(wasmtime.wat2wasm(case[0]))
    for _ in range(data.draw(st.integers(1, 3))):
        wasm[data.draw(st.integers(8, len(wasm) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(wasm)
    try:
        header = read_header(damaged)
    except WasmFormatError:
        return
    probed = probe_refused_grows(damaged, header, validates)
    assert validates(probed) == validates(damaged)


def _corpus() -> list[Path]:
    found = sorted((ROOT / "fixtures").rglob("*.wasm"))
    if SUITE.is_dir():
        found += sorted(SUITE.rglob("*.wasm"))
    return found


# Corpus programs run on fuel: one may wait or spin (a test of poll_oneoff, of clocks).
_FUELED = wasmtime.Config()
_FUELED.consume_fuel = True
_FUEL_ENGINE = wasmtime.Engine(_FUELED)
_COMMAND_FUEL = 3_000_000_000


def _run_command(wasm: bytes, memory_bytes: int) -> tuple[int | str, bytes, int]:
    """A WASI command run by wasmtime's own WASI: exit code (or trap), stdout, memory size."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "stdout"
        config = wasmtime.WasiConfig()
        config.argv = ["guest.wasm"]
        config.stdout_file = str(out)
        config.stdin_file = os.devnull
        store = wasmtime.Store(_FUEL_ENGINE)
        store.set_fuel(_COMMAND_FUEL)
        store.set_limits(memory_size=memory_bytes)
        store.set_wasi(config)
        linker = wasmtime.Linker(_FUEL_ENGINE)
        linker.define_wasi()
        instance = linker.instantiate(store, wasmtime.Module(_FUEL_ENGINE, wasm))
        start = instance.exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)
        code: int | str
        try:
            start(store)
            code = 0
        except wasmtime.ExitTrap as exit_trap:
            code = exit_trap.code
        except wasmtime.Trap as trap:
            code = str(trap.trap_code)
        except wasmtime.WasmtimeError as error:
            # Its cause, not its backtrace: the probe moves code offsets.
            code = str(error).strip().splitlines()[-1]
        memory = instance.exports(store).get("memory")
        pages = memory.size(store) if isinstance(memory, wasmtime.Memory) else -1
        return code, out.read_bytes(), pages


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: str(p.relative_to(p.parents[2])))
def test_every_corpus_module_validates_alike_once_probed(path: Path) -> None:
    wasm = path.read_bytes()
    try:
        header = read_header(wasm)
    except WasmFormatError:
        return
    probed = probe_refused_grows(wasm, header, validates)
    assert validates(probed) == validates(wasm)


@pytest.mark.parametrize(
    ("argv", "memory_bytes"), [(["malloc:3000000"], 2 * 1024 * 1024), (["malloc:100"], 1 << 30)]
)
def test_a_real_program_runs_alike_once_probed(argv: list[str], memory_bytes: int) -> None:
    """The wasi-libc fixture under built-in WASI, refused its malloc and not: same exit code,
    output and memory size, and a refusal recorded past the limit."""
    wasm = LIBC.read_bytes()
    probed = probe_refused_grows(wasm, read_header(wasm), validates)
    assert probed != wasm
    results = []
    for module in (wasm, probed):
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "stdout"
            config = wasmtime.WasiConfig()
            config.argv = ["libc", *argv]
            config.stdout_file = str(out)
            store = wasmtime.Store(_ENGINE)
            store.set_limits(memory_size=memory_bytes)
            store.set_wasi(config)
            linker = wasmtime.Linker(_ENGINE)
            linker.define_wasi()
            instance = linker.instantiate(store, wasmtime.Module(_ENGINE, module))
            start = instance.exports(store)["_start"]
            assert isinstance(start, wasmtime.Func)
            try:
                start(store)
                code = 0
            except wasmtime.ExitTrap as exit_trap:
                code = exit_trap.code
            memory = instance.exports(store)["memory"]
            assert isinstance(memory, wasmtime.Memory)
            refused = instance.exports(store).get(GROW_REFUSED_EXPORT)
            recorded = refused.value(store) if isinstance(refused, wasmtime.Global) else None
            results.append((code, out.read_bytes(), memory.size(store)))
    assert results[0] == results[1]
    if memory_bytes < 3000000:
        assert recorded is not None and recorded * PAGE > memory_bytes
    else:
        assert recorded == 0


def _commands() -> list[Path]:
    """The corpus modules that are WASI commands (every import from preview1, a _start)."""
    found = []
    for path in _corpus():
        try:
            header = read_header(path.read_bytes())
        except WasmFormatError:
            continue
        if any(e.name == "_start" for e in header.exports) and all(
            i.module == "wasi_snapshot_preview1" for i in header.imports
        ):
            found.append(path)
    return found


# Every command compiled twice costs ~0.3 s each; the suite runs the smallest few.
_SUITE_COMMANDS = int(os.environ.get("WASIHOST_GROWPROBE_COMMANDS", "4"))


@pytest.mark.parametrize(
    "path",
    sorted(_commands(), key=lambda p: p.stat().st_size)[:_SUITE_COMMANDS],
    ids=lambda p: p.name,
)
@pytest.mark.parametrize("memory_bytes", [1 << 30, 2 * 1024 * 1024])
def test_a_corpus_command_runs_alike_once_probed(path: Path, memory_bytes: int) -> None:
    wasm = path.read_bytes()
    probed = probe_refused_grows(wasm, read_header(wasm), validates)
    before, after = _run_command(wasm, memory_bytes), _run_command(probed, memory_bytes)
    if before != after and _run_command(wasm, memory_bytes) != before:
        # Its output differs from run to run (poll_oneoff_stdio prints a HashMap seeded from
        # random_get): only what does not vary is compared.
        before, after = before[::2], after[::2]
    assert after == before
