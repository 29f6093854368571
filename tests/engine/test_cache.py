"""The on-disk module cache against other local users: directory swaps, shared parents, and
packages whose digest lies. Each case ends in a recompile or a disabled cache with a warning,
never in loading code the host did not compile itself."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import cbor2
import pytest

from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, escape, guest_wat
from wasihost.core.errors import AdmissionError
from wasihost.engine.cache import CACHE_KEY_BYTES
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package

# The uid the tests give "another user"'s files (we run as root, which may chown).
OTHER_UID = 65534
ANSWER_AT = 8192
KEY_NAME = "hmac.key"  # the cache's on-disk layout


def answering(value: str) -> bytes:
    """A guest whose every command answers ``value``: which code ran is visible in the answer."""
    blob = b"\x00\x00\x00\x00" + cbor2.dumps(value)
    return build(
        guest_wat(
            f"(call $packed (i32.const {ANSWER_AT}) (i32.const {len(blob)}))",
            extra=f'(data (i32.const {ANSWER_AT}) "{escape(blob)}")',
        )
    )


VICTIM = answering("victim")
ATTACKER = answering("attacker")


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def open_host(cache: Path) -> tuple[Host, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        host = Host(Policy(allow=ALL_CAPS), cache_dir=cache)
    return host, [str(w.message) for w in caught]


def forge_attacker_dir(attacker: Path, victim_cache: Path) -> tuple[str, bytes]:
    """What another user prepares: their own key, and under the name of the victim's entry,
    a validly serialised module of a different guest, signed with that key."""
    with Host(Policy(allow=ALL_CAPS), cache_dir=attacker) as host:
        module = host.engine.compile(ATTACKER, hashlib.sha256(ATTACKER).hexdigest()).module
        payload = bytes(module.serialize())
    with Host(Policy(allow=ALL_CAPS), cache_dir=victim_cache) as victim:
        name = victim.engine.cache._entry_name(hashlib.sha256(VICTIM).hexdigest())
    key = (attacker / KEY_NAME).read_bytes()
    assert len(key) == CACHE_KEY_BYTES
    mac = hmac.new(key, name.encode() + b"\0" + payload, hashlib.sha256).digest()
    for entry in attacker.glob("*.cwasm"):
        entry.unlink()
    (attacker / name).write_bytes(mac + payload)
    for path in (attacker, *attacker.iterdir()):
        os.chown(path, OTHER_UID, OTHER_UID)
    return name, mac + payload


SWAPPER = r"""
import ctypes, ctypes.util, os, sys, time
a, b, seconds, name, forged = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
blob = open(forged, "rb").read()
mine = os.open(b, os.O_RDONLY | os.O_DIRECTORY)  # the attacker's directory, wherever it is
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
def exchange():
    if hasattr(libc, "renameat2"):
        if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0:
            return
    tmp = a + ".swap"  # no renameat2: two renames, a wider window but the same attack
    os.rename(a, tmp); os.rename(b, a); os.rename(tmp, b)
def replant():
    # The victim runs as root here and may delete or overwrite files in the attacker's
    # directory, which another user's victim could not: put the forged entry back.
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=mine)
        with os.fdopen(fd, "rb") as f:
            if f.read(64) == blob[:64]:
                return
    except OSError:
        pass
    fd = os.open(".plant", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=mine)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(".plant", name, src_dir_fd=mine, dst_dir_fd=mine)
swaps = 0
end = time.monotonic() + seconds
print("ready", flush=True)
while time.monotonic() < end:
    exchange()
    swaps += 1
    if swaps % 8 == 0:
        replant()
