"""WASI host calls that do work in proportion to a guest-declared length check the destination
and the price first, and blocking host calls wait on something the host's interrupt wakes.
Each through the real engine, with hand-written guests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.common import bare, run_in_thread
from tests.support.guests import build
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.core.serving import ProfileBinding
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import Mount, WasiBinding, WasiOptions, capabilities_for
from wasihost.wasi.fds import Descriptor, HostDescriptor, StdinDescriptor
from wasihost.wasi.registry import PROFILE

MIB = 1 << 20
# Enough for the guest's few instructions and a host call's base price, far from 1 MiB of bytes.
SMALL_FUEL = 20_000

# fd_read(0) of 1 MiB into [1024, +1 MiB): the iovec at 0, nread at 16.
READ_STDIN = f"""(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 17)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const {MIB}))
    (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 16)))))"""

# path_open(3, "big") for reading (fd at 400), then fd_read of 1 MiB into [1024, +1 MiB).
READ_FILE = f"""(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 17)
  (data (i32.const 100) "big")
  (func (export "_start")
    (if (i32.ne (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 3)
                  (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 400))
                (i32.const 0))
      (then unreachable))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const {MIB}))
    (drop (call $read (i32.load (i32.const 400)) (i32.const 0) (i32.const 1) (i32.const 16)))))"""

RANDOM = f"""(module
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (memory (export "memory") 17)
  (func (export "_start")
    (drop (call $random (i32.const 1024) (i32.const {MIB})))))"""

# Says "z" on stdout (the test's cue), then waits in poll_oneoff on one relative monotonic clock
# subscription of 60 s (userdata 7) at 0; its event at 64.
SLEEP_60S = """(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 200) "z")
  (func (export "_start")
    (i32.store (i32.const 300) (i32.const 200))
    (i32.store (i32.const 304) (i32.const 1))
    (drop (call $write (i32.const 1) (i32.const 300) (i32.const 1) (i32.const 310)))
    (i64.store (i32.const 0) (i64.const 7))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 60000000000))
    (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))))"""


def _host(config: WasiOptions, on_binding: Callable[[WasiBinding], None] | None = None) -> Host:
    """A Host serving ``config``; ``on_binding`` sees each instance's WASI state before the
    guest starts."""

    def factory(ext: Extension) -> ProfileBinding:
        binding = WasiBinding.for_extension(config, ext)
        if on_binding is not None:
            on_binding(binding)
        return binding

    caps = capabilities_for(config)
    return Host(Policy(allow=caps), cache_dir=None, profiles=[(PROFILE, factory)])


def _stdin_keeper() -> tuple[list[StdinDescriptor], Callable[[WasiBinding], None]]:
    """A list that receives each instance's stdin descriptor, and the hook that fills it."""
    stdin: list[StdinDescriptor] = []

    def keep_stdin(binding: WasiBinding) -> None:
        desc = binding.state.fds.get(0)
        assert isinstance(desc, StdinDescriptor)
        stdin.append(desc)

    return stdin, keep_stdin


def test_a_big_stdin_read_without_the_fuel_reads_nothing() -> None:
    config = WasiOptions(stdin=b"s" * (2 * MIB), stdout=lambda data: None)
    stdin, keep_stdin = _stdin_keeper()
    with _host(config, keep_stdin) as host:
        ext = host.admit(bare(build(READ_STDIN)), grants=capabilities_for(config), fuel=SMALL_FUEL)
        with pytest.raises(CallError) as caught:
            ext.run_command()
    assert caught.value.failure is FailureClass.OUT_OF_FUEL
    assert stdin[0].pos == 0  # nothing was read: the offset did not move


def test_a_big_file_read_without_the_fuel_leaves_the_offset(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"f" * (2 * MIB))
    config = WasiOptions(mounts=[Mount(tmp_path, "/data")])
    offsets: list[int] = []  # host descriptors sharing each opened file's offset

    def watch_opens(binding: WasiBinding) -> None:
        fds = binding.state.fds
        insert = fds.insert

        def keep_a_twin(desc: Descriptor) -> int:
            if isinstance(desc, HostDescriptor) and not desc.is_dir:
                offsets.append(os.dup(desc.fd))
            return insert(desc)

        fds.insert = keep_a_twin  # type: ignore[method-assign]

    with _host(config, watch_opens) as host:
        ext = host.admit(bare(build(READ_FILE)), grants=capabilities_for(config), fuel=SMALL_FUEL)
        with pytest.raises(CallError) as caught:
            ext.run_command()
    assert caught.value.failure is FailureClass.OUT_OF_FUEL
    assert len(offsets) == 1
    try:
        assert os.lseek(offsets[0], 0, os.SEEK_CUR) == 0  # nothing was read
    finally:
        os.close(offsets[0])


