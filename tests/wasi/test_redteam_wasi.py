"""Red-team review of the WASI profile: hostile guests written in WAT that call
wasi_snapshot_preview1 directly, through the real engine. Each test names the break it proves
fixed (or the attack it keeps refused)."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from tests.support.common import bare
from tests.support.guests import build, escape, guest_wat
from tests.support.wasi import package, revoke_mid_run
from wasihost.cli.wasi_command import config_from_args, parse_args
from wasihost.core.errors import CallError, ConfigError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.engine.native import SETTLE_FUEL
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host
from wasihost.wasi import Errno, Mount, WasiOptions, capabilities_for, limits, wasi_profile
from wasihost.wasi.abi import ALL_RIGHTS, DIR_READ_RIGHTS
from wasihost.wasi.registry import (
    FUEL_PER_LOG_RECORD,
    FUEL_PER_SEEDED_RANDOM_BYTE,
    FUEL_POLL,
    FUEL_TO_WAIT,
    FUNCTIONS,
    MODULE,
)
from wasihost.wasi.scopes import apply_scopes, check_scope

# Every preview1 function imported under $<name>, so a guest body can call any of them.
IMPORTS = " ".join(
    f'(import "{MODULE}" "{f.name}" (func ${f.name}'
    + (f" (param {' '.join(f.params)})" if f.params else "")
    + (f" (result {' '.join(f.results)})" if f.results else "")
    + "))"
    for f in FUNCTIONS
)

O_DIRECTORY = 2
LOOKUP_FOLLOW = 1
READ_RIGHTS = (1 << 1) | (1 << 2) | (1 << 5) | (1 << 14) | (1 << 21)  # read, seek, tell, readdir,
# fd_filestat_get


def command(body: str, data: dict[int, bytes] | None = None, pages: int = 2) -> bytes:
    """A plain WASI command: ``body`` is _start's code; ``data`` puts bytes at addresses."""
    segments = " ".join(
        f'(data (i32.const {at}) "{escape(blob)}")' for at, blob in (data or {}).items()
    )
    return bytes(
        wasmtime.wat2wasm(
            f'(module {IMPORTS} (memory (export "memory") {pages}) {segments}'
            f' (func (export "_start") {body}))'
        )
    )


def open_at(dirfd: str, path_at: int, path_len: int, out: int, *, oflags: int = 0,
            follow: int = 0, rights: int = READ_RIGHTS, inheriting: int | None = None) -> str:  # fmt: skip
    """WAT: path_open(dirfd, follow, path, oflags, rights, inheriting (or rights), 0, out)."""
    inherit = rights if inheriting is None else inheriting
    return (
        f"(call $path_open {dirfd} (i32.const {follow}) (i32.const {path_at})"
        f" (i32.const {path_len}) (i32.const {oflags}) (i64.const {rights})"
        f" (i64.const {inherit}) (i32.const 0) (i32.const {out}))"
    )


def exit_unless_ok(call: str, code: int) -> str:
    """WAT: exit with ``code`` * 1000 + errno unless ``call`` answers success."""
    return (
        f"(local.set $e {call})"
        f"(if (local.get $e) (then (call $proc_exit"
        f" (i32.add (i32.const {code * 1000}) (local.get $e)))))"
    )


def run(
    wasm: bytes,
    config: WasiOptions,
    *,
    fuel: int = 2_000_000_000,
    timeout_ms: int = 10_000,
    grants: frozenset[str] | None = None,
) -> tuple[int, Extension]:
    caps = capabilities_for(config) if grants is None else grants
    with Host(Policy(allow=caps), cache_dir=None, profiles=[wasi_profile(config)]) as host:
        ext = host.admit(bare(wasm), grants=caps, fuel=fuel, timeout_ms=timeout_ms)
        return ext.run_command(), ext


# --- path walks are priced per component ------------------------------------------------------


def _link_chain(mount: Path) -> None:
    """40 symlinks c0 -> c1 -> ... -> f, each target padded with 818 ``a/..`` pairs: one
    path_open of c0 walks the most components a resolution may (MAX_WALK_STEPS)."""
    (mount / "a").mkdir()
    (mount / "f").write_text("x")
    pad = "a/../" * 818
    for i in range(40):
        (mount / f"c{i}").symlink_to(pad + (f"c{i + 1}" if i < 39 else "f"))


def _open_chain_guest(name: bytes) -> bytes:
    body = f"(drop {open_at('(i32.const 3)', 100, len(name), 200, follow=LOOKUP_FOLLOW)})"
    return command(body, {100: name})


def test_a_long_walk_is_charged_per_component(tmp_path: Path) -> None:
    """Break: a path call's price was flat (2000) while its walk could take 4096 components
    (an openat and fstat each, ~12 ms of host time through a symlink chain): ~6 host
    microseconds per fuel unit instead of the ~20 units per microsecond of every other call."""
    _link_chain(tmp_path)
    config = WasiOptions(mounts=[Mount(tmp_path, "/m")])
    _, short = run(_open_chain_guest(b"f"), config)
    _, long = run(_open_chain_guest(b"c0"), config)
    charged = long.last_fuel_used - short.last_fuel_used
    assert charged >= (limits.MAX_WALK_STEPS - 16) * 300


