"""`wasihost bench`: the results file's shape, the compatibility matrix's verdicts through the
real admission, skipped peers, and argument errors. Runs are cut to one batch of a few
scenarios on a two-fixture directory, so that they measure nothing worth reading: the tests
check what is reported, not how fast anything is."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES
from wasihost.benchmark import scenarios, systems, targets
from wasihost.benchmark.hosts import bench_policy
from wasihost.benchmark.names import SCENARIOS, SYSTEMS
from wasihost.cli import EXIT_FAILURE, EXIT_USAGE, main
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.supervisor.governor import Throttled

REQUIRED_SCENARIOS = {"noop", "echo-0", "echo-64", "echo-4KiB", "echo-64KiB", "echo-1MiB",
                      "host-call-64", "host-call-native", "instantiate-cached",
                      "cold-start"}  # fmt: skip
ROW_KEYS = {"scenario", "system", "median_us", "spread", "runs", "skipped", "ratio_to_floor"}


@pytest.fixture(scope="module")
def small_fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """echo (ABI 1.0, a noop command), events (ABI 1.1, imports 1.1 entries), compute, and
    rawecho (the raw byte echo that large payloads use)."""
    root = tmp_path_factory.mktemp("fixtures")
    for name in ("echo", "events", "compute", "rawecho"):
        shutil.copytree(FIXTURES / name, root / name)
    return root


def _bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _run(
    capsys: pytest.CaptureFixture[str], fixtures: Path, out: Path, *extra: str
) -> tuple[dict[str, Any], str]:
    code, stdout, stderr = _bench(
        capsys, "--quick", "--json", str(out), "--fixtures", str(fixtures), "--batches", "1",
        *extra,
    )  # fmt: skip
    assert code == 0, stderr
    assert "Traceback" not in stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc, stdout


def test_names_cover_the_documented_systems_and_scenarios() -> None:
    assert set(SYSTEMS) == {"wasihost", "wasmtime-generic", "wasmtime-floor", "extism"}
    assert set(SCENARIOS) == REQUIRED_SCENARIOS


def test_quick_json_has_the_documented_shape(
    capsys: pytest.CaptureFixture[str], small_fixtures: Path, tmp_path: Path
) -> None:
    chosen = ["noop", "echo-64", "echo-1MiB", "host-call-64"]
    doc, _ = _run(capsys, small_fixtures, tmp_path / "r.json", "--sections", "call_cost,overhead",
               "--scenarios", ",".join(chosen))  # fmt: skip
    assert {"machine", "call_cost", "compat", "overhead", "scaling"} <= set(doc)
    machine = doc["machine"]
    assert len(machine["load_before"]) == 3 and len(machine["load_after"]) == 3
    assert machine["cpus"] >= 1 and machine["python"] and machine["wasmtime"]
    assert "extism" in machine
    # Every chosen scenario x every system has a row: measured, or skipped with a reason.
    rows = {(r["scenario"], r["system"]): r for r in doc["call_cost"]}
    assert set(rows) == {(s, y) for s in chosen for y in SYSTEMS}
    for row in rows.values():
        assert set(row) >= ROW_KEYS
        if row["skipped"] is None:
            assert row["median_us"] > 0 and row["runs"] == 1
        else:
            assert row["median_us"] is None and row["skipped"]
    # The floor and wasihost always run the no-op; ratios are against the floor.
    assert rows[("noop", "wasmtime-floor")]["ratio_to_floor"] == 1.0
    assert rows[("noop", "wasihost")]["median_us"] > 0
    # 1 MiB crosses as raw bytes (fixtures/rawecho, ABI 1.1), not as CBOR.
    assert rows[("echo-1MiB", "wasihost")]["median_us"] > 0
    assert rows[("host-call-64", "wasihost")]["median_us"] > 0
    if machine["extism"] is None:
        assert "extism is not installed" in rows[("noop", "extism")]["skipped"]
    else:
        assert rows[("noop", "extism")]["median_us"] > 0
        assert rows[("echo-1MiB", "extism")]["mb_per_s"] > 0
    variants = {r["variant"] for r in doc["overhead"]}
    assert {"raw none", "raw fuel", "raw epoch", "raw fuel+epoch"} <= variants
    assert doc["not_run"].keys() == {"compat", "scaling", "process"}


def test_an_absent_peer_is_skipped_with_the_reason(
    capsys: pytest.CaptureFixture[str], small_fixtures: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    reason = "extism is not installed (test)"
    monkeypatch.setattr(scenarios, "extism_unavailable", lambda: reason)
    monkeypatch.setattr(systems, "extism_unavailable", lambda: reason)
    doc, out = _run(capsys, small_fixtures, tmp_path / "r.json", "--sections", "call_cost",
                    "--scenarios", "noop")  # fmt: skip
    (extism,) = [r for r in doc["call_cost"] if r["system"] == "extism"]
    assert extism["skipped"] == reason and extism["median_us"] is None
    assert doc["machine"]["extism"] is None and doc["machine"]["extism_skipped"] == reason
    assert "noop / extism: extism is not installed (test)" in out


def test_compat_matrix_runs_links_and_refuses_with_reasons(
    capsys: pytest.CaptureFixture[str], small_fixtures: Path, tmp_path: Path
) -> None:
    doc, out = _run(capsys, small_fixtures, tmp_path / "r.json", "--sections", "compat")
    cells = {(r["guest"], r["view"], r["runtime"]): r for r in doc["compat"]}
    guests = {r["guest"] for r in doc["compat"]}
    assert {"echo", "events", "wat-1.0-noop", "wat-2.0-noop"} <= guests
    assert {r["view"] for r in doc["compat"]} == {"1.0", "1.1", "2.0"}
    # A 1.1 guest is refused by a 1.0 host, naming the imports 1.0 lacks; a 1.1 host runs it.
    refused = cells[("events", "1.0", "in-process")]
    assert refused["verdict"] == "refused"
    assert "declares ABI 1.1" in refused["reason"]
    assert "wasihost_v1.events_subscribe" in refused["reason"]
    assert cells[("events", "1.1", "in-process")]["verdict"] == "ran"
    # A 1.0 guest links and runs on both views; with a noop command its cost is measured.
    for view in ("1.0", "1.1"):
        echo = cells[("echo", view, "in-process")]
        assert echo["verdict"] == "ran" and echo["call_cost"]["median_us"] > 0
    # A 1.0 guest importing a 1.1 entry is refused by the real admission, naming it.
    (sneaky,) = [g for g in guests if g.startswith("wat-1.0-imports-")]
    assert cells[(sneaky, "1.1", "in-process")]["verdict"] == "refused"
    assert sneaky.removeprefix("wat-1.0-imports-") in cells[(sneaky, "1.1", "in-process")]["reason"]
    assert "declares ABI 2.0" in cells[("wat-2.0-noop", "1.1", "in-process")]["reason"]
    # Every guest x view has an out-of-process cell, run in a walled child: the same verdict.
    for guest in guests:
        for view in ("1.0", "1.1", "2.0"):
            twin = cells[(guest, view, "out-of-process")]
            assert twin["verdict"] == cells[(guest, view, "in-process")]["verdict"], twin
    assert cells[("echo", "1.0", "out-of-process")]["call_cost"]["median_us"] > 0
    assert "refusals:" in out and "events on 1.0: module declares ABI 1.1" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--scenarios", "nope"],
        ["--sections", "call_cost,bogus"],
        ["--batches", "0"],
        ["--batches", "many"],
        ["--unknown-flag"],
    ],
)
def test_bad_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = _bench(capsys, "--quick", *argv)
    assert code == EXIT_USAGE
    assert err.startswith("error: usage:") and "Traceback" not in err


def test_plot_without_matplotlib_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, out, err = _bench(capsys, "--quick", "--plot", str(tmp_path / "c.png"))
    assert code == EXIT_FAILURE
    assert "--plot: matplotlib is not installed" in err and "Traceback" not in err
    assert out == ""  # refused before measuring anything
    assert not (tmp_path / "c.png").exists()


def test_a_missing_fixtures_directory_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _bench(capsys, "--quick", "--fixtures", str(tmp_path))
    assert code == EXIT_FAILURE
    assert "no fixtures directory" in err and "--fixtures DIR" in err


def test_plot_draws_a_png(
    capsys: pytest.CaptureFixture[str], small_fixtures: Path, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "c.png"
    code, _, err = _bench(capsys, "--quick", "--fixtures", str(small_fixtures), "--batches", "1",
                          "--sections", "call_cost", "--scenarios", "noop", "--plot", str(png))  # fmt: skip
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG")


def test_an_unwritable_results_path_is_refused_before_measuring(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _bench(capsys, "--quick", "--json", str(tmp_path / "no" / "r.json"))
    assert code == EXIT_FAILURE
    assert "its directory does not exist" in err and out == ""


def _cost(scenario: str, system: str, median_us: float | None) -> dict[str, Any]:
    return {"scenario": scenario, "system": system, "median_us": median_us, "spread": 0.1}


def test_the_target_table_judges_a_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "machine": {"cpus": 2, "load_before": [1.0], "load_after": [1.5], "wasmtime": "x"},
        "settings": {"quick": False},
        "call_cost": [
            _cost("noop", "wasihost", 4.0),
            _cost("noop", "extism", 10.0),  # 0.40x: met
            _cost("noop", "wasmtime-floor", 3.0),  # the floor at 0.30x, under the 0.5x bound
            _cost("instantiate-cached", "wasmtime-floor", 90.0),
            _cost("instantiate-cached", "extism", 100.0),  # the floor at 0.90x, over 0.8x
            _cost("echo-64", "wasihost", 7.0),
            _cost("echo-64", "extism", 10.0),  # 0.70x: missed
            _cost("echo-1MiB", "wasihost", 1024 * 1024 / 2500),  # 2,500 MB/s: met
            _cost("host-call-native", "wasihost", 2.0),
            _cost("host-call-native", "extism", 5.0),
            _cost("host-call-64", "wasihost", 5.5),  # judged against Extism's i64 call: 1.10x
            _cost("host-call-64", "extism", 20.0),
        ],
        "scaling": [
            {"workload": "noop", "mode": "2 threads", "vs_1_thread": 1.6, "skipped": None},
        ],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    assert targets.main([str(path)]) == 0
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    assert rows["no-op call"].endswith("0.40x | ≤ 0.5x Extism | yes |")
    assert rows["echo 64 B"].endswith("0.70x | ≤ 0.6x Extism | no |")
    assert "2,500 MB/s" in rows["echo 1 MiB, one call"] and rows["echo 1 MiB, one call"].endswith(
        "yes |"
    )
    assert rows["native host function, one i64"].endswith(
        "0.40x | ≤ 0.8x Extism's i64 host function | yes |"
    )
    assert "1.10x" in rows["CBOR host call, 64 B request"]
    assert rows["CBOR host call, 64 B request"].endswith("| no |")
    assert rows["echo 4 KiB"].endswith("not measured | ≤ 0.6x Extism | — |")
    assert rows["2 threads, 2 extensions, small calls"].endswith(
        "1.60x of 1 thread | ≥ 1.5x | yes |"
    )


def test_the_target_table_sets_each_ratio_beside_the_raw_floor(tmp_path: Path) -> None:
    doc = {
        "call_cost": [
            _cost("noop", "wasmtime-floor", 3.0),
            _cost("noop", "extism", 10.0),
            _cost("instantiate-cached", "wasmtime-floor", 90.0),
            _cost("instantiate-cached", "extism", 100.0),
            _cost("echo-64", "wasmtime-floor", 5.0),  # no Extism figure: no note
        ],
    }
    notes = targets.floor_notes(doc)
    assert "- no-op call: the raw floor is 0.30x Extism" in notes
    assert (
        "- instantiate + first call (cached): the raw floor is 0.90x Extism "
        "(the target is below the floor)" in notes
    )
    assert not any(note.startswith("- echo 64 B") for note in notes)
    assert targets.floor_notes({"call_cost": []}) == []


def test_the_target_table_refuses_what_is_not_a_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"call_cost": 3}')
    assert targets.main([str(path)]) == 2
    assert "not a `wasihost bench --json` results file" in capsys.readouterr().err
    assert targets.main([str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


@pytest.mark.parametrize("bench", [True, False])
def test_a_bench_host_counts_a_cpu_budget_crossing_but_refuses_no_call(
    tmp_path: Path, bench: bool
) -> None:
    """The benchmark's hosts measure calls, not governance: a 1 MiB echo or the compute loop
    spends the default CPU budget within seconds here, and its throttle refused the rest of a
    full run. Under the bench policy the crossing is counted and warned of; under the default
    one the next call is refused."""
    package = tmp_path / "compute"
    shutil.copytree(FIXTURES / "compute", package, ignore=shutil.ignore_patterns("src"))
    toml = package / "extension.toml"
    text = toml.read_text().replace("[resources]\n", "[resources]\ncpu_fuel_per_minute = 1\n")
    toml.write_text(text)
    policy = bench_policy() if bench else Policy()
    with Host(policy, cache_dir=None) as host:
        ext = host.load(package)
        ext.call("run", {"n": 1000})
        if bench:
            assert ext.call("run", {"n": 1000}) is not None
            assert ext.usage().actions_fired["warn"] == 1
        else:
            with pytest.raises(Throttled):
                ext.call("run", {"n": 1000})


def test_the_plot_draws_each_bar_with_its_fastest_and_slowest_batch() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer

    from wasihost.benchmark import report

    rows = [
        {"scenario": "noop", "system": "wasihost", "median_us": 3.0, "min_us": 2.5, "max_us": 4.5},
        {"scenario": "noop", "system": "extism", "median_us": 6.0, "min_us": 5.0, "max_us": 9.0},
        {"scenario": "echo-64", "system": "extism", "median_us": None, "skipped": "absent"},
    ]
    fig = report.figure(rows)
    try:
        (ax,) = fig.axes
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        assert [len(c) for c in bars] == [1, 1]  # the skipped row draws nothing
        spans = []
        for bar in bars:
            assert bar.errorbar is not None
            (segments,) = bar.errorbar.lines[2]  # the vertical line of each bar's error bar
            (low, high) = sorted(y for _, y in segments.get_segments()[0])
            spans.append((bar.patches[0].get_height(), low, high))
        assert sorted(spans) == [(3.0, 2.5, 4.5), (6.0, 5.0, 9.0)]
    finally:
        plt.close(fig)


def test_a_scaling_row_whose_rounds_spread_more_than_its_effect_is_flagged() -> None:
    from wasihost.benchmark import report
    from wasihost.benchmark.scaling import settled

    assert settled([1.8, 1.9, 1.85]) is True  # 0.1 of spread, 0.85 of effect
    assert settled([0.6, 1.9, 1.2]) is False  # 1.3 of spread, 0.2 of effect
    assert settled([1.6]) is False  # one round says nothing of its spread
    rows = [
        {"workload": "noop", "mode": "1 thread", "calls_per_s": 1000.0, "vs_1_thread": 1.0,
         "ratio_by_round": [1.0, 1.0, 1.0], "settled": True, "skipped": None},
        {"workload": "noop", "mode": "2 threads", "calls_per_s": 1200.0, "vs_1_thread": 1.2,
         "ratio_by_round": [0.6, 1.9, 1.2], "settled": False, "skipped": None},
        {"workload": "compute", "mode": "2 threads", "calls_per_s": 1850.0, "vs_1_thread": 1.85,
         "ratio_by_round": [1.8, 1.9, 1.85], "settled": True, "skipped": None},
    ]  # fmt: skip
    lines = report.scaling_table(rows)
    flagged = [line for line in lines if "! spread > effect" in line]
    assert len(flagged) == 1 and flagged[0].startswith("noop      2 threads")
    assert "0.60-1.90" in flagged[0]
    assert any(line.startswith("! the rounds of this row spread more") for line in lines)
    judged = targets._scaling("noop", 1.1)({"scaling": rows})
    assert judged == ("1.20x of 1 thread, unsettled (spread > effect)", False)
    assert targets._scaling("compute", 1.8)({"scaling": rows}) == ("1.85x of 1 thread", True)