print(swaps, flush=True)
"""


@pytest.fixture
def swapper() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_directory_swap_race_never_loads_the_other_users_entry(
    tmp_path: Path, swapper: list[subprocess.Popen[str]]
) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    cache, attacker = parent / "cache", parent / "attacker"
    # The victim's own entry exists, so that a load through the right directory is a disk hit.
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as host:
        assert host.admit(bare(VICTIM)).call("run") == "victim"
    private_dir(attacker)
    name, blob = forge_attacker_dir(attacker, cache)
    forged = tmp_path / "forged"
    forged.write_bytes(blob)
    # Without the fix, a victim that reads key and entries by path during the swaps runs the
    # attacker's code: check the forged directory would indeed be accepted by path.
    assert len(list(attacker.glob("*.cwasm"))) == 1

    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(cache), str(attacker), "3", name, str(forged)],
        stdout=subprocess.PIPE,
        text=True,
    )
    swapper.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    outcomes = {"disk": 0, "compiled": 0, "disabled": 0}
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        host, messages = open_host(cache)
        with host:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ext = host.admit(bare(VICTIM))
            messages += [str(w.message) for w in caught]
            assert ext.call("run") == "victim"
            stats = host.engine.cache
            if host.engine.cache.directory is None:
                outcomes["disabled"] += 1
                assert any("module cache disabled" in m for m in messages), messages
            elif stats.disk_hits:
                outcomes["disk"] += 1
            else:
                outcomes["compiled"] += 1
    print(outcomes)
    assert outcomes["disk"] + outcomes["compiled"] + outcomes["disabled"] > 5, outcomes
    assert outcomes["disabled"] > 0, outcomes  # the swap did land while hosts opened the cache


def test_a_parent_writable_by_others_disables_the_cache(tmp_path: Path) -> None:
    for mode in (0o777, 0o775, 0o757):
        shared = tmp_path / f"shared-{mode:o}"
        shared.mkdir()
        shared.chmod(mode)
        host, messages = open_host(shared / "wasihost" / "modules")
        with host:
            assert host.engine.cache.directory is None
            assert any(
                "module cache disabled" in m and "writable by group or others" in m
                for m in messages
            ), messages
            assert host.admit(bare(VICTIM)).call("run") == "victim"  # compiled, in memory
        assert list(shared.iterdir()) == []  # nothing was created under the shared parent


def test_a_sticky_parent_of_ours_is_trusted(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    host, messages = open_host(sticky / "cache")
    with host:
        assert messages == []
        assert host.engine.cache.directory == sticky / "cache"


def test_a_parent_or_directory_of_another_user_disables_the_cache(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    host, messages = open_host(theirs / "cache")
    with host:
        assert host.engine.cache.directory is None
        assert any(f"owned by uid {OTHER_UID}" in m for m in messages), messages
    cache = private_dir(tmp_path / "cache")
    os.chown(cache, OTHER_UID, OTHER_UID)
    host, messages = open_host(cache)
    with host:
        assert host.engine.cache.directory is None
        assert any(f"owned by uid {OTHER_UID}" in m for m in messages), messages


def test_a_symlinked_cache_directory_is_checked_where_it_points(tmp_path: Path) -> None:
    target = private_dir(tmp_path / "target")
    os.chown(target, OTHER_UID, OTHER_UID)
    link = tmp_path / "link"
    link.symlink_to(target)
    host, messages = open_host(link)
    with host:
        assert host.engine.cache.directory is None
        assert any(f"owned by uid {OTHER_UID}" in m for m in messages), messages


def test_a_cache_directory_with_group_or_other_bits_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o750)
    host, messages = open_host(cache)
    with host:
        assert host.engine.cache.directory is None
        assert any("it must be 0700" in m for m in messages), messages


def test_close_releases_the_directory_handle(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    before = len(os.listdir("/proc/self/fd"))
    host, _ = open_host(cache)
    assert len(os.listdir("/proc/self/fd")) == before + 1
    host.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert oct(cache.stat().st_mode & 0o777) == "0o700"


def test_a_package_whose_digest_lies_never_poisons_nor_loads_an_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    victim_digest = hashlib.sha256(VICTIM).hexdigest()
    lying = Package("compute.wasm", None, ATTACKER, victim_digest)
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as host:
        with contextlib.suppress(AdmissionError):
            host.admit(lying)
        assert host.admit(bare(VICTIM)).call("run") == "victim"  # not from the memory cache
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as host:
        assert host.admit(bare(VICTIM)).call("run") == "victim"  # nor from the disk cache
    # The victim loaded first, then a lie naming the attacker's digest: refused, and each
    # module still runs its own code.
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as host:
        with pytest.raises(AdmissionError, match="sha256 does not match its module bytes"):
            host.admit(lying)
        with pytest.raises(AdmissionError, match="sha256 does not match its module bytes"):
            host.admit(Package("echo.wasm", None, VICTIM, hashlib.sha256(ATTACKER).hexdigest()))
        assert host.admit(bare(ATTACKER)).call("run") == "attacker"
        assert host.admit(bare(VICTIM)).call("run") == "victim"


def test_the_cache_keys_entries_by_the_digest_it_computes(tmp_path: Path) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=tmp_path / "cache") as host:
        _, digest = host.engine.cache.get(ATTACKER)
        assert digest == hashlib.sha256(ATTACKER).hexdigest()
        names = [p.name for p in (tmp_path / "cache").glob("*.cwasm")]
        assert [n.split("-")[0] for n in names] == [digest]
