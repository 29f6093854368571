"""benchmarks/bench_tick.py, which docs/engine.md's figures for the epoch tick come from: it
measures each tick beside a busy Python thread and beside a busy Python process, the control
that tells the GIL's share of the thread's cost from the CPU's (issue 28, item 24). Cut to one
round of tiny workloads: the test checks what is measured, not how fast anything is."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tick.py"


@pytest.fixture(scope="module")
def bench_tick() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_tick", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_tick_is_measured_alone_beside_a_busy_thread_and_beside_a_busy_process(
    bench_tick: ModuleType, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    overhead = bench_tick.tick_overhead([10], fuel=1_000_000, calls=5, repeats=1, cache_dir=cache)
    assert set(overhead) == {"idle", "busy", "process"}
    for condition in ("idle", "busy", "process"):
        assert set(overhead[condition]["spin"]) == {"10", str(bench_tick.BASELINE_TICK_MS)}
    # Only the busy thread's own progress can be counted in this process.
    assert "app_rate" in overhead["busy"] and "app_rate" not in overhead["process"]


@pytest.mark.skipif(sys.platform != "linux", reason="the child listing uses procps' ps")
def test_the_busy_process_is_gone_when_its_measurement_ends(bench_tick: ModuleType) -> None:
    with bench_tick.contender("process"):
        children = _children()
        assert len(children) == 1
    assert _children() == []


def _children() -> list[str]:
    """The running (not zombie) children of this process that run the busy loop."""
    ps = ["ps", "--ppid", str(os.getpid()), "-o", "stat=,args="]
    # ps exits 1 when it lists nothing.
    listing = subprocess.run(ps, check=False, capture_output=True, text=True).stdout
    return [
        line
        for line in listing.splitlines()
        if "while True" in line and not line.lstrip().startswith("Z")
    ]

