"""Issue 28, items 25-27: what a plain WASI command run by ``wasihost wasi`` (or through
``WasiOptions``) may use of memory, terminals and descriptors, checked with the wasi-libc C
fixture (a real program on wasi-libc's malloc and stdio) and hand-written WAT where the
program's own behaviour is beside the point."""

from __future__ import annotations

import os
import pty
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import wasmtime

from tests.support.guests import build, guest_wat
from tests.support.wasi import (
    CACHE_DIR,
    LIBC,
    ROOT,
    package,
    run_reference,
    run_wasihost,
    validates,
)
from wasihost.cli import UsageError
from wasihost.cli import wasi_command as wasi_cli
from wasihost.cli.wasi_command import config_from_args, parse_args, run
from wasihost.core import limits
from wasihost.core.errors import CallError, ConfigError
from wasihost.core.growprobe import GROW_REFUSED_EXPORT, probe_refused_grows
from wasihost.core.wasmbin import read_header
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import Mount, WasiOptions, wasi_profile
from wasihost.wasi import limits as limits_wasi
from wasihost.wasi.errno import WasiError
from wasihost.wasi.fds import Descriptor, FdTable

MiB = 1024 * 1024


def wasi(*argv: str) -> int:
    return run(parse_args(["--cache-dir", str(CACHE_DIR), *argv]))


# --- item 25: a command's memory ---------------------------------------------------------------


def test_a_plain_command_may_grow_past_the_extension_default() -> None:
    """A C program mallocs (and writes) 40 MB: before, a plain command had the extension
    default of 16 MiB and malloc returned NULL."""
    result = run_wasihost(LIBC, ["libc", "malloc:40000000"])
    assert (result.code, result.lines) == (0, ["malloc:40000000: ok 1"])
    assert result.ext is not None
    assert result.ext.resources.max_memory_bytes == limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES


def test_max_memory_bytes_bounds_a_command_and_its_refused_grow_is_recorded() -> None:
    result = run_wasihost(LIBC, ["libc", "malloc:17000000"], max_memory_bytes=16 * MiB)
    assert (result.code, result.lines) == (1, ["malloc:17000000: error Out of memory"])
    assert result.ext is not None
    assert result.ext.resources.max_memory_bytes == 16 * MiB
    refused = result.ext.last_refused_memory_bytes
    assert refused is not None and 17_000_000 <= refused <= 16 * MiB + 17_000_000


def test_a_run_that_recovers_from_a_refused_grow_is_not_a_failure() -> None:
    """Only a failed run is told of a refused grow: a program may probe for memory."""
    wat = """(module (memory (export "memory") 1)
      (func (export "_start") (drop (memory.grow (i32.const 1000)))))"""
    result = run_wasihost(build(wat), max_memory_bytes=MiB)
    assert result.code == 0
    assert result.ext is not None and result.ext.last_refused_memory_bytes is None


def test_a_trap_after_a_refused_grow_names_the_limit() -> None:
    """A Rust program whose allocation fails aborts with `unreachable`; the trap alone said
    nothing of the limit (issue 28: "panic: wasm trap: unreachable")."""
    wat = """(module (memory (export "memory") 1)
      (func (export "_start")
        (if (i32.eq (memory.grow (i32.const 1000)) (i32.const -1)) (then unreachable))))"""
    with pytest.raises(CallError) as caught:
        run_wasihost(build(wat), max_memory_bytes=16 * MiB)
    assert caught.value.hint is not None
    assert (
        f"memory.grow to {1001 * 65536} bytes was refused: its linear memory is limited to "
        f"{16 * MiB} bytes"
    ) in caught.value.hint
    assert "max_memory_bytes" in caught.value.hint