def test_a_long_walk_without_the_fuel_ends_before_walking_it(tmp_path: Path) -> None:
    _link_chain(tmp_path)
    config = WasiOptions(mounts=[Mount(tmp_path, "/m")])
    with pytest.raises(CallError) as caught:
        run(_open_chain_guest(b"c0"), config, fuel=200_000)
    assert caught.value.failure is FailureClass.OUT_OF_FUEL


# --- directory snapshots are priced and bounded per instance ----------------------------------


def snapshot(fd_at: int) -> str:
    """WAT: fd_readdir at cookie 0 with an empty buffer of the descriptor stored at ``fd_at``."""
    return (
        f"(call $fd_readdir (i32.load (i32.const {fd_at})) (i32.const 1024) (i32.const 0)"
        " (i64.const 0) (i32.const 300))"
    )


def open_big(out: int, code: int) -> str:
    return exit_unless_ok(open_at("(i32.const 3)", 100, 3, out, oflags=O_DIRECTORY), code)


def _listing_guest(opens: int, rounds: int) -> bytes:
    """Opens ``big`` ``opens`` times and snapshots each ``rounds`` times; exits with the first
    failing errno + 1000 * (the descriptor's index + 1)."""
    body = ["(local $e i32) (local $i i32)"]
    for k in range(opens):
        body.append(open_big(200 + 4 * k, 100 + k))
        body.append(
            f"(local.set $i (i32.const {rounds}))"
            f"(loop $l{k}"
            + exit_unless_ok(snapshot(200 + 4 * k), k + 1)
            + "(local.set $i (i32.sub (local.get $i) (i32.const 1)))"
            f"(br_if $l{k} (local.get $i)))"
        )
    return command("".join(body), {100: b"big"})


def _big_dir(root: Path, entries: int) -> None:
    big = root / "big"
    big.mkdir()
    for i in range(entries):
        (big / f"{i:05d}").touch()


def test_a_directory_snapshot_is_charged_per_entry(tmp_path: Path) -> None:
    """Break: fd_readdir at cookie 0 re-read the whole directory (up to 100,000 entries, ~0.2 s
    of host time and ~20 MB) for its flat price of 300, whatever the buffer."""
    _big_dir(tmp_path, 2000)
    config = WasiOptions(mounts=[Mount(tmp_path, "/m")])
    code, once = run(_listing_guest(1, 1), config)
    assert code == 0
    code, many = run(_listing_guest(1, 11), config)
    assert code == 0
    assert many.last_fuel_used - once.last_fuel_used >= 10 * 2000 * 50


