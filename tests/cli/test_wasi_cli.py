"""``wasihost wasi``: flags to config and grants, stdio forwarding, exit status, errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.wasi import CACHE_DIR, LIBC, PROBE, STD
from wasihost.cli import UsageError, main
from wasihost.cli.common import budget_hint
from wasihost.cli.wasi_command import config_from_args, exit_status, parse_args, run
from wasihost.core import limits as resource_limits
from wasihost.core.errors import AdmissionError, CallError, FailureClass, WasihostError
from wasihost.wasi.config import capabilities_for


def wasi(*argv: str) -> int:
    return run(parse_args(["--cache-dir", str(CACHE_DIR), *argv]))


def test_argv0_is_the_module_name_and_exit_code_is_the_status(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    assert wasi(str(PROBE), "args", "exit:3") == 3
    out = capsysbinary.readouterr().out
    assert out.startswith(b"args 0 3 ") and b"[wasi-probe.wasm] [args] [exit:3]" in out


def test_with_no_flags_an_ordinary_program_runs(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """Rust std reads a clock for ``Instant::now`` and random bytes to seed ``HashMap``: a bare
    run grants coarse standard clocks and the OS CSPRNG, as peer runtimes do (before, it
    panicked)."""
    assert wasi(str(STD), "time", "hashmap") == 0
    lines = capsysbinary.readouterr().out.decode().splitlines()
    assert lines[0] == "time: after-2020=true monotonic-ok=true"
    assert lines[1].startswith("hashmap: [")


def test_with_no_flags_files_env_and_sockets_stay_denied(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    args = parse_args([str(PROBE), "env", "clock:0", "random:4", "prestat:3", "write:2:oops"])
    config = config_from_args(args)
    assert capabilities_for(config) == {"wasi.stdio", "wasi.args", "wasi.clock", "wasi.random"}
    assert config.clock is not None and config.clock.value == "standard"
    assert run(args) == 0
    out, err = capsysbinary.readouterr()
    assert out.splitlines() == [b"env 0 0 0 0", b"clock 0 1 0 1", b"random 0 1", b"prestat 8",
                                b"write 0 4"]  # fmt: skip
    assert err == b"oops"


def test_clocks_and_random_can_be_withheld(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    args = parse_args(["--profile", "none", "--no-random", str(PROBE), "clock:0", "random:4"])
    assert capabilities_for(config_from_args(args)) == {"wasi.stdio", "wasi.args"}
    assert run(args) == 0
    assert capsysbinary.readouterr().out.splitlines() == [b"clock 76 0 76 0", b"random 76 0"]


def test_flags_grant_mounts_env_clocks_random_and_stdin(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    (tmp_path / "ro").mkdir()
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro" / "in.txt").write_text("from the host\n")
    (tmp_path / "stdin.bin").write_bytes(b"12345")
    status = wasi(
        "--dir-ro", f"{tmp_path / 'ro'}::/in", "--dir", f"{tmp_path / 'rw'}::/out",
        "--env", "GREETING=hi", "--profile", "anonymous", "--random-seed", "00" * 16,
        "--stdin", str(tmp_path / "stdin.bin"),
        str(STD), "read:/in/in.txt", "write:/out/o.txt:done", "write:/in/x:no", "env", "time",
        "hashmap", "stdin",
    )  # fmt: skip
    assert status == 0
    lines = capsysbinary.readouterr().out.decode().splitlines()
    assert lines == [
        'read:/in/in.txt: 14 bytes, first line "from the host"',
        "write:/out/o.txt:done: wrote 4 bytes",
        "write:/in/x:no: error Uncategorized (errno 69)",  # ROFS
        'env: [("GREETING", "hi")]',
        "time: after-2020=true monotonic-ok=true",
        lines[5],
        "stdin: stdin 5 bytes",
    ]
    assert lines[5].startswith("hashmap: [")
    assert (tmp_path / "rw" / "o.txt").read_text() == "done"
    assert sorted(p.name for p in (tmp_path / "ro").iterdir()) == ["in.txt"]


def test_options_after_the_module_belong_to_the_guest(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    assert wasi(str(LIBC), "args", "--dir", "/") == 0
    assert b"argc=4 [wasi-libc.wasm] [args] [--dir] [/]" in capsysbinary.readouterr().out


@pytest.mark.parametrize(
    ("argv", "error", "match"),
    [
        # A bad flag value is a usage error naming the flag (exit 2), as the main CLI's are.
        (["--dir", "/no/such/dir", str(PROBE)], UsageError, "not a directory"),
        (["--env", "NOEQUALS", str(PROBE)], UsageError, "not K=V"),
        (["--random-seed", "zz", str(PROBE)], UsageError, "--random-seed 'zz' is not hex"),
        (
            ["--random-seed", "00", str(PROBE)],
            UsageError,
            "--random-seed is 1 bytes; it must be 16",
        ),
        (["--stdin", "/no/such/file", str(PROBE)], UsageError, "--stdin /no/such/file"),
        (["--max-write-bytes", "-5", str(PROBE)], UsageError, "--max-write-bytes must be in 0"),
        (["--fuel", "0", str(PROBE)], UsageError, "--fuel must be in 1..100000000000, got 0"),
        (["--timeout-ms", "0", str(PROBE)], UsageError, "--timeout-ms must be in 1..600000"),
        (["/no/such/module.wasm"], WasihostError, "does not exist"),
    ],
)
def test_bad_input_is_a_wasihost_error(argv: list[str], error: type, match: str) -> None:
    with pytest.raises(error, match=re.escape(match)):
        wasi(*argv)


def test_a_bad_wasi_flag_exits_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wasi", "--random-seed", "00", str(PROBE)]) == 2
    assert capsys.readouterr().err.startswith("error: usage: --random-seed is 1 bytes")


def test_guest_failures_surface_with_their_class(tmp_path: Path) -> None:
    with pytest.raises(CallError) as info:
        wasi("--profile", "standard", "--timeout-ms", "300", str(PROBE), "sleep:10000000000")
    assert info.value.failure is FailureClass.DEADLINE
    with pytest.raises(CallError) as info:
        wasi("--fuel", "1000", str(STD), "hello")
    assert info.value.failure is FailureClass.OUT_OF_FUEL
    not_wasm = tmp_path / "x.wasm"
    not_wasm.write_bytes(b"not wasm")
    with pytest.raises(AdmissionError):
        wasi(str(not_wasm))


def test_exit_status_mapping() -> None:
    assert [exit_status(c) for c in (0, 3, 255, 256, 257, 0xFFFF_FFFF)] == [0, 3, 255, 1, 1, 255]


def test_a_guest_that_died_on_a_withheld_clock_gets_a_hint(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """Rust std panics when ``Instant::now`` is refused; the user is told which flag did it."""
    try:
        status = wasi("--profile", "none", "--no-random", str(STD), "time")
    except WasihostError as exc:  # a trap: the CLI's main prints the hint after the error
        assert exc.hint is not None and "--profile none" in exc.hint
    else:
        assert status != 0
        err = capsysbinary.readouterr().err.decode()
        assert "hint: the guest asked for a clock, which was withheld" in err
    # A run that succeeds, or fails without asking for a withheld capability, gets no hint.
    assert wasi("--profile", "none", "--no-random", str(PROBE), "exit:3") == 3
    assert b"hint:" not in capsysbinary.readouterr().err


def test_a_run_without_a_module_names_only_the_module_as_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The guest's arguments are optional: argparse's default said "required: module, args"."""
    assert main(["wasi", "--dir", "/"]) == 2
    assert capsys.readouterr().err == "error: usage: the following arguments are required: module\n"