def test_the_cli_names_a_refused_grow_and_the_flag_that_raises_it(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    assert wasi("--max-memory", "1M", str(LIBC), "malloc:2000000") == 1
    out, err = capsysbinary.readouterr()
    assert out == b"malloc:2000000: error Out of memory\n"
    assert err.startswith(b"hint: the program's memory.grow to ")
    assert f"limited to {MiB} bytes (--max-memory)".encode() in err
    assert wasi("--max-memory", "4096K", str(LIBC), "malloc:2000000") == 0
    assert capsysbinary.readouterr() == (b"malloc:2000000: ok 1\n", b"")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("2G", "--max-memory 2G is 2147483648 bytes; it must be 65536"),
        ("1000", "--max-memory 1000 is 1000 bytes; it must be 65536"),
        ("12x", "--max-memory '12x' is not a size"),
        ("-1", "--max-memory '-1' is not a size"),
    ],
)
def test_a_bad_max_memory_is_a_usage_error_naming_the_range(value: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        wasi("--max-memory", value, str(LIBC))


@pytest.mark.parametrize(
    ("flag", "value", "problem"),
    [
        (
            "--max-memory",
            "9" * 5000,
            r"--max-memory '9{40}'\.\.\. \(5000 characters\) is far too large",
        ),
        ("--max-memory", "\u0661\u0660M", "--max-memory '\u0661\u0660M' is not a size"),
        ("--max-memory", "1.5G", "--max-memory '1.5G' is not a size"),
        ("--max-memory", "0x10", "--max-memory '0x10' is not a size"),
        (
            "--max-fds",
            "\u0661\u0660\u0660",
            "--max-fds '\u0661\u0660\u0660' is not a number of descriptors",
        ),
        ("--max-fds", "9" * 5000, r"--max-fds '9{40}'\.\.\. \(5000 characters\) is far too large"),
        ("--max-fds", " 100", "--max-fds ' 100' is not a number"),
        ("--max-fds", "1_000", "--max-fds '1_000' is not a number"),
        ("--max-fds", "0x10", "--max-fds '0x10' is not a number"),
        ("--max-fds", "-1", r"--max-fds must be in 5\.\.65536, got -1"),
        ("--max-fds", "0", r"--max-fds must be in 5\.\.65536, got 0"),
    ],
    ids=lambda v: v if len(v) < 20 and v.isascii() else f"<{len(v)} chars>",
)
def test_a_flag_value_no_decimal_reading_fits_is_a_usage_error(
    flag: str, value: str, problem: str
) -> None:
    """int() read '\u0661\u0660\u0660' (Arabic-Indic digits) as 100, and a --max-memory of 5,000
    digits ended in "error: internal: ValueError" (int's 4,300-digit limit), quoted whole."""
    with pytest.raises(UsageError, match=problem) as caught:
        wasi(flag, value, str(LIBC))
    assert len(str(caught.value)) < 300


def test_max_memory_bytes_is_checked_where_it_is_given() -> None:
    for bad in (0, 2 * limits.MAX_MAX_MEMORY_BYTES, True, 1.5):
        with pytest.raises(ConfigError, match="max_memory_bytes"):
            WasiOptions(max_memory_bytes=bad)  # type: ignore[arg-type]


def test_policy_ceilings_still_lower_a_commands_memory() -> None:
    config = WasiOptions(argv=["libc", "malloc:3000000"], stdout=lambda _: None)
    host = Host(
        Policy(allow={"wasi.args", "wasi.stdio"}, ceilings={"max_memory_bytes": 2 * MiB}),
        cache_dir=CACHE_DIR,
        profiles=[wasi_profile(config)],
    )
    try:
        ext = host.admit(package(LIBC), grants={"wasi.args", "wasi.stdio"})
        assert ext.resources.max_memory_bytes == 2 * MiB
        assert ext.run_command() == 1
        assert ext.last_refused_memory_bytes is not None
    finally:
        host.close()


def test_an_abi_guest_keeps_the_extension_default() -> None:
    host = Host(Policy(allow={"log"}), cache_dir=CACHE_DIR)
    try:
        ext = host.admit(package(build(guest_wat())))
        assert ext.resources.max_memory_bytes == limits.DEFAULT_MAX_MEMORY_BYTES
    finally:
        host.close()


def test_the_probe_keeps_what_memory_grow_answers() -> None:
    """The rewritten grow answers as the instruction does (old size, or -1), and records only
    a refusal: the pages the refused grow asked for."""
    wat = """(module (memory (export "memory") 1 100)
      (global $out (export "out") (mut i32) (i32.const 0))
      (func (export "_start")
        (global.set $out (i32.add (i32.mul (memory.grow (i32.const 2)) (i32.const 1000))
                                  (memory.grow (i32.const 500))))))"""
    wasm = build(wat)
    probed = probe_refused_grows(wasm, read_header(wasm), validates)
    assert probed != wasm
    results = []
    for module in (wasm, probed):
        store = wasmtime.Store()
        instance = wasmtime.Instance(store, wasmtime.Module(store.engine, module), [])
        start = instance.exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)
        start(store)
        out = instance.exports(store)["out"]
        assert isinstance(out, wasmtime.Global)
        results.append(out.value(store))
    assert results == [1000 - 1, 1000 - 1]
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, probed), [])
    start = instance.exports(store)["_start"]
    assert isinstance(start, wasmtime.Func)
    start(store)
    refused = instance.exports(store)[GROW_REFUSED_EXPORT]
    assert isinstance(refused, wasmtime.Global)
    assert refused.value(store) == 3 + 500


def test_a_module_without_memory_grow_is_compiled_as_it_is(tmp_path: Path) -> None:
    wasm = build('(module (memory (export "memory") 1) (func (export "_start")))')
    assert probe_refused_grows(wasm, read_header(wasm), validates) == wasm