def test_directory_snapshots_held_at_once_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break: each descriptor kept its own snapshot, so 60 descriptors on one directory of
    100,000 entries held gigabytes of host memory. Snapshots held at once by an instance are
    bounded: one more is NOBUFS, and closing a descriptor gives its share back."""
    monkeypatch.setattr(limits, "MAX_LISTED_ENTRIES", 1000)
    _big_dir(tmp_path, 600)
    config = WasiOptions(mounts=[Mount(tmp_path, "/m")])
    code, _ = run(_listing_guest(2, 1), config)
    assert code == 2000 + Errno.NOBUFS  # the second snapshot would hold 1204 entries
    close_first = command(
        "(local $e i32)"
        + open_big(200, 1)
        + open_big(204, 2)
        + exit_unless_ok(snapshot(200), 3)
        + exit_unless_ok("(call $fd_close (i32.load (i32.const 200)))", 4)
        + exit_unless_ok(snapshot(204), 5)
        + exit_unless_ok(snapshot(204), 6),
        {100: b"big"},
    )
    assert run(close_first, config)[0] == 0


# --- no read after a revocation returns --------------------------------------------------------

def _read_loop(fd: str, setup: str = "") -> bytes:
    """After ``setup``, loops: fd_seek ``fd`` to 0 (stdin: ESPIPE, ignored), fd_read 16 bytes,
    fd_write what it read to stdout (nothing once the read is refused)."""
    return command(
        "(local $e i32)"
        + setup
        + f"""
    (i32.store (i32.const 300) (i32.const 1000))
    (i32.store (i32.const 304) (i32.const 16))
    (loop $l
      (drop (call $fd_seek {fd} (i64.const 0) (i32.const 0) (i32.const 500)))
      (i32.store (i32.const 508) (i32.const 0))
      (drop (call $fd_read {fd} (i32.const 300) (i32.const 1) (i32.const 508)))
      (i32.store (i32.const 312) (i32.const 1000))
      (i32.store (i32.const 316) (i32.load (i32.const 508)))
      (drop (call $fd_write (i32.const 1) (i32.const 312) (i32.const 1) (i32.const 520)))
      (br $l))""",
        {100: b"secret"},
    )


@pytest.mark.parametrize("capability", ["wasi.fs.read", "wasi.stdio"])
def test_nothing_is_read_after_a_revocation_returns(tmp_path: Path, capability: str) -> None:
    """Break: fd_read is a core entry (the engine's gate lets it through whatever the grant),
    so after `revoke(ext, "wasi.fs.read")` (or wasi.stdio) returned, a running program kept
    reading the files it had open (or its stdin)."""
    (tmp_path / "secret").write_bytes(b"TOP SECRET\n")
    seen: list[tuple[float, bytes]] = []
    config = WasiOptions(
        mounts=[Mount(tmp_path, "/data")],
        stdin=b"STDIN SECRET\n" * 100_000,
        stdout=lambda b: seen.append((time.monotonic(), b)),
    )
    guest = (
        _read_loop("(i32.load (i32.const 400))", exit_unless_ok(open_at("(i32.const 3)", 100, 6, 400), 1))
        if capability == "wasi.fs.read"
        else _read_loop("(i32.const 0)")
    )
    caps = capabilities_for(config)
    with Host(Policy(allow=caps), cache_dir=None, profiles=[wasi_profile(config)]) as host:
        ext = host.admit(bare(guest), grants=caps, fuel=10**10, timeout_ms=800)
        run = revoke_mid_run(host, ext, lambda: bool(seen), capability)
        revoked = run.revoked_at
    assert any(b"SECRET" in data for _, data in seen)
    after = [data for at, data in seen if at > revoked]
    assert after, "the guest kept running after the revocation"
    # A read done before the revocation returned may reach stdout just after it; no later one.
    assert sum(1 for data in after if data) <= 1, "reads landed after the revocation returned"
    assert isinstance(run.outcome, CallError) and run.outcome.failure is FailureClass.DEADLINE


# --- cputime clocks say nothing about the host's other work -----------------------------------

RESOLUTION_NS = 1_000_000  # the policy's default clock resolution
CLOCK_IMPORT = f'(import "{MODULE}" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))'


# How far apart two readings one call makes back to back may be on a loaded machine: a
# preemption or two of the thread between them, rounded up to the clock's resolution.
PREEMPTION_SLACK_NS = 50 * RESOLUTION_NS


def _clock_reader() -> bytes:
    """A wasihost-ABI guest whose command answers the readings of clocks 1, 2 and 3 (monotonic,
    process and thread cputime) as one CBOR byte string of three little-endian u64s."""
    body = (
        "(drop (call $clock (i32.const 1) (i64.const 0) (i32.const 8198)))"
        "(drop (call $clock (i32.const 2) (i64.const 0) (i32.const 8206)))"
        "(drop (call $clock (i32.const 3) (i64.const 0) (i32.const 8214)))"
        "(call $packed (i32.const 8192) (i32.const 30))"
    )
    # The response's 4-byte prefix, then CBOR's head of a 24-byte string; the readings follow.
    extra = '(data (i32.const 8192) "\\00\\00\\00\\00\\58\\18")'
    return build(guest_wat(body, imports=CLOCK_IMPORT, extra=extra))


def _readings(ext: Extension) -> tuple[int, int, int]:
    raw = ext.call("run")
    assert isinstance(raw, bytes)
    mono, process, thread = struct.unpack("<3Q", raw)
    return mono, process, thread


def _in_thread(fn: Callable[[], tuple[int, int, int]]) -> tuple[int, int, int]:
    out: list[tuple[int, int, int]] = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join()
    return out[0]


def test_cputime_clocks_say_nothing_about_the_hosts_other_work() -> None:
    """Break: the standard profile's cputime clocks were the host process's CPU time (every
    thread's, so other extensions' work too: a side channel between tenants) and the calling
    thread's since the instance was made (called from another thread, it went backwards and
    read 2**64 minus the difference). They now read as the instance's monotonic clock."""
    config = WasiOptions(clock="standard")
    sum(range(3_000_000))  # this thread has used some CPU before the instance exists
    with Host(Policy(allow={"wasi.clock"}), cache_dir=None, profiles=[wasi_profile(config)]) as host:
        ext = host.admit(package(_clock_reader()), grants={"wasi.clock"})
        first = _readings(ext)
        busy = threading.Thread(target=lambda: sum(range(20_000_000)))
        busy.start()
        busy.join()  # another tenant's work, on another thread
        for mono, process, thread in (first, _in_thread(lambda: _readings(ext)), _readings(ext)):
            # They read as the monotonic clock, whatever the thread: read a moment after it.
            # On a loaded machine (the suite on every core) that moment can hold a preemption
            # of a few milliseconds; the host's other work read as the break did is the busy
            # thread's CPU, hundreds of them (or, from another thread, about 2**64).
            assert 0 <= process - mono <= PREEMPTION_SLACK_NS, (mono, process, thread)
            assert 0 <= thread - mono <= PREEMPTION_SLACK_NS, (mono, process, thread)


# --- poll_oneoff never waits on credit --------------------------------------------------------

# One relative monotonic clock subscription of 60 s (userdata 7) at 0, its event at 64.
SLEEP_60S = command(
    """
    (i64.store (i32.const 0) (i64.const 7))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 60000000000))
    (drop (call $poll_oneoff (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))"""
)


