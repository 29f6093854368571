"""The second attack on growprobe (issue 28 item 25's rewrite of a plain command's
``memory.grow``): a rewrite of untrusted code must not make a module the engine refuses one it
accepts, nor the reverse, and the guest must not be able to write what the host reads as a
refused grow."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.support.guests import build
from tests.support.wasi import CACHE_DIR, run_wasihost, validates
from wasihost.cli.wasi_command import parse_args, run
from wasihost.core.codeshape import MAX_FUNCTION_BODY_BYTES, MAX_FUNCTIONS, scan_module
from wasihost.core.errors import AdmissionError, CallError
from wasihost.core.growprobe import GROW_REFUSED_EXPORT, probe_refused_grows
from wasihost.core.wasmbin import MAX_TYPE_VALUES, read_header

MiB = 1024 * 1024


def _module(*sections: tuple[int, bytes]) -> bytes:
    out = b"\x00asm\x01\x00\x00\x00"
    for sid, payload in sections:
        out += bytes([sid, len(payload)]) + payload
    return out


def _start_module(body: bytes) -> bytes:
    """One ``() -> ()`` function exported as ``_start``, one memory page, ``body`` its code
    (no locals; ``body`` ends with its ``end``). Hand-framed: wat2wasm refuses what these
    bodies do."""
    code = b"\x00" + body
    return _module(
        (1, b"\x01\x60\x00\x00"),
        (3, b"\x01\x00"),
        (5, b"\x01\x00\x01"),
        (7, b"\x02\x06_start\x00\x00\x06memory\x02\x00"),
        (10, bytes([1, len(code)]) + code),
    )


# A module with no global writes global 0 and calls function 1, neither of which it has: both
# are the indices the probe's global and function would take.
_GROW = b"\x41\x01\x40\x00\x1a"  # i32.const 1; memory.grow 0; drop
INVALID_INDEX_MODULES = {
    "global.set of the probe's global": _start_module(b"\x42\x05\x24\x00" + _GROW + b"\x0b"),
    "call of the probe's function": _start_module(b"\x41\x7f\x10\x01\x1a" + _GROW + b"\x0b"),
}


@pytest.mark.parametrize("name", sorted(INVALID_INDEX_MODULES))
def test_a_module_naming_the_probes_indices_stays_invalid(name: str) -> None:
    """The probe's function and global take the next free indices: a module that (invalidly)
    named them validated once rewritten, its `global.set` then forging a refusal."""
    wasm = INVALID_INDEX_MODULES[name]
    assert not validates(wasm)
    assert probe_refused_grows(wasm, read_header(wasm), validates) == wasm


def test_a_module_naming_the_probes_global_is_refused_at_admission() -> None:
    wasm = INVALID_INDEX_MODULES["global.set of the probe's global"]
    with pytest.raises(AdmissionError, match="does not validate"):
        run_wasihost(wasm, max_memory_bytes=MiB)


def test_a_64_bit_memory_is_left_as_it_is() -> None:
    """memory.grow of a 64-bit memory takes and answers an i64: the probe's (i32) -> i32
    made a valid module one that failed to validate ("type mismatch"). Admission refuses
    64-bit memories, so the probe leaves them alone rather than rewrite them."""
    wat = """(module (memory (export "memory") i64 1 100)
      (func (export "_start") (drop (memory.grow (i64.const 2)))))"""
    wasm = build(wat)
    assert validates(wasm)
    assert probe_refused_grows(wasm, read_header(wasm), validates) == wasm


def test_a_rewrite_the_engine_would_refuse_is_not_kept() -> None:
    """Whatever the probe gets wrong, the validator has the last word: a module that
    validates is never made one that does not (here, a validator refusing every rewrite)."""
    wasm = build('(module (memory 1) (func (export "_start") (drop (memory.grow (i32.const 1)))))')
    assert probe_refused_grows(wasm, read_header(wasm), lambda b: b == wasm) == wasm


def test_a_guest_exporting_the_probes_name_cannot_forge_a_refusal() -> None:
    """A module exporting the probe's name is not probed; the host still read that export
    after a failed run, so the guest's own global named any refusal it liked."""
    wat = f"""(module (memory (export "memory") 1)
      (global (export "{GROW_REFUSED_EXPORT}") (mut i64) (i64.const 0))
      (func (export "_start")
        (global.set 0 (i64.const 123456))
        (drop (memory.grow (i32.const 1)))
        unreachable))"""
    with pytest.raises(CallError) as caught:
        run_wasihost(build(wat), max_memory_bytes=MiB)
    assert caught.value.hint is None or "memory.grow" not in caught.value.hint
    exits = wat.replace(
        "(module", '(module (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))'
    ).replace("unreachable", "(call $exit (i32.const 1))")
    result = run_wasihost(build(exits), max_memory_bytes=MiB)
    assert result.code == 1
    assert result.ext is not None and result.ext.last_refused_memory_bytes is None


