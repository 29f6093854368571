"""The host's view of guest memory, through the real engine: every access a native broker makes
agrees with the memory's contents and faults exactly outside it, before and after the guest
grows its memory, whatever the pointers.

A probe profile gives the guest two entries: ``arg(i)`` hands it the test's values, and
``probe(kind, ptr, len)`` makes one access through the broker's ``GuestMemory``. The guest
fills its memory with a known pattern, makes a first access (so the host builds its view at the
initial size), optionally grows, refills, and makes the access under test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.common import bare, native_entry
from tests.support.guests import build
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.guestmem import GuestMemory
from wasihost.core.registry import HostFunction, Profile
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

MODULE = "probe_preview1"
PAGE = 65536
READ, READ_U32, READ_U64, READ_IOVEC, WRITE, TAKE_IOVEC = range(6)
# Where TAKE_IOVEC writes its count: always inside memory, so only the iovec can fault.
COUNT_AT = 8


def _entry(name: str, params: tuple[str, ...], results: tuple[str, ...]) -> HostFunction:
    return native_entry(MODULE, name, params, results, "probe", fuel_base=1, fuel_per_byte=0)


PROFILE = Profile(
    name="probe",
    module=MODULE,
    functions=(
        _entry("arg", ("i32",), ("i64",)),
        _entry("probe", ("i32", "i32", "i32"), ("i32",)),
    ),
)


def pattern(addr: int) -> int:
    return (addr * 7 + 3) & 0xFF


class Probe:
    """The test's side: the values handed to the guest, and what the accesses saw."""

    args: tuple[int, ...] = ()
    seen: list[Any] = []  # noqa: RUF012 (reset per example)
    counts: list[int] = []  # noqa: RUF012 (reset per example)


class ProbeBinding:
    def __init__(self, ext: Extension) -> None:
        pass

    def handler(self, e: HostFunction) -> Callable[..., Any]:
        def arg(mem: GuestMemory, index: int) -> int:
            return Probe.args[index]

        def probe(mem: GuestMemory, kind: int, ptr: int, length: int) -> int:
            if kind == READ:
                Probe.seen.append(mem.read(ptr, length))
            elif kind == READ_U32:
                Probe.seen.append(mem.read_u32(ptr))
            elif kind == READ_U64:
                Probe.seen.append(mem.read_u64(ptr))
            elif kind == READ_IOVEC:
                Probe.seen.append(mem.read_iovec(ptr, length))
            elif kind == TAKE_IOVEC:
                data = mem.take_iovec(ptr, length, COUNT_AT)
                Probe.seen.append(data)
                Probe.counts.append(mem.read_u32(COUNT_AT))
            else:
                mem.write(ptr, bytes(pattern(ptr + i) ^ 0xFF for i in range(length)))
                Probe.seen.append(None)
            return 0

        return {"arg": arg, "probe": probe}[e.name]

    def close(self) -> None:
        pass


def guest(pages: int) -> bytes:
    """Fills memory with the pattern, probes (0, 1), grows by arg(3) pages, refills, probes
    (arg(0), arg(1), arg(2)) as (kind, ptr, len), then checks that a WRITE landed where the guest
    sees it."""
    return build(f"""(module
      (import "{MODULE}" "arg" (func $arg (param i32) (result i64)))
      (import "{MODULE}" "probe" (func $probe (param i32 i32 i32) (result i32)))
      (memory (export "memory") {pages})
      (func $fill (local $i i32) (local $end i32)
        (local.set $end (i32.mul (memory.size) (i32.const {PAGE})))
        (loop $l
          (i32.store8 (local.get $i)
            (i32.add (i32.mul (local.get $i) (i32.const 7)) (i32.const 3)))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $l (i32.lt_u (local.get $i) (local.get $end)))))
      (func (export "_start")
        (call $fill)
        (drop (call $probe (i32.const {READ}) (i32.const 0) (i32.const 1)))
        (if (i32.lt_s (memory.grow (i32.wrap_i64 (call $arg (i32.const 3)))) (i32.const 0))
          (then unreachable))
        (call $fill)
        (drop (call $probe (i32.wrap_i64 (call $arg (i32.const 0)))
                           (i32.wrap_i64 (call $arg (i32.const 1)))
                           (i32.wrap_i64 (call $arg (i32.const 2)))))
        ;; a WRITE of at least one byte must show in the guest's own memory
        (if (i32.and (i64.eq (call $arg (i32.const 0)) (i64.const {WRITE}))
                     (i64.ne (call $arg (i32.const 2)) (i64.const 0)))
          (then
            (if (i32.ne (i32.load8_u (i32.wrap_i64 (call $arg (i32.const 1))))
                        (i32.xor (i32.and (i32.add (i32.mul (i32.wrap_i64 (call $arg (i32.const 1)))
                                                            (i32.const 7))
                                                   (i32.const 3))
                                          (i32.const 255))
                                 (i32.const 255)))
              (then unreachable))))))""")


