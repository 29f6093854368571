"""`wasihost bench --sections process`: the process runtime's section runs through the real
engine (walled children included) and reports every row with numbers and every target by
name. The run is cut to one batch, one round and one cold start of a few milliseconds each:
the test checks what is reported, never how fast anything is (speed targets are checked by
benchmarks/bench_process.py, not by timed unit tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.support.common import FIXTURES
from wasihost.benchmark import process_runtime
from wasihost.benchmark.names import SECTIONS
from wasihost.cli import bench_command, main

FIGURE_KEYS = {"median", "min", "max", "n"}


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """--quick, cut down to a fraction of a second of measuring."""
    plan = attrs.evolve(
        bench_command.QUICK,
        process_batches=1,
        process_batch_s=0.002,
        process_rounds=1,
        process_round_s=0.005,
        process_cold_runs=1,
    )
    monkeypatch.setattr(bench_command, "QUICK", plan)


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_figure(fig: Any, positive: bool = True) -> bool:
    """A median and its range, all numbers (positive ones, but for a difference)."""
    if not isinstance(fig, dict) or set(fig) != FIGURE_KEYS or fig["n"] < 1:
        return False
    values = [fig["min"], fig["median"], fig["max"]]
    if not all(_number(v) for v in values) or not values[0] <= values[1] <= values[2]:
        return False
    return not positive or values[0] > 0


@pytest.mark.usefixtures("tiny")
def test_the_process_section_reports_every_row_and_target(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    code = main(["bench", "--quick", "--sections", "process", "--fixtures", str(FIXTURES),
                 "--json", str(out)])  # fmt: skip
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert "process" in SECTIONS
    assert set(doc["not_run"]) == set(SECTIONS) - {"process"}
    section = doc["process"]
    assert len(section["load_before"]) == 3 and len(section["load_after"]) == 3
    assert section["settings"] == {"batches": 1, "batch_s": 0.002, "rounds": 1,
                                   "round_s": 0.005, "cold_runs": 1}  # fmt: skip

    # 1. Per call: each scenario in both runtimes, the added cost and the control.
    calls = {row["scenario"]: row for row in section["calls"]}
    assert set(calls) == {"noop", "echo-64", "greet (1 host call)"}
    for row in calls.values():
        assert _is_figure(row["in_process_us"]) and _is_figure(row["process_us"])
        assert _is_figure(row["added_us"], positive=False)
        assert _is_figure(row["control_round_trip_us"])
    assert calls["greet (1 host call)"]["fixture"] == "hello"
    assert not calls["greet (1 host call)"]["judged"]

    # 2. Throughput: both runtimes and the control, one thread and two, and their ratio.
    throughput = {row["runtime"]: row for row in section["throughput"]}
    assert set(throughput) == {"in-process", "process-only", "control"}
    for row in throughput.values():
        assert row["calls_per_thread"] >= 1
        for key in ("one_thread_calls_per_s", "two_threads_calls_per_s", "ratio"):
            assert _is_figure(row[key]), (row["runtime"], key)

    # 3. The cold start: every phase the runtime has, with a number; none it lacks.
    cold = {row["phase"]: row for row in section["cold"]}
    assert tuple(cold) == process_runtime.COLD_PHASES
    lacks = {
        "in_process_ms": {"spawn + walls + HELLO", "LOAD (module to the child)",
                          "of which serialising the module"},
        "process_ms": {"new instance (in-process: a Store)"},
    }  # fmt: skip
    for phase, row in cold.items():
        for runtime, missing in lacks.items():
            if phase in missing:
                assert row[runtime] is None, (phase, runtime)
            else:
                assert _is_figure(row[runtime], positive=False), (phase, runtime)
                assert row[runtime]["median"] >= 0
    assert cold["spawn to first answer"]["process_ms"]["median"] > 0

    # Native plugins, reported beside the same calls of a Wasm guest in a walled child.
    native = section["native"]
    rows = {row["scenario"]: row for row in native["calls"]}
    assert set(rows) == {"no host call", "greet (1 host call)"}
    assert rows["no host call"]["native"] == "hostile-native ping"
    for row in rows.values():
        assert _is_figure(row["native_us"]) and _is_figure(row["process_us"])
    assert _is_figure(native["cold"]["load_ms"]) and _is_figure(native["cold"]["first_call_ms"])
    assert "native plugins (runtime native-process)" in stdout

    # The targets: each named, with its bound, its figure and a verdict (greet: reported).
    targets = {row["target"]: row for row in section["targets"]}
    assert set(targets) == {
        "1. added cost per small call, noop",
        "1. added cost per small call, echo-64",
        "1. added cost per small call, greet (1 host call)",
        "2. small calls, 2 extensions on 2 threads over 1 (process-only)",
        "3. a cold child, spawn to first answer",
    }
    for name, row in targets.items():
        assert row["measured"] and row["bound"]
        assert (row["met"] is None) == ("greet" in name)

    # The printed table: the load, the baseline beside each figure, each target's verdict.
    assert "Process runtime (issue 30)" in stdout and "load average" in stdout
    assert "in-process" in stdout and "process-only" in stdout
    for name in targets:
        (line,) = [line for line in stdout.splitlines() if name in line]
        assert line.rstrip().endswith(("PASS", "MISS", "-"))


def test_a_missing_fixture_is_reported_not_raised(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "echo").symlink_to(FIXTURES / "echo")  # echo alone: no hello
    out = tmp_path / "r.json"
    code = main(["bench", "--quick", "--sections", "process", "--fixtures", str(tmp_path),
                 "--json", str(out)])  # fmt: skip
    stdout, _ = capsys.readouterr()
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["process"] == {}
    assert "hello.wasm is missing" in doc["not_run"]["process"]
    assert "Process runtime (issue 30)" in stdout and "not run" in stdout


def test_without_the_native_fixtures_the_wasm_rows_stand(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("echo", "hello"):
        (tmp_path / name).symlink_to(FIXTURES / name)
    out = tmp_path / "r.json"
    code = main(["bench", "--quick", "--sections", "process", "--fixtures", str(tmp_path),
                 "--json", str(out)])  # fmt: skip
    stdout, _ = capsys.readouterr()
    assert code == 0
    section = json.loads(out.read_text())["process"]
    assert section["calls"] and section["throughput"] and section["cold"]
    assert section["native"] == {
        "not_run": f"{tmp_path / 'hello-native' / 'hello-native'} is missing"
    }
    assert "native plugins: not run" in stdout