def test_a_big_random_get_without_the_fuel_makes_no_bytes() -> None:
    config = WasiOptions(random=True)
    made: list[int] = []

    def spy_on_random(binding: WasiBinding) -> None:
        source = binding.state.random
        assert source is not None

        def counted(n: int) -> bytes:
            made.append(n)
            return source(n)

        binding.state.random = counted

    with _host(config, spy_on_random) as host:
        caps = capabilities_for(config)
        ext = host.admit(bare(build(RANDOM)), grants=caps, fuel=SMALL_FUEL)
        with pytest.raises(CallError) as caught:
            ext.run_command()
        assert caught.value.failure is FailureClass.OUT_OF_FUEL
        assert made == []  # no random bytes were made, none written into guest memory
        # With the fuel, the same guest gets its megabyte.
        rich = host.admit(bare(build(RANDOM), "rich.wasm"), grants=caps, fuel=10_000_000)
        assert rich.run_command() == 0
        assert made == [MIB]


def test_disable_wakes_a_guest_sleeping_in_poll_oneoff() -> None:
    """A guest asleep in poll_oneoff(60 s) under a 4 s deadline, disabled after 0.2 s, ends at
    once (before: at its 4 s deadline), reported as revoked."""
    about_to_sleep = threading.Event()
    config = WasiOptions(clock="standard", stdout=lambda data: about_to_sleep.set())
    with _host(config) as host:
        ext = host.admit(
            bare(build(SLEEP_60S)), grants=capabilities_for(config), fuel=10_000_000,
            timeout_ms=4000,
        )  # fmt: skip
        worker, outcome = run_in_thread(ext.run_command)
        assert about_to_sleep.wait(10)
        time.sleep(0.2)  # the guest is asleep in poll_oneoff by now
        disabled = time.monotonic()
        host.disable(ext.id, "test")
        worker.join(5)
        ended = time.monotonic() - disabled
        assert not worker.is_alive()
    assert ended < 0.5, f"the sleeping call ended {ended:.2f} s after the disable"
    assert len(outcome) == 1 and isinstance(outcome[0], ExtensionRevoked), outcome


# fd_read(0) of 8 bytes into [1024, +8), with the nread slot far outside memory.
READ_STDIN_WILD_RESULT = """(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 8))
    (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 0x7ffffff0)))))"""

# path_open(3, "out") for writing (fd at 400), then fd_write of "hello" with a wild nwritten.
WRITE_FILE_WILD_RESULT = """(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "out")
  (data (i32.const 200) "hello")
  (func (export "_start")
    (if (i32.ne (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 3)
                  (i32.const 1) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 400))
                (i32.const 0))
      (then unreachable))
    (i32.store (i32.const 0) (i32.const 200))
    (i32.store (i32.const 4) (i32.const 5))
    (drop (call $write (i32.load (i32.const 400)) (i32.const 0) (i32.const 1)
                       (i32.const 0x7ffffff0)))))"""


def test_a_read_with_a_wild_result_slot_consumes_nothing() -> None:
    config = WasiOptions(stdin=b"s" * 64, stdout=lambda data: None)
    stdin, keep_stdin = _stdin_keeper()
    with _host(config, keep_stdin) as host:
        ext = host.admit(bare(build(READ_STDIN_WILD_RESULT)), grants=capabilities_for(config))
        with pytest.raises(CallError) as caught:
            ext.run_command()
    assert caught.value.failure is FailureClass.PROTOCOL
    assert stdin[0].pos == 0  # before: the 8 bytes were consumed, then the call faulted


def test_a_write_with_a_wild_result_slot_writes_nothing(tmp_path: Path) -> None:
    config = WasiOptions(mounts=[Mount(tmp_path, "/data", writable=True)])
    with _host(config) as host:
        ext = host.admit(bare(build(WRITE_FILE_WILD_RESULT)), grants=capabilities_for(config))
        with pytest.raises(CallError) as caught:
            ext.run_command()
    assert caught.value.failure is FailureClass.PROTOCOL
    assert (tmp_path / "out").read_bytes() == b""  # before: "hello" landed, then the fault