# --- item 26: a terminal only where there is one -------------------------------------------


def _stdio_sinks(terminal_fds: frozenset[int], steps: list[str]) -> tuple[list[int], bytes, int]:
    """Run the C fixture with both stdio sinks counting their writes."""
    writes: list[int] = []
    out = bytearray()

    def sink(data: bytes) -> None:
        writes.append(len(data))
        out.extend(data)

    config = WasiOptions(argv=["libc", *steps], stdout=sink, stderr=sink, terminal_fds=terminal_fds)
    result = run_wasihost(LIBC, config=config)
    return writes, bytes(out), result.code


def test_stdio_is_a_terminal_only_where_the_config_says() -> None:
    """isatty() was true for fd 0, 1 and 2 whatever they were: a shell given a script went
    interactive. A sink or stdin bytes is no terminal, as a pipe or file is none for
    wasmtime's built-in WASI."""
    steps = ["isatty:0", "isatty:1", "isatty:2"]
    _, out, code = _stdio_sinks(frozenset(), steps)
    assert (code, out) == (0, b"isatty:0: 0\nisatty:1: 0\nisatty:2: 0\n")
    assert run_reference(LIBC, ["libc", *steps]).stdout == out
    _, out, _ = _stdio_sinks(frozenset({1, 2}), steps)
    assert out == b"isatty:0: 0\nisatty:1: 1\nisatty:2: 1\n"


def test_a_named_descriptor_going_to_the_log_is_no_terminal() -> None:
    """terminal_fds names what the embedder's own descriptors are; fd 1 without a sink writes
    to the extension's log, which no one types into or watches line by line (docs/wasi.md)."""
    config = WasiOptions(argv=["libc", "isatty:1", "isatty:2"], terminal_fds={1, 2})
    result = run_wasihost(LIBC, config=config)
    assert result.ext is not None
    assert [r.message for r in result.ext.logs() if r.source == "stdout"] == [
        "isatty:1: 0",
        "isatty:2: 0",
    ]


def test_stdout_to_a_sink_is_fully_buffered_by_libc() -> None:
    """wasi-libc line-buffers a terminal's stdout: 10,000 short lines were 10,003 writes
    (a `.dump` of 10k rows 9,236 against built-in WASI's 2,028); to a sink, a buffer's worth
    at a time."""
    writes, out, code = _stdio_sinks(frozenset(), ["lines:10000"])
    assert code == 0 and out.count(b"\n") == 10_000
    assert len(writes) <= 100
    writes, _, _ = _stdio_sinks(frozenset({1}), ["lines:10000"])
    assert len(writes) >= 10_000


@pytest.mark.parametrize("bad", [{3}, {-1}, "1", 1, {True}])
def test_terminal_fds_holds_only_stdio(bad: object) -> None:
    with pytest.raises(ConfigError, match="terminal_fds"):
        WasiOptions(terminal_fds=bad)  # type: ignore[arg-type]


