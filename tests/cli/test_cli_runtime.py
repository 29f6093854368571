"""``--runtime`` on the command line: ``run``, ``wasi`` and ``inspect`` choose where the guest
runs (docs/process-runtime.md), through the real CLI and real children."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import run_cli
from tests.support.common import FIXTURES
from tests.support.wasi import STD


@pytest.mark.parametrize("runtime", ["process", "process-only", "prefer-process", "in-process"])
def test_run_calls_a_command_in_the_runtime_asked_for(
    capsys: pytest.CaptureFixture[str], runtime: str
) -> None:
    code, out, err = run_cli(
        capsys,
        "run",
        str(FIXTURES / "hello"),
        "greet",
        "--input",
        '{"name": "cli"}',
        "--runtime",
        runtime,
        "--no-cache",
    )
    assert (code, json.loads(out)) == (0, {"greeting": "hello, cli"}), err


def test_wasi_runs_a_command_in_a_child(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "wasi", "--runtime", "process", str(STD), "hello")
    assert code == 0, err
    assert "hello" in out


def test_an_unknown_runtime_is_a_usage_error_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(capsys, "run", str(FIXTURES / "hello"), "greet", "--runtime", "vm")
    assert code == 2
    assert "invalid choice: 'vm'" in err and "process-only" in err


def test_inspect_says_the_runtime_and_each_wall_this_machine_gives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(
        capsys, "inspect", str(FIXTURES / "hello"), "--runtime", "process", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["admission"]["runtime"] == "process-only"
    assert [w["name"] for w in doc["walls"]] == [
        "no_new_privs",
        "namespaces",
        "landlock",
        "rlimits",
        "seccomp",
    ]
    walls = [line for line in doc["enforced"] + doc["declared"] if "process wall" in line]
    assert len(walls) == 5  # each wall once: enforced here, or declared with its reason
    assert any(line.startswith("a second wall") for line in doc["enforced"])
    code, out, _ = run_cli(capsys, "inspect", str(FIXTURES / "hello"), "--json")
    assert json.loads(out)["admission"]["runtime"] in ("in-process", "process-only")
