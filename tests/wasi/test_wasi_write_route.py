"""fd_write's engine shortcut (``guestmem.WriteRoute``): a one-iovec write to an output
descriptor goes from guest memory to its sink without the handler, through a table of sinks the
descriptor table keeps in step. Proven through the real engine with WAT guests: the table
follows renumbering, rights dropped and closing, and the shortcut keeps every range check."""

from __future__ import annotations

import errno

import pytest
import wasmtime

from tests.support.wasi import run_wasihost
from wasihost.core.errors import CallError, FailureClass
from wasihost.wasi import WasiOptions
from wasihost.wasi.errno import Errno

_IMPORTS = """
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $renumber (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_fdstat_set_rights"
    (func $set_rights (param i32 i64 i64) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "a\\n")
  (data (i32.const 200) "\\64\\00\\00\\00\\02\\00\\00\\00")
  (data (i32.const 208) "\\ff\\ff\\00\\00\\02\\00\\00\\00")
  (data (i32.const 216) "\\90\\01\\00\\00\\40\\00\\00\\00")
  (data (i32.const 400) "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\\n")
"""

# Each step's errno lands in the exit code, one decimal digit per step (BADF is 8).
_STEPS = (
    _IMPORTS
    + """
  (func (export "_start") (local $code i32)
    ;; 1: stdout, through the shortcut
    (local.set $code (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300)))
    ;; 2: stderr moved onto fd 1: fd 1 now writes to stderr's sink, fd 2 is gone
    (drop (call $renumber (i32.const 2) (i32.const 1)))
    (local.set $code (i32.add (i32.mul (local.get $code) (i32.const 10))
      (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300))))
    (local.set $code (i32.add (i32.mul (local.get $code) (i32.const 10))
      (call $write (i32.const 2) (i32.const 200) (i32.const 1) (i32.const 300))))
    ;; 3: the write right dropped: nothing written
    (drop (call $set_rights (i32.const 1) (i64.const 0) (i64.const 0)))
    (local.set $code (i32.add (i32.mul (local.get $code) (i32.const 10))
      (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300))))
    ;; 4: closed
    (drop (call $close (i32.const 1)))
    (local.set $code (i32.add (i32.mul (local.get $code) (i32.const 10))
      (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300))))
    (call $exit (local.get $code)))
"""
)


def test_the_sink_table_follows_renumber_rights_and_close() -> None:
    run = run_wasihost(bytes(wasmtime.wat2wasm(_STEPS)))
    badf = int(Errno.BADF)
    assert run.code == badf * 100 + badf * 10 + badf
    assert run.stdout == b"a\n"
    assert run.stderr == b"a\n"


def test_a_closed_stdout_takes_no_more_writes() -> None:
    body = """
  (func (export "_start")
    (drop (call $close (i32.const 1)))
    (call $exit (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300))))
"""
    run = run_wasihost(bytes(wasmtime.wat2wasm(_IMPORTS + body)))
    assert (run.code, run.stdout) == (int(Errno.BADF), b"")


def _wild(iovs: int, nwritten: int) -> bytes:
    # A good line first, so that the wild one meets the memory view the engine already holds.
    body = f"""
  (func (export "_start")
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300)))
    (drop (call $write (i32.const 1) (i32.const {iovs}) (i32.const 1) (i32.const {nwritten})))
    (call $exit (i32.const 0)))
"""
    return bytes(wasmtime.wat2wasm(_IMPORTS + body))


@pytest.mark.parametrize(
    ("iovs", "nwritten"),
    [
        (65536 - 4, 300),  # the iovec itself past the end of memory
        (200, 65536 - 2),  # the count's slot past the end
        (200, 0xFFFF_FFFF),  # a count pointer that wraps as an i32
        (0xFFFF_FFF8, 300),  # an iovec pointer that wraps
        (208, 300),  # the bytes the iovec names run past the end
    ],
)
def test_a_wild_pointer_faults_before_any_output(iovs: int, nwritten: int) -> None:
    out = bytearray()
    config = WasiOptions(stdout=out.extend)
    with pytest.raises(CallError) as info:
        run_wasihost(_wild(iovs, nwritten), config=config)
    assert info.value.failure is FailureClass.PROTOCOL
    assert out == b"a\n"