def test_a_guest_that_cannot_pay_never_sleeps() -> None:
    """Break: poll_oneoff's price (500) was charged after the wait, inside the engine's
    10,000-unit allowance, so a guest with 50 units left slept until its deadline (up to ten
    minutes) on credit. Now it ends out_of_fuel at once."""
    assert FUEL_TO_WAIT == SETTLE_FUEL + FUEL_POLL  # the allowance it must hold beyond the price
    start = time.monotonic()
    with pytest.raises(CallError) as caught:
        run(SLEEP_60S, WasiOptions(clock="standard"), fuel=5_000, timeout_ms=3_000)
    assert caught.value.failure is FailureClass.OUT_OF_FUEL
    assert time.monotonic() - start < 1.5


# --- host files the ABI cannot describe exactly ------------------------------------------------


def test_a_host_file_from_before_1970_is_stated_not_a_host_error(tmp_path: Path) -> None:
    """Break: a file in a mount with a timestamp before 1970 made fd_filestat_get and
    path_filestat_get fail as host errors (struct refused the negative u64), with a traceback
    in the host's log. Its times read as 0."""
    (tmp_path / "old").write_text("x")
    os.utime(tmp_path / "old", ns=(-(10**18), -(10**18)))
    mtim_is_zero = "(i64.eqz (i64.load (i32.const 1072)))"  # the filestat at 1024: mtim at +48
    body = (
        "(local $e i32)"
        + exit_unless_ok(open_at("(i32.const 3)", 100, 3, 200), 1)
        + exit_unless_ok("(call $fd_filestat_get (i32.load (i32.const 200)) (i32.const 1024))", 2)
        + f"(if (i32.eqz {mtim_is_zero}) (then (call $proc_exit (i32.const 3))))"
        + exit_unless_ok(
            "(call $path_filestat_get (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 3)"
            " (i32.const 1024))",
            4,
        )
        + f"(if (i32.eqz {mtim_is_zero}) (then (call $proc_exit (i32.const 5))))"
    )
    assert run(command(body, {100: b"old"}), WasiOptions(mounts=[Mount(tmp_path, "/m")]))[0] == 0


# --- seeded random bytes are priced for what they cost ----------------------------------------


def _random_guest(length: int) -> bytes:
    return command(
        f"(call $proc_exit (call $random_get (i32.const 1024) (i32.const {length})))", pages=17
    )


def test_seeded_random_bytes_are_priced_for_their_host_time() -> None:
    """Break: random_get cost 1 unit a byte from the seeded stream too (HMAC-SHA256 per 32
    bytes, ~190 ns a byte): 1 MiB took ~0.19 s of host time for about a million units. A guest
    that cannot pay the seeded price ends out_of_fuel with no byte made."""
    seeded = WasiOptions(random_seed=b"0123456789abcdef")
    code, small = run(_random_guest(16), seeded)
    assert code == 0
    code, big = run(_random_guest(65536), seeded)
    assert code == 0
    assert big.last_fuel_used - small.last_fuel_used >= 65520 * (1 + FUEL_PER_SEEDED_RANDOM_BYTE)
    with pytest.raises(CallError) as caught:
        run(_random_guest(1 << 20), seeded, fuel=5_000_000)
    assert caught.value.failure is FailureClass.OUT_OF_FUEL
    # The OS CSPRNG (~10 ns a byte) keeps the one unit a byte.
    code, os_random = run(_random_guest(65536), WasiOptions(random=True))
    assert code == 0 and os_random.last_fuel_used - small.last_fuel_used < 70_000


# --- lines to the extension's log are priced per record ----------------------------------------


def _newlines_guest(length: int, iovecs: int = 1) -> bytes:
    """fd_write to stdout of ``length`` newlines (in ``iovecs`` equal iovecs)."""
    part = length // iovecs
    setup = "".join(
        f"(i32.store (i32.const {8 * i}) (i32.const {1024 + part * i}))"
        f"(i32.store (i32.const {8 * i + 4}) (i32.const {part}))"
        for i in range(iovecs)
    )
    return command(
        f"(memory.fill (i32.const 1024) (i32.const 10) (i32.const {length})) {setup}"
        f"(call $proc_exit (call $fd_write (i32.const 1) (i32.const 0) (i32.const {iovecs})"
        " (i32.const 512)))",
        pages=17,
    )


@pytest.mark.parametrize(("length", "iovecs"), [(4096, 1), (65536, 1), (65536, 4)])
def test_lines_to_the_log_are_charged_per_record(length: int, iovecs: int) -> None:
    """Break: with stdio not granted, each line of stdout becomes a record of the extension's
    log (or a call of the embedder's log sink), yet a write paid only its bytes: 1 MiB of
    newlines made a million records (~1 s of host time) for about two million units. The
    engine's shortcut (one iovec of at most 4 KiB) took the same price."""
    _, one = run(_newlines_guest(1), WasiOptions(), grants=frozenset())
    code, many = run(_newlines_guest(length, iovecs), WasiOptions(), grants=frozenset())
    assert code == 0
    assert many.last_fuel_used - one.last_fuel_used >= (length - 1) * FUEL_PER_LOG_RECORD
    # A caller's sink (wasi.stdio) makes no records: bytes only, as before.
    config = WasiOptions(stdout=lambda data: None)
    code, to_caller = run(_newlines_guest(length, iovecs), config)
    assert code == 0 and to_caller.last_fuel_used - one.last_fuel_used < 3 * length


# --- configuration ---------------------------------------------------------------------------


