"""The command line: outputs, exit codes, and one clean error line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest

from tests.support.common import FIXTURES
from tests.support.guests import build, escape, guest_wat
from wasihost.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_hello_greets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "run", str(FIXTURES / "hello"), "greet", "--input", '{"name":"ada"}', "--no-cache"
    )
    assert (code, out) == (0, '{"greeting": "hello, ada"}\n')


def test_json_envelope_reports_fuel_and_logs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "run",
        str(FIXTURES / "hello"),
        "greet",
        "--input",
        '{"name":"bo"}',
        "--json",
        "--no-cache",
    )
    doc = json.loads(out)
    assert code == 0
    assert doc["output"] == {"greeting": "hello, bo"}
    assert doc["fuel_used"] > 0
    assert isinstance(doc["logs"], list)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["run", "FIX/hello", "greet", "--input", "{nope"],
            "error: usage: --input: not valid JSON",
        ),
        (
            ["run", "FIX/hello", "greet", "--fuel", "0"],
            "error: usage: --fuel must be in 1..100000000000, got 0",
        ),
        (["run", "FIX/hello", "greet", "--timeout-ms", "abc"], "error: usage:"),
        (
            ["run", "FIX/hello", "wasihost.hello"],
            "error: config: command 'wasihost.hello' is reserved",
        ),
        (["run", "FIX/hello", "nosuch"], "error: config: command 'nosuch' is not declared"),
        (
            ["run", "FIX/hello", "greet", "--grant", "random"],
            "error: admission: grant 'random' was not requested",
        ),
        (["run", "FIX/does-not-exist", "greet"], "error: package: module"),
        (["frobnicate"], "error: usage:"),
        (["abi", "--version", "x"], "error: usage: ABI version 'x' is not MAJOR.MINOR"),
    ],
)
def test_bad_arguments_get_one_clean_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    argv = [a.replace("FIX", str(FIXTURES)) for a in argv]
    code, _, err = run_cli(capsys, *argv, *(["--no-cache"] if argv[0] == "run" else []))
    assert code in (1, 2)
    assert err.strip().splitlines()[-1].startswith(fragment), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("wasm", "fragment"),
    [
        (b"", "error: admission: not a valid module: not a wasm module"),
        (b"\0asm\x01\0\0\0\x01\x05", "error: admission: not a valid module"),
        (
            build(guest_wat(imports='(import "env" "system" (func (param i32) (result i32)))')),
            "error: admission: import env.system: unknown import module 'env'",
        ),
        (
            build(guest_wat(memory='(memory (export "memory") 60000)')),
            "error: admission: memory 0 declares a minimum of 60000 pages",
        ),
    ],
)
def test_hostile_modules_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, wasm: bytes, fragment: str
) -> None:
    path = tmp_path / "guest.wasm"
    path.write_bytes(wasm)
    code, _, err = run_cli(capsys, "run", str(path), "run", "--no-cache")
    assert code == 1
    assert err.startswith(fragment), err


def test_bare_module_with_grants(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "guest.wasm"
    path.write_bytes(build(guest_wat()))
    code, out, err = run_cli(capsys, "run", str(path), "anything", "--grant", "log", "--no-cache")
    assert (code, out) == (0, "null\n"), err
    code, _, err = run_cli(capsys, "run", str(path), "x", "--grant", "teleport", "--no-cache")
    assert code == 1 and "unknown capability 'teleport'" in err


def test_inspect_reports_imports_verdict_and_enforcement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "inspect", str(FIXTURES / "hello"), "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["abi"] == "1.0"
    assert doc["admission"]["admitted"] is True
    by_name = {i["name"]: i for i in doc["imports"]}
    assert by_name["log"]["entry"]["capability"] == "log"
    assert any("fuel" in line for line in doc["enforced"])
    assert doc["declared"]
    code, out, _ = run_cli(capsys, "inspect", str(FIXTURES / "hello"))
    assert "enforced by the host:" in out and "declared only" in out


def test_inspect_refused_module(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "guest.wasm"
    path.write_bytes(build(guest_wat(imports='(import "env" "system" (func))')))
    code, out, _ = run_cli(capsys, "inspect", str(path))
    assert code == 1
    assert "admission: REFUSED" in out and "env.system" in out


def test_abi_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "abi", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["versions"] == ["1.1", "2.0"]
    assert doc["features"] == {
        "1.0": [],
        "1.1": ["bytes-commands", "namespaces"],
        "2.0": ["bytes-commands", "namespaces", "native-log"],
    }
    v1 = {f["name"] for f in doc["functions"] if f["module"] == "wasihost_v1"}
    assert {"abort", "log", "clock_now", "random_bytes"} < v1
    assert {f["name"] for f in doc["functions"] if f["since"] == "1.0"} >= {"log", "abort"}
    assert len([f for f in doc["functions"] if f["module"] == "wasi_snapshot_preview1"]) == 46
    code, out, _ = run_cli(capsys, "abi", "--version", "1.0")
    assert "wasihost_v1.log (i32, i32, i32, i32) -> (i32)" in out
    # A v1.0 guest's view hides what 1.1 added.
    assert "storage_get" not in out
    code, out, _ = run_cli(capsys, "abi", "--version", "1.1")
    assert "wasihost_v1.storage_get (i32, i32, i32, i32) -> (i32)" in out
    # The v2 view: log changed to typed arguments, the rest carried over under wasihost_v2.
    code, out, _ = run_cli(capsys, "abi", "--version", "2.0")
    assert code == 0 and "view 2.0: features bytes-commands, namespaces, native-log" in out
    assert "wasihost_v2.log (i32, i32, i32) -> (i32)  capability=log since=2.0" in out
    assert "wasihost_v2.storage_get (i32, i32, i32, i32) -> (i32)" in out
    assert "wasihost_v1." not in out
    code, _, err = run_cli(capsys, "abi", "--version", "3.0")
    assert code != 0 and "ABI 3.0 is not served by this host (serves 1.1, 2.0)" in err


def test_inspect_shows_a_v2_guest_and_its_features(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "inspect", str(FIXTURES / "logger-v2"))
    assert code == 0
    assert "abi:     2.0" in out
    assert "features: bytes-commands, namespaces, native-log" in out
    assert "wasihost_v2.log (i32, i32, i32) -> (i32)  capability=log request<=4096B" in out


def test_console_entry_point_never_prints_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "wasihost.cli", "run", str(tmp_path / "missing.wasm"), "x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: package: module")
    assert "Traceback" not in proc.stderr


def test_state_commands_end_to_end(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path / "state")]
    ext = "org.wasihost.fixtures.hello"
    code, out, _ = run_cli(capsys, "install", str(FIXTURES / "hello"), *state)
    assert code == 0 and "holds no grants" in out
    code, _, err = run_cli(capsys, "run", ext, "greet", "--input", '{"name":"a"}', *state)
    assert code == 1 and "required capability 'log' is not granted" in err
    assert run_cli(capsys, "grants", "grant", ext, "log", *state)[0] == 0
    code, out, _ = run_cli(capsys, "run", ext, "greet", "--input", '{"name":"a"}', *state)
    assert (code, out) == (0, '{"greeting": "hello, a"}\n')
    code, out, _ = run_cli(capsys, "grants", "list", ext, "--json", *state)
    doc = json.loads(out)
    assert doc["epoch"] == 1 and [g["capability"] for g in doc["grants"]] == ["log"]
    code, _, err = run_cli(capsys, "grants", "grant", ext, "log", "--scope", "[1]", *state)
    assert code == 1 and "scope must be a JSON object" in err
    assert run_cli(capsys, "grants", "revoke", ext, "--reason", "key leak", *state)[0] == 0
    code, _, err = run_cli(capsys, "run", ext, "greet", "--input", '{"name":"a"}', *state)
    assert code == 1 and err.strip().endswith("is revoked: key leak")
    code, out, _ = run_cli(capsys, "status", ext, "--json", *state)
    (report,) = json.loads(out)["extensions"]
    assert report["state"] == "revoked" and report["why"] == "key leak"
    assert report["remaining"]["package"] is not None
    assert report["remove"].startswith(f"wasihost remove {ext} --purge")
    code, out, _ = run_cli(capsys, "status", *state)
    assert "revoked (key leak)" in out and "to remove everything" in out
    assert run_cli(capsys, "remove", ext, "--purge", *state)[0] == 0
    code, out, _ = run_cli(capsys, "status", *state)
    assert "no extensions" in out
    code, _, err = run_cli(capsys, "grants", "grant", ext, "teleport", *state)
    assert code == 1 and "unknown capability 'teleport'" in err


def test_run_points_plain_wasi_commands_to_the_wasi_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = FIXTURES / "wasi-std" / "wasi-std.wasm"
    code, _, err = run_cli(capsys, "run", str(module), "main", "--no-cache")
    assert code == 2 and "run it with `wasihost wasi" in err
    code, out, _ = run_cli(capsys, "wasi", "--no-cache", str(module))
    assert code == 0 and "hello from rust std" in out


def test_guest_text_cannot_drive_the_terminal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A guest's error text with escape sequences is printed inert, on one line."""
    body = b"\x01\x00\x00\x00" + cbor2.dumps(
        {"class": "evil", "message": "\x1b[2J\x1b]0;pwned\x07\nfake: line"}
    )
    wat = guest_wat(
        f"(call $packed (i32.const 9000) (i32.const {len(body)}))",
        extra=f'(data (i32.const 9000) "{escape(body)}")',
    )
    path = tmp_path / "evil.wasm"
    path.write_bytes(build(wat))
    code, _, err = run_cli(capsys, "run", str(path), "run", "--no-cache")
    assert code == 1
    assert "\x1b" not in err and "\x07" not in err
    assert err.count("\n") == 1 and "\\x1b[2J" in err


