"""What a new user tripped over at the command line: every refusal they can fix names the
fix in CLI terms, bytes and files go in, a closed pipe ends quietly, installs never downgrade
silently."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.common import FIXTURES, ROOT, bare
from tests.support.guests import build, guest_wat, host_import
from wasihost.cli import main
from wasihost.core.errors import AdmissionError
from wasihost.core.manifest import version_order
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HELLO_ID = "org.wasihost.fixtures.hello"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_ungranted_import_names_the_grant_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    module = tmp_path / "clocky.wasm"
    module.write_bytes(build(guest_wat(imports=host_import("clock_now"))))
    code, _, err = run_cli(capsys, "run", str(module), "run", "--no-cache")
    assert code == 1
    assert "needs capability 'clock', which is not granted" in err
    assert err.splitlines()[-1] == "hint: grant it: --grant clock"


def test_the_api_message_names_the_grants_argument(host: Host) -> None:
    with pytest.raises(AdmissionError, match=r"grants=\['clock'\]") as info:
        host.admit(bare(build(guest_wat(imports=host_import("clock_now")))), grants=())
    assert info.value.ungranted == ("clock",)


def test_installed_extensions_get_the_grants_command_with_the_state_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = str(tmp_path / "state")
    assert run_cli(capsys, "install", str(FIXTURES / "hello"), "--state-dir", state)[0] == 0
    code, _, err = run_cli(capsys, "run", HELLO_ID, "greet", "--state-dir", state)
    assert code == 1
    assert f"hint: grant it: wasihost grants grant {HELLO_ID} log --state-dir {state}" in err


def test_out_of_fuel_and_deadline_name_their_flags(capsys: pytest.CaptureFixture[str]) -> None:
    compute = str(FIXTURES / "compute")
    code, _, err = run_cli(
        capsys, "run", compute, "run", "--input", '{"n": 25}', "--fuel", "2000", "--no-cache"
    )
    assert code == 1 and "error: out_of_fuel" in err
    assert "hint: it ran out of fuel: raise --fuel N (this run had 2000)" in err
    spin = str(FIXTURES / "spin")
    code, _, err = run_cli(
        capsys, "run", spin, "run", "--timeout-ms", "50", "--fuel", "10000000000", "--no-cache"
    )
    assert code == 1 and "error: deadline" in err and "--timeout-ms" in err


@pytest.mark.parametrize(
    ("flag", "value"), [("--fuel", "100000000001"), ("--fuel", "0"), ("--timeout-ms", "9999999")]
)
def test_budget_flags_are_refused_in_their_own_words(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    code, _, err = run_cli(capsys, "run", str(FIXTURES / "echo"), "echo", flag, value)
    assert code == 2
    assert err.startswith(f"error: usage: {flag} must be in 1..")
    assert "fuel_per_call" not in err and "timeout_ms" not in err


def test_an_oversized_input_names_max_input_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = tmp_path / "big.json"
    big.write_text('"' + "x" * 200_000 + '"')
    code, _, err = run_cli(
        capsys, "run", str(FIXTURES / "echo"), "echo", "--input-file", str(big), "--no-cache"
    )
    assert code == 1 and "max_input_bytes" in err.splitlines()[-1]


def test_an_import_the_manifest_does_not_request_is_remedied_in_the_manifest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fixtures/ungranted imports random_bytes, and its manifest does not request `random`: a
    --grant cannot lift that (it fails "not requested by the manifest"), so the hint names
    the manifest and the guest's features (issue 35 item 4)."""
    code, _, err = run_cli(capsys, "run", str(FIXTURES / "ungranted"), "run", "--no-cache")
    first, hint = err.splitlines()[-2:]
    assert code == 1
    assert first.endswith("needs capability 'random', which its manifest does not request "
                          "(extension.toml [capabilities])")  # fmt: skip
    assert hint.startswith("hint: the module imports functions of random, which its "
                           "extension.toml does not request: add random to [capabilities]")  # fmt: skip
    assert "--grant" not in hint
    # And in Python: the error says which capabilities only the manifest can add.
    with (
        Host(Policy(allow={"log", "random"}), cache_dir=None) as host,
        pytest.raises(AdmissionError) as refused,
    ):
        host.load(FIXTURES / "ungranted")
    assert (refused.value.unrequested, refused.value.ungranted) == (("random",), ())


