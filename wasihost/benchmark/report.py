"""The results document of a run, its tables, and the call-cost chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .names import FLOOR, SYSTEMS

# The JSON's version: bump it when a key changes meaning, so that old files are not compared
# with new ones by mistake.
SCHEMA = "wasihost-bench/1"


def _fmt_us(us: float) -> str:
    if us >= 10_000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.2f} µs" if us < 100 else f"{us:.0f} µs"


def call_cost_table(rows: list[dict[str, Any]]) -> list[str]:
    by = {(r["scenario"], r["system"]): r for r in rows}
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    width = 24
    lines = [f"{'scenario':<20}" + "".join(f"{s:>{width}}" for s in SYSTEMS)]
    skipped: list[str] = []
    for scenario in scenarios:
        cells = []
        for system in SYSTEMS:
            row = by.get((scenario, system))
            if row is None:
                cells.append("-")
            elif row["median_us"] is None:
                cells.append("skipped")
                skipped.append(f"  {scenario} / {system}: {row['skipped']}")
            else:
                text = f"{_fmt_us(row['median_us'])} ±{row['spread'] * 100:.0f}%"
                if row.get("ratio_to_floor") is not None and system != FLOOR:
                    text += f" {row['ratio_to_floor']:.2f}x"
                cells.append(text)
        lines.append(f"{scenario:<20}" + "".join(f"{c:>{width}}" for c in cells))
        rates = [
            f"{s} {by[(scenario, s)]['mb_per_s']:.0f} MB/s"
            for s in SYSTEMS
            if by.get((scenario, s), {}).get("mb_per_s") is not None
        ]
        if rates and scenario in ("echo-64KiB", "echo-1MiB"):
            lines.append(f"{'':<20}  {', '.join(rates)}")
    if skipped:
        lines += ["skipped (system cannot run the scenario, and why):", *skipped]
    return lines


def compat_table(rows: list[dict[str, Any]]) -> list[str]:
    """The matrix, in-process; then, out-of-process, each cell whose verdict differs (a guest
    that runs in one runtime and not the other) and the per-call cost of those that ran."""
    views = list(dict.fromkeys(r["view"] for r in rows))
    by = {(r["guest"], r["view"], r["runtime"]): r for r in rows}
    guests = list(dict.fromkeys(r["guest"] for r in rows))
    lines = [f"{'guest':<34}{'declares':>9}" + "".join(f"{'view ' + v:>22}" for v in views)]
    reasons: list[str] = []
    outside: list[str] = []
    for guest in guests:
        first = by[(guest, views[0], "in-process")]
        cells = []
        for view in views:
            row = by[(guest, view, "in-process")]
            cell = row["verdict"]
            if row["call_cost"]:
                cell += f" {row['call_cost']['median_us']:.1f} µs"
            if row["verdict"] == "refused":
                reasons.append(f"  {guest} on {view}: {row['reason']}")
            cells.append(cell)
            twin = by.get((guest, view, "out-of-process"))
            if twin is not None and twin["verdict"] != row["verdict"]:
                outside.append(f"  {guest} on {view}: {twin['verdict']} ({twin['reason']})")
            elif twin is not None and twin["call_cost"] and view == views[0]:
                outside.append(f"  {guest}: ran, {twin['call_cost']['median_us']:.1f} µs a call")
        declares = first["declares"] or "-"
        lines.append(f"{guest:<34}{declares:>9}" + "".join(f"{c:>22}" for c in cells))
    lines.append("out-of-process (each instance in a walled child): the same verdicts, except:")
    lines += outside or ["  (none)"]
    if reasons:
        lines += ["refusals:", *reasons]
    return lines


def overhead_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'variant':<24}{'median':>12}{'spread':>9}{'vs none':>9}"]
    for r in rows:
        lines.append(
            f"{r['variant']:<24}{_fmt_us(r['median_us']):>12}{r['spread'] * 100:>8.0f}%"
            f"{r['ratio_to_none']:>8.2f}x"
        )
    return lines


def scaling_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'workload':<10}{'mode':<14}{'calls/s':>12}{'vs 1 thread':>13}  rounds"]
    unsettled = False
    for r in rows:
        if r["calls_per_s"] is None:
            lines.append(f"{r['workload']:<10}{r['mode']:<14}  skipped: {r['skipped']}")
            continue
        by_round = r.get("ratio_by_round") or []
        spread = f"{min(by_round):.2f}-{max(by_round):.2f}" if by_round else ""
        flag = ""
        if r.get("settled") is False:
            flag, unsettled = "  ! spread > effect", True
        lines.append(
            f"{r['workload']:<10}{r['mode']:<14}{r['calls_per_s']:>12.0f}"
            f"{r['vs_1_thread']:>12.2f}x  {spread}{flag}"
        )
    if unsettled:
        lines.append(
            "! the rounds of this row spread more than its effect (max - min of the ratio "
            "exceeds its distance from 1.0): noise, not a result; rerun on a quiet machine"
        )
    return lines


def _fig(value: dict[str, Any] | None, fmt: str, sign: str = "") -> str:
    if value is None:
        return "-"
    lo, mid, hi = (format(value[k], fmt) for k in ("min", "median", "max"))
    return f"{sign}{mid} [{lo}-{hi}]"


def process_table(result: dict[str, Any]) -> list[str]:
    """The section as text: the load, the three tables (median [min-max]) and the targets."""
    before, after = result["load_before"], result["load_after"]
    settings = result["settings"]
    lines = [
        f"load average {before[0]:.2f} {before[1]:.2f} {before[2]:.2f} before, "
        f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} after (1, 5, 15 min), "
        f"{result['cpus']} CPUs",
        "",
        f"per call, µs: median [min-max] over {settings['batches']} interleaved batches; "
        "control: a bare process round trip in the same batches",
        f"{'scenario':<20}{'in-process':>20}{'process-only':>22}{'added':>22}{'control':>20}",
    ]
    for row in result["calls"]:
        lines.append(
            f"{row['scenario']:<20}{_fig(row['in_process_us'], '.1f'):>20}"
            f"{_fig(row['process_us'], '.1f'):>22}{_fig(row['added_us'], '.1f', '+'):>22}"
            f"{_fig(row['control_round_trip_us'], '.1f'):>20}"
        )
    lines += [
        "",
        f"throughput, calls/s: median [min-max] over {settings['rounds']} rounds; control: "
        "GIL-free hashing in the same rounds",
        f"{'runtime':<14}{'1 ext, 1 thread':>28}{'2 exts, 2 threads':>28}{'2 vs 1':>20}",
    ]
    for row in result["throughput"]:
        lines.append(
            f"{row['runtime']:<14}{_fig(row['one_thread_calls_per_s'], ',.0f'):>28}"
            f"{_fig(row['two_threads_calls_per_s'], ',.0f'):>28}"
            f"{_fig(row['ratio'], '.2f'):>20}"
        )
    lines += [
        "",
        f"cold start of fixtures/echo, ms: median [min-max] over {settings['cold_runs']} runs",
        f"{'phase':<36}{'in-process':>22}{'process-only':>22}",
    ]
    for row in result["cold"]:
        lines.append(
            f"{row['phase']:<36}{_fig(row['in_process_ms'], '.1f'):>22}"
            f"{_fig(row['process_ms'], '.1f'):>22}"
        )
    native = result.get("native")
    if native is not None and "not_run" in native:
        lines += ["", f"native plugins: not run ({native['not_run']})"]
    elif native is not None:
        lines += [
            "",
            "native plugins (runtime native-process), µs per call: median [min-max], "
            "interleaved with the same call of a Wasm guest in a walled child",
            f"{'scenario':<22}{'native plugin':>22}{'wasm, process-only':>24}",
        ]
        for row in native["calls"]:
            lines.append(
                f"{row['scenario']:<22}{_fig(row['native_us'], '.1f'):>22}"
                f"{_fig(row['process_us'], '.1f'):>24}"
            )
        cold = native["cold"]
        lines.append(
            f"a new plugin (hello-native), ms: load {_fig(cold['load_ms'], '.1f')}, "
            f"first call (spawn, launcher, walls, exec, HELLO, LOAD, handshake, greet) "
            f"{_fig(cold['first_call_ms'], '.1f')}"
        )
    lines += ["", "targets (issue 30)"]
    for row in result["targets"]:
        verdict = {True: "PASS", False: "MISS", None: "-"}[row["met"]]
        lines.append(f"  {row['target']:<64}{row['measured']:>12}  {row['bound']:<10} {verdict}")
    return lines


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    out = [
        f"wasihost bench ({'quick' if doc['settings']['quick'] else 'full'}): python "
        f"{m['python']}, wasmtime {m['wasmtime']}, extism {m['extism'] or 'not installed'}, "
        f"{m['cpus']} CPUs, load average {m['load_before'][0]:.2f} before, "
        f"{m['load_after'][0]:.2f} after",
    ]
    if m["rust_backtrace_inherited"] not in (None, "0"):
        out.append(
            f"note: RUST_BACKTRACE={m['rust_backtrace_inherited']} was inherited; it was set "
            "to 0 before wasmtime and extism loaded (a backtrace per trap slows calls)"
        )
    sections = (
        (
            "call_cost",
            "Call cost: median per call over interleaved batches, ±spread "
            "((max-min)/median), and the ratio to wasmtime-floor",
            call_cost_table,
        ),
        ("compat", "Compatibility: guest x ABI view (in-process)", compat_table),
        ("overhead", "Fuel and limits overhead (fixtures/compute)", overhead_table),
        ("scaling", "Scaling: 2 extensions", scaling_table),
        (
            "process",
            "Process runtime (issue 30): process-only beside in-process",
            process_table,
        ),
    )
    for key, title, table in sections:
        if key in doc["not_run"]:
            out += ["", f"{title}: not run ({doc['not_run'][key]})"]
        elif doc[key]:
            out += ["", title, *table(doc[key])]
    return "\n".join(out)


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def plot_unavailable() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'wasihost[bench]')"
    return None


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """The call-cost chart (:func:`figure`) as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(rows)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(rows: list[dict[str, Any]]) -> Any:
    """Grouped bars, one group per scenario, one bar per system, log scale (µs): each bar the
    median over the batches, its error bar the fastest and the slowest batch."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    by = {(r["scenario"], r["system"]): r for r in rows if r.get("median_us")}
    fig, ax = plt.subplots(figsize=(max(8, len(scenarios) * 1.4), 5))
    width = 0.8 / len(SYSTEMS)
    for i, system in enumerate(SYSTEMS):
        drawn = [(j, by[(s, system)]) for j, s in enumerate(scenarios) if (s, system) in by]
        if not drawn:
            continue
        mids = [r["median_us"] for _, r in drawn]
        below = [r["median_us"] - r.get("min_us", r["median_us"]) for _, r in drawn]
        above = [r.get("max_us", r["median_us"]) - r["median_us"] for _, r in drawn]
        ax.bar(
            [j + i * width for j, _ in drawn],
            mids,
            width,
            yerr=[below, above],
            capsize=3,
            label=system,
        )
    ax.set_yscale("log")
    ax.set_ylabel("median µs per call (log); bars: fastest-slowest batch")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(scenarios))])
    ax.set_xticklabels(scenarios, rotation=30, ha="right")
    ax.legend()
    ax.set_title("wasihost bench: call cost (missing bar = skipped)")
    fig.tight_layout()
    return fig
