"""Issue 12's targets, judged from one ``wasihost bench --json`` results file.

``python -m wasihost.benchmark.targets RESULTS.json`` prints the Markdown table that heads
``benchmarks/README.md``, so the figures there come from the same code a user runs. Pure: it
reads a results document and formats it; it measures nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

MIB = 1024 * 1024


@attrs.frozen
class Target:
    """One row: a scenario, what wasihost is compared with, and the bound it must meet."""

    label: str
    target: str
    # The measured figure (shown) and whether it meets the target, or None when not measured.
    judge: Callable[[dict[str, Any]], tuple[str, bool] | None]
    # For a bound on wasihost / Extism: the scenario and the bound, to set beside the raw
    # floor's own ratio (a bound below it is out of any wasmtime-py host's reach).
    scenario: str | None = None
    bound: float | None = None


def _median(doc: dict[str, Any], scenario: str, system: str) -> float | None:
    for row in doc.get("call_cost", []):
        if row["scenario"] == scenario and row["system"] == system:
            value = row.get("median_us")
            return float(value) if value is not None else None
    return None


def _vs(scenario: str, bound: float, peer_scenario: str | None = None) -> Callable[..., Any]:
    """wasihost's median over Extism's (of ``peer_scenario``, by default the same scenario)."""

    def judge(doc: dict[str, Any]) -> tuple[str, bool] | None:
        ours = _median(doc, scenario, "wasihost")
        theirs = _median(doc, peer_scenario or scenario, "extism")
        if ours is None or not theirs:
            return None
        ratio = ours / theirs
        return f"{_us(ours)} vs {_us(theirs)}: {ratio:.2f}x", ratio <= bound

    return judge


def _throughput(scenario: str, size: int, floor_mb_s: float) -> Callable[..., Any]:
    def judge(doc: dict[str, Any]) -> tuple[str, bool] | None:
        ours = _median(doc, scenario, "wasihost")
        if not ours:
            return None
        mb_s = size / ours  # bytes per µs is MB/s
        return f"{mb_s:,.0f} MB/s", mb_s >= floor_mb_s

    return judge


def _scaling(workload: str, bound: float) -> Callable[..., Any]:
    def judge(doc: dict[str, Any]) -> tuple[str, bool] | None:
        for row in doc.get("scaling", []):
            if row["workload"] == workload and row["mode"] == "2 threads" and not row["skipped"]:
                ratio = float(row["vs_1_thread"])
                if row.get("settled") is False:  # its rounds spread more than its effect
                    return f"{ratio:.2f}x of 1 thread, unsettled (spread > effect)", False
                return f"{ratio:.2f}x of 1 thread", ratio >= bound
        return None

    return judge


def _us(value: float) -> str:
    return f"{value / 1000:,.1f} ms" if value >= 10_000 else f"{value:,.1f} µs"


def _ratio(label: str, scenario: str, bound: float) -> Target:
    """A row bounding wasihost / Extism on ``scenario``."""
    return Target(label, f"≤ {bound}x Extism", _vs(scenario, bound), scenario, bound)


TARGETS = (
    _ratio("no-op call", "noop", 0.5),
    _ratio("echo 64 B", "echo-64", 0.6),
    _ratio("echo 4 KiB", "echo-4KiB", 0.6),
    Target("echo 1 MiB, one call", "≥ 2 GB/s", _throughput("echo-1MiB", MIB, 2000.0)),
    Target(
        "native host function, one i64",
        "≤ 0.8x Extism's i64 host function",
        _vs("host-call-native", 0.8),
    ),
    Target(
        "CBOR host call, 64 B request",
        "≤ 1.0x Extism's i64 host function",
        _vs("host-call-64", 1.0, "host-call-native"),
    ),
    _ratio("instantiate + first call (cached)", "instantiate-cached", 0.8),
    _ratio("cold run in a new process", "cold-start", 1.2),
    Target("2 threads, 2 extensions, small calls", "≥ 1.5x", _scaling("noop", 1.5)),
    Target("2 threads, 2 extensions, compute", "≥ 1.8x", _scaling("compute", 1.8)),
)


def table(doc: dict[str, Any]) -> list[str]:
    """The Markdown table of every target, judged on ``doc``."""
    machine = doc.get("machine", {})
    load = machine.get("load_before", ["?"])[0], machine.get("load_after", ["?"])[0]
    lines = [
        f"`wasihost bench{' --quick' if doc.get('settings', {}).get('quick') else ''}`, "
        f"{machine.get('cpus', '?')} CPUs, load average {load[0]} before and {load[1]} after; "
        f"wasmtime {machine.get('wasmtime', '?')}, Extism {machine.get('extism', '?')}, "
        "medians over interleaved batches.",
        "",
        "| scenario | measured | target | met |",
        "| --- | --- | --- | --- |",
    ]
    for target in TARGETS:
        verdict = target.judge(doc)
        shown, met = verdict if verdict is not None else ("not measured", None)
        mark = "—" if met is None else ("yes" if met else "no")
        lines.append(f"| {target.label} | {shown} | {target.target} | {mark} |")
    return lines + floor_notes(doc)


def floor_notes(doc: dict[str, Any]) -> list[str]:
    """Each ratio target beside the raw floor's own ratio to Extism in the same run (the
    ``wasmtime_func_call_unchecked`` path with no checks at all), naming those set below it."""
    notes = []
    for target in TARGETS:
        if target.scenario is None or target.bound is None:
            continue
        floor = _median(doc, target.scenario, "wasmtime-floor")
        theirs = _median(doc, target.scenario, "extism")
        if floor is None or not theirs:
            continue
        ratio = floor / theirs
        below = " (the target is below the floor)" if target.bound < ratio else ""
        notes.append(f"- {target.label}: the raw floor is {ratio:.2f}x Extism{below}")
    if not notes:
        return []
    return ["", "The raw floor in the same run, against the same Extism figure:", *notes]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wasihost.benchmark.targets",
        description="print issue 12's target table from a `wasihost bench --json` file",
    )
    parser.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    try:
        doc = json.loads(args.results.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {args.results}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or not isinstance(doc.get("call_cost"), list):
        print(f"error: {args.results}: not a `wasihost bench --json` results file", file=sys.stderr)
        return 2
    print("\n".join(table(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