def test_a_read_only_mount_inside_a_writable_one_is_refused_however_spelled(
    tmp_path: Path,
) -> None:
    """Break: the nesting check compared paths as text, so a writable mount spelled
    "<tmp>/x/.." (or reached through a symlink) held a read-only "<tmp>/in", writable through
    it. Paths are compared as the directories they are."""
    (tmp_path / "in").mkdir()
    (tmp_path / "x").mkdir()
    (tmp_path / "link").symlink_to(tmp_path)
    for writable in (tmp_path / "x" / "..", tmp_path / "link"):
        with pytest.raises(ConfigError, match="lies inside writable mount"):
            WasiOptions(mounts=[Mount(writable, "/w", writable=True), Mount(tmp_path / "in", "/r")])


# --- the write budget: what one instance may add to its writable mounts -----------------------


def expect(call: str, want: int, step: int) -> str:
    """WAT: exit with ``step`` unless ``call`` answers ``want``."""
    return f"(if (i32.ne {call} (i32.const {want})) (then (call $proc_exit (i32.const {step}))))"


def test_files_cannot_add_more_than_the_write_budget(tmp_path: Path) -> None:
    """Break: only each file's size was bounded (1 GiB), so a guest could make any number of
    1 GiB files, sparse ones (a pwrite past the end, set_size, allocate) for a few hundred
    units each. Now growth past a file's end, holes included, and 4 KiB per file, directory
    or link made, are taken from the instance's budget (max_write_bytes); DQUOT beyond it."""
    fd = "(i32.load (i32.const 200))"
    body = (
        "(local $e i32)"
        + exit_unless_ok(open_at("(i32.const 3)", 100, 1, 200, oflags=1, rights=ALL_RIGHTS), 1)
        # a 1-byte iovec at 0 (the byte at 1024), and a 10,000-byte one at 8
        + "(i32.store (i32.const 0) (i32.const 1024)) (i32.store (i32.const 4) (i32.const 1))"
        + "(i32.store (i32.const 8) (i32.const 1024)) (i32.store (i32.const 12) (i32.const 10000))"
        + expect(f"(call $fd_pwrite {fd} (i32.const 0) (i32.const 1) (i64.const 100000)"
                 " (i32.const 300))", Errno.DQUOT, 2)
        + expect(f"(call $fd_filestat_set_size {fd} (i64.const 1073741824))", Errno.DQUOT, 3)
        + expect(f"(call $fd_allocate {fd} (i64.const 0) (i64.const 1048576))", Errno.DQUOT, 4)
        + expect(f"(call $fd_write {fd} (i32.const 8) (i32.const 1) (i32.const 300))", 0, 5)
        + expect("(i32.load (i32.const 300))", 10_000 - 4096, 6)  # a short write: what is left
        + expect(f"(call $fd_write {fd} (i32.const 0) (i32.const 1) (i32.const 300))",
                 Errno.DQUOT, 7)
        + expect("(call $path_create_directory (i32.const 3) (i32.const 101) (i32.const 1))",
                 Errno.DQUOT, 8)
        # overwriting within the file adds nothing: still allowed
        + expect(f"(call $fd_pwrite {fd} (i32.const 0) (i32.const 1) (i64.const 0)"
                 " (i32.const 300))", 0, 9)
    )
    config = WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)], max_write_bytes=10_000)
    assert run(command(body, {100: b"fd"}), config)[0] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
    assert (tmp_path / "f").stat().st_size == 10_000 - 4096


def test_a_flood_of_empty_files_ends_at_the_write_budget(tmp_path: Path) -> None:
    """Making files, directories and links counts 4 KiB each: a loop making names "a", "b", ...
    (O_CREAT, path_create_directory, path_symlink in turn) gets DQUOT after 1 MiB / 4 KiB."""
    body = """(local $i i32) (local $e i32)
    (loop $l
      (i32.store8 (i32.const 100) (i32.add (i32.const 65) (i32.rem_u (local.get $i) (i32.const 26))))
      (i32.store8 (i32.const 101) (i32.add (i32.const 65) (i32.div_u (local.get $i) (i32.const 26))))
      (local.set $e
        (if (result i32) (i32.eqz (i32.rem_u (local.get $i) (i32.const 3)))
          (then """ + open_at("(i32.const 3)", 100, 2, 200, oflags=1) + """)
          (else (if (result i32) (i32.eq (i32.rem_u (local.get $i) (i32.const 3)) (i32.const 1))
            (then (call $path_create_directory (i32.const 3) (i32.const 100) (i32.const 2)))
            (else (call $path_symlink (i32.const 102) (i32.const 1) (i32.const 3)
                     (i32.const 100) (i32.const 2)))))))
      (if (i32.eqz (local.get $e))
        (then
          (if (i32.eqz (i32.rem_u (local.get $i) (i32.const 3)))
            (then (drop (call $fd_close (i32.load (i32.const 200))))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $l))))
    (call $proc_exit (i32.add (i32.mul (local.get $i) (i32.const 100)) (local.get $e)))"""
    config = WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)], max_write_bytes=1 << 20)
    code = run(command(body, {102: b"x"}), config)[0]
    assert code == 256 * 100 + Errno.DQUOT
    assert len(os.listdir(tmp_path)) == 256