GUESTS = {pages: guest(pages) for pages in (1, 2)}


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    with Host(Policy(allow={"probe"}), cache_dir=None, profiles=[(PROFILE, ProbeBinding)]) as h:
        yield h


def expected(kind: int, ptr: int, length: int, size: int) -> Any:
    """What the access must give, or None if it must fault."""
    width = {READ: length, READ_U32: 4, READ_U64: 8, READ_IOVEC: 8, TAKE_IOVEC: 8, WRITE: length}[
        kind
    ]
    if ptr + width > size:
        return None
    if kind in (READ, WRITE):
        return bytes(pattern(ptr + i) for i in range(length)) if kind == READ else "written"
    raw = bytes(pattern(ptr + i) for i in range(width))
    if kind in (READ_U32, READ_U64):
        return int.from_bytes(raw, "little")
    buf, buf_len = int.from_bytes(raw[:4], "little"), int.from_bytes(raw[4:], "little")
    take = min(buf_len, length)
    if buf + take > size:
        return None
    return bytes(pattern(buf + i) for i in range(take))


def near(size: int) -> st.SearchStrategy[int]:
    """Pointers that matter: anywhere, and close to each page and memory boundary."""
    edges = [PAGE, 2 * PAGE, 3 * PAGE, 4 * PAGE, size, 2**32]
    return st.one_of(
        st.integers(0, 2**32 - 1),
        st.sampled_from(edges).flatmap(
            lambda e: st.integers(max(0, e - 16), min(2**32 - 1, e + 8))
        ),
    )


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_access_agrees_with_memory_or_faults(host: Host, data: st.DataObject) -> None:
    pages = data.draw(st.sampled_from([1, 2]), label="pages")
    grow = data.draw(st.integers(0, 2), label="grow")
    size = (pages + grow) * PAGE
    kind = data.draw(
        st.sampled_from([READ, READ_U32, READ_U64, READ_IOVEC, TAKE_IOVEC, WRITE]), label="kind"
    )
    ptr = data.draw(near(size), label="ptr")
    length = data.draw(st.integers(0, 64) | st.integers(0, 2**32 - 1), label="length")
    if kind == WRITE:
        length = min(length, 256)  # the host builds the bytes it writes
    want = expected(kind, ptr, length, size)
    Probe.args = (kind, ptr, length, grow)
    Probe.seen = []
    Probe.counts = []
    ext = host.admit(bare(GUESTS[pages]), grants=["probe"])
    event("fault" if want is None else "served")
    if want is None:
        with pytest.raises(CallError) as info:
            ext.run_command()
        assert info.value.failure is FailureClass.PROTOCOL
        assert "outside guest memory" in info.value.message
        assert len(Probe.seen) == 1  # only the first probe got through
    else:
        assert ext.run_command() == 0
        assert Probe.seen[1] == (None if kind == WRITE else want)
        if kind == TAKE_IOVEC:
            assert Probe.counts == [len(want)]