# A line to stderr first (it meets no memory view yet, so it takes the general way), then the
# line to stdout whose errno is the exit code: the shortcut's.
_WRITE_AND_EXIT = _IMPORTS + """
  (func (export "_start")
    (drop (call $write (i32.const 2) (i32.const 200) (i32.const 1) (i32.const 300)))
    (call $exit (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300))))
"""


def test_a_failing_sink_is_answered_as_the_handler_answers_it() -> None:
    # An OSError of the caller's sink is the guest's errno (EPIPE for a closed pipe), through
    # the shortcut as through the handler; any other exception is a host error, never guest
    # data, and ends the run.
    def broken(data: bytes) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    run = run_wasihost(
        bytes(wasmtime.wat2wasm(_WRITE_AND_EXIT)), config=WasiOptions(stdout=broken)
    )
    assert run.code == int(Errno.PIPE)

    def failing(data: bytes) -> None:
        raise RuntimeError("/secret/host/path")

    with pytest.raises(CallError) as info:
        run_wasihost(bytes(wasmtime.wat2wasm(_WRITE_AND_EXIT)), config=WasiOptions(stdout=failing))
    assert info.value.failure is FailureClass.HOST_ERROR


def test_the_shortcut_charges_what_the_handler_charged() -> None:
    # fd_write's price: its base plus one fuel unit per byte moved (the line, the iovec, the
    # count), the same through the shortcut as through the general dispatch. The first write
    # of a run meets no memory view yet and goes the general way; the second is the shortcut's.
    from wasihost.wasi.registry import FUNCTIONS_BY_NAME

    entry = FUNCTIONS_BY_NAME["fd_write"]
    write = "(drop (call $write (i32.const 1) (i32.const 216) (i32.const 1) (i32.const 300)))"
    line = b"0123456789abcdef" * 3 + b"0123456789abcde\n"
    fuel = []
    for writes in (1, 2):
        body = f'(func (export "_start") {write * writes} (call $exit (i32.const 0)))'
        run = run_wasihost(bytes(wasmtime.wat2wasm(_IMPORTS + body)))
        assert run.ext is not None and run.stdout == line * writes
        fuel.append(run.ext.last_fuel_used)
    # What is left over is the guest's own few instructions around the call.
    moved = len(line) + 12
    assert fuel[1] - fuel[0] - entry.fuel_base - entry.fuel_per_byte * moved in range(0, 8)


# Hostile iovecs, each after a good line (so that the shortcut holds its memory view): the
# shortcut takes none of them, and each gets what the handler answers. Memory is 18 pages, so a
# write of more than the 1 MiB cap fits in it. The exit code is errno * 2**24 + the count the
# guest was told.
_HOSTILE = """
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 18)
  (data (i32.const 100) "a\\n")
  (data (i32.const 200) "\\64\\00\\00\\00\\02\\00\\00\\00")
  (func (export "_start") (local $errno i32)
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300)))
    (i32.store (i32.const 300) (i32.const 0))
    (i32.store (i32.const 400) (i32.const {buf0}))
    (i32.store (i32.const 404) (i32.const {len0}))
    (i32.store (i32.const 408) (i32.const {buf1}))
    (i32.store (i32.const 412) (i32.const {len1}))
    (local.set $errno (call $write (i32.const 1) (i32.const 400) (i32.const {count})
      (i32.const 300)))
    (call $exit (i32.add (i32.shl (local.get $errno) (i32.const 24))
      (i32.load (i32.const 300)))))
"""
_MIB = 1 << 20
_MEMORY = 18 * 65536


def _hostile(buf0: int, len0: int, count: int = 1, buf1: int = 0, len1: int = 0) -> bytes:
    text = _HOSTILE.format(buf0=buf0, len0=len0, buf1=buf1, len1=len1, count=count)
    return bytes(wasmtime.wat2wasm(text))