def test_by_default_a_run_adds_at_most_one_gib_even_sparse(tmp_path: Path) -> None:
    """The default budget (1 GiB, DEFAULT_MAX_WRITE_BYTES): a first sparse file of nearly
    1 GiB is made; a second one is DQUOT (before, any number were, for ~2,300 units each)."""
    size = limits.DEFAULT_MAX_WRITE_BYTES - 2 * limits.NEW_ENTRY_BYTES  # room for b itself
    body = "(local $e i32)"
    for k, name_at in enumerate((100, 101)):
        body += exit_unless_ok(
            open_at("(i32.const 3)", name_at, 1, 200, oflags=1, rights=ALL_RIGHTS), 10 + k
        ) + expect(
            f"(call $fd_filestat_set_size (i32.load (i32.const 200)) (i64.const {size}))",
            0 if k == 0 else Errno.DQUOT,
            20 + k,
        )
    config = WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)])
    assert run(command(body, {100: b"ab"}), config)[0] == 0
    assert (tmp_path / "a").stat().st_size == size and (tmp_path / "b").stat().st_size == 0


def test_the_write_budget_is_set_by_the_cli_and_lowered_by_a_grant_scope(tmp_path: Path) -> None:
    args = parse_args(["--max-write-bytes", "5000", "--dir", str(tmp_path), "m.wasm"])
    assert config_from_args(args).max_write_bytes == 5000
    assert config_from_args(parse_args(["m.wasm"])).max_write_bytes == (
        limits.DEFAULT_MAX_WRITE_BYTES
    )
    with pytest.raises(ConfigError, match="--max-write-bytes must be in 0"):
        config_from_args(parse_args(["--max-write-bytes", "-1", "m.wasm"]))
    mine = WasiOptions(max_write_bytes=10_000)
    assert apply_scopes(mine, {"wasi.fs.write": {"max_write_bytes": 100}}).max_write_bytes == 100
    assert apply_scopes(mine, {"wasi.fs.write": {"max_write_bytes": 10**9}}).max_write_bytes == (
        10_000
    )
    for bad in (True, -1, "1"):
        with pytest.raises(ConfigError, match="max_write_bytes"):
            check_scope("wasi.fs.write", {"max_write_bytes": bad})


# --- a coarse clock stays coarse inside poll_oneoff --------------------------------------------

# Reads the realtime clock (at 1024), then polls two subscriptions at 0: stdout writable (always
# ready) and the realtime clock due at that reading + 1 ns, absolute; exits with the number of
# events. Ready at once either way; the clock's event says whether the finer clock has passed it.
FINE_TIME_PROBE = command(
    """
    (drop (call $clock_time_get (i32.const 0) (i64.const 0) (i32.const 1024)))
    (i64.store (i32.const 0) (i64.const 1))
    (i32.store8 (i32.const 8) (i32.const 2))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 48) (i64.const 2))
    (i32.store8 (i32.const 56) (i32.const 0))
    (i32.store (i32.const 64) (i32.const 0))
    (i64.store (i32.const 72) (i64.add (i64.load (i32.const 1024)) (i64.const 1)))
    (i32.store16 (i32.const 88) (i32.const 1))
    (drop (call $poll_oneoff (i32.const 0) (i32.const 256) (i32.const 2) (i32.const 512)))
    (call $proc_exit (i32.load (i32.const 512)))"""
)


def test_poll_oneoff_tells_no_finer_time_than_the_clock_profile() -> None:
    """Break: an absolute clock subscription was compared with the host's exact clock, so with an
    always-ready descriptor beside it (no wait) poll_oneoff said whether any instant had passed:
    under the anonymous profile (1 s) a guest binary-searched the time to the nanosecond. It is
    compared with the reading the guest may see."""
    config = WasiOptions(clock="anonymous", stdout=lambda data: None)
    code, _ = run(FINE_TIME_PROBE, config)
    assert code == 1  # only stdout: the coarse clock has not reached reading + 1 ns


def test_an_empty_write_past_the_end_costs_no_budget(tmp_path: Path) -> None:
    """An empty fd_pwrite (or fd_write after a seek) past the end grows nothing: it must not
    spend the budget on a hole that was never made."""
    fd = "(i32.load (i32.const 200))"
    body = (
        "(local $e i32)"
        + exit_unless_ok(open_at("(i32.const 3)", 100, 1, 200, oflags=1, rights=ALL_RIGHTS), 1)
        + "(i32.store (i32.const 0) (i32.const 1024)) (i32.store (i32.const 4) (i32.const 0))"
        + expect(f"(call $fd_pwrite {fd} (i32.const 0) (i32.const 1) (i64.const 1000000)"
                 " (i32.const 300))", 0, 2)
        + expect(f"(call $fd_seek {fd} (i64.const 1000000) (i32.const 0) (i32.const 300))", 0, 3)
        + expect(f"(call $fd_write {fd} (i32.const 0) (i32.const 1) (i32.const 300))", 0, 4)
        + "(i32.store (i32.const 4) (i32.const 5000))"
        + expect(f"(call $fd_pwrite {fd} (i32.const 0) (i32.const 1) (i64.const 0)"
                 " (i32.const 300))", 0, 5)
        + expect("(i32.load (i32.const 300))", 5000, 6)
    )
    config = WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)], max_write_bytes=10_000)
    assert run(command(body, {100: b"f"}), config)[0] == 0