def test_inspect_prints_a_modules_names_inert_and_each_on_its_own_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Export and import names are the module's: a line break in one must not forge a line
    of the report (a fake "admission: admitted"), nor an escape or a bidi override rewrite it."""
    forged = "\\0d\\0aadmission: admitted (granted: everything)\\1b[2J\\e2\\80\\ae"
    wat = guest_wat(
        imports=f'(import "wasihost_v1" "log{forged}" (func (param i32 i32 i32 i32) (result i32)))',
        extra=f'(func (export "run{forged}"))',
    )
    path = tmp_path / "names.wasm"
    path.write_bytes(build(wat))
    code, out, _ = run_cli(capsys, "inspect", str(path))
    assert code == 1  # the import is no registry entry: refused
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    lines = out.splitlines()
    assert not any(line.startswith("admission: admitted") for line in lines)
    assert sum(line.startswith("admission:") for line in lines) == 1
    assert "\\x0d\\x0aadmission: admitted" in out and "\\u202e" in out


def test_inspect_a_plain_wasi_command(capsys: pytest.CaptureFixture[str]) -> None:
    module = FIXTURES / "wasi-std" / "wasi-std.wasm"
    code, out, _ = run_cli(capsys, "inspect", str(module), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["abi"] == "none: a plain wasi command"
    assert all(i["entry"] is not None for i in doc["imports"])
    assert doc["admission"]["abi"] == "the wasi profile"


def test_a_state_directory_that_is_a_file_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plain = tmp_path / "state"
    plain.write_text("not a directory")
    code, _, err = run_cli(capsys, "status", "--state-dir", str(plain))
    assert code == 1
    assert f"state directory refused: {plain}: Not a directory" in err
    assert plain.read_text() == "not a directory"  # nothing of it was touched


def test_status_and_grants_print_a_revocation_reason_inert(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = str(tmp_path / "state")
    assert run_cli(capsys, "install", str(FIXTURES / "echo"), "--state-dir", state)[0] == 0
    reason = "\x1b[2J\nfake: line\u202e"
    ext = "org.wasihost.fixtures.echo"
    code, _, _ = run_cli(capsys, "grants", "revoke", ext, "--reason", reason, "--state-dir", state)
    assert code == 0
    for argv in (("status", ext), ("grants", "list", ext)):
        code, out, _ = run_cli(capsys, *argv, "--state-dir", state)
        assert code == 0
        assert "\x1b" not in out and "\u202e" not in out and "\nfake" not in out
        assert "\\x1b[2J\\x0afake: line\\u202e" in out


def test_remove_purge_deletes_the_storage_the_extension_wrote(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`remove --purge` says "and its data": a re-install of the same id must not find the
    rows its predecessor wrote (they live in the state directory's storage database, outside
    the extension's data directory)."""
    state = ["--state-dir", str(tmp_path / "state")]
    ext = "org.wasihost.fixtures.storage"

    def install_and_grant() -> None:
        assert run_cli(capsys, "install", str(FIXTURES / "storage"), *state)[0] == 0
        assert run_cli(capsys, "grants", "grant", ext, "storage", *state)[0] == 0

    install_and_grant()
    put = '{"key": "k", "value": {"$bytes": "6869"}}'
    assert run_cli(capsys, "run", ext, "put", "--input", put, *state)[:2] == (0, "null\n")
    code, out, _ = run_cli(capsys, "run", ext, "get", "--input", '{"key": "k"}', *state)
    assert (code, out) == (0, '{"$bytes": "6869"}\n')
    code, out, _ = run_cli(capsys, "remove", ext, "--purge", *state)
    assert (code, out) == (0, f"removed {ext} and its data\n")
    install_and_grant()
    code, out, _ = run_cli(capsys, "run", ext, "get", "--input", '{"key": "k"}', *state)
    assert (code, out) == (0, "null\n")


