"""Compile bombs: the code-shape pre-check refuses them before the engine sees them, and what
it admits compiles under a budget, in a worker process the budget kills, never in the host."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import shutil
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.common import ALL_CAPS, FIXTURES, ROOT, bare
from tests.support.guests import build, guest_wat
from wasihost.cli import main
from wasihost.core import codeshape as cs
from wasihost.core.codeshape import CodeShape, CodeShapeError, scan_code
from wasihost.core.errors import AdmissionError, CallError
from wasihost.core.settings import EngineSettings, MiB
from wasihost.core.wasmbin import read_header
from wasihost.engine.compile_worker import FRAME_MAGIC
from wasihost.engine.compiler import (
    IN_PROCESS_MAX_BRANCHES,
    IN_PROCESS_MAX_INDIRECT,
    ModuleCompiler,
)
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

# Beside the checkout, as CI lays it out (tests/wasi/test_wasi_conformance.py finds it the same way).
TESTSUITE = ROOT.parent / "shared" / "wasi-testsuite" / "tests"
HELLO = (FIXTURES / "hello" / "hello.wasm").read_bytes()
LOOP, BLOCK, END, NOP = b"\x03\x40", b"\x02\x40", b"\x0b", b"\x01"
# A fresh worker's interpreter, wasmtime and engine already map ~185 MB; this leaves too little
# for a compile of any size, so a test of the memory budget is quick.
TIGHT_MEMORY = 256 * MiB


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        done = (n == 0 and not b & 0x40) or (n == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


def _sections(wasm: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 8
    while pos < len(wasm):
        sid, pos = wasm[pos], pos + 1
        size = shift = 0
        while True:
            b, pos = wasm[pos], pos + 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append((sid, wasm[pos : pos + size]))
        pos += size
    return out


MARK = 0x5EED0


def with_bodies(base_wat: str, bodies: list[tuple[bytes, bytes]]) -> bytes:
    """``base_wat``'s module with functions of the given raw (locals, code) bodies added.

    wat2wasm cannot be trusted with 100,000 nested loops (it recurses), so each function is
    written in WAT as a placeholder, ``i32.const MARK+k; drop``, and its body swapped for the
    raw bytes in the binary's code section.
    """
    extra = "".join(f"(func i32.const {MARK + k} drop)" for k in range(len(bodies)))
    wasm = build(base_wat.replace("(;BODIES;)", extra))
    out = bytearray(wasm[:8])
    for sid, payload in _sections(wasm):
        section = payload
        if sid == 10:
            for k, (locals_, code) in enumerate(bodies):
                old = b"\x00\x41" + sleb(MARK + k) + b"\x1a\x0b"
                new = locals_ + code + END
                old, new = uleb(len(old)) + old, uleb(len(new)) + new
                assert section.count(old) == 1
                section = section.replace(old, new)
        out += bytes([sid]) + uleb(len(section)) + section
    return bytes(out)


def guest(*bodies: tuple[bytes, bytes]) -> bytes:
    """An ABI guest (it passes static admission) carrying the given extra function bodies."""
    return with_bodies(guest_wat(extra="(;BODIES;)"), list(bodies))


def command(*bodies: tuple[bytes, bytes]) -> bytes:
    """A plain WASI command carrying the given extra function bodies."""
    wat = '(module (memory (export "memory") 1) (func (export "_start")) (;BODIES;))'
    return with_bodies(wat, list(bodies))


def raw_module(count: int) -> bytes:
    """A module of ``count`` empty functions (too many to write as WAT quickly)."""

    def section(sid: int, payload: bytes) -> bytes:
        return bytes([sid]) + uleb(len(payload)) + payload

    codes = b"\x02\x00\x0b" * count
    return (
        b"\x00asm\x01\x00\x00\x00"
        + section(1, b"\x01\x60\x00\x00")
        + section(3, uleb(count) + b"\x00" * count)
        + section(10, uleb(count) + codes)
    )


def last_function(wasm: bytes) -> int:
    """The index of the module's last function (imports come first in the index space)."""
    header = read_header(wasm)
    imported = sum(1 for i in header.imports if i.kind == "func")
    payload = dict(_sections(wasm))[3]
    defined = shift = pos = 0
    while True:
        b = payload[pos]
        defined |= (b & 0x7F) << shift
        shift, pos = shift + 7, pos + 1
        if not b & 0x80:
            return imported + defined - 1


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def many_locals(n: int) -> bytes:
    return b"\x01" + uleb(n) + b"\x7f"


