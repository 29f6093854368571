"""Property: no sequence of preview1 calls reaches a host path outside the granted mount.

Handlers are driven directly over a BytearrayMemory with random call sequences whose paths come
from an alphabet of ``..``, ``.``, ``/``, names and hostile symlinks. Every host system call that
names something relative to a directory descriptor is checked as it happens: the directory must
lie inside the mount, and ``..`` is never asked of the mount's root. After every call every
descriptor the guest holds must be inside the mount, and at the end the sentinel directory next
to the mount must be untouched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.wasi import READ_RIGHTS, DirectGuest
from tests.wasi.test_wasi_escapes import snapshot
from wasihost.wasi import Mount, WasiOptions
from wasihost.wasi.abi import ALL_RIGHTS
from wasihost.wasi.fds import HostDescriptor

NAMES = ["a", "b", "sub", "f.txt", "in", "out", "abs", "dangling", "loop", "..", ".", ""]
# Calls that take (dirfd, path); write calls are included, the mount is writable.
PATH_CALLS = ["open", "open_create", "mkdir", "rmdir", "unlink", "stat", "stat_follow",
              "readlink", "utimes", "symlink", "rename", "link", "link_follow"]  # fmt: skip
FD_CALLS = ["close", "read", "write", "readdir", "renumber", "seek", "filestat", "set_size"]

paths = st.builds(
    lambda lead, parts, trail: ("/" if lead else "") + "/".join(parts) + ("/" if trail else ""),
    st.integers(0, 9).map(lambda n: n == 0),  # now and then an absolute path
    st.lists(st.sampled_from(NAMES), min_size=0, max_size=6),
    st.booleans(),
)
# Mostly the preopen (3) or the first descriptors opened after it; now and then any number.
fd_choice = st.sampled_from([3, 3, 3, 3, 4, 4, 5, 6, *range(13)])
calls = st.one_of(
    st.tuples(st.sampled_from(PATH_CALLS), fd_choice, paths, paths),
    st.tuples(st.sampled_from(FD_CALLS), fd_choice, fd_choice, st.integers(0, 64)),
)


def build_world(root: Path) -> tuple[Path, Path]:
    mount = root / "mount"
    sentinel = root / "sentinel"
    (mount / "sub" / "a").mkdir(parents=True)
    sentinel.mkdir()
    (sentinel / "secret").write_text("secret")
    (sentinel / "dir").mkdir()
    (mount / "f.txt").write_text("inside")
    (mount / "in").symlink_to("sub")
    (mount / "out").symlink_to("../sentinel")
    (mount / "sub" / "out").symlink_to("../../sentinel/secret")
    (mount / "abs").symlink_to(str(sentinel))
    (mount / "dangling").symlink_to("../sentinel/created")
    (mount / "loop").symlink_to("loop")
    return mount, sentinel


@contextmanager
def guarded_syscalls(mount: Path) -> Iterator[list[str]]:
    """Wrap the os functions the profile uses with a dir_fd, checking each call's directory."""
    real = os.path.realpath(mount)
    violations: list[str] = []
    saved: dict[str, Callable[..., Any]] = {}

    def check(fn_name: str, dir_fd: Any, name: Any) -> None:
        if not isinstance(dir_fd, int):
            return
        where = os.readlink(f"/proc/self/fd/{dir_fd}")
        inside = where == real or where.startswith(real + "/")
        if not inside or (os.fsencode(name) == b".." and where == real):
            violations.append(f"{fn_name}({name!r}) in {where}")

    def wrap(fn_name: str, arg_names: tuple[str, ...]) -> None:
        original = getattr(os, fn_name)
        saved[fn_name] = original

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for i, key in enumerate(arg_names):
                if key in kwargs and i < len(args):
                    check(fn_name, kwargs[key], args[i])
            return original(*args, **kwargs)

        setattr(os, fn_name, wrapper)

    wrap("open", ("dir_fd",))
    wrap("mkdir", ("dir_fd",))
    wrap("rmdir", ("dir_fd",))
    wrap("unlink", ("dir_fd",))
    wrap("readlink", ("dir_fd",))
    wrap("stat", ("dir_fd",))
    wrap("utime", ("dir_fd",))
    wrap("symlink", ("", "dir_fd"))
    wrap("rename", ("src_dir_fd", "dst_dir_fd"))
    wrap("link", ("src_dir_fd", "dst_dir_fd"))
    try:
        yield violations
    finally:
        for fn_name, original in saved.items():
            setattr(os, fn_name, original)


