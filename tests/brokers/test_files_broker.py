"""The files broker through the real engine: the Rust fixture (fixtures/files, on the SDK's
``files::File``) for what a guest normally does, and a WAT proxy guest (files_support) for
requests no SDK would send. Mounts are tmp_path directories with a sentinel directory planted
next to them; nothing outside a mount may be read, created or changed."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import FIXTURES, FakeClock, bare, run_in_thread
from tests.support.files import PROXY, call, proxy_wasm, raw_call
from wasihost.brokers import files as files_module
from wasihost.brokers.files import MAX_FILE_BYTES, MAX_IO_BYTES, MAX_OPEN_FILES, FilesBroker
from wasihost.core.errors import AdmissionError, CallError, ConfigError
from wasihost.core.status import Status
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import fs as wasi_fs

FILES = FIXTURES / "files"
SECRET = b"top secret\n"
TTL_S = 60.0


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """tmp/data (granted rw), tmp/ro (granted r), tmp/outside (the sentinel), tmp/tmp (the
    broker's temporary directory), with hostile symlinks planted in the data mount."""
    data, ro, outside = tmp_path / "data", tmp_path / "ro", tmp_path / "outside"
    for d in (data, ro, outside, tmp_path / "tmp", data / "sub"):
        d.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (data / "a.txt").write_bytes(b"hello")
    (data / "sub" / "b.txt").write_bytes(b"in sub")
    (ro / "r.txt").write_bytes(b"read only")
    (data / "inner").symlink_to("a.txt")  # stays inside: followed, as WASI follows it
    (data / "linkdir").symlink_to("sub")
    (data / "outsecret").symlink_to("../outside/secret")
    (data / "escdir").symlink_to("../outside")  # a symlinked parent directory
    (data / "abs").symlink_to(str(outside / "secret"))
    (data / "abs-in").symlink_to(str(data / "a.txt"))  # absolute, even though it is inside
    (data / "deep-out").symlink_to("sub/../../outside/secret")
    (data / "loop1").symlink_to("loop2")
    (data / "loop2").symlink_to("loop1")
    return tmp_path


def scope(world: Path, **extra: Any) -> dict[str, Any]:
    return {
        "mounts": {
            "data": {"host": str(world / "data"), "mode": "rw"},
            "ro": {"host": str(world / "ro"), "mode": "r"},
        },
        **extra,
    }


def outside_state(world: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (world / "outside").iterdir() if p.is_file()}


def make_host(world: Path, clock: FakeClock, cache: Path, **options: Any) -> Host:
    options.setdefault("temp_dir", world / "tmp")
    broker = FilesBroker(clock=clock, temp_ttl_s=TTL_S, **options)
    return Host(Policy(allow={"files", "log"}), cache_dir=cache, brokers=[broker])


@pytest.fixture
def host(world: Path, clock: FakeClock, cache: Path) -> Iterator[Host]:
    with make_host(world, clock, cache) as h:
        yield h


def load(host: Host, world: Path, **extra: Any) -> Extension:
    ext = host.load(FILES)
    host.grant(ext.id, "files", scope(world, **extra))
    return ext


def proxy(host: Host, world: Path | None = None) -> Extension:
    ext = host.admit(bare(PROXY), grants=["files"])
    if world is not None:
        host.grant(ext.id, "files", scope(world))
    return ext


def fails(ext: Extension, command: str, value: Any) -> str:
    """The guest error class a command ends with (the host status its call got)."""
    with pytest.raises(CallError) as info:
        ext.call(command, value)
    return str(info.value.guest_class)


# -- what a guest does ----------------------------------------------------------------------


def test_each_operation_through_the_sdk(host: Host, world: Path) -> None:
    ext = load(host, world)
    data = world / "data"
    assert ext.call("read", {"mount": "data", "path": "a.txt"}) == b"hello"
    assert ext.call("read", {"mount": "ro", "path": "r.txt"}) == b"read only"
    big = bytes(range(256)) * 200  # 51,200 bytes: two calls each way
    assert ext.call("write", {"mount": "data", "path": "new.bin", "data": big}) == len(big)
    assert (data / "new.bin").read_bytes() == big
    assert ext.call("write", {"mount": "data", "path": "new.bin", "data": b"short"}) == 5
    assert (data / "new.bin").read_bytes() == b"short"  # "w" truncates
    assert ext.call("append", {"mount": "data", "path": "new.bin", "data": b"+more"}) == 5
    assert ext.call("append", {"mount": "data", "path": "log.txt", "data": b"one"}) == 3
    assert (data / "new.bin").read_bytes() == b"short+more"
    assert (data / "log.txt").read_bytes() == b"one"
    assert ext.call(
        "write-at", {"mount": "data", "path": "new.bin", "offset": 1, "data": b"HO"}
    ) == [2, b"sHOrt+more"]
    assert ext.call("copy", {"from": ["data", "new.bin"], "to": ["data", "sub/copy"]}) == 10
    assert (data / "sub" / "copy").read_bytes() == b"sHOrt+more"
    assert ext.call("copy", {"from": ["ro", "r.txt"], "to": ["data", "c"]}) == 9
    assert ext.call("temp-roundtrip", {"data": big}) == big
    assert ext.call("read", {"mount": "data", "path": "sub/b.txt"}) == b"in sub"


def test_symlinks_inside_the_mount_are_followed_as_the_wasi_profile_follows_them(
    host: Host, world: Path
) -> None:
    ext = load(host, world)
    assert ext.call("read", {"mount": "data", "path": "inner"}) == b"hello"
    assert ext.call("read", {"mount": "data", "path": "linkdir/b.txt"}) == b"in sub"
    assert ext.call("read", {"mount": "data", "path": "sub/../a.txt"}) == b"hello"


def test_the_broker_resolves_paths_with_the_wasi_profiles_walk(
    host: Host, world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One implementation: every open goes through wasihost.wasi.fs.PathWalk. A symlink to the
    outside swapped in between the walk and the final open (CVE-2024-38358's race) is seen as
    a link by the O_NOFOLLOW open, and following it through the walk is refused."""
    ext = load(host, world)
    target = world / "data" / "target"
    target.write_bytes(b"inside")
    real_walk = wasi_fs.PathWalk.walk
    walked: list[bytes] = []

    def walk_then_swap(self: wasi_fs.PathWalk) -> tuple[int, bytes, bool]:
        result = real_walk(self)
        walked.append(result[1])
        if result[1] == b"target" and not target.is_symlink():
            target.unlink()
            target.symlink_to("../outside/secret")
        return result

    monkeypatch.setattr(wasi_fs.PathWalk, "walk", walk_then_swap)
    assert fails(ext, "read", {"mount": "data", "path": "target"}) == "denied"
    assert fails(ext, "write", {"mount": "data", "path": "target", "data": b"x"}) == "denied"
    assert b"target" in walked
    assert outside_state(world) == {"secret": SECRET}


# -- escapes --------------------------------------------------------------------------------

ESCAPES = [
    ("../outside/secret", "denied"),
    ("sub/../../outside/secret", "denied"),
    ("./../outside/secret", "denied"),
    ("outsecret", "denied"),  # a symlink inside the mount pointing outside
    ("escdir/secret", "denied"),  # a symlinked parent directory pointing outside
    ("deep-out", "denied"),
    ("abs", "denied"),  # an absolute symlink target
    ("abs-in", "denied"),  # absolute targets are refused even when they point inside
    ("loop1", "denied"),
    ("/etc/passwd", "invalid_argument"),  # an absolute path: refused before any I/O
    (str(Path("/") / "outside" / "secret"), "invalid_argument"),
]


@pytest.mark.parametrize(("path", "expected"), ESCAPES)
def test_escapes_are_refused_and_nothing_outside_changes(
    host: Host, world: Path, path: str, expected: str
) -> None:
    ext = load(host, world)
    assert fails(ext, "read", {"mount": "data", "path": path}) == expected
    for command in ("write", "append"):
        assert fails(ext, command, {"mount": "data", "path": path, "data": b"x"}) == expected
    if "/" in path and path.endswith("secret"):  # creating a new name out there
        created = path.replace("secret", "created")
        assert fails(ext, "write", {"mount": "data", "path": created, "data": b"x"}) == expected
    assert outside_state(world) == {"secret": SECRET}


def test_a_mount_name_that_is_not_granted_is_denied(host: Host, world: Path) -> None:
    ext = load(host, world)
    assert fails(ext, "read", {"mount": "outside", "path": "secret"}) == "denied"
    assert fails(ext, "read", {"mount": str(world / "outside"), "path": "secret"}) == (
        "invalid_argument"  # a host path is not even a mount name
    )
    other = proxy(host)  # granted files, but no mounts at all
    assert call(other, "o", ["data", "a.txt", "r"]) is Status.DENIED


def test_a_mount_whose_directory_vanished_is_unavailable(host: Host, world: Path) -> None:
    p = proxy(host, world)
    (world / "ro" / "r.txt").unlink()
    (world / "ro").rmdir()
    assert call(p, "o", ["ro", "r.txt", "r"]) is Status.UNAVAILABLE


def test_no_host_path_reaches_the_guest(host: Host, world: Path) -> None:
    ext = load(host, world)
    texts = []
    for path, _ in ESCAPES:
        with pytest.raises(CallError) as info:
            ext.call("read", {"mount": "data", "path": path})
        texts.append(str(info.value))
    with pytest.raises(CallError) as info:
        ext.call("read", {"mount": "data", "path": "missing"})
    texts.append(str(info.value))
    texts.extend(r.message for r in ext.logs())
    assert texts and not any(str(world) in t for t in texts)
    # Everything the proxy gets back is a handle, bytes or a count.
    p = proxy(host, world)
    handle = call(p, "o", ["data", "a.txt", "r"])
    assert isinstance(handle, int)
    assert call(p, "r", [handle, None, 100]) == b"hello"


# -- modes ----------------------------------------------------------------------------------


def test_a_read_only_mount_refuses_every_writing_mode(host: Host, world: Path) -> None:
    ext = load(host, world)
    for command in ("write", "append"):
        assert fails(ext, command, {"mount": "ro", "path": "r.txt", "data": b"x"}) == "denied"
        assert fails(ext, command, {"mount": "ro", "path": "new", "data": b"x"}) == "denied"
    assert fails(ext, "write-at", {"mount": "ro", "path": "r.txt", "offset": 0, "data": b"x"}) == (
        "denied"
    )
    assert sorted(p.name for p in (world / "ro").iterdir()) == ["r.txt"]
    assert (world / "ro" / "r.txt").read_bytes() == b"read only"


def test_a_handle_does_only_what_its_mode_allows(host: Host, world: Path) -> None:
    p = proxy(host, world)
    reader = call(p, "o", ["data", "a.txt", "r"])
    assert call(p, "w", [reader, None, b"x"]) is Status.DENIED
    writer = call(p, "o", ["data", "w.txt", "w"])
    appender = call(p, "o", ["data", "a.log", "a"])
    assert call(p, "r", [writer, 0, 10]) is Status.DENIED
    assert call(p, "r", [appender, 0, 10]) is Status.DENIED
    assert call(p, "w", [appender, 0, b"x"]) is Status.INVALID_ARGUMENT  # appends only at the end
    assert call(p, "w", [appender, None, b"ab"]) == 2
    assert call(p, "w", [appender, None, b"cd"]) == 2
    assert (world / "data" / "a.log").read_bytes() == b"abcd"
    assert (world / "data" / "a.txt").read_bytes() == b"hello"
    rw = call(p, "o", ["data", "a.txt", "rw"])
    assert call(p, "w", [rw, 5, b"!"]) == 1
    assert call(p, "r", [rw, None, 100]) == b"hello!"
    assert call(p, "o", ["data", "missing", "rw"]) is Status.NOT_FOUND  # rw does not create


def test_only_regular_files_are_handed_out(host: Host, world: Path) -> None:
    os.mkfifo(world / "data" / "fifo")
    p = proxy(host, world)
    started = time.monotonic()
    assert call(p, "o", ["data", "fifo", "r"]) is Status.DENIED  # not blocked on the FIFO
    assert call(p, "o", ["data", "fifo", "a"]) in (Status.DENIED, Status.UNAVAILABLE)
    assert time.monotonic() - started < 2
    assert call(p, "o", ["data", "sub", "r"]) is Status.DENIED
    assert call(p, "o", ["data", "sub", "w"]) is Status.DENIED
    assert call(p, "o", ["data", "sub/", "r"]) is Status.INVALID_ARGUMENT
    assert call(p, "o", ["data", ".", "r"]) is Status.INVALID_ARGUMENT


# -- handles --------------------------------------------------------------------------------


def test_another_extensions_handle_numbers_mean_nothing(host: Host, world: Path) -> None:
    owner = load(host, world)
    handle = owner.call("temp-keep", {"data": b"owner's"})
    forger = proxy(host, world)
    assert call(forger, "r", [handle, 0, 100]) is Status.NOT_FOUND
    assert call(forger, "w", [handle, 0, b"forged"]) is Status.NOT_FOUND
    assert call(forger, "c", handle) is Status.NOT_FOUND
    # The forger's own first handle may carry the same number: it is the forger's own file.
    own = call(forger, "o", ["data", "a.txt", "r"])
    assert call(forger, "r", [own, 0, 100]) == b"hello"
    assert owner.call("read-handle", {"handle": handle}) == b"owner's"
    assert fails(owner, "read-handle", {"handle": handle + 1000}) == "not_found"


def test_open_handles_are_bounded_per_extension(host: Host, world: Path) -> None:
    ext = load(host, world)
    many = {"mount": "data", "path": "a.txt", "n": MAX_OPEN_FILES + 4}
    assert ext.call("open-many", many) == {"opened": MAX_OPEN_FILES, "error": "quota_exceeded"}
    # The SDK closed them as the command returned: the next command has them all again.
    assert ext.call("open-many", many) == {"opened": MAX_OPEN_FILES, "error": "quota_exceeded"}
    p = proxy(host, world)
    handles = [call(p, "o", ["data", "a.txt", "r"]) for _ in range(MAX_OPEN_FILES)]
    assert call(p, "o", ["data", "a.txt", "r"]) is Status.QUOTA_EXCEEDED
    assert call(p, "t", None) is Status.QUOTA_EXCEEDED
    assert call(p, "c", handles[0]) is None
    assert call(p, "c", handles[0]) is Status.NOT_FOUND
    fresh = call(p, "o", ["data", "a.txt", "r"])
    assert fresh not in handles  # numbers are never reused


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_handles_and_temporary_files_close_with_the_extension(host: Host, world: Path) -> None:
    p = proxy(host, world)
    assert call(p, "c", 99) is Status.NOT_FOUND  # instantiated: the engine's own are open
    before = _open_fds()
    for _ in range(4):
        assert isinstance(call(p, "o", ["data", "a.txt", "r"]), int)
        assert isinstance(call(p, "t", None), int)
    assert _open_fds() == before + 8
    private = list((world / "tmp").iterdir())
    assert len(private) == 1
    p.close()
    assert _open_fds() <= before
    assert list((world / "tmp").iterdir()) == []


@pytest.mark.parametrize("o_tmpfile", [True, False])
def test_temporary_files_are_nameless_in_a_private_directory(
    host: Host, world: Path, monkeypatch: pytest.MonkeyPatch, o_tmpfile: bool
) -> None:
    if not o_tmpfile:  # a file system without nameless files: created, then unlinked at once
        monkeypatch.delattr(files_module.os, "O_TMPFILE", raising=False)
    ext = load(host, world)
    handle = ext.call("temp-keep", {"data": b"scratch"})
    (private,) = (world / "tmp").iterdir()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert list(private.iterdir()) == []  # unlinked at creation: no name to find it by
    assert ext.call("read-handle", {"handle": handle}) == b"scratch"
    assert ext.call("close-handle", {"handle": handle}) is None
    assert fails(ext, "read-handle", {"handle": handle}) == "not_found"


def test_a_temporary_file_expires_after_its_time_bound(
    host: Host, world: Path, clock: FakeClock
) -> None:
    ext = load(host, world)
    assert ext.call("read", {"mount": "data", "path": "a.txt"}) == b"hello"  # instantiated
    fds = _open_fds()
    handle = ext.call("temp-keep", {"data": b"short-lived"})
    assert _open_fds() == fds + 1
    clock.now += TTL_S - 1
    assert ext.call("read-handle", {"handle": handle}) == b"short-lived"
    clock.now += 1
    assert fails(ext, "read-handle", {"handle": handle}) == "not_found"
    assert fails(ext, "write-handle", {"handle": handle, "data": b"x"}) == "not_found"
    assert _open_fds() == fds  # its descriptor, the file's last reference, is closed
    # Expired files are swept by any call, without being touched again.
    handle = ext.call("temp-keep", {"data": b"swept"})
    clock.now += TTL_S
    assert ext.call("read", {"mount": "data", "path": "a.txt"}) == b"hello"
    assert _open_fds() == fds


# -- bounds ---------------------------------------------------------------------------------


def test_each_call_moves_at_most_the_registrys_bound(host: Host, world: Path) -> None:
    (world / "data" / "big").write_bytes(b"b" * (MAX_IO_BYTES + 100))
    p = proxy(host, world)
    h = call(p, "o", ["data", "big", "rw"])
    assert len(call(p, "r", [h, 0, MAX_IO_BYTES])) == MAX_IO_BYTES
    assert call(p, "r", [h, 0, MAX_IO_BYTES + 1]) is Status.INVALID_ARGUMENT
    assert call(p, "w", [h, 0, b"w" * MAX_IO_BYTES]) == MAX_IO_BYTES
    assert call(p, "w", [h, 0, b"w" * (MAX_IO_BYTES + 1)]) is Status.INVALID_ARGUMENT
    # Past the entry's request limit the engine answers before the broker sees anything.
    assert call(p, "w", [h, 0, b"w" * 40_000]) is Status.PAYLOAD_TOO_LARGE


def test_the_write_quota_is_per_extension_and_leaves_files_unchanged(
    host: Host, world: Path
) -> None:
    # Each of q1 and q2 is made: NEW_ENTRY_BYTES each, then 1000 bytes of content.
    ext = load(host, world, max_write_bytes=2 * files_module.NEW_ENTRY_BYTES + 1000)
    assert ext.call("write", {"mount": "data", "path": "q1", "data": b"1" * 600}) == 600
    assert fails(ext, "write", {"mount": "data", "path": "q2", "data": b"2" * 401}) == (
        "quota_exceeded"
    )
    assert (world / "data" / "q2").read_bytes() == b""  # opened, nothing written
    assert ext.call("append", {"mount": "data", "path": "q1", "data": b"3" * 400}) == 400
    # Temporary files count too; and the quota is the extension's, not another one's.
    assert fails(ext, "temp-roundtrip", {"data": b"t"}) == "quota_exceeded"
    other = proxy(host, world)
    t = call(other, "t", None)
    assert call(other, "w", [t, None, b"x" * 1001]) == 1001


def test_the_embedders_quota_applies_without_a_scope_value(
    world: Path, clock: FakeClock, cache: Path
) -> None:
    with make_host(world, clock, cache, max_write_bytes=10) as host:
        ext = load(host, world)
        assert fails(ext, "temp-roundtrip", {"data": b"x" * 11}) == "quota_exceeded"
        assert ext.call("temp-roundtrip", {"data": b"x" * 10}) == b"x" * 10


def test_a_temporary_file_cannot_grow_past_its_bound(
    world: Path, clock: FakeClock, cache: Path
) -> None:
    with make_host(world, clock, cache, max_temp_bytes=1000) as host:
        ext = load(host, world)
        assert ext.call("temp-roundtrip", {"data": b"x" * 1000}) == b"x" * 1000
        assert fails(ext, "temp-roundtrip", {"data": b"x" * 1001}) == "quota_exceeded"
        p = proxy(host, world)
        t = call(p, "t", None)
        assert call(p, "w", [t, 999, b"ab"]) is Status.QUOTA_EXCEEDED
        assert call(p, "w", [t, 10**15, b"a"]) is Status.QUOTA_EXCEEDED


def test_a_write_cannot_make_a_mounted_file_huge(host: Host, world: Path) -> None:
    ext = load(host, world)
    far = {"mount": "data", "path": "a.txt", "offset": MAX_FILE_BYTES, "data": b"x"}
    assert fails(ext, "write-at", far) == "quota_exceeded"
    assert (world / "data" / "a.txt").stat().st_size == 5  # no sparse giant


def test_making_files_and_holes_is_paid_from_the_write_quota(host: Host, world: Path) -> None:
    # Break (red-team 2026-12-01): the quota counted only the bytes of each write. A guest with a
    # quota of 0 created file after file (60 empty files with 200-byte names, each an inode and
    # a directory entry of the host's disk), and with a quota of 10 bytes one byte written at
    # MAX_FILE_BYTES - 1 made a 1 GiB file, as many times as it liked.
    data = world / "data"
    p = host.admit(bare(PROXY), grants=["files"])
    host.grant(p.id, "files", scope(world, max_write_bytes=0))
    assert call(p, "o", ["data", "n" * 200, "w"]) is Status.QUOTA_EXCEEDED
    assert call(p, "o", ["data", "n" * 200, "a"]) is Status.QUOTA_EXCEEDED
    assert not (data / ("n" * 200)).exists()
    # Opening a file that exists makes nothing and pays nothing, in every mode.
    for mode in ("w", "a", "rw", "r"):
        h = call(p, "o", ["data", "sub/b.txt", mode])
        assert not isinstance(h, Status), mode
        assert call(p, "c", h) is None
    p2 = host.admit(bare(PROXY), grants=["files"])
    host.grant(p2.id, "files", scope(world, max_write_bytes=2 * files_module.NEW_ENTRY_BYTES + 10))
    made = [call(p2, "o", ["data", f"made{i}", m]) for i, m in enumerate("waw")]
    assert [isinstance(h, Status) for h in made] == [False, False, True]
    assert made[2] is Status.QUOTA_EXCEEDED and not (data / "made2").exists()
    # The ten bytes left pay for ten bytes written, not for a hole in front of them.
    h = made[0]
    assert call(p2, "w", [h, MAX_FILE_BYTES - 1, b"x"]) is Status.QUOTA_EXCEEDED
    assert call(p2, "w", [h, 10, b"x"]) is Status.QUOTA_EXCEEDED  # a hole of 10, then 1
    assert (data / "made0").stat().st_size == 0
    assert call(p2, "w", [h, 3, b"xy"]) == 2  # a hole of 3 and 2 bytes: 5 of the 10
    assert (data / "made0").read_bytes() == b"\0\0\0xy"
    assert call(p2, "w", [h, 0, b"abcde"]) == 5  # rewriting counts again, as it always has
    assert call(p2, "w", [h, 0, b"a"]) is Status.QUOTA_EXCEEDED
    assert call(p2, "w", [h, 99, b""]) == 0  # an empty write extends nothing and pays nothing
    assert (data / "made0").read_bytes() == b"abcde"


# -- revocation, admission, scopes ----------------------------------------------------------


def test_no_write_lands_after_a_revocation_returns(host: Host, world: Path) -> None:
    ext = load(host, world)
    target = world / "data" / "flood"
    result: list[Any] = []
    worker, outcome = run_in_thread(
        lambda: result.append(ext.call("append-until-error", {"mount": "data", "path": "flood"}))
    )
    deadline = time.monotonic() + 10
    while (not target.exists() or target.stat().st_size < 100) and time.monotonic() < deadline:
        time.sleep(0.001)
    host.revoke(ext.id, "files", "test")
    size_at_revoke = target.stat().st_size
    worker.join(timeout=10)
    assert not worker.is_alive() and not outcome
    assert size_at_revoke >= 100
    assert target.stat().st_size == size_at_revoke, "a write landed after revoke returned"
    assert result[0]["error"] == "denied"
    assert result[0]["written"] == size_at_revoke


def test_a_withdrawn_mount_stops_serving_the_handles_opened_under_it(
    host: Host, world: Path
) -> None:
    p = proxy(host, world)
    h = call(p, "o", ["data", "a.txt", "rw"])
    t = call(p, "t", None)
    host.grant(p.id, "files", {"mounts": {"ro": {"host": str(world / "ro")}}})
    assert call(p, "r", [h, 0, 10]) is Status.DENIED
    assert call(p, "w", [h, 0, b"x"]) is Status.DENIED
    assert call(p, "w", [t, 0, b"temp"]) == 4  # a temporary file belongs to no mount
    assert (world / "data" / "a.txt").read_bytes() == b"hello"


def test_a_1_0_guest_importing_a_files_entry_is_refused_by_name(host: Host) -> None:
    with pytest.raises(AdmissionError) as info:
        host.admit(bare(proxy_wasm("1.0")), grants=["files"])
    problems = "\n".join(info.value.problems)
    assert "wasihost_v1.file_open" in problems
    assert "added in ABI 1.1" in problems


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"paths": {}}, "unknown keys paths"),
        ({"mounts": [{"host": "/tmp"}]}, "must map names"),
        ({"mounts": {"data": {"host": "relative"}}}, "must be absolute"),
        ({"mounts": {"data": {"host": "/tmp", "mode": "w"}}}, 'mode "r" or "rw"'),
        ({"mounts": {"data": {"host": "/tmp", "writable": True}}}, "expected"),
        ({"mounts": {"../x": {"host": "/tmp"}}}, "mount name"),
        ({"mounts": {"data": {"host": "/nonexistent-wasihost-dir"}}}, "not a directory"),
        ({"max_write_bytes": -1}, "max_write_bytes"),
        ({"max_write_bytes": True}, "max_write_bytes"),
    ],
)
def test_a_malformed_scope_is_refused_at_grant(
    host: Host, bad: dict[str, Any], message: str
) -> None:
    ext = proxy(host)
    with pytest.raises(ConfigError, match=message):
        host.grant(ext.id, "files", bad)


def test_embedder_mounts_serve_every_granted_extension(
    world: Path, clock: FakeClock, cache: Path
) -> None:
    shared = {"shared": {"host": str(world / "ro"), "mode": "r"}}
    with make_host(world, clock, cache, mounts=shared) as host:
        ext = host.load(FILES)  # granted files with no scope of its own
        assert ext.call("read", {"mount": "shared", "path": "r.txt"}) == b"read only"
        assert fails(ext, "write", {"mount": "shared", "path": "r.txt", "data": b""}) == "denied"
        with pytest.raises(ConfigError, match="is the embedder's already"):
            host.grant(ext.id, "files", {"mounts": {"shared": {"host": str(world / "data")}}})


# -- hostile requests -----------------------------------------------------------------------

MALFORMED = [
    ("o", []),
    ("o", ["data", "a.txt"]),
    ("o", ["data", "a.txt", "x"]),
    ("o", ["data", "a.txt", "R"]),
    ("o", ["data", "a.txt", ["r"]]),
    ("o", ["data", "a.txt", {"r": 1}]),
    ("o", ["data", "a\0b", "r"]),
    ("o", ["data", "/etc/passwd", "r"]),
    ("o", ["data", "", "r"]),
    ("o", ["data", "a" * 1025, "r"]),
    ("o", ["data", "n" * 256, "r"]),
    ("o", [1, "a.txt", "r"]),
    ("o", ["da/ta", "a.txt", "r"]),
    ("o", ["data", b"a.txt", "r"]),
    ("o", {"mount": "data"}),
    ("t", 0),
    ("t", []),
    ("r", [1, -1, 10]),
    ("r", [1, 0, -1]),
    ("r", [1, 0, MAX_IO_BYTES + 1]),
    ("r", [1, 0, True]),
    ("r", [-1, 0, 1]),
    ("r", [1, "0", 1]),
    ("r", [1, 0.5, 1]),
    ("r", [1, 2**63, 1]),
    ("r", "1"),
    ("w", [1, -1, b"x"]),
    ("w", [1, 0, "text"]),
    ("w", [1, None, b"x" * (MAX_IO_BYTES + 1)]),
    ("w", [1, None]),
    ("c", -1),
    ("c", "1"),
    ("c", True),
    ("c", [1]),
]


@pytest.mark.parametrize(("op", "request_value"), MALFORMED)
def test_malformed_requests_get_invalid_argument_before_any_io(
    host: Host, world: Path, monkeypatch: pytest.MonkeyPatch, op: str, request_value: Any
) -> None:
    p = proxy(host, world)
    handle = call(p, "o", ["data", "a.txt", "rw"])
    assert handle == 1  # so the malformed requests above name a real handle
    touched: list[str] = []
    for name in ("pread", "pwrite", "write", "open"):
        real = getattr(os, name)
        monkeypatch.setattr(
            files_module.os,
            name,
            lambda *a, _real=real, _name=name, **k: touched.append(_name) or _real(*a, **k),
        )
    monkeypatch.setattr(
        files_module, "open_beneath", lambda *a, **k: touched.append("open_beneath")
    )
    assert call(p, op, request_value) is Status.INVALID_ARGUMENT
    assert touched == []
    monkeypatch.undo()
    assert (world / "data" / "a.txt").read_bytes() == b"hello"


HOSTILE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Extension, Path]]:
    world = tmp_path_factory.mktemp("hostile")
    (world / "data").mkdir()
    (world / "ro").mkdir()
    (world / "data" / "a.txt").write_bytes(b"hello")
    with Host(Policy(allow={"files"}), cache_dir=None) as host:
        yield proxy(host, world), world


@HOSTILE
@given(op=st.sampled_from("otrwc"), request=st.binary(max_size=300))
def test_any_request_bytes_get_a_status_or_a_response(
    hostile: tuple[Extension, Path], op: str, request: bytes
) -> None:
    ext, world = hostile
    ret, response = raw_call(ext, op, request)
    if ret < 0:
        Status(-ret)  # a code of the ABI, nothing else
    else:
        cbor2.loads(response)
    assert {p.name for p in world.iterdir()} == {"data", "ro"}


@HOSTILE
@given(
    op=st.sampled_from("otrwc"),
    request=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.text() | st.binary(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=8,
    ),
)
def test_any_request_value_gets_a_status_or_a_response(
    hostile: tuple[Extension, Path], op: str, request: Any
) -> None:
    ext, world = hostile
    answer = call(ext, op, request)
    assert answer is None or isinstance(answer, (Status, int, bytes))
    assert {p.name for p in world.iterdir()} == {"data", "ro"}
