"""Escape attempts against the mount: whatever the guest does, nothing outside the mount is
read, created or modified. Each attack runs through the engine with the raw-call probe (real
preview1 calls from a real module), with a sentinel directory planted next to the mount."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pytest

from tests.support.wasi import PROBE, DirectGuest, package, run_wasihost
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import Errno, Mount, WasiOptions, capabilities_for, wasi_profile
from wasihost.wasi import fs as wasi_fs
from wasihost.wasi.abi import ALL_RIGHTS, OFLAG_CREAT

SECRET = "top secret\n"


def snapshot(root: Path, skip: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` except the mount: type, size, mtime, content digest."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if here == skip or skip in here.parents:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = here / name
            if p == skip:
                continue
            st = p.lstat()
            digest = (
                hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink()
                else os.readlink(p) if p.is_symlink() else ""
            )  # fmt: skip
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """tmp/mount (the guest's /m) next to tmp/outside (the sentinel), with hostile symlinks
    and a hard link planted in the mount by the host."""
    mount = tmp_path / "mount"
    outside = tmp_path / "outside"
    mount.mkdir()
    outside.mkdir()
    (outside / "secret").write_text(SECRET)
    (outside / "dir").mkdir()
    (mount / "f.txt").write_text("inside\n")
    (mount / "sub").mkdir()
    (mount / "etc").symlink_to("/etc")
    (mount / "out").symlink_to("../outside")
    (mount / "outsecret").symlink_to("../outside/secret")
    (mount / "dangling-out").symlink_to("../outside/created-by-guest")
    (mount / "chain1").symlink_to("chain2")
    (mount / "chain2").symlink_to("sub/../chain3")
    (mount / "chain3").symlink_to("../outside/secret")
    (mount / "loop1").symlink_to("loop2")
    (mount / "loop2").symlink_to("loop1")
    (mount / "abs-self").symlink_to(str(mount / "f.txt"))
    return tmp_path


ATTACKS = [
    # `..` chains
    ("open:3:../outside/secret::r:n", "open 63"),
    ("open:3:sub/../../outside/secret::r:n", "open 63"),
    ("open:3:sub/../sub/../../outside/secret::r:f", "open 63"),
    ("open:3:./.././outside/secret::r:n", "open 63"),
    ("open:3:../outside/new:c:rw:n", "open 63"),
    ("mkdir:3:../outside/evil", "mkdir 63"),
    ("mkdir:3:../evil", "mkdir 63"),
    ("unlink:3:../outside/secret", "unlink 63"),
    ("rmdir:3:../outside/dir", "rmdir 63"),
    ("rename:3:f.txt:3:../outside/moved", "rename 63"),
    ("rename:3:../outside/secret:3:stolen", "rename 63"),
    ("stat:3:..:n", "stat 63 0 0 0"),
    ("stat:3:../outside/secret:n", "stat 63 0 0 0"),
    ("ptimes:3:../outside/secret:5:n", "ptimes 63"),
    ("readlink:3:../outside/x:10", "readlink 63 0 "),
    # absolute paths
    ("open:3:/etc/passwd::r:f", "open 63"),
    ("open:3://etc/passwd::r:f", "open 63"),
    ("open:3:/::r:n", "open 63"),
    ("mkdir:3:/tmp/evil", "mkdir 63"),
    # symlinks planted by the host
    ("open:3:etc/passwd::r:f", "open 63"),
    ("open:3:etc::r:f", "open 63"),
    ("stat:3:etc:f", "stat 63 0 0 0"),
    ("open:3:out/secret::r:n", "open 63"),
    ("open:3:out/new:c:rw:n", "open 63"),
    ("mkdir:3:out/evil", "mkdir 63"),
    ("open:3:outsecret::r:f", "open 63"),
    ("open:3:outsecret::rw:f", "open 63"),
    ("open:3:outsecret:t:rw:f", "open 63"),
    ("ptimes:3:outsecret:5:f", "ptimes 63"),
    ("link:3:outsecret:3:hard:f", "link 63"),
    ("open:3:chain1::r:f", "open 63"),
    ("open:3:loop1::r:f", "open 32"),
    ("open:3:abs-self::r:f", "open 63"),  # absolute even though it points inside
    # the CVE-2024-38358 shape: create through a dangling symlink that points outside
    ("open:3:dangling-out:c:rw:f", "open 63"),
    ("open:3:dangling-out:c:rw:n", "open 32"),
    ("open:3:dangling-out:cx:rw:f", "open 20"),
    # symlinks created by the guest
    ("symlink:/etc:3:myetc", "symlink 69"),  # the mount is writable: refused as absolute
    ("symlink:../outside:3:myout", "symlink 0"),  # created (just text), but never followed:
    ("open:3:myout/secret::r:n", "open 44"),  # ... it does not exist yet in this run's order
    # hard links out of the mount
    ("link:3:f.txt:3:../outside/linked:n", "link 63"),
    ("link:3:../outside/secret:3:stolen:n", "link 63"),
    # over-long and malformed paths
    ("longpath:3:5000", "longpath 37"),
    ("longname:3:300", "longname 37"),
    ("badutf8:3", "badutf8 25"),
]


@pytest.mark.parametrize(("step", "expected"), ATTACKS, ids=[a for a, _ in ATTACKS])
def test_escape_attempt_is_refused_and_touches_nothing_outside(
    world: Path, step: str, expected: str
) -> None:
    mount = world / "mount"
    before = snapshot(world, mount)
    # the mount is writable, so refusals come from resolution, not from read-only-ness; the
    # absolute-symlink refusal is PERM (69 would be ROFS): see the expected list
    run = run_wasihost(PROBE, ["probe", step], mounts=[Mount(mount, "/m", writable=True)])
    line = run.lines[0]
    if step.startswith("symlink:/etc"):
        expected = "symlink 63"
    assert line == expected
    assert snapshot(world, mount) == before
    assert SECRET not in run.stdout.decode("utf-8", "replace")


def test_guest_made_symlinks_out_are_never_followed(world: Path) -> None:
    mount = world / "mount"
    before = snapshot(world, mount)
    steps = ["symlink:../outside:3:myout", "open:3:myout/secret::r:n", "open:3:myout::r:f",
             "symlink:../../../../../../etc/passwd:3:deep", "open:3:deep::r:f",
             "open:3:myout/x:c:rw:f", "mkdir:3:myout/d", "stat:3:myout/secret:f"]  # fmt: skip
    run = run_wasihost(PROBE, ["probe", *steps], mounts=[Mount(mount, "/m", writable=True)])
    assert run.lines == ["symlink 0", "open 63", "open 63", "symlink 0", "open 63", "open 63",
                         "mkdir 63", "stat 63 0 0 0"]  # fmt: skip
    assert snapshot(world, mount) == before


def test_a_directory_swapped_for_a_symlink_after_open(world: Path) -> None:
    """The guest holds a descriptor to sub; the host then replaces sub with a symlink to the
    outside. The descriptor still means the original directory, and new paths through sub are
    refused."""
    mount = world / "mount"
    guest = DirectGuest(WasiOptions(mounts=[Mount(mount, "/m", writable=True)]))
    try:
        err, sub_fd = guest.open(3, "sub")
        assert err == 0
        (mount / "sub").rename(mount / "sub-old")
        (mount / "sub").symlink_to("../outside")
        before = snapshot(world, mount)
        assert guest.open(sub_fd, "new.txt", OFLAG_CREAT, rights=ALL_RIGHTS)[0] == 0
        # ... in the original directory, now called sub-old
        assert (mount / "sub-old" / "new.txt").exists()
        assert guest.open(3, "sub/secret")[0] == Errno.PERM
        assert guest.open(3, "sub/evil", OFLAG_CREAT, rights=ALL_RIGHTS)[0] == Errno.PERM
        assert guest.path_call("path_create_directory", 3, "sub/evil") == Errno.PERM
        assert guest.open(sub_fd, "../outside/secret")[0] == Errno.PERM
        assert snapshot(world, mount) == before
    finally:
        guest.close()


def test_a_symlink_swapped_in_during_resolution_is_not_followed(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of CVE-2024-38358: between the walk and the final open the host swaps the last
    component for a symlink to the outside. The final open carries O_NOFOLLOW, so the swapped
    link is seen as a link, and resolving it is refused."""
    mount = world / "mount"
    (mount / "target").write_text("inside")
    guest = DirectGuest(WasiOptions(mounts=[Mount(mount, "/m", writable=True)]))
    real_walk = wasi_fs.PathWalk.walk

    def walk_then_swap(self: wasi_fs.PathWalk) -> tuple[int, bytes, bool]:
        result = real_walk(self)
        if result[1] == b"target" and not (mount / "target").is_symlink():
            (mount / "target").unlink()
            (mount / "target").symlink_to("../outside/secret")
        return result

    monkeypatch.setattr(wasi_fs.PathWalk, "walk", walk_then_swap)
    before = snapshot(world, mount)
    try:
        assert guest.open(3, "target", OFLAG_CREAT, rights=ALL_RIGHTS)[0] == Errno.PERM
        assert guest.open(3, "target", follow=False)[0] == Errno.LOOP
    finally:
        guest.close()
    assert snapshot(world, mount) == before


def test_a_directory_moved_out_during_resolution_fails_closed(world: Path) -> None:
    """`..` is checked against the directory the walk descended from: once the host has moved
    the guest's directory elsewhere, `..` from it no longer leads back and is refused."""
    mount = world / "mount"
    (mount / "sub" / "deeper").mkdir()
    guest = DirectGuest(WasiOptions(mounts=[Mount(mount, "/m", writable=True)]))
    try:
        err, deeper = guest.open(3, "sub/deeper")
        assert err == 0
        (mount / "sub" / "deeper").rename(world / "outside" / "moved")
        # relative to its own descriptor the guest may still use it (it holds the directory),
        # but it cannot climb out of it
        assert guest.open(deeper, "../secret")[0] == Errno.PERM
        assert guest.open(deeper, "../../outside/secret")[0] == Errno.PERM
    finally:
        guest.close()


def test_links_and_renames_never_cross_mounts(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    rw = tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "precious").write_text("read-only data")
    steps = ["link:3:precious:4:writable-alias:n", "rename:3:precious:4:moved",
             "rename:4:x:3:y", "open:4:new:c:rw:n"]  # fmt: skip
    run = run_wasihost(
        PROBE, ["probe", *steps], mounts=[Mount(ro, "/ro"), Mount(rw, "/rw", writable=True)]
    )
    assert run.lines == ["link 75", "rename 75", "rename 75", "open 0"]
    assert os.listdir(rw) == ["new"]
    assert (ro / "precious").read_text() == "read-only data"


def test_deep_paths_hold_one_walk_descriptor(world: Path) -> None:
    mount = world / "mount"
    deep = mount
    for _ in range(200):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "leaf").write_text("deep")
    guest = DirectGuest(WasiOptions(mounts=[Mount(mount, "/m")]))
    try:
        before = len(os.listdir("/proc/self/fd"))
        path = "/".join(["d"] * 200) + "/leaf"
        err, fd = guest.open(3, path)
        assert err == 0 and guest.read(fd, 10) == (0, b"deep")
        assert len(os.listdir("/proc/self/fd")) == before + 1  # just the opened file
        up = "/".join(["d"] * 200) + "/" + "/".join([".."] * 200) + "/f.txt"
        assert guest.open(3, up)[0] == 0
        assert guest.open(3, up.replace("f.txt", "../outside/secret"))[0] == Errno.PERM
    finally:
        guest.close()


