"""Handlers driven directly over a BytearrayMemory: layouts, limits and corner cases that are
awkward to reach from a compiled program."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from tests.support.wasi import DirectGuest
from wasihost.brokers.log import RECORD_OVERHEAD_BYTES, ExtensionLog, Level
from wasihost.core.status import GuestDeadline, GuestExit, GuestFault, GuestOutOfFuel
from wasihost.wasi import Errno, Mount, WasiOptions
from wasihost.wasi import limits as wasi_limits
from wasihost.wasi.abi import ALL_RIGHTS, DIRENT, EVENT, FDSTAT, PRESTAT, Filetype, Right
from wasihost.wasi.fds import HostDescriptor
from wasihost.wasi.stdio import LogLines


class FakeClock:
    def __init__(self) -> None:
        self.real = 1_700_000_123_456_789_012
        self.mono = 5_000_000_000_123

    def realtime_ns(self) -> int:
        return self.real

    def monotonic_ns(self) -> int:
        return self.mono


def test_args_and_environ_layout() -> None:
    g = DirectGuest(WasiOptions(argv=["prog", "été"], env={"A": "1", "LONG": "x" * 10}))
    count, size = g.alloc(4), g.alloc(4)
    assert g.call("args_sizes_get", count, size) == 0
    assert (g.u32(count), g.u32(size)) == (2, len("prog\0été\0".encode()))
    ptrs, buf = g.alloc(8), g.alloc(64)
    assert g.call("args_get", ptrs, buf) == 0
    first, second = struct.unpack("<II", g.mem.read(ptrs, 8))
    assert first == buf and g.mem.read(second, len("été".encode()) + 1) == "été\0".encode()
    assert g.call("environ_sizes_get", count, size) == 0
    assert (g.u32(count), g.u32(size)) == (2, 4 + 16)
    # not granted: sizes 0/0 and args_get writes nothing (engine-denied args_get answers 0 too)
    bare = DirectGuest(WasiOptions(argv=["prog"], env={"A": "1"}), grants=())
    assert bare.call("args_sizes_get", count, size) == 0
    assert (bare.u32(count), bare.u32(size)) == (0, 0)
    assert bare.call("environ_sizes_get", count, size) == 0
    assert (bare.u32(count), bare.u32(size)) == (0, 0)


def test_host_environment_is_never_exposed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WASIHOST_SECRET", "do-not-leak")
    g = DirectGuest(WasiOptions())
    count, size = g.alloc(4), g.alloc(4)
    g.call("environ_sizes_get", count, size)
    assert g.u32(count) == 0


def test_clock_resolution_and_origins() -> None:
    clock = FakeClock()
    g = DirectGuest(WasiOptions(clock="standard"), clock=clock, resolution_ns=1_000_000)
    out = g.alloc(8)
    assert g.call("clock_time_get", 0, 0, out) == 0
    assert g.u64(out) == clock.real - clock.real % 1_000_000
    assert g.call("clock_res_get", 1, out) == 0 and g.u64(out) == 1_000_000
    clock.mono += 2_500_000  # 2.5 ms after start: the guest's monotonic clock starts at 1 s
    assert g.call("clock_time_get", 1, 0, out) == 0 and g.u64(out) == 1_002_000_000
    anon = DirectGuest(WasiOptions(clock="anonymous"), clock=clock)
    assert anon.call("clock_time_get", 0, 0, out) == 0
    assert anon.u64(out) == clock.real // 10**9 * 10**9
    assert anon.call("clock_res_get", 0, out) == 0 and anon.u64(out) == 1_000_000_000
    assert anon.call("clock_time_get", 2, 0, out) == Errno.INVAL
    assert anon.call("clock_res_get", 3, out) == Errno.INVAL
    none = DirectGuest(WasiOptions(clock="standard"), grants=())
    assert none.call("clock_time_get", 0, 0, out) == Errno.NOTCAPABLE


def poll_subs(g: DirectGuest, subs: list[bytes]) -> tuple[int, list[tuple[int, ...]]]:
    inp, _ = g.put(b"".join(subs))
    out = g.alloc(32 * len(subs))
    n = g.alloc(4)
    err = g.call("poll_oneoff", inp, out, len(subs), n)
    events = (
        [EVENT.unpack(g.mem.read(out + 32 * i, 32)) for i in range(g.u32(n))] if not err else []
    )
    return err, events


def clock_sub(userdata: int, clock: int, timeout: int, abstime: bool = False) -> bytes:
    return struct.pack("<QB7xI4xQQH6x", userdata, 0, clock, timeout, 0, int(abstime))


def fd_sub(userdata: int, kind: int, fd: int) -> bytes:
    return struct.pack("<QB7xI28x", userdata, kind, fd)


def test_poll_oneoff_waits_for_the_earliest_clock_and_reports_what_is_due() -> None:
    g = DirectGuest(WasiOptions(clock="standard"))
    start = time.monotonic()
    err, events = poll_subs(g, [clock_sub(1, 1, 30_000_000), clock_sub(2, 1, 10**15),
                                clock_sub(3, 0, 30_000_000)])  # fmt: skip
    assert err == 0 and time.monotonic() - start >= 0.03
    assert sorted(e[0] for e in events) == [1, 3]
    # an absolute deadline already past is due at once; fd events come without waiting
    err, events = poll_subs(g, [clock_sub(4, 1, 0, abstime=True), fd_sub(5, 2, 1)])
    assert err == 0 and sorted((e[0], e[1]) for e in events) == [(4, 0), (5, 0)]
    err, events = poll_subs(g, [fd_sub(6, 1, 42), fd_sub(7, 1, 1), clock_sub(8, 2, 1)])
    assert sorted((e[0], e[1]) for e in events) == [(6, Errno.BADF), (7, Errno.BADF),
                                                   (8, Errno.INVAL)]  # fmt: skip
    assert poll_subs(g, [])[0] == Errno.INVAL
    assert poll_subs(g, [struct.pack("<QB39x", 9, 7)])[0] == Errno.INVAL


def test_poll_oneoff_never_waits_past_the_call_deadline() -> None:
    g = DirectGuest(WasiOptions(clock="standard"), deadline=time.monotonic() + 0.2)
    start = time.monotonic()
    with pytest.raises(GuestDeadline):
        poll_subs(g, [clock_sub(1, 1, 3600 * 10**9)])
    assert 0.15 < time.monotonic() - start < 0.5


def test_random_is_seeded_or_from_the_os() -> None:
    seed = b"0123456789abcdef"
    a = DirectGuest(WasiOptions(random_seed=seed))
    b = DirectGuest(WasiOptions(random_seed=seed))
    buf = a.alloc(64)
    assert a.call("random_get", buf, 64) == 0 and b.call("random_get", buf, 64) == 0
    assert a.mem.read(buf, 64) == b.mem.read(buf, 64) != bytes(64)
    policy = DirectGuest(WasiOptions(random=True), policy_seed=seed)
    assert policy.call("random_get", buf, 64) == 0 and policy.mem.read(buf, 64) == a.mem.read(
        buf, 64
    )
    os_random = DirectGuest(WasiOptions(random=True))
    assert os_random.call("random_get", buf, 64) == 0 and os_random.mem.read(buf, 64) != a.mem.read(
        buf, 64
    )
    assert (
        os_random.call("random_get", buf, wasi_limits.MAX_RANDOM_BYTES_PER_CALL + 1) == Errno.INVAL
    )
    assert DirectGuest(WasiOptions()).call("random_get", buf, 8) == Errno.NOTCAPABLE


def test_proc_calls() -> None:
    g = DirectGuest(WasiOptions())
    with pytest.raises(GuestExit) as info:
        g.call("proc_exit", 0xFFFF_FFFF)
    assert info.value.code == 0xFFFF_FFFF
    assert g.call("proc_raise", 9) == Errno.NOSYS
    assert g.call("sched_yield") == 0


def test_log_lines_split_bound_and_flush() -> None:
    log = ExtensionLog(10_000)
    lines = LogLines(log, Level.INFO, "stdout")
    lines(b"one\ntw")
    lines(b"o\n\xff\xfe bad\nthree")
    assert [r.message for r in log.records] == ["one", "two", "\ufffd\ufffd bad"]
    lines(b"x" * (wasi_limits.MAX_LOG_LINE_BYTES * 2 + 10))
    lines.flush()
    messages = [r.message for r in log.records]
    assert messages[3] == "three" + "x" * (wasi_limits.MAX_LOG_LINE_BYTES - 5)
    assert all(len(m) <= wasi_limits.MAX_LOG_LINE_BYTES for m in messages)
    assert sum(len(m) for m in messages[3:]) == 5 + wasi_limits.MAX_LOG_LINE_BYTES * 2 + 10
    full = ExtensionLog(RECORD_OVERHEAD_BYTES + 8)  # room for one one-byte record
    flood = LogLines(full, Level.WARN, "stderr")
    flood(b"a\nb\nc\n")
    assert len(full.records) == 1 and full.dropped == 2


def test_stdio_descriptors() -> None:
    g = DirectGuest(WasiOptions(stdin=b"input"), grants=["wasi.stdio"])
    out = g.alloc(24)
    for fd in (0, 1, 2):
        assert g.call("fd_fdstat_get", fd, out) == 0
        filetype, _flags, base, _inh = FDSTAT.unpack(g.mem.read(out, 24))
        assert filetype == Filetype.UNKNOWN  # bytes and sinks are no terminal
        assert not base & (Right.FD_SEEK | Right.FD_TELL)
    tty = DirectGuest(WasiOptions(stdout=lambda _: None, terminal_fds={1}), grants=["wasi.stdio"])
    out = tty.alloc(24)
    for fd, filetype_wanted in ((0, Filetype.UNKNOWN), (1, Filetype.CHARACTER_DEVICE)):
        assert tty.call("fd_fdstat_get", fd, out) == 0
        filetype, _flags, base, _inh = FDSTAT.unpack(tty.mem.read(out, 24))
        assert filetype == filetype_wanted  # a character device: libc's isatty() says yes
    assert g.read(0, 3) == (0, b"inp") and g.read(0, 10) == (0, b"ut") and g.read(0, 1) == (0, b"")
    assert g.write(0, b"x")[0] == Errno.BADF
    assert g.read(1, 1)[0] == Errno.BADF
    assert g.call("fd_seek", 1, 0, 0, out) == Errno.SPIPE
    assert g.call("fd_prestat_get", 0, out) == Errno.BADF
    # rights only shrink; a dropped fd_write right stops writes
    assert g.call("fd_fdstat_set_rights", 1, ALL_RIGHTS, 0) == Errno.NOTCAPABLE
    assert g.call("fd_fdstat_set_rights", 1, int(Right.FD_FILESTAT_GET), 0) == 0
    assert g.write(1, b"x")[0] == Errno.BADF
    # renumber needs both open; closing frees the number for the next open
    assert g.call("fd_renumber", 2, 9) == Errno.BADF
    assert g.call("fd_renumber", 2, 1) == 0
    assert g.call("fd_fdstat_get", 2, out) == Errno.BADF
    assert g.call("fd_close", 1) == 0 and g.call("fd_close", 1) == Errno.BADF


def test_iovec_limits_and_scatter(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"0123456789")
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m")]))
    err, fd = g.open(3, "f")
    assert err == 0
    a, b = g.alloc(3), g.alloc(16)
    iov, _ = g.put(struct.pack("<IIII", a, 3, b, 16))
    n = g.alloc(4)
    assert g.call("fd_read", fd, iov, 2, n) == 0
    assert g.u32(n) == 10 and g.mem.read(a, 3) == b"012" and g.mem.read(b, 7) == b"3456789"
    assert g.call("fd_read", fd, iov, wasi_limits.MAX_IOVECS + 1, n) == Errno.INVAL
    wild, _ = g.put(struct.pack("<II", 0xFFFF_FF00, 64))
    with pytest.raises(GuestFault):
        g.call("fd_pread", fd, wild, 1, 0, n)


def test_fd_readdir_cookies_and_truncation(tmp_path: Path) -> None:
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / name).write_text(name)
    (tmp_path / "dir").mkdir()
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m")]))
    buf, used = g.alloc(4096), g.alloc(4)

    def entries(cookie: int, size: int) -> list[tuple[int, bytes, int]]:
        assert g.call("fd_readdir", 3, buf, size, cookie, used) == 0
        data = g.mem.read(buf, g.u32(used))
        out = []
        pos = 0
        while pos + DIRENT.size <= len(data):
            nxt, _ino, namlen, kind = DIRENT.unpack_from(data, pos)
            out.append((nxt, data[pos + 24 : pos + 24 + namlen], kind))
            pos += 24 + namlen
        return out

    whole = entries(0, 4096)
    assert [e[1] for e in whole] == [b".", b"..", b"alpha", b"beta", b"dir", b"gamma"]
    assert [e[2] for e in whole] == [3, 3, 4, 4, 3, 4]
    assert [e[0] for e in whole] == [1, 2, 3, 4, 5, 6]
    assert [e[1] for e in entries(4, 4096)] == [b"dir", b"gamma"]
    assert entries(6, 4096) == [] and g.u32(used) == 0
    # a buffer that ends inside an entry is filled completely: the guest sees bufused == size
    g.call("fd_readdir", 3, buf, 30, 0, used)
    assert g.u32(used) == 30
    # the snapshot made at cookie 0 keeps later cookies stable while the directory changes
    (tmp_path / "aaa-new").write_text("")
    assert [e[1] for e in entries(2, 4096)] == [b"alpha", b"beta", b"dir", b"gamma"]
    assert b"aaa-new" in [e[1] for e in entries(0, 4096)]


def test_bulk_calls_check_destination_and_price_before_the_work(tmp_path: Path) -> None:
    """fd_readdir does not list, fd_read does not read (the offset stays), random_get makes
    nothing, when the destination is wild or the budget cannot pay the declared length."""
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m")], random=True))
    err, fd = g.open(3, "f")
    assert err == 0
    desc = g.state.fds.get(3)
    assert isinstance(desc, HostDescriptor)
    file_desc = g.state.fds.get(fd)
    assert isinstance(file_desc, HostDescriptor)
    buf, used = g.alloc(60_000), g.alloc(4)
    iov, _ = g.put(buf.to_bytes(4, "little") + (60_000).to_bytes(4, "little"))
    wild_iov, _ = g.put(
        (g.MEMORY_BYTES - 10).to_bytes(4, "little") + (60_000).to_bytes(4, "little")
    )
    # A wild destination faults before anything happens.
    with pytest.raises(GuestFault):
        g.call("fd_readdir", 3, g.MEMORY_BYTES - 10, 60_000, 0, used)
    with pytest.raises(GuestFault):
        g.call("fd_read", fd, wild_iov, 1, used)
    with pytest.raises(GuestFault):
        g.call("random_get", g.MEMORY_BYTES - 10, 60_000)
    assert desc.listing is None and os.lseek(file_desc.fd, 0, os.SEEK_CUR) == 0
    # So does a budget that cannot pay for the declared length.
    g.mem.fuel = 50_000
    before = bytes(g.mem.data)
    for name, args in (
        ("fd_readdir", (3, buf, 60_000, 0, used)),
        ("fd_read", (fd, iov, 1, used)),
        ("fd_pread", (fd, iov, 1, 0, used)),
        ("random_get", (buf, 60_000)),
    ):
        with pytest.raises(GuestOutOfFuel):
            g.call(name, *args)
    assert desc.listing is None and os.lseek(file_desc.fd, 0, os.SEEK_CUR) == 0
    assert bytes(g.mem.data) == before
    g.mem.fuel = None
    assert g.call("fd_read", fd, iov, 1, used) == 0 and g.u32(used) == 60_000


def test_prestat_and_dir_name(tmp_path: Path) -> None:
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/data")]))
    out = g.alloc(8)
    assert g.call("fd_prestat_get", 3, out) == 0
    assert PRESTAT.unpack(g.mem.read(out, 8)) == (0, 5)
    name = g.alloc(8)
    assert g.call("fd_prestat_dir_name", 3, name, 4) == Errno.NAMETOOLONG
    assert g.call("fd_prestat_dir_name", 3, name, 5) == 0 and g.mem.read(name, 5) == b"/data"
    assert g.call("fd_prestat_get", 4, out) == Errno.BADF
    # without wasi.fs.read the mount is not there at all
    hidden = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/data")]), grants=())
    assert hidden.call("fd_prestat_get", 3, out) == Errno.BADF


def test_writable_mount_needs_the_write_grant(tmp_path: Path) -> None:
    config = WasiOptions(mounts=[Mount(tmp_path, "/data", writable=True)])
    read_only = DirectGuest(config, grants=["wasi.fs.read"])
    assert read_only.open(3, "new", oflags=1, rights=ALL_RIGHTS)[0] == Errno.ROFS
    assert read_only.path_call("path_create_directory", 3, "d") == Errno.ROFS
    assert os.listdir(tmp_path) == []
    writable = DirectGuest(config, grants=["wasi.fs.read", "wasi.fs.write"])
    assert writable.open(3, "new", oflags=1, rights=ALL_RIGHTS)[0] == 0
    assert os.listdir(tmp_path) == ["new"]


# wasmtime's directory rights (what its preopens report), which wasi-testsuite's
# path_open_preopen requires at least; ours add PATH_FILESTAT_SET_SIZE, the gate of O_TRUNC.
WASMTIME_DIR_RIGHTS = 129498624


def _fdstat(g: DirectGuest, fd: int) -> tuple[int, int, int, int]:
    out = g.alloc(FDSTAT.size)
    assert g.call("fd_fdstat_get", fd, out) == 0
    return FDSTAT.unpack(g.mem.read(out, FDSTAT.size))


@pytest.mark.parametrize("writable", [True, False])
def test_a_directory_reopens_with_the_rights_it_reports(tmp_path: Path, writable: bool) -> None:
    """What Rust's wasi-testsuite does first: re-open the preopen "." with its own rights.
    Those rights must not read as a request to write (the directory would open O_RDWR: ISDIR,
    or ROFS on a read-only mount)."""
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m", writable=writable)]))
    _, _, base, inheriting = _fdstat(g, 3)
    if writable:
        assert base == WASMTIME_DIR_RIGHTS | Right.PATH_FILESTAT_SET_SIZE
    else:
        assert base & ~WASMTIME_DIR_RIGHTS == 0 and base & Right.PATH_OPEN
    assert not base & (Right.FD_DATASYNC | Right.FD_SYNC | Right.FD_FDSTAT_SET_FLAGS)
    p, n = g.put(b".")
    out = g.alloc(4)
    oflags = 2  # OFLAGS_DIRECTORY
    assert g.call("path_open", 3, 0, p, n, oflags, base, inheriting, 0, out) == 0
    assert _fdstat(g, g.u32(out))[2] == base
    # A directory asked for with the write right is refused as POSIX does.
    rw = int(Right.FD_READ | Right.FD_WRITE)
    assert g.call("path_open", 3, 0, p, n, oflags, rw, 0, 0, out) == (
        Errno.ISDIR if writable else Errno.ROFS
    )


def test_truncating_on_open_needs_path_filestat_set_size(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"keep me")
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)]))
    _, _, base, inheriting = _fdstat(g, 3)
    assert g.call("fd_fdstat_set_rights", 3, base & ~Right.PATH_FILESTAT_SET_SIZE, inheriting) == 0
    assert g.open(3, "f", oflags=8, rights=0)[0] == Errno.NOTCAPABLE  # OFLAGS_TRUNC
    assert (tmp_path / "f").read_bytes() == b"keep me"
    fresh = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)]))
    assert fresh.open(3, "f", oflags=8, rights=0)[0] == 0
    assert (tmp_path / "f").read_bytes() == b""


def test_files_cannot_grow_past_the_size_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wasi_limits, "MAX_FILE_BYTES", 10)
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m", writable=True)]))
    err, fd = g.open(3, "f", oflags=1, rights=ALL_RIGHTS)
    assert err == 0
    assert g.write(fd, b"0123456789abc") == (0, 10)  # a short write up to the limit
    assert g.write(fd, b"x")[0] == Errno.FBIG
    assert g.call("fd_filestat_set_size", fd, 11) == Errno.FBIG
    assert g.call("fd_allocate", fd, 5, 6) == Errno.FBIG
    assert (tmp_path / "f").stat().st_size == 10


def test_special_files_in_a_mount_are_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m")]))
    start = time.monotonic()
    assert g.open(3, "fifo")[0] == Errno.ACCES
    assert time.monotonic() - start < 1


@pytest.mark.parametrize("grants", [("wasi.sockets",), ()])
def test_sockets_say_not_a_socket_granted_or_not(grants: tuple[str, ...]) -> None:
    g = DirectGuest(WasiOptions(), grants=grants)
    out = g.alloc(8)
    assert g.call("sock_accept", 1, 0, out) == Errno.NOTSOCK
    assert g.call("sock_shutdown", 77, 3) == Errno.BADF
    assert g.call("sock_recv", 0, out, 0, 0, out, out) == Errno.NOTSOCK
    assert g.call("sock_send", 2, out, 0, 0, out) == Errno.NOTSOCK


def test_closing_the_binding_closes_every_host_descriptor(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    before = len(os.listdir("/proc/self/fd"))
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m")]))
    assert g.open(3, "f")[0] == 0 and g.open(3, ".")[0] == 0
    assert len(os.listdir("/proc/self/fd")) == before + 3
    g.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_symlink_chains_are_bounded(tmp_path: Path) -> None:
    """40 links are followed, as on Linux; and long targets cannot make one call walk more than
    MAX_WALK_STEPS components."""
    (tmp_path / "l0").symlink_to("f")
    (tmp_path / "f").write_text("x")
    for i in range(1, 45):
        (tmp_path / f"l{i}").symlink_to(f"l{i - 1}")
    (tmp_path / "sub").mkdir()
    deep = "/".join(["sub", ".."] * 580)  # 1160 components, no symlink among them
    (tmp_path / "long").symlink_to(deep + "/long2")
    (tmp_path / "long2").symlink_to(deep + "/long3")
    (tmp_path / "long3").symlink_to(deep + "/long4")
    (tmp_path / "long4").symlink_to(deep + "/long5")
    (tmp_path / "long5").symlink_to("f")
    g = DirectGuest(WasiOptions(mounts=[Mount(tmp_path, "/m")]))
    assert g.open(3, "l39")[0] == 0
    assert g.open(3, "l40")[0] == Errno.LOOP
    assert g.open(3, "long")[0] == Errno.LOOP  # 5 links, but over 4096 components walked
    assert g.open(3, "long3")[0] == 0  # 3 links, about 2,300 components