BOMBS = {
    "100,000 nested loops": ((b"\x00", LOOP * 100_000 + END * 100_000), "MAX_CONTROL_DEPTH"),
    # 3 MB in one body: its size is refused before its depth is scanned.
    "1M nested blocks": ((b"\x00", BLOCK * 1_000_000 + END * 1_000_000), "MAX_FUNCTION_BODY"),
    "300,000 nested blocks": ((b"\x00", BLOCK * 300_000 + END * 300_000), "MAX_CONTROL_DEPTH"),
    "3,000 loops one after another": ((b"\x00", (LOOP + END) * 3000), "MAX_LOOPS_PER_FUNCTION"),
    "5,000 locals": ((many_locals(5000), b""), "MAX_LOCALS"),
    "1,000 locals across 300 blocks": (
        (many_locals(1000), (BLOCK + END) * 300),
        "MAX_LOCALS_X_BLOCKS",
    ),
    "a 2 MiB body": ((b"\x00", NOP * (2 * MiB)), "MAX_FUNCTION_BODY_BYTES"),
    "a br_table of 70,000 targets": (
        (b"\x00", BLOCK + b"\x41\x00\x0e" + uleb(70_000) + b"\x00" * 70_001 + END),
        "MAX_BR_TABLE_TARGETS",
    ),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_hostile_shapes_are_refused_quickly_by_the_pre_check(name: str) -> None:
    body, limit = BOMBS[name]
    wasm = guest(body)
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        start = time.perf_counter()
        with pytest.raises(AdmissionError, match=limit) as info:
            host.admit(bare(wasm))
        assert time.perf_counter() - start < 2.0  # the scan stops at the limit it crosses
        assert host.engine.cache.compiles == 0
        assert host.engine.compiler.worker_compiles == 0
    assert info.value.error_class == "admission"
    assert info.value.message.startswith(f"function {last_function(wasm)}: ")


def test_99000_tiny_functions_are_refused_by_count() -> None:
    wasm = raw_module(99_000)
    with Host(Policy(), cache_dir=None) as host:
        start = time.perf_counter()
        with pytest.raises(CodeShapeError, match=r"99000 functions, over 50000 \(MAX_FUNCTIONS\)"):
            host.engine.compile(wasm)
        assert time.perf_counter() - start < 1.0


def test_the_pre_check_admits_every_fixture_and_testsuite_program() -> None:
    modules = glob.glob(str(FIXTURES / "*" / "*.wasm"))
    modules += glob.glob(str(TESTSUITE / "**" / "*.wasm"), recursive=True)
    assert len(modules) >= 18
    for path in modules:
        wasm = Path(path).read_bytes()
        imported = sum(1 for i in read_header(wasm).imports if i.kind == "func")
        shape = scan_code(wasm, imported)
        assert shape.functions > 0, path


# One of every instruction family wasmtime 50 accepts with wasihost's configuration: every
# immediate shape (LEBs, memargs with offsets, lanes, shuffles, br_table, select t,
# try_table's catch clauses) must be skipped exactly, or the depth and counts below drift.
FAMILIES = """(module
  (type $t (func (param i32) (result i32)))
  (type $v (func))
  (memory 1)
  (table 4 funcref)
  (data $d "abc")
  (elem $e func $f)
  (tag $x (param i32))
  (global $g (mut i64) (i64.const -1))
  (func $f (type $t) (local i64 f32 f64 v128 funcref externref)
    local.get 0
    return_call $f)
  (func $g2 (param i32) (result i32)
    local.get 0 i32.const 0 return_call_indirect (type $t))
  (func $all (result i32) (local $r i32) (local v128)
    i32.const -12345 drop  i64.const -9999999999 drop  f32.const 1.5 drop  f64.const -2.25 drop
    i32.const 0 i32.load offset=4 align=2 drop  i32.const 0 i64.const 1 i64.store8 offset=70000
    memory.size drop  i32.const 1 memory.grow drop
    i32.const 0 i32.const 0 i32.const 1 memory.copy  i32.const 0 i32.const 0 i32.const 1 memory.fill
    i32.const 0 i32.const 0 i32.const 1 memory.init $d  data.drop $d
    i32.const 0 table.get 0 drop  i32.const 0 ref.null func table.set 0  table.size 0 drop
    ref.null func i32.const 1 table.grow 0 drop  i32.const 0 ref.null func i32.const 0 table.fill 0
    i32.const 0 i32.const 0 i32.const 0 table.copy 0 0  i32.const 0 i32.const 0 i32.const 0 table.init 0 $e  elem.drop $e
    ref.func $f ref.is_null drop
    i32.const 1 i32.const 2 i32.const 0 select (result i32) drop
    i32.const 0 call_indirect (type $v)
    f32.const 1 i32.trunc_sat_f32_s drop  i32.const 1 i32.extend8_s drop
    v128.const i32x4 1 2 3 4  v128.const i32x4 5 6 7 8  i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 local.set 1
    local.get 1 i32x4.extract_lane 3 drop  local.get 1 i32.const 7 i32x4.replace_lane 1 local.set 1
    i32.const 0 local.get 1 v128.load32_lane offset=8 2 local.set 1  i32.const 0 v128.load32_zero local.set 1
    i32.const 0 v128.load offset=16 local.set 1  i32.const 0 local.get 1 v128.store
    local.get 1 local.get 1 local.get 1 f32x4.relaxed_madd drop
    block $out (result i32)
      loop $l
        i32.const 0
        if
          i32.const 1 br_if $l
        else
          block $b1 block $b2 i32.const 0 br_table $b1 $b2 $b2 end end
        end
      end
      block $h
        try_table (catch_all $h)
          i32.const 5 throw $x
        end
      end
      block $hx (result i32)
        try_table (result i32) (catch $x $hx)
          i32.const 5 throw $x
        end
        drop
        i32.const 3
      end
    end
    drop
    i32.const 0)
)
"""


def test_the_scan_decodes_every_instruction_family() -> None:
    wasm = build(FAMILIES)
    with Host(Policy(), cache_dir=None) as host:
        host.engine.compile(wasm)  # wasmtime accepts it
    shape = scan_code(wasm)
    # $all: the body, block $out, loop, if, two blocks: depth 6; nine blocks, two locals.
    assert (shape.functions, shape.max_depth, shape.loops) == (3, 6, 1)
    assert (shape.max_locals, shape.max_locals_x_blocks) == (6, 18)
    # $all's if, br_if, br_table and two try_tables of one catch each; its table.get, grow,
    # fill, copy, init and call_indirect, and $g2's return_call_indirect (table.set and
    # table.size are cheap and not counted).
    assert (shape.max_branches, shape.indirect) == (7, 7)


@settings(max_examples=100)
@given(st.data())
def test_the_scan_of_any_bytes_returns_a_shape_or_refuses(data: st.DataObject) -> None:
    """Like the codec's invariant: measure, or raise CodeShapeError, never anything else."""
    wasm = bytearray(HELLO)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(8, len(wasm) - 1))
        wasm[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(8, len(wasm)))
    with contextlib.suppress(CodeShapeError):
        scan_code(bytes(wasm[:cut]))