def test_what_status_says_is_kept_can_be_purged_after_a_plain_remove(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`status` of an id removed without --purge still shows its records and the command that
    removes them; that command must work, and an id nothing is kept for is named as such."""
    state = ["--state-dir", str(tmp_path / "state")]
    ext = "org.wasihost.fixtures.hello"
    assert run_cli(capsys, "install", str(FIXTURES / "hello"), *state)[0] == 0
    assert run_cli(capsys, "grants", "grant", ext, "log", *state)[0] == 0
    assert run_cli(capsys, "remove", ext, *state)[:2] == (0, f"removed {ext}\n")
    code, out, _ = run_cli(capsys, "status", ext, "--json", *state)
    (report,) = json.loads(out)["extensions"]
    assert report["grants"] == ["log"] and report["remaining"]["package"] is None
    assert report["remove"].startswith(f"wasihost remove {ext} --purge")
    code, out, _ = run_cli(capsys, "remove", ext, "--purge", *state)
    assert (code, out) == (0, f"removed {ext} and its data\n")
    code, out, _ = run_cli(capsys, "status", *state)
    assert "no extensions" in out
    code, out, _ = run_cli(capsys, "status", ext, *state)
    assert "nothing is kept for it" in out and "to remove everything" not in out
    code, _, err = run_cli(capsys, "remove", ext, "--purge", *state)
    assert (code, err) == (1, f"error: package: {ext} is not installed and nothing is kept for it\n")
    code, _, err = run_cli(capsys, "remove", ext, *state)
    assert (code, err) == (1, f"error: package: {ext} is not installed\n")


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        (["--extension", "org.example.hello", "latest"], "'latest' is not a SemVer 2.0.0 version"),
        (["--extension", "Hello", "0.1.0"], "--extension: 'Hello' is not an extension id"),
        (["--module-sha256", "xyz"], "--module-sha256: 'xyz' is not 64 lowercase hex"),
        (["--signing-key", "aGVsbG8="], "--signing-key: 'aGVsbG8=' is 5 bytes, not 32"),
        (["--publisher", "evil example"], "--publisher: 'evil example' is not a publisher id"),
    ],
)
def test_revoke_refuses_an_entry_it_cannot_write_as_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: list[str], expected: str
) -> None:
    """A malformed entry is the operator's typo, named by its flag: not "the revocation list is
    malformed (every package is refused)", and never a list written with an entry (a version
    that is not SemVer) that no package can match while the command reports success."""
    key = tmp_path / "ops"
    assert run_cli(capsys, "keygen", "--publisher", "ops.example", "--out", str(key))[0] == 0
    listfile = tmp_path / "revocations"
    code, out, err = run_cli(capsys, "revoke", str(listfile), "--key", f"{key}.key", *flag)
    assert (code, out) == (2, "")
    assert err.startswith("error: usage: ") and expected in err, err
    assert "every package" not in err and not listfile.exists()


def test_python_dash_m_reports_a_subcommands_usage_error_as_one(tmp_path: Path) -> None:
    """`python -m wasihost.cli` ran the one-file module as __main__, a second copy of it: a
    subcommand module's UsageError (bench's) came out as `error: internal: UsageError` with exit
    70. The package's __main__ now imports main from the package, the one copy."""
    proc = subprocess.run(
        [sys.executable, "-m", "wasihost.cli", "bench", "--batches", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert (proc.returncode, proc.stderr) == (2, "error: usage: --batches must be 1..1000\n")


def test_reinstate_says_which_grants_the_extension_holds_and_refused_grants_wait_for_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`grants revoke EXT` withdraws every grant; `reinstate` gave none back yet printed "it
    holds the grants it had before". A refused grant of an id not installed was announced as
    "the change waits for it" before its error."""
    state = ["--state-dir", str(tmp_path / "state")]
    ext = "org.example.tool"
    code, out, err = run_cli(capsys, "grants", "reinstate", ext, *state)
    assert (code, out, err) == (0, f"{ext} is not revoked: nothing to reinstate\n", "")
    code, out, err = run_cli(capsys, "grants", "grant", ext, "teleport", *state)
    assert (code, out, err) == (1, "", "error: config: unknown capability 'teleport'\n")
    code, out, err = run_cli(capsys, "grants", "grant", ext, "clock", *state)
    assert code == 0 and out.startswith("granted clock") and "is not installed" in err
    assert run_cli(capsys, "grants", "revoke", ext, *state)[0] == 0
    code, out, _ = run_cli(capsys, "grants", "reinstate", ext, *state)
    assert code == 0 and "it holds no grants" in out
    assert f"wasihost grants grant {ext} CAP --state-dir {tmp_path / 'state'}" in out
    code, out, _ = run_cli(capsys, "grants", "list", ext, "--json", *state)
    assert json.loads(out)["grants"] == []


def test_reading_commands_do_not_create_a_mistyped_state_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`status` and `grants list` only read: a --state-dir that does not exist is named as
    such, not created (with its parents) and reported as holding no extensions."""
    missing = tmp_path / "typo" / "state"
    for argv in (["status"], ["grants", "list", "org.example.tool"]):
        code, out, err = run_cli(capsys, *argv, "--state-dir", str(missing))
        assert (code, out) == (1, "")
        assert err == f"error: config: state directory {missing} does not exist (install creates one; check the path)\n"
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("capability", ["log", "clock", "random", "jobs"])
def test_a_scope_for_a_capability_that_reads_none_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, capability: str
) -> None:
    """jobs.md says jobs "takes no scope", nor do log, clock and random: a scope given to them
    was stored and listed as if it bounded something."""
    state = ["--state-dir", str(tmp_path / "state")]
    argv = ["grants", "grant", "org.example.tool", capability, *state]
    code, out, err = run_cli(capsys, *argv, "--scope", '{"max_jobs": 1}')
    assert (code, out) == (1, "")
    assert err == f"error: config: grant scope of {capability} takes no keys (got max_jobs)\n"
    code, out, _ = run_cli(capsys, *argv, "--scope", "{}")
    assert code == 0 and out.startswith(f"granted {capability} to org.example.tool")


def test_run_of_a_missing_source_says_where_it_looked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RUN's source is a path or an installed id. A missing path with a '/' or a .wasm name was
    reported as "... is not installed" once the default state directory existed, and a missing
    id gave no clue that it may live in another state directory."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "wasihost").mkdir(parents=True, mode=0o700)
    for source in ("missing.wasm", "nowhere/x"):
        code, _, err = run_cli(capsys, "run", source, "greet")
        assert (code, err) == (1, f"error: package: module {source} does not exist\n")
    code, _, err = run_cli(capsys, "run", "org.example.hello", "greet")
    assert code == 1 and err.startswith("error: package: org.example.hello is not installed\n")
    assert err.endswith(
        f"hint: org.example.hello is neither a file here nor an extension installed in "
        f"{tmp_path / 'data' / 'wasihost'}; one installed elsewhere needs --state-dir DIR\n"
    )


def test_keygen_and_endorse_refuse_an_empty_prefix_and_a_self_endorsement(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(capsys, "keygen", "--publisher", "a.example", "--out", "")
    assert (code, err) == (2, "error: usage: --out is empty: give a file prefix, such as acme\n")
    key = tmp_path / "a"
    assert run_cli(capsys, "keygen", "--publisher", "a.example", "--out", str(key))[0] == 0
    code, out, err = run_cli(capsys, "endorse", f"{key}.pub", "--key", f"{key}.key")
    assert (code, out) == (2, "")
    assert err == f"error: usage: {key}.pub is the public key of {key}.key itself: endorse a new key\n"


def test_a_bytes_command_given_json_gets_the_cli_flags_as_its_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", str(FIXTURES / "rawecho"), "echo-bytes", "--input", '"x"']
    code, _, err = run_cli(capsys, *argv)
    assert code == 1 and "takes bytes" in err
    assert err.endswith(
        "hint: give the bytes with --input-bytes FILE ('-': stdin) or --input '{\"$bytes\": \"HEX\"}'\n"
    )


def test_python_dash_m_wasihost_is_the_cli() -> None:
    """`python -m wasihost` for an environment whose scripts directory is not on PATH: the
    same command, exit statuses included."""
    hello = subprocess.run(
        [sys.executable, "-m", "wasihost", "run", str(FIXTURES / "echo"), "echo", "--input", "7"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert hello.returncode == 0, hello.stderr
    assert json.loads(hello.stdout) == 7
    bad = subprocess.run(
        [sys.executable, "-m", "wasihost", "run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("value", ["1e5", "\u0661\u0660\u0660", "1_000", " 8", "8 ", "+8", "0x10"])
@pytest.mark.parametrize(
    "argv",
    [
        ["run", str(FIXTURES / "hello"), "greet", "--fuel"],
        ["run", str(FIXTURES / "hello"), "greet", "--timeout-ms"],
        ["wasi", "--fuel"],
        ["wasi", "--timeout-ms"],
        ["wasi", "--max-write-bytes"],
        ["revoke", "list.json", "--key", "k.key", "--expires-days"],
    ],
)
def test_an_integer_flag_takes_ascii_digits_only(
    argv: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """int() read Arabic-Indic digits, '1_000' and spaces around a number as counts: every
    integer flag takes digits 0-9 (a '-' in front), anything else is a usage error naming it."""
    module = [] if argv[0] != "wasi" else [str(FIXTURES / "wasi-libc" / "wasi-libc.wasm")]
    assert main([*argv, value, *module]) == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-1]}: " in err and "is not a whole number in digits 0-9" in err


def test_an_integer_flag_of_more_digits_than_any_limit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", str(FIXTURES / "hello"), "greet", "--fuel", "9" * 5000]) == 2
    err = capsys.readouterr().err
    assert "has more digits than any limit here" in err and len(err) < 200


def test_status_counts_what_storage_keeps_and_says_when_it_cannot_read_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 35 item 7: status said "data 0 bytes" while the storage broker held entries."""
    state_dir = tmp_path / "state"
    state = ["--state-dir", str(state_dir)]
    ext = "org.wasihost.fixtures.storage"
    assert run_cli(capsys, "install", str(FIXTURES / "storage"), *state)[0] == 0
    assert run_cli(capsys, "grants", "grant", ext, "storage", *state)[0] == 0
    code, out, _ = run_cli(capsys, "status", ext, *state)
    assert "storage 0 bytes in 0 entries" in out  # nothing stored yet, and no database made
    assert not (state_dir / "storage.sqlite3").exists()
    value = {"$bytes": b"hello world".hex()}
    for key in ("k1", "k2"):
        put = json.dumps({"key": key, "value": value})
        assert run_cli(capsys, "run", ext, "put", "--input", put, *state)[:2] == (0, "null\n")
    code, out, _ = run_cli(capsys, "status", ext, "--json", *state)
    (report,) = json.loads(out)["extensions"]
    kept = report["remaining"]
    # Each entry counts its key and its value, as the storage quota does.
    assert (kept["storage_bytes"], kept["storage_entries"]) == (2 * (2 + 11), 2)
    assert kept["storage_error"] is None
    code, out, _ = run_cli(capsys, "status", ext, *state)
    assert code == 0 and "storage 26 bytes in 2 entries" in out
    # A storage database that is not one: status says so, and still reports the rest.
    for suffix in ("", "-wal", "-shm"):
        (state_dir / f"storage.sqlite3{suffix}").unlink(missing_ok=True)
    (state_dir / "storage.sqlite3").write_bytes(b"not a database" * 100)
    code, out, err = run_cli(capsys, "status", ext, *state)
    assert code == 0 and "Traceback" not in err
    assert "storage unreadable (storage database" in out and "grants (epoch 1): storage" in out


def test_granting_what_an_extension_already_holds_writes_no_journal_line(
    tmp_path: Path,
) -> None:
    """An application that grants at every start: the journal gains no line per start."""
    from wasihost import Host, Policy
    from wasihost.store.state import StateStore

    ext = "org.wasihost.fixtures.hello"
    for _ in range(3):
        with Host(Policy(allow={"log", "clock"}), state_dir=tmp_path) as host:
            assert host.grant(ext, "log") == 1
            host.load(FIXTURES / "hello").call("greet", {"name": "a"})
    with Host(Policy(allow={"log", "clock"}), state_dir=tmp_path) as host:
        assert host.grant(ext, "clock") == 2  # a change is still journaled
    store = StateStore(tmp_path)
    try:
        grants = [e.detail for e in store.events(ext, limit=1000) if e.kind == "grant"]
    finally:
        store.close()
    assert sorted(grants) == ["clock scope {} epoch 2", "log scope {} epoch 1"]


def test_granting_what_the_installed_version_does_not_request_says_it_gives_nothing_yet(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The grant rule (docs/grants.md) gives only what the manifest requests: a grant kept for
    a later version is taken, and said to give nothing until then (before: said nothing)."""
    state = ("--state-dir", str(tmp_path))
    assert run_cli(capsys, "install", str(FIXTURES / "hello"), *state)[0] == 0
    ext = "org.wasihost.fixtures.hello"
    code, out, err = run_cli(capsys, "grants", "grant", ext, "random", *state)
    assert code == 0 and f"granted random to {ext}" in out
    assert "does not request random: the grant gives it nothing until a version" in err
    code, out, err = run_cli(capsys, "grants", "grant", ext, "clock", *state)
    assert code == 0 and "note:" not in err
