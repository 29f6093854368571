"""fd_write's engine shortcut (``guestmem.WriteRoute``): a one-iovec write to an output
descriptor goes from guest memory to its sink without the handler, through a table of sinks the
descriptor table keeps in step. Proven through the real engine with WAT guests: the table
follows renumbering, rights dropped and closing, and the shortcut keeps every range check."""

from __future__ import annotations

import errno

import pytest
import wasmtime
from wasi_support import run_wasihost

from wasihost.errors import CallError, FailureClass
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
