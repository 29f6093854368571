"""Real WASI programs (Rust std, wasi-libc C, a raw-call probe) through the engine and the WASI
profile: with nothing granted they start and get the documented errnos; with grants they give
the same results as wasmtime's built-in WASI (the reference host, allowed in tests only)."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from tests.support.guests import build, escape, guest_wat
from tests.support.wasi import LIBC, PROBE, STD, Run, package, run_reference, run_wasihost
from wasihost.core.errors import CallError, ConfigError, FailureClass
from wasihost.core.registry import CORE_CAPABILITY
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import FUNCTIONS, MODULE, Errno, Mount, WasiOptions, wasi_profile

Setup = Callable[[Path], None]


def tree(root: Path) -> None:
    """A small mount: a file, a subdirectory, and symlinks in and out of the mount."""
    (root / "f.txt").write_text("hello world\nsecond line\n")
    (root / "sub").mkdir()
    (root / "sub" / "g.txt").write_text("ggg")
    (root / "lnk").symlink_to("f.txt")
    (root / "sublnk").symlink_to("sub")


def both(
    module: Path,
    steps: list[str],
    tmp_path: Path,
    *,
    writable: bool = True,
    setup: Setup = tree,
    **kw: object,
) -> tuple[Run, Run]:
    """The same run on wasihost (everything granted) and on the reference, each in a fresh
    copy of the mount."""
    runs = []
    for side in ("wasihost", "reference"):
        root = tmp_path / side
        root.mkdir()
        setup(root)
        mounts = [Mount(root, "/data" if module != PROBE else "/m", writable)]
        argv = ["prog", *steps]
        env = [("HOME", "/home/guest"), ("LANG", "C")]
        if side == "wasihost":
            runs.append(
                run_wasihost(
                    module, argv, mounts=mounts, env=env, clock="standard", random=True, **kw
                )
            )
        else:
            runs.append(run_reference(module, argv, mounts=mounts, env=env))
    return runs[0], runs[1]


def records(run: Run) -> list[tuple[str, str, str]]:
    assert run.ext is not None
    return [(r.level.name, r.source, r.message) for r in run.ext.logs()]


# --- nothing granted ---------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "greeting"), [(STD, "hello from rust std"),
                                                  (LIBC, "hello from wasi-libc")])  # fmt: skip
def test_with_nothing_granted_real_toolchains_start_and_print_to_the_log(
    module: Path, greeting: str
) -> None:
    """wasi-libc and Rust std start with no grant at all: the preopen scan ends at BADF, argv
    and environ are empty (so the steps below are never seen), stdout goes to the log."""
    run = run_wasihost(module, config=WasiOptions(argv=["x", "args", "env"]), grants=())
    assert run.code == 0
    assert records(run) == [("INFO", "stdout", greeting)]


def test_with_nothing_granted_each_group_answers_its_documented_errno(tmp_path: Path) -> None:
    """Only argv is granted (to drive the probe); every other group is refused with its errno
    and no host file is touched."""
    (tmp_path / "m").mkdir()
    steps = ["prestat:3", "env", "clock:0", "clock:1", "random:8", "sleep:1000", "open:3:x:c:rw:n",
             "mkdir:3:x", "sock:1", "raise:1", "yield", "fdstat:1", "read:0:5", "write:1:to-log",
             "write:2:err"]  # fmt: skip
    config = WasiOptions(argv=["probe", *steps], mounts=[Mount(tmp_path / "m", "/m", True)])
    run = run_wasihost(PROBE, config=config, grants=["wasi.args"])
    lines = [m for lvl, src, m in records(run) if src == "stdout"]
    assert lines == [
        "prestat 8",  # no mount is visible without wasi.fs.read: the scan ends at once
        "env 0 0 0 0",
        "clock 76 0 76 0",
        "clock 76 0 76 0",
        "random 76 0",
        "sleep 0 1 1 76 0",  # the clock subscription's event carries NOTCAPABLE
        "open 8",
        "mkdir 69",
        "sock 57 57 57 57",  # fd 1 is not a socket: NOTSOCK, granted or not
        "raise 52",
        "yield 0",
        "fdstat 0 0 0",  # stdout to the log is no terminal: type unknown, as a pipe's
        "read 0 0 ",  # stdin: end of file
        "to-logwrite 0 6",
        "write 0 3",
    ]
    assert ("WARN", "stderr", "err") in records(run)
    assert list((tmp_path / "m").iterdir()) == []


def test_stdio_grant_routes_output_to_the_caller_and_serves_stdin() -> None:
    got = bytearray()
    config = WasiOptions(argv=["x", "stdin", "stderr:e"], stdin=b"abc", stdout=got.extend)
    run = run_wasihost(STD, config=config, grants=["wasi.args", "wasi.stdio"])
    assert bytes(got) == b"stdin: stdin 3 bytes\nstderr:e: to stderr\n"
    assert records(run) == [("WARN", "stderr", "e")]  # stderr has no sink: still the log
    # without wasi.stdio the same config's sink and stdin are not used
    run = run_wasihost(STD, config=config, grants=["wasi.args"])
    assert [m for _, _, m in records(run)][:1] == ["stdin: stdin 0 bytes"]


def test_rust_hashmap_needs_random() -> None:
    """std's HashMap seeds SipHash from random_get and panics without it: grant wasi.random
    (seeded, for reproducible runs)."""
    with pytest.raises(CallError) as info:
        run_wasihost(STD, config=WasiOptions(argv=["x", "hashmap"]), grants=["wasi.args"])
    assert info.value.failure is FailureClass.PANIC
    run = run_wasihost(STD, ["x", "hashmap"], random_seed=b"0123456789abcdef")
    assert run.lines[0].startswith('hashmap: [("brown", 1)')


# --- the same results as the reference host ----------------------------------------------------

STD_STEPS = [
    "hello", "args", "env", "time", "hashmap", "read:/data/f.txt", "read:/data/lnk",
    "read:/data/nope", "read:/etc/passwd", "read:/data/../../etc/passwd", "write:/data/new.txt:hi",
    "append:/data/new.txt:there", "read:/data/new.txt", "list:/data", "list:/data/sublnk",
    "mkdir:/data/a/b/c", "meta:/data/a", "meta:/data/f.txt", "rename:/data/new.txt:/data/a/n.txt",
    "remove:/data/a/n.txt", "list:/data/a", "stderr:oops", "stdin", "sleep:5", "exit:3",
]  # fmt: skip

LIBC_STEPS = [
    "hello", "args", "env", "cat:/data/f.txt", "cat:/etc/passwd", "write:/data/w.txt:yo",
    "cat:/data/w.txt", "ls:/data", "ls:/", "stat:/data/f.txt", "stat:/data/sub", "mkdir:/data/d",
    "rmdir:/data/d", "mv:/data/w.txt:/data/x.txt", "rm:/data/x.txt", "ln:f.txt:/data/l",
    "cat:/data/l", "ln:/etc/passwd:/data/l2", "time", "monotonic", "random", "sleep:5",
    "stderr:err", "stdin", "exit:4",
]  # fmt: skip


@pytest.mark.parametrize(("module", "steps"), [(STD, STD_STEPS), (LIBC, LIBC_STEPS)])
def test_real_programs_match_the_reference_host(
    module: Path, steps: list[str], tmp_path: Path
) -> None:
    ours, ref = both(module, steps, tmp_path)
    assert ours.lines == ref.lines
    assert ours.stderr == ref.stderr
    assert ours.code == ref.code != 0
    assert sorted(os.listdir(tmp_path / "wasihost")) == sorted(os.listdir(tmp_path / "reference"))


PROBE_GROUPS = {
    "preopens": ["prestat:3", "prestat:4", "fdstat:3"],
    "args-env": ["args", "env"],
    "read-seek": ["open:3:f.txt::r:n", "read:$0:5", "tell:$0", "seek:$0:-3:2",
                  "read:$0:10", "pread:$0:4:6", "seek:$0:0:0", "read:$0:2", "seek:$0:-100:1",
                  "fstat:$0", "fdstat:$0", "advise:$0:1", "write:$0:x", "close:$0", "close:$0"],
    "write": ["open:3:new.txt:c:rw:n", "write:$0:abcdef", "pwrite:$0:ZZ:1", "pread:$0:10:0",
              "setsize:$0:3", "fstat:$0", "seek:$0:0:2", "write:$0:END", "setsize:$0:0",
              "sync:$0", "ftimes:$0:1000", "mtime:3:new.txt", "badtimes:$0",
              "ptimes:3:new.txt:2000:n", "mtime:3:new.txt", "open:3:f.txt::r:n", "write:$0:x",
              "setsize:$0:1", "open:3:new.txt:cx:rw:n", "open:3:new.txt:t:rw:n", "fstat:$0",
              "open:3:ap.txt:c:rw:n:1", "write:$0:aa", "seek:$0:0:0", "write:$0:bb",
              "pread:$0:10:0", "fdstat:$0"],
    "directories": ["mkdir:3:d1", "mkdir:3:d1", "mkdir:3:d1/d2", "rmdir:3:d1", "rmdir:3:d1/d2",
                    "rmdir:3:d1", "rmdir:3:f.txt", "open:3:sub:d:r:n", "readdir:$0:24",
                    "readdir:$0:4096", "open:3:.:d:r:n", "stat:3:sub/:n", "stat:3:sub/.:n",
                    "stat:3:sub//g.txt:n", "stat:3:f.txt/:n", "open:3:f.txt:d:r:n",
                    "open:3:f.txt/::r:n", "readdir:3:7", "open:3:sub:c:rw:n"],
    "links": ["stat:3:lnk:n", "stat:3:lnk:f", "readlink:3:lnk:100", "readlink:3:lnk:2",
              "readlink:3:f.txt:10", "open:3:lnk::r:f", "read:$0:5", "open:3:lnk::r:n",
              "open:3:sublnk:d:r:n", "open:3:sublnk:d:r:f", "stat:3:sublnk/:n",
              "link:3:f.txt:3:hard:n", "stat:3:hard:n", "link:3:lnk:3:hard2:n", "stat:3:hard2:n",
              "symlink:f.txt:3:s1", "open:3:s1::r:f", "symlink:nothere:3:dangling",
              "stat:3:dangling:f", "open:3:dangling:c:rw:f", "stat:3:nothere:n",
              "symlink:loop2:3:loop1", "symlink:loop1:3:loop2", "open:3:loop1::r:f",
              "unlink:3:lnk", "unlink:3:sub", "unlink:3:sub/", "unlink:3:sublnk/",
              "unlink:3:f.txt/", "symlink::3:empty"],
    "rename": ["rename:3:f.txt:3:f2.txt", "stat:3:f.txt:n", "stat:3:f2.txt:n",
               "rename:3:f2.txt:3:sub", "rename:3:sub:3:f2.txt", "mkdir:3:e", "rename:3:e:3:sub",
               "rename:3:sub:3:e", "stat:3:e/g.txt:n"],
    "fd-table": ["open:3:f.txt::r:n", "open:3:sub/g.txt::r:n", "renumber:$0:$1", "read:$1:3",
                 "close:$0", "renumber:4:99", "fdstat:99"],
    "clocks": ["clock:0", "clock:1", "random:16", "sleep:1000000", "yield", "pollfd:1:w",
               "pollfd:0:r"],
    "escapes": ["open:3:../x::r:n", "open:3:/etc/passwd::r:f", "open:3:sub/../../x::r:n",
                "open:3:sub/../f.txt::r:n", "stat:3:..:n", "mkdir:3:../evil",
                "symlink:/etc/passwd:3:abs", "badutf8:3", "longpath:3:5000", "longname:3:300"],
}  # fmt: skip


@pytest.mark.parametrize("group", sorted(PROBE_GROUPS))
def test_probe_function_groups_match_the_reference_host(group: str, tmp_path: Path) -> None:
    ours, ref = both(PROBE, PROBE_GROUPS[group], tmp_path)
    # fd_readdir order is the directory's order on the reference and sorted on wasihost
    assert sorted(ours.lines) == sorted(ref.lines) if group == "directories" else True
    norm = [sorted(line.split(" ")) if line.startswith("readdir") else line for line in ours.lines]
    ref_norm = [
        sorted(line.split(" ")) if line.startswith("readdir") else line for line in ref.lines
    ]
    assert norm == ref_norm
    assert (ours.code, ours.stderr) == (ref.code, ref.stderr)


DELIBERATE_DIFFERENCES = [
    # (steps, wasihost's answer, wasmtime's answer, why)
    (["open:3:f.txt::r:n", "setflags:$0:16"], "setflags 58", "setflags 28",
     "sync flags are chosen at open: NOTSUP"),
    (["open:3:f.txt::r:n", "read2:$0:4"], "read2 0 7 hello w", "read2 0 3 hel",
     "fd_read fills every iovec (the reference stops after the first)"),
    (["open:3:n:c:rw:n", "write2:$0:ab", "pread:$0:9:0"], "pread 0 4 abab", "pread 0 2 ab",
     "fd_write writes every iovec (the reference stops after the first)"),
    (["open:3:f.txt::m:n", "fstat:$0"], "fstat 76 0 0", "fstat 0 4 24",
     "rights are enforced: fd_filestat_get was not asked for"),
    (["open:3:new:c:rw:n", "allocate:$0:0:10"], "allocate 0", "allocate 58",
     "fd_allocate is implemented (up to the file size limit)"),
    (["raise:9"], "raise 52", "raise 58", "proc_raise: NOSYS, as the issue asks"),
    (["clock:2"], "clock 0 1 0 1", "clock 8 0 8 0", "the standard profile has cputime clocks"),
    (["pollfd:99:r"], "pollfd 0 1 8 1", "pollfd 8 0 0 0",
     "a bad descriptor is reported in its event, not for the whole call"),
    (["iovhuge:1"], "iovhuge 28", "iovhuge 48", "more than 1024 iovecs: INVAL, as writev"),
    (["link:3:lnk:3:hard:f", "stat:3:hard:n"], "stat 0 4 24 2", "stat 44 0 0 0",
     "path_link follows a symlink source when asked (LOOKUP_SYMLINK_FOLLOW)"),
]  # fmt: skip


@pytest.mark.parametrize(("steps", "ours", "theirs", "why"), DELIBERATE_DIFFERENCES)
def test_deliberate_differences_from_the_reference(
    steps: list[str], ours: str, theirs: str, why: str, tmp_path: Path
) -> None:
    got, ref = both(PROBE, steps, tmp_path)
    assert (got.lines[-1], ref.lines[-1]) == (ours, theirs), why


def test_read_only_mounts_refuse_every_write_with_rofs(tmp_path: Path) -> None:
    steps = ["open:3:f.txt::r:n", "write:$0:x", "setsize:$0:1", "ftimes:$0:5",
             "open:3:f.txt::rw:n", "open:3:new:c:rw:n", "open:3:new:c:r:n", "open:3:f.txt:t:r:n",
             "mkdir:3:d", "rmdir:3:sub", "unlink:3:f.txt", "rename:3:f.txt:3:x",
             "link:3:f.txt:3:x:n", "symlink:f.txt:3:x", "ptimes:3:f.txt:5:n", "open:3:sub:d:r:n",
             "mkdir:$0:x", "read:$1:5", "readdir:$0:4096"]  # fmt: skip
    ours, ref = both(PROBE, steps, tmp_path, writable=False)
    assert ours.lines == [
        "open 0", "write 8 0", "setsize 69", "ftimes 69", "open 69", "open 69", "open 69",
        "open 69", "mkdir 69", "rmdir 69", "unlink 69", "rename 69", "link 69", "symlink 69",
        "ptimes 69", "open 0", "mkdir 69", "read 0 5 hello", "readdir ./3 ../3 g.txt/4 = 0",
    ]  # fmt: skip
    # the reference refuses the same calls (with PERM): only the errno differs
    assert [line.split(" ")[1] in ("63", "8") for line in ref.lines] == [
        line.split(" ")[1] in ("69", "8") for line in ours.lines
    ]
    assert sorted(os.listdir(tmp_path / "wasihost")) == ["f.txt", "lnk", "sub", "sublnk"]
    assert (tmp_path / "wasihost" / "f.txt").read_text() == "hello world\nsecond line\n"


# --- exit codes, deadlines, budgets, clocks ----------------------------------------------------


@pytest.mark.parametrize(("module", "step", "code"), [(STD, "exit:3", 3), (LIBC, "exit:4", 4),
                                                      (PROBE, "exit:3", 3)])  # fmt: skip
def test_proc_exit_ends_the_run_with_its_code(module: Path, step: str, code: int) -> None:
    assert run_wasihost(module, ["x", step, "hello"]).code == code


@pytest.mark.parametrize(("module", "step"), [(PROBE, "sleep:3600000000000"),
                                              (STD, "sleep:3600000"), (LIBC, "sleep:3600000")])  # fmt: skip
def test_an_hour_long_poll_under_a_one_second_deadline_ends_in_time(
    module: Path, step: str
) -> None:
    start = time.monotonic()
    with pytest.raises(CallError) as info:
        run_wasihost(module, ["x", step, "hello"], clock="standard", timeout_ms=1000)
    elapsed = time.monotonic() - start
    assert info.value.failure is FailureClass.DEADLINE
    assert "poll_oneoff" in info.value.message
    assert 0.9 < elapsed < 2.0


def test_short_sleeps_are_honoured() -> None:
    start = time.monotonic()
    run = run_wasihost(PROBE, ["x", "sleep:50000000"], clock="standard")
    assert run.lines == ["sleep 0 1 1 0 0"]
    assert time.monotonic() - start >= 0.05


def test_clock_profiles(tmp_path: Path) -> None:
    steps = ["clock:0", "clock:1", "clock:2", "clock:3", "clock:4"]
    # "clock <errno> <reading > 0> <errno of res> <res > 0>"; cputime clocks count from the
    # instance's start, so only their errnos are stable
    standard = run_wasihost(PROBE, ["x", *steps], clock="standard")
    assert standard.lines[:2] == ["clock 0 1 0 1"] * 2
    assert [line.split()[1::2] for line in standard.lines[2:]] == [["0", "0"]] * 2 + [["28", "28"]]
    anonymous = run_wasihost(PROBE, ["x", *steps], clock="anonymous")
    assert anonymous.lines == ["clock 0 1 0 1"] * 2 + ["clock 28 0 28 0"] * 3
    # granted but not provided by the config: NOTCAPABLE
    out = bytearray()
    config = WasiOptions(argv=["x", "clock:0"], stdout=out.extend)
    run_wasihost(PROBE, config=config, grants=["wasi.args", "wasi.stdio", "wasi.clock"])
    assert bytes(out) == b"clock 76 0 76 0\n"


def test_open_descriptors_count_against_the_handle_budget(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    # 3 stdio + 1 mount + 2 files = 6
    steps = ["open:3:f::r:n", "open:3:f::r:n", "open:3:f::r:n", "close:$0", "open:3:f::r:n"]
    run = run_wasihost(PROBE, ["x", *steps], mounts=[Mount(tmp_path, "/m")], max_fds=6)
    assert run.lines == ["open 0", "open 0", "open 33", "close 0", "open 0"]


def test_wild_iovecs_trap_and_huge_counts_are_refused() -> None:
    for step in ("iovbad:1", "iovptrbad:1"):
        with pytest.raises(CallError) as info:
            run_wasihost(PROBE, ["x", step])
        assert info.value.failure is FailureClass.PROTOCOL
        assert "outside guest memory" in info.value.message
    assert run_wasihost(PROBE, ["x", "iovhuge:1"]).lines == ["iovhuge 28"]


def test_bytes_moved_are_charged_as_fuel() -> None:
    small = run_wasihost(PROBE, ["x", "write:1:x"])
    big = run_wasihost(PROBE, ["x", "write:1:" + "x" * 5000])
    assert small.ext is not None and big.ext is not None
    assert big.ext.last_fuel_used - small.ext.last_fuel_used >= 5000


# --- every entry, nothing granted --------------------------------------------------------------

# What a core entry answers when called with fd 3 (no preopen without wasi.fs.read) and zeros.
CORE_ANSWERS = {
    "args_sizes_get": Errno.SUCCESS,  # 0/0
    "environ_sizes_get": Errno.SUCCESS,
    "poll_oneoff": Errno.INVAL,  # zero subscriptions
    "proc_raise": Errno.NOSYS,
    "sched_yield": Errno.SUCCESS,
}


def every_entry_module() -> tuple[bytes, list[tuple[str, int]]]:
    """A command that calls every entry but proc_exit with fd 3 and zero arguments, and exits
    with 100 + the index of the first whose answer is not the expected one (0 if all are)."""
    imports, body, expected = [], [], []
    for f in FUNCTIONS:
        sig = f"(param {' '.join(f.params)})" if f.params else ""
        res = f"(result {' '.join(f.results)})" if f.results else ""
        imports.append(f'(import "{MODULE}" "{f.name}" (func ${f.name} {sig} {res}))')
        if f.name == "proc_exit":
            continue
        if f.capability == CORE_CAPABILITY:
            want = int(CORE_ANSWERS.get(f.name, Errno.BADF))
        else:
            assert f.denied_result is not None
            want = f.denied_result
        expected.append((f.name, want))
        args = " ".join(
            "(i32.const 3)" if j == 0 and p == "i32" and f.name.startswith(("fd_", "path_", "sock_"))
            else f"({p}.const 0)"
            for j, p in enumerate(f.params)
        )  # fmt: skip
        body.append(
            f"(if (i32.ne (call ${f.name} {args}) (i32.const {want}))"
            f" (then (call $proc_exit (i32.const {100 + len(expected) - 1}))))"
        )
    wat = (
        f'(module {" ".join(imports)} (memory (export "memory") 1)'
        f' (func (export "_start") {" ".join(body)}))'
    )
    return bytes(wasmtime.wat2wasm(wat)), expected


def test_every_entry_answers_its_documented_errno_when_nothing_is_granted(tmp_path: Path) -> None:
    wasm, expected = every_entry_module()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "f").write_text("x")
    config = WasiOptions(mounts=[Mount(tmp_path / "m", "/m", writable=True)])
    run = run_wasihost(wasm, config=config, grants=())
    failed = expected[run.code - 100][0] if run.code >= 100 else None
    assert run.code == 0, f"{failed} answered something else"
    assert len(expected) == 45
    assert sorted(os.listdir(tmp_path / "m")) == ["f"]


def test_wasihost_abi_guests_may_import_wasi_entries() -> None:
    """A guest of the wasihost ABI links WASI entries from the same registry view: here
    fd_write to stdout, which becomes a record of its log."""
    text = b"hello from an ABI guest\n"
    imports = (
        f'(import "{MODULE}" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))'
    )
    extra = (
        f'(data (i32.const 8192) "{escape(text)}")'
        f'(data (i32.const 8448) "{escape(struct.pack("<II", 8192, len(text)))}")'
    )
    body = "(drop (call $fd_write (i32.const 1) (i32.const 8448) (i32.const 1) (i32.const 8464)))"
    wasm = build(guest_wat(f"{body} (call $ok_null)", imports=imports, extra=extra))
    with Host(Policy(), cache_dir=None, profiles=[wasi_profile()]) as host:
        ext = host.admit(package(wasm))
        assert ext.call("run") is None
        assert [(r.level.name, r.source, r.message) for r in ext.logs()] == [
            ("INFO", "stdout", "hello from an ABI guest")
        ]


def test_a_mount_that_disappeared_is_a_config_error(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    config = WasiOptions(argv=["x"], mounts=[Mount(gone, "/g")])
    gone.rmdir()
    with pytest.raises(ConfigError, match="mount"):
        run_wasihost(PROBE, config=config)


def stdout_writer(body: str) -> bytes:
    """A command with one page of memory, "hi\\n" at 16, and ``body`` run by ``_start``; $w
    writes the iovec at its first argument to stdout, with nwritten at its second."""
    return build(f"""(module
      (import "{MODULE}" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (data (i32.const 16) "hi\\n")
      (func $w (param $iov i32) (param $nw i32)
        (if (call $fd_write (i32.const 1) (local.get $iov) (i32.const 1) (local.get $nw))
          (then unreachable)))
      (func (export "_start") {body}))""")


def test_stdout_writes_from_memory_grown_after_the_first_write() -> None:
    # The first write builds the host's view of one page; the second comes from a second page.
    body = """(i32.store (i32.const 0) (i32.const 16)) (i32.store (i32.const 4) (i32.const 3))
              (call $w (i32.const 0) (i32.const 8))
              (drop (memory.grow (i32.const 1)))
              (i32.store (i32.const 70000) (i32.const 0x0a6b6f))
              (i32.store (i32.const 70008) (i32.const 70000))
              (i32.store (i32.const 70012) (i32.const 3))
              (call $w (i32.const 70008) (i32.const 70016))
              (if (i32.ne (i32.load (i32.const 70016)) (i32.const 3)) (then unreachable))"""
    assert run_wasihost(stdout_writer(body)).stdout == b"hi\nok\n"


@pytest.mark.parametrize(
    ("buffer", "iovec", "nwritten"),
    [(16, 65532, 8), (16, 0, 65534), (65534, 0, 8)],
    ids=["iovec-straddles-the-end", "nwritten-straddles-the-end", "buffer-past-the-end"],
)
def test_wild_stdout_writes_trap_before_any_output(buffer: int, iovec: int, nwritten: int) -> None:
    body = f"""(i32.store (i32.const 0) (i32.const {buffer})) (i32.store (i32.const 4) (i32.const 3))
               (call $w (i32.const {iovec}) (i32.const {nwritten}))"""
    out = bytearray()
    config = WasiOptions(stdout=out.extend)
    with pytest.raises(CallError) as info:
        run_wasihost(stdout_writer(body), config=config, grants=["wasi.stdio"])
    assert info.value.failure is FailureClass.PROTOCOL
    assert "outside guest memory" in info.value.message
    assert out == b""