def test_an_oversized_output_names_max_output_bytes_and_where_to_raise_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 35 item 4: it said `protocol` with a limit of 65545 nobody had set."""
    code, _, err = run_cli(
        capsys, "run", str(FIXTURES / "oversize"), "run", "--input", '{"mode": "output"}',
        "--no-cache",
    )  # fmt: skip
    first, hint = err.splitlines()[-2:]
    assert code == 1 and first.startswith("error: output_too_large: the command's output of ")
    assert first.endswith("is over its limit (max_output_bytes 65536)") and "65545" not in err
    assert hint.startswith("hint: raise [resources] max_output_bytes in the extension's")


def test_input_from_a_file_and_raw_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = tmp_path / "in.json"
    doc.write_text('{"a": [1, 2]}')
    code, out, _ = run_cli(
        capsys, "run", str(FIXTURES / "echo"), "echo", "--input-file", str(doc), "--no-cache"
    )
    assert (code, out) == (0, '{"a": [1, 2]}\n')
    raw = tmp_path / "in.bin"
    raw.write_bytes(b"\x00\xff")
    code, out, _ = run_cli(
        capsys, "run", str(FIXTURES / "echo"), "echo", "--input-bytes", str(raw), "--no-cache"
    )
    assert (code, out) == (0, '{"$bytes": "00ff"}\n')
    code, _, err = run_cli(
        capsys, "run", str(FIXTURES / "echo"), "echo", "--input", "1", "--input-bytes", str(raw)
    )
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run_cli(
        capsys, "run", str(FIXTURES / "echo"), "echo", "--input-file", str(tmp_path / "nope")
    )
    assert code == 2 and "cannot read" in err


def test_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m wasihost.cli abi | head -1",
        shell=True,  # the pipe is the point
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.stdout.startswith("ABI versions:")
    assert proc.stderr == ""


def _hello_at(tmp_path: Path, version: str) -> Path:
    folder = tmp_path / f"hello-{version}"
    shutil.copytree(
        FIXTURES / "hello",
        folder,
        ignore=shutil.ignore_patterns("target", "src"),
        dirs_exist_ok=True,
    )
    manifest = folder / "extension.toml"
    manifest.write_text(manifest.read_text().replace('version = "0.1.0"', f'version = "{version}"'))
    return folder


def test_install_refuses_a_silent_downgrade_and_reports_real_grants(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = ["--state-dir", str(tmp_path / "state")]
    assert run_cli(capsys, "install", str(_hello_at(tmp_path, "0.2.0")), *state)[0] == 0
    assert run_cli(capsys, "grants", "grant", HELLO_ID, "log", *state)[0] == 0
    code, out, _ = run_cli(capsys, "install", str(_hello_at(tmp_path, "0.2.0")), *state)
    assert code == 0 and "it holds the grants it had: log" in out
    code, _, err = run_cli(capsys, "install", str(FIXTURES / "hello"), *state)
    assert code == 1 and "would downgrade it" in err and "--allow-downgrade" in err
    code, out, _ = run_cli(capsys, "install", str(FIXTURES / "hello"), "--allow-downgrade", *state)
    assert code == 0 and "0.1.0" in out


def test_version_order_is_semver_precedence() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1+build.5",
        "1.10.0",
        "2.0.0",
    ]
    shuffled = ordered[5:] + ordered[:5]
    assert sorted(shuffled, key=version_order) == ordered
    assert version_order("1.0.0+a") == version_order("1.0.0+b")


def test_random_seed_help_says_how_long(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["wasi", "--help"])
    assert "16 to 64 bytes" in " ".join(capsys.readouterr().out.split())


def test_a_grant_the_policy_does_not_allow_names_the_policy_not_the_manifest() -> None:
    """hello's manifest requests clock (optional): refusing it is the policy's doing, and the
    error said the manifest had not requested it (issue 35 item 4)."""
    with (
        Host(Policy(allow={"log"}), cache_dir=None) as host,
        pytest.raises(AdmissionError) as refused,
    ):
        host.load(FIXTURES / "hello", grants=["log", "clock", "storage"])
    assert refused.value.problems == (
        "grant 'storage' was not requested by the manifest (a guest that uses it lists it in "
        "extension.toml's [capabilities] optional)",
        "grant 'clock' is requested by the manifest but not allowed by the host's policy "
        "(Policy(allow=...) does not name it: add 'clock' there to grant it)",
    )


@pytest.mark.parametrize(
    ("value", "says", "hint"),
    [
        ("x" * 200_000, "text string of 200000 characters exceeds 131072 bytes",
         "raise [resources] max_input_bytes in the extension's extension.toml"),
        (list(range(5000)), "more than 4096 data items", "at most 4096 data items"),
        ({1, 2}, "cannot encode a value of type set", "an input is None, a bool"),
    ],
)  # fmt: skip
def test_an_input_the_codec_refuses_says_so_with_its_remedy_in_python(
    value: object, says: str, hint: str
) -> None:
    """Issue 35 item 4: a CodecError said what was wrong, not that it was the input, nor how
    to lift it; the hint existed only in the CLI."""
    from wasihost.core.errors import CodecError

    with Host(Policy(allow=set()), cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo")
        with pytest.raises(CodecError) as refused:
            ext.call("echo", value)
        assert ext.call("echo", "still fine") == "still fine"
    assert refused.value.message == f"command input: {says}"
    assert refused.value.hint is not None and hint in refused.value.hint


def test_a_call_out_of_fuel_or_time_says_which_and_what_raises_it_in_python() -> None:
    """Issue 35 item 4: a looping guest's failure names the budget it ran out of, and the
    manifest key or call argument that raises that one."""
    from wasihost.core.errors import CallError, FailureClass

    with Host(Policy(allow=set()), cache_dir=None) as host:
        spin = host.load(FIXTURES / "spin", fuel=10**10)
        with pytest.raises(CallError) as late:
            spin.call("run", timeout_ms=50)
        with pytest.raises(CallError) as hungry:
            spin.call("run", fuel=100_000)
    assert late.value.failure is FailureClass.DEADLINE
    assert late.value.hint is not None and "timeout_ms" in late.value.hint
    assert "fuel_per_call" not in late.value.hint
    assert hungry.value.failure is FailureClass.OUT_OF_FUEL
    assert hungry.value.hint is not None and "fuel_per_call" in hungry.value.hint