def test_nul_in_a_path_is_invalid(world: Path) -> None:
    guest = DirectGuest(WasiOptions(mounts=[Mount(world / "mount", "/m")]))
    try:
        assert guest.open(3, b"f.txt\0../../outside/secret")[0] == Errno.INVAL
    finally:
        guest.close()


def test_no_host_descriptor_outlives_a_run(world: Path) -> None:
    steps = ["open:3:f.txt::r:n", "open:3:sub:d:r:n", "open:3:sub/x:c:rw:n", "exit:0"]
    config = WasiOptions(argv=["probe", *steps], mounts=[Mount(world / "mount", "/m", True)])
    with Host(Policy(allow=capabilities_for(config)), cache_dir=None,
              profiles=[wasi_profile(config)]) as host:  # fmt: skip
        ext = host.admit(package(PROBE), grants=capabilities_for(config))
        ext.run_command()  # compiles and warms up whatever the engine keeps open
        # Objects of earlier tests that the collector finalises mid-run would close their own
        # descriptors and change the listing: collect first, and not during the measurement.
        gc.collect()
        gc.disable()
        try:
            before = sorted(os.listdir("/proc/self/fd"))
            assert ext.run_command() == 0
            assert sorted(os.listdir("/proc/self/fd")) == before
        finally:
            gc.enable()