def run_call(guest: DirectGuest, call: tuple[Any, ...]) -> None:
    kind, fd, a, b = call
    if kind == "open":
        guest.open(fd, a, rights=READ_RIGHTS, follow=True)
    elif kind == "open_create":
        guest.open(fd, a, oflags=1, rights=ALL_RIGHTS, follow=len(a) % 2 == 0)
    elif kind in ("mkdir", "rmdir", "unlink"):
        name = {"mkdir": "path_create_directory", "rmdir": "path_remove_directory",
                "unlink": "path_unlink_file"}[kind]  # fmt: skip
        guest.path_call(name, fd, a)
    elif kind in ("stat", "stat_follow"):
        p, n = guest.put(a.encode())
        guest.call("path_filestat_get", fd, int(kind == "stat_follow"), p, n, guest.alloc(64))
    elif kind == "readlink":
        p, n = guest.put(a.encode())
        guest.call("path_readlink", fd, p, n, guest.alloc(64), 64, guest.alloc(4))
    elif kind == "utimes":
        p, n = guest.put(a.encode())
        guest.call("path_filestat_set_times", fd, 1, p, n, 0, 5_000_000_000, 4)
    elif kind == "symlink":
        t, tn = guest.put(b.encode())
        p, n = guest.put(a.encode())
        guest.call("path_symlink", t, tn, fd, p, n)
    elif kind == "rename":
        p, n = guest.put(a.encode())
        q, m = guest.put(b.encode())
        guest.call("path_rename", fd, p, n, 3, q, m)
    elif kind in ("link", "link_follow"):
        p, n = guest.put(a.encode())
        q, m = guest.put(b.encode())
        guest.call("path_link", fd, int(kind == "link_follow"), p, n, 3, q, m)
    elif kind == "close":
        if fd > 3:  # keep the preopen most of the time: more paths get exercised
            guest.call("fd_close", fd)
    elif kind == "read":
        guest.read(fd, b)
    elif kind == "write":
        guest.write(fd, b"x" * b)
    elif kind == "readdir":
        guest.call("fd_readdir", fd, guest.alloc(256), 256, b % 4, guest.alloc(4))
    elif kind == "renumber":
        if a > 3:
            guest.call("fd_renumber", fd, a)
    elif kind == "seek":
        guest.call("fd_seek", fd, b, 0, guest.alloc(8))
    elif kind == "filestat":
        guest.call("fd_filestat_get", fd, guest.alloc(64))
    elif kind == "set_size":
        guest.call("fd_filestat_set_size", fd, b)


def held_paths(guest: DirectGuest) -> list[str]:
    return [
        os.readlink(f"/proc/self/fd/{desc.fd}")
        for _, desc in guest.state.fds
        if isinstance(desc, HostDescriptor)
    ]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name descriptors")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(calls, min_size=1, max_size=25))
def test_no_call_sequence_reaches_outside_the_mount(sequence: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mount, sentinel = build_world(root)
        real_mount = os.path.realpath(mount)
        before = snapshot(root, mount)
        guest = DirectGuest(WasiOptions(mounts=[Mount(mount, "/m", writable=True)], max_fds=12))
        try:
            with guarded_syscalls(mount) as violations:
                for call in sequence:
                    run_call(guest, call)
                    for path in held_paths(guest):
                        assert path == real_mount or path.startswith(real_mount + "/"), path
            assert violations == []
        finally:
            guest.close()
        assert snapshot(root, mount) == before
        assert (sentinel / "secret").read_text() == "secret"