@pytest.mark.parametrize(
    ("buf", "length"),
    [
        (0xFFFF_FF00, 0x200),  # buf + len wraps past 2**32 to a small address
        # a length whose sum wraps below the buffer; clamped to the 1 MiB cap, still past the end
        (_MEMORY - 0x100, 0xFFFF_FFF8),
        (_MEMORY - 8, 16),  # starts inside, ends past the end
        (_MEMORY, 0),  # empty, but at the end of memory: inside (nothing to read)
    ],
)
def test_a_wrapping_or_outside_iovec_faults_or_writes_nothing(buf: int, length: int) -> None:
    out = bytearray()
    config = WasiOptions(stdout=out.extend)
    if length == 0:
        run = run_wasihost(_hostile(buf, length), config=config)
        assert (run.code, out) == (0, bytearray(b"a\n"))
        return
    with pytest.raises(CallError) as info:
        run_wasihost(_hostile(buf, length), config=config)
    assert info.value.failure is FailureClass.PROTOCOL
    assert out == b"a\n"


def test_too_many_iovecs_are_refused_before_any_is_read() -> None:
    # 1025 iovecs (over MAX_IOVECS) at an address where 1025 of them would run past memory:
    # INVAL, nothing read, nothing written.
    out = bytearray()
    run = run_wasihost(_hostile(100, 2, count=1025), config=WasiOptions(stdout=out.extend))
    assert (run.code >> 24, run.code & 0xFF_FFFF) == (int(Errno.INVAL), 0)
    assert out == b"a\n"


@pytest.mark.parametrize(
    ("buf0", "len0", "count", "buf1", "len1", "written"),
    [
        (0, _MIB + 1, 1, 0, 0, _MIB),  # one iovec over the cap: a short write of the cap
        (0, _MIB - 10, 2, 0, 100, _MIB),  # two whose total is over it: the same
        (0, 5000, 1, 0, 0, 5000),  # a long line (past the shortcut's copy size): all of it
        (0, 0, 0, 0, 0, 0),  # no iovec at all: nothing
    ],
)
def test_long_and_multiple_iovecs_write_what_the_handler_writes(
    buf0: int, len0: int, count: int, buf1: int, len1: int, written: int
) -> None:
    out = bytearray()
    run = run_wasihost(
        _hostile(buf0, len0, count, buf1, len1), config=WasiOptions(stdout=out.extend)
    )
    assert run.code == written  # errno 0, the count told to the guest
    assert len(out) == 2 + written


_GROWN = _IMPORTS + """
  (func (export "_start")
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300)))
    ;; a second page, and a line and its iovec in it: past the view the shortcut holds
    (drop (memory.grow (i32.const 1)))
    (i32.store (i32.const 70000) (i32.const 0x0a626262))
    (i32.store (i32.const 70008) (i32.const 70000))
    (i32.store (i32.const 70012) (i32.const 4))
    (drop (call $write (i32.const 1) (i32.const 70008) (i32.const 1) (i32.const 70016)))
    (drop (call $write (i32.const 1) (i32.const 70008) (i32.const 1) (i32.const 70016)))
    (call $exit (i32.load (i32.const 70016))))
"""


def test_lines_in_memory_grown_during_the_run_are_written() -> None:
    run = run_wasihost(bytes(wasmtime.wat2wasm(_GROWN)))
    assert (run.code, run.stdout) == (4, b"a\nbbb\nbbb\n")


_FROM_START = _IMPORTS + """
  (func $init
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300))))
  (start $init)
  (func (export "_start")
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300)))
    (call $exit (i32.load (i32.const 300))))
"""


def test_a_line_from_the_start_function_is_written_before_the_memory_is_bound() -> None:
    # The start function runs during instantiation, before the instance holds its memory: the
    # shortcut sees no memory (size 0) and the general way serves it, looking memory up by name.
    run = run_wasihost(bytes(wasmtime.wat2wasm(_FROM_START)))
    assert (run.code, run.stdout) == (2, b"a\na\n")