def test_a_command_line_program_gets_a_command_line_budget(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """Issue 28, item 25: with no flag a program gets the most fuel and time a run may have
    (before, the extension's 10M fuel and one second ended a program printing 300,000 lines out
    of fuel in half a second); the flags still lower them."""
    args = parse_args([str(LIBC), "lines:300000"])
    assert (args.fuel, args.timeout_ms) == (
        resource_limits.MAX_FUEL_PER_CALL,
        resource_limits.MAX_TIMEOUT_MS,
    )
    assert wasi(str(LIBC), "lines:300000") == 0
    assert capsysbinary.readouterr().out.splitlines()[-1] == b"line 299999"
    with pytest.raises(CallError) as info:
        wasi("--fuel", "1000000", str(LIBC), "lines:300000")
    assert info.value.failure is FailureClass.OUT_OF_FUEL


def test_a_run_out_of_fuel_or_time_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI says which flag raises the budget a program ran out of, and when it is already
    the most a run may have, says that instead."""
    assert main(["wasi", "--cache-dir", str(CACHE_DIR), "--fuel", "1000000", str(LIBC),
                 "lines:300000"]) == 1  # fmt: skip
    assert (
        "hint: it ran out of fuel: raise --fuel N (this run had 1000000)" in capsys.readouterr().err
    )
    assert main(["wasi", "--cache-dir", str(CACHE_DIR), "--timeout-ms", "200", str(PROBE),
                 "sleep:10000000000"]) == 1  # fmt: skip
    assert (
        "hint: it ran past its deadline: raise --timeout-ms (this run had 200 ms)"
        in capsys.readouterr().err
    )
    most = str(resource_limits.MAX_FUEL_PER_CALL)
    assert budget_hint(FailureClass.OUT_OF_FUEL, int(most), 1000) == (
        f"this run had {most} fuel, the most --fuel allows"
    )
    assert budget_hint(FailureClass.TRAP, 1, 1) is None