def test_truncated_or_unknown_code_is_refused_by_name() -> None:
    with pytest.raises(CodeShapeError, match="unsupported instruction 0xfe"):
        scan_code(raw_module(1).replace(b"\x02\x00\x0b", b"\x02\x00\xfe"))
    with pytest.raises(CodeShapeError, match="function 0: body is truncated or malformed"):
        scan_code(raw_module(1).replace(b"\x02\x00\x0b", b"\x02\x00\x41"))


def heavy_guest() -> bytes:
    """Within every shape limit, yet a few seconds of compile: three functions each with
    MAX_LOCALS locals all live across nested loops up to MAX_LOCALS_X_BLOCKS."""
    loops = cs.MAX_LOCALS_X_BLOCKS // cs.MAX_LOCALS - 1
    touch = b"".join(b"\x20" + uleb(i) + b"\x21" + uleb(i) for i in range(cs.MAX_LOCALS))
    body = (b"\x01" + uleb(cs.MAX_LOCALS) + b"\x7e", LOOP * loops + touch + END * loops)
    return guest(body, body, body)


def bulky_guest() -> bytes:
    """Within every shape limit, yet ~300 MB to compile: one 300 KB function of `if`s nested
    as deep as MAX_CONTROL_DEPTH allows, again and again."""
    depth = cs.MAX_CONTROL_DEPTH - 1
    nest = b"\x41\x00\x04\x40" * depth + END * depth
    return guest((b"\x00", nest * (300 * 1024 // len(nest))))


def worker_host(**budget: int) -> Host:
    settings = EngineSettings(compile_in_process_max_bytes=0, **budget)
    return Host(Policy(allow=ALL_CAPS), cache_dir=None, settings=settings)


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        ({"compile_cpu_seconds": 1}, "budget of 1 s of CPU time"),
        ({"compile_memory_bytes": TIGHT_MEMORY}, "budget of 256 MiB of memory"),
        ({"compile_timeout_seconds": 1, "compile_cpu_seconds": 60}, "1 s of wall-clock time"),
    ],
)
def test_a_module_over_the_worker_budget_is_refused_by_the_worker(
    budget: dict[str, int], reason: str
) -> None:
    wasm = bulky_guest() if "memory" in reason else heavy_guest()
    scan_code(wasm)  # the pre-check admits it
    with worker_host(**budget) as host:
        start = time.perf_counter()
        with pytest.raises(AdmissionError, match=reason):
            host.admit(bare(wasm))
        # The reason proves which budget stopped it; the time only that it did not run on. A
        # loaded machine (CI beside other jobs) stretches every run, so the bound is loose.
        assert time.perf_counter() - start < 60
        assert host.engine.compiler.worker_compiles == 1


def test_a_worker_compiled_module_runs_and_is_cached_authenticated(tmp_path: Path) -> None:
    wasm = build(guest_wat())
    settings = EngineSettings(compile_in_process_max_bytes=0)
    with Host(Policy(allow=ALL_CAPS), cache_dir=tmp_path, settings=settings) as host:
        assert host.admit(bare(wasm)).call("run") is None
        assert (host.engine.compiler.worker_compiles, host.engine.cache.compiles) == (1, 1)
    with Host(Policy(allow=ALL_CAPS), cache_dir=tmp_path, settings=settings) as host:
        assert host.admit(bare(wasm)).call("run") is None
        assert (host.engine.compiler.worker_compiles, host.engine.cache.disk_hits) == (0, 1)


def test_small_cheap_modules_compile_in_process_and_costly_ones_in_a_worker() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        host.admit(bare(build(guest_wat())))
        assert host.engine.compiler.worker_compiles == 0
        costly = guest((b"\x00", (LOOP + END) * 600))  # small, but over IN_PROCESS_MAX_LOOPS
        host.admit(bare(costly)).call("run")
        assert host.engine.compiler.worker_compiles == 1


IN_PROCESS_LIMITS = {"indirect": IN_PROCESS_MAX_INDIRECT, "branches": IN_PROCESS_MAX_BRANCHES}
TABLE = "(table $tb 1 funcref) (type $t (func (param i32) (result i32)))"


@pytest.mark.parametrize(
    ("unit", "limit"),
    [
        # 6,000 of these in one 59 KB function took 7 s of CPU and 217 MB in-process.
        ("(table.copy $tb $tb (i32.const 0) (i32.const 0) (i32.const 1))", "indirect"),
        ("(drop (call_indirect (type $t) (i32.const 0) (i32.const 0)))", "indirect"),
        ("(if (i32.load (i32.const 64)) (then (nop)))", "branches"),
        # Two each: the try_table and its catch clause.
        ("(block $h (try_table (catch_all $h) (nop)))", "branches"),
    ],
)
def test_small_modules_dense_in_branches_or_table_calls_compile_in_a_worker(
    unit: str, limit: str
) -> None:
    def module(units: int) -> bytes:
        return build(guest_wat(f"{unit * units} (call $ok_null)", extra=TABLE))

    def measure(shape: CodeShape) -> int:
        return shape.indirect if limit == "indirect" else shape.max_branches

    # The skeleton's own dispatch shares the command's function: count from what it has.
    room = IN_PROCESS_LIMITS[limit] - measure(scan_code(module(0)))
    count = room // (measure(scan_code(module(1))) - measure(scan_code(module(0))))
    at_limit, over = module(count), module(count + 1)
    assert measure(scan_code(at_limit)) <= IN_PROCESS_LIMITS[limit] < measure(scan_code(over))
    assert len(over) < EngineSettings().compile_in_process_max_bytes  # small enough otherwise
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        host.admit(bare(at_limit)).close()
        assert host.engine.compiler.worker_compiles == 0
        host.admit(bare(over)).close()
        assert host.engine.compiler.worker_compiles == 1


def test_the_host_checks_the_workers_answer() -> None:
    wasm = build(guest_wat())
    with Host(Policy(), cache_dir=None) as host:
        compiler: ModuleCompiler = host.engine.compiler
        header = b'{"options": {}}'
        artifact = b"native code"
        good = (
            FRAME_MAGIC
            + hashlib.sha256(header).digest()
            + hashlib.sha256(wasm).digest()
            + struct.pack(">Q", len(artifact))
            + hashlib.sha256(artifact).digest()
            + artifact
        )
        assert compiler._check_artifact(0, good, b"", header, wasm) == artifact
        bad = [
            good[:-1],  # truncated
            good[:-1] + b"X",  # altered
            good.replace(hashlib.sha256(wasm).digest(), bytes(32)),  # another module's
            good.replace(hashlib.sha256(header).digest(), bytes(32)),  # another request's
            b"garbage",
        ]
        for out in bad:
            with pytest.raises(CallError, match="compile worker's answer"):
                compiler._check_artifact(0, out, b"", header, wasm)
        with pytest.raises(CallError, match="worker failed"):
            compiler._check_artifact(1, good, b"boom\n", header, wasm)


def test_the_cli_reports_a_refused_module_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = (b"\x00", LOOP * 100_000 + END * 100_000)
    bomb = tmp_path / "bomb.wasm"
    bomb.write_bytes(guest(body))
    code, _, err = run_cli(capsys, "run", str(bomb), "run", "--no-cache")
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: admission: function ") and "MAX_CONTROL_DEPTH" in err
    wasi_bomb = tmp_path / "wasi-bomb.wasm"
    wasi_bomb.write_bytes(command(body))
    code, _, err = run_cli(capsys, "wasi", "--no-cache", str(wasi_bomb))
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "admission" in err and "MAX_CONTROL_DEPTH" in err


def _bomb_package(tmp_path: Path) -> Path:
    """The hello package with its module swapped for one over a shape limit."""
    folder = tmp_path / "bomb"
    shutil.copytree(FIXTURES / "hello", folder, ignore=shutil.ignore_patterns("target", "src"))
    body, _ = BOMBS["100,000 nested loops"]
    (folder / "hello.wasm").write_bytes(guest(body))
    return folder


def test_inspect_and_install_refuse_what_load_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = _bomb_package(tmp_path)
    code, out, _ = run_cli(capsys, "inspect", str(bomb))
    assert code == 1 and "MAX_CONTROL_DEPTH" in out
    with (
        Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=tmp_path / "state") as host,
        pytest.raises(AdmissionError, match="MAX_CONTROL_DEPTH"),
    ):
        host.install(bomb)