def test_a_module_at_the_function_limit_is_not_pushed_over_it() -> None:
    """Admission's shape scan allows MAX_FUNCTIONS functions; the probe's one more made a
    module admission accepts one it refused ("module defines 50001 functions")."""
    wasm = _functions_module(MAX_FUNCTIONS, b"\x00" + _GROW + b"\x0b")
    header = read_header(wasm)
    scan_module(header, wasm)  # admitted as it is
    assert validates(wasm)
    probed = probe_refused_grows(wasm, header, validates)
    scan_module(read_header(probed), probed)
    assert probed == wasm


def _functions_module(functions: int, first_body: bytes) -> bytes:
    """A command of ``functions`` functions of type () -> (), the first (its ``_start``) with
    ``first_body``, the rest empty, and one page of memory."""
    empty_body = b"\x00\x0b"
    code = _leb(functions) + _leb(len(first_body)) + first_body
    code += (bytes([len(empty_body)]) + empty_body) * (functions - 1)
    return _module(
        [
            (1, b"\x01\x60\x00\x00"),
            (3, _leb(functions) + b"\x00" * functions),
            (5, b"\x01\x00\x01"),
            (7, b"\x02\x06_start\x00\x00\x06memory\x02\x00"),
            (10, code),
        ]
    )


def _module(sections: list[tuple[int, bytes]]) -> bytes:
    """A module of ``sections`` (id, payload), in the order given."""
    return b"\x00asm\x01\x00\x00\x00" + b"".join(
        bytes([sid]) + _leb(len(payload)) + payload for sid, payload in sections
    )


def _leb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_a_body_at_its_byte_limit_is_not_pushed_over_it() -> None:
    """A call of function 128 or later takes three bytes where `memory.grow 0` took two: a
    body of MAX_FUNCTION_BODY_BYTES with grows in it came out over the limit."""
    functions = 200  # the probe's function is number 200: a two-byte LEB index
    grow = b"\x41\x00\x40\x00\x1a"  # i32.const 0; memory.grow 0; drop
    body = b"\x00" + grow * 1000
    body += b"\x01" * (MAX_FUNCTION_BODY_BYTES - len(body) - 1) + b"\x0b"  # nops, end
    wasm = _functions_module(functions, body)
    header = read_header(wasm)
    scan_module(header, wasm)
    assert validates(wasm)
    probed = probe_refused_grows(wasm, header, validates)
    scan_module(read_header(probed), probed)
    assert probed == wasm


def test_a_module_at_the_header_scans_limits_is_not_pushed_over_them() -> None:
    """The header scan allows MAX_TYPE_VALUES value types in all; the probe's (i32) -> i32
    adds two, and a module at the limit was refused once rewritten."""
    wide = b"\x60" + _leb(1000) + b"\x7f" * 1000 + b"\x00"  # 1,000 i32 params, no result
    types = MAX_TYPE_VALUES // 1000
    body = b"\x00" + _GROW + b"\x0b"
    sections = [
        (1, _leb(types + 1) + b"\x60\x00\x00" + wide * types),
        (3, b"\x01\x00"),
        (5, b"\x01\x00\x01"),
        (7, b"\x02\x06_start\x00\x00\x06memory\x02\x00"),
        (10, b"\x01" + bytes([len(body)]) + body),
    ]
    wasm = _module(sections)
    header = read_header(wasm)
    assert validates(wasm)
    probed = probe_refused_grows(wasm, header, validates)
    read_header(probed)
    assert probed == wasm


@pytest.mark.parametrize(
    ("memory", "delta", "reason"),
    [
        ("1 2", 5, f"the module declares a maximum of {2 * 65536} bytes"),
        ("1", 65536, f"past the {4 * 1024 * MiB} bytes a 32-bit memory can hold"),
    ],
)
def test_a_grow_refused_whatever_the_limit_does_not_blame_the_limit(
    memory: str, delta: int, reason: str
) -> None:
    """A grow past the module's own declared maximum, or past wasm32's 4 GiB, is refused
    whatever the limit: the hint named the limit anyway ("grow to 393216 bytes was refused:
    its linear memory is limited to 1073741824 bytes") and told the user to raise it."""
    wat = f"""(module (memory (export "memory") {memory})
      (func (export "_start")
        (if (i32.eq (memory.grow (i32.const {delta})) (i32.const -1)) (then unreachable))))"""
    with pytest.raises(CallError) as caught:
        run_wasihost(build(wat))
    asked = (1 + delta) * 65536
    assert caught.value.hint == f"the program's memory.grow to {asked} bytes was refused: {reason}"
    module = Path(tempfile.mkdtemp()) / "grow.wasm"
    module.write_bytes(build(wat))
    with pytest.raises(CallError) as by_cli:
        run(parse_args(["--cache-dir", str(CACHE_DIR), str(module)]))
    assert by_cli.value.hint == f"the program's memory.grow to {asked} bytes was refused: {reason}"