# --- attacks that held, kept as tests that fail were the protection removed -------------------

FD_READ, FD_WRITE = 1 << 1, 1 << 6


def test_rights_never_grow_through_set_rights_inheritance_or_renumbering(tmp_path: Path) -> None:
    """A read-only descriptor cannot be given write rights (fd_fdstat_set_rights only drops),
    a right dropped from a directory's inheriting rights is not regained by a new open, a
    directory opened from a read-only mount with every right asked creates nothing (ROFS), and
    a read-only file renumbered onto stdout does not become writable (nor reach the sink)."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "f").write_text("orig")
    (tmp_path / "r" / "sub").mkdir(parents=True)
    said: list[bytes] = []
    config = WasiOptions(
        mounts=[Mount(tmp_path / "w", "/w", writable=True), Mount(tmp_path / "r", "/r")],
        stdout=said.append,
    )
    a, b, sub = "(i32.load (i32.const 200))", "(i32.load (i32.const 204))", "(i32.load (i32.const 208))"
    body = (
        "(local $e i32)"
        + "(i32.store (i32.const 0) (i32.const 1024)) (i32.store (i32.const 4) (i32.const 1))"
        + exit_unless_ok(open_at("(i32.const 3)", 100, 1, 200, rights=FD_READ), 1)
        + expect(f"(call $fd_write {a} (i32.const 0) (i32.const 1) (i32.const 300))", Errno.BADF, 2)
        + expect(f"(call $fd_fdstat_set_rights {a} (i64.const -1) (i64.const -1))",
                 Errno.NOTCAPABLE, 3)
        + exit_unless_ok("(call $fd_fdstat_get (i32.const 3) (i32.const 600))", 4)
        + exit_unless_ok("(call $fd_fdstat_set_rights (i32.const 3) (i64.load (i32.const 608))"
                         f" (i64.and (i64.load (i32.const 616)) (i64.const {~FD_WRITE})))", 5)
        + exit_unless_ok(open_at("(i32.const 3)", 100, 1, 204, rights=FD_READ | FD_WRITE), 6)
        + expect(f"(call $fd_write {b} (i32.const 0) (i32.const 1) (i32.const 300))", Errno.BADF, 7)
        + exit_unless_ok(open_at("(i32.const 4)", 101, 3, 208, oflags=O_DIRECTORY,
                                 rights=DIR_READ_RIGHTS, inheriting=ALL_RIGHTS), 8)
        + expect(open_at(sub, 104, 3, 212, oflags=1, rights=ALL_RIGHTS), Errno.ROFS, 9)
        + exit_unless_ok(f"(call $fd_renumber {a} (i32.const 1))", 10)
        + expect("(call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 300))",
                 Errno.BADF, 11)
    )
    assert run(command(body, {100: b"fsubnew"}), config)[0] == 0
    assert (tmp_path / "w" / "f").read_text() == "orig"
    assert list((tmp_path / "r" / "sub").iterdir()) == [] and said == []


# --- no log record after a revocation returns -------------------------------------------------

# Prints "AAAAAAAAA\n" to stdout forever.
PRINT_LOOP = command(
    """(memory.fill (i32.const 1024) (i32.const 65) (i32.const 9))
    (i32.store8 (i32.const 1033) (i32.const 10))
    (i32.store (i32.const 0) (i32.const 1024)) (i32.store (i32.const 4) (i32.const 10))
    (loop $l (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
      (br $l))"""
)


def _revoke_while_printing(host: Host, ext: Extension, seen: list[float]) -> None:
    """Revoke PRINT_LOOP once 100 lines were seen; none may arrive after revoke returns."""
    run = revoke_mid_run(host, ext, lambda: len(seen) >= 100, None)
    assert len(seen) >= 100
    assert [at for at in seen if at > run.revoked_at] == []
    assert isinstance(run.outcome, ExtensionRevoked)


def test_no_log_record_is_delivered_after_a_revocation_returns() -> None:
    """Break: with stdio not granted, a line to stdout became a record of the extension's log
    (or a call of the embedder's log sink) with no grant check, so after `host.revoke(ext)`
    returned a running program kept delivering records until its next epoch tick (thousands).
    Such writes now commit as the core log entry's records do."""
    delivered: list[float] = []
    config = WasiOptions()
    with Host(
        Policy(),
        cache_dir=None,
        profiles=[wasi_profile(config)],
        log_sink=lambda ext_id, record: delivered.append(time.monotonic()),
    ) as host:
        ext = host.admit(bare(PRINT_LOOP), grants=frozenset(), fuel=10**10, timeout_ms=3000)
        _revoke_while_printing(host, ext, delivered)


def test_no_line_reaches_the_callers_sink_after_a_revocation_returns() -> None:
    """Break: a line to the caller's stdout sink (wasi.stdio) takes the engine's write shortcut,
    which checked nothing of the extension's state, so after `host.revoke(ext)` returned a
    running program kept printing until its next epoch tick (about 2,500 lines). Every native
    host call now ends at once once its instance is interrupted."""
    printed: list[float] = []
    config = WasiOptions(stdout=lambda data: printed.append(time.monotonic()))
    caps = capabilities_for(config)
    with Host(Policy(allow=caps), cache_dir=None, profiles=[wasi_profile(config)]) as host:
        ext = host.admit(bare(PRINT_LOOP), grants=caps, fuel=10**10, timeout_ms=3000)
        _revoke_while_printing(host, ext, printed)


# --- red-team pass of 2026-12-01 with hostile guests ------------------------------------------


def test_a_pwrite_on_an_append_descriptor_is_paid_where_it_lands(tmp_path: Path) -> None:
    """Break: Linux's pwrite on an O_APPEND descriptor appends whatever the offset, but
    fd_pwrite limited and paid the bytes at the offset. 50 pwrites of 60,000 bytes at offset 0
    through a descriptor opened with FDFLAG_APPEND grew the file to 3 MB under a 100,000-byte
    write budget (and past MAX_FILE_BYTES, given the time). Now they are paid at the end."""
    fd = "(i32.load (i32.const 200))"
    append_open = (
        "(call $path_open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 1)"
        f" (i32.const 1) (i64.const {ALL_RIGHTS}) (i64.const {ALL_RIGHTS}) (i32.const 1)"
        " (i32.const 200))"
    )
    body = (
        "(local $e i32) (local $i i32)"
        + exit_unless_ok(append_open, 1)
        + "(i32.store (i32.const 8) (i32.const 1024)) (i32.store (i32.const 12) (i32.const 60000))"
        + "(loop $l"
        + exit_unless_ok(
            f"(call $fd_pwrite {fd} (i32.const 8) (i32.const 1) (i64.const 0) (i32.const 300))", 2
        )
        + "(local.set $i (i32.add (local.get $i) (i32.const 1)))"
        + "(br_if $l (i32.lt_u (local.get $i) (i32.const 50))))"
    )
    config = WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)], max_write_bytes=100_000)
    assert run(command(body, {100: b"f"}), config)[0] == 2000 + Errno.DQUOT
    # 60,000 bytes, then the 35,904 the budget had left (a short write), then DQUOT
    assert (tmp_path / "f").stat().st_size == 100_000 - limits.NEW_ENTRY_BYTES