def _cli_isatty(stdout: int, stderr: int) -> int:
    """``wasihost wasi`` in a child process, this tree's code first on its path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_BACKTRACE": "0"}
    argv = [sys.executable, "-m", "wasihost", "wasi", "--cache-dir", str(CACHE_DIR), str(LIBC)]
    steps = ["isatty:0", "isatty:1", "isatty:2"]
    proc = subprocess.run(
        [*argv, *steps], stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
        timeout=120, check=False,
    )  # fmt: skip
    return proc.returncode


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # a pty's master reads EIO once its slave is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_the_cli_reports_a_terminal_where_its_own_stdout_is_one(tmp_path: Path) -> None:
    """The CLI asks os.isatty of its real stdout and stderr: piped, neither is a terminal to
    the guest; on a pty, that one is. Its stdin never is (bytes read before the run)."""
    piped = tmp_path / "out"
    with piped.open("wb") as out_file, (tmp_path / "err").open("wb") as err_file:
        assert _cli_isatty(out_file.fileno(), err_file.fileno()) == 0
    assert piped.read_bytes() == b"isatty:0: 0\nisatty:1: 0\nisatty:2: 0\n"
    master, slave = pty.openpty()
    try:
        with (tmp_path / "err2").open("wb") as err_file:
            assert _cli_isatty(slave, err_file.fileno()) == 0
        os.close(slave)
        slave = -1
        seen = _read_all(master).replace(b"\r\n", b"\n")
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert seen == b"isatty:0: 0\nisatty:1: 1\nisatty:2: 0\n"


# --- item 27: descriptors ----------------------------------------------------------------------


def _openmany(tmp_path: Path, count: int, **config_kw: object) -> list[str]:
    (tmp_path / "f").write_text("x")
    result = run_wasihost(
        LIBC, ["libc", f"openmany:{count}:/d/f"], mounts=[Mount(tmp_path, "/d")], **config_kw
    )
    assert result.code == 0
    return result.lines


def test_a_program_may_open_hundreds_of_files(tmp_path: Path) -> None:
    """64 descriptors in all let a program open 59 files where built-in WASI opened 200."""
    assert _openmany(tmp_path, 250) == ["openmany:250: opened 250"]


def test_max_fds_bounds_what_a_program_holds_open(tmp_path: Path) -> None:
    # stdio and the mount hold 4 of the 20
    assert _openmany(tmp_path, 100, max_fds=20) == [
        "openmany:100: opened 16, then error No file descriptors available"
    ]


def test_the_cli_gives_a_native_programs_budget_and_max_fds_changes_it(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    (tmp_path / "f").write_text("x")
    mount = f"{tmp_path}::/d"
    assert wasi("--dir", mount, str(LIBC), "openmany:1100:/d/f") == 0
    assert capsysbinary.readouterr().out == (
        b"openmany:1100: opened 1020, then error No file descriptors available\n"
    )
    assert wasi("--max-fds", "100", "--dir", mount, str(LIBC), "openmany:1100:/d/f") == 0
    assert capsysbinary.readouterr().out == (
        b"openmany:1100: opened 96, then error No file descriptors available\n"
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("4", "--max-fds must be in 5..65536, got 4"),
        ("70000", "--max-fds must be in 5..65536, got 70000"),
        ("900", r"--max-fds 900 needs 984 descriptors .* at most 512 .* give --max-fds 428"),
    ],
)
def test_a_max_fds_the_process_cannot_hold_is_a_usage_error(
    value: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget, 64 for the host, and the 20 the process holds already must fit."""
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (512, 512))
    monkeypatch.setattr(wasi_cli, "_open_descriptors", lambda: 20)
    with pytest.raises(UsageError, match=problem):
        wasi("--max-fds", value, str(LIBC))


def test_the_default_budget_fits_a_low_hard_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default is lowered to what the process may open, never refused."""
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (512, 512))
    monkeypatch.setattr(wasi_cli, "_open_descriptors", lambda: 20)
    assert config_from_args(parse_args([str(LIBC)])).max_fds == 512 - 64 - 20


def test_descriptor_numbers_are_lowest_free_without_a_scan() -> None:
    table = FdTable(limits_wasi.MAX_MAX_FDS)
    started = time.perf_counter()
    for _ in range(limits_wasi.MAX_MAX_FDS):
        table.insert(Descriptor(filetype=0, rights_base=0, rights_inheriting=0))
    assert time.perf_counter() - started < 5  # a scan from 0 per open took minutes
    for fd in (700, 3, 65_000):
        table.close(fd)
    table.renumber(10, 20)  # 10 is free now, 20 holds what 10 held
    numbers = [
        table.insert(Descriptor(filetype=0, rights_base=0, rights_inheriting=0)) for _ in range(4)
    ]
    assert numbers == [3, 10, 700, 65_000]
    with pytest.raises(WasiError):
        table.insert(Descriptor(filetype=0, rights_base=0, rights_inheriting=0))


_HOLD_EVERYTHING = """
import os, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from tests.support.wasi import LIBC, run_wasihost
from wasihost.wasi import Mount, WasiOptions
free_while_held = []

def sink(data):
    # Host code running while the guest holds every descriptor it could open.
    opened = []
    try:
        while len(opened) < 64:
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    free_while_held.append(len(opened))
    for fd in opened:
        os.close(fd)
    sys.stdout.write(data.decode())

config = WasiOptions(
    argv=["libc", "openmany:1000:/d/f"], mounts=[Mount(Path(sys.argv[2]), "/d")],
    max_fds=65536, stdout=sink,
)
result = run_wasihost(LIBC, config=config)
print(result.code, free_while_held)
"""


def test_guests_leave_the_host_descriptors_under_the_process_limit(tmp_path: Path) -> None:
    """A library host's guest with max_fds 65,536 (or many guests with 256 each) took every
    descriptor under the process's soft RLIMIT_NOFILE: the host's own opens (its files,
    sockets, compile pipes) failed with EMFILE while the guest held them. A guest's open is
    refused (NFILE) while it would leave the host fewer than 64."""
    (tmp_path / "f").write_text("x")
    done = subprocess.run(
        [sys.executable, "-c", _HOLD_EVERYTHING, str(ROOT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report, summary = done.stdout.splitlines()
    assert report.startswith("openmany:1000: opened ") and "then error" in report
    assert summary == "0 [64]"