def test_file_timestamps_tell_no_finer_time_than_the_clock_profile(tmp_path: Path) -> None:
    """Break: a guest with no clock at all wrote a file and read its mtime (fd_filestat_get,
    path_filestat_get, or *_NOW through set_times): the host's clock to the nanosecond on a
    recent Linux, a timer for side channels. Timestamps the kernel stamps are now rounded down
    to the clock profile's resolution (the anonymous second without a clock); times the guest
    set itself read back exactly (the official suite sets mtim - 100 and reads it back)."""
    fd = "(i32.load (i32.const 200))"
    mtim = "(i64.load (i32.const 1048))"  # filestat: dev, ino, filetype+pad, nlink, size, atim, mtim
    stat_fd = f"(call $fd_filestat_get {fd} (i32.const 1000))"
    body = (
        "(local $e i32)"
        + exit_unless_ok(open_at("(i32.const 3)", 100, 1, 200, oflags=1, rights=ALL_RIGHTS), 1)
        + "(i32.store (i32.const 0) (i32.const 100)) (i32.store (i32.const 4) (i32.const 1))"
        + exit_unless_ok(f"(call $fd_write {fd} (i32.const 0) (i32.const 1) (i32.const 300))", 2)
        + exit_unless_ok(stat_fd, 3)
        + expect(f"(i64.eqz (i64.rem_u {mtim} (i64.const 1000000000)))", 1, 4)
        + expect("(i64.eqz (i64.rem_u (i64.load (i32.const 1040)) (i64.const 1000000000)))", 1, 5)
        + expect("(i64.eqz (i64.rem_u (i64.load (i32.const 1056)) (i64.const 1000000000)))", 1, 6)
        # MTIM_NOW (8) through the path: no finer either
        + exit_unless_ok("(call $path_filestat_set_times (i32.const 3) (i32.const 0)"
                         " (i32.const 100) (i32.const 1) (i64.const 0) (i64.const 0)"
                         " (i32.const 8))", 7)
        + exit_unless_ok("(call $path_filestat_get (i32.const 3) (i32.const 0) (i32.const 100)"
                         " (i32.const 1) (i32.const 1000))", 8)
        + expect(f"(i64.eqz (i64.rem_u {mtim} (i64.const 1000000000)))", 1, 9)
        # a time the guest sets itself reads back exactly
        + exit_unless_ok(f"(call $fd_filestat_set_times {fd} (i64.const 0)"
                         " (i64.const 1234567890123) (i32.const 4))", 10)
        + exit_unless_ok(stat_fd, 11)
        + expect(f"(i64.eq {mtim} (i64.const 1234567890123))", 1, 12)
    )
    config = WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)])
    assert run(command(body, {100: b"f"}), config)[0] == 0
    assert (tmp_path / "f").stat().st_mtime_ns == 1234567890123
