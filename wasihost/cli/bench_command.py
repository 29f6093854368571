"""``wasihost bench``: the argument parser and the run.

    wasihost bench [--quick] [--json FILE] [--plot FILE.png] [--fixtures DIR]
                   [--sections S,...] [--scenarios S,...] [--batches N]

Exit status: 0 when the run finished (a peer or scenario that could not run is reported as
skipped, with the reason, and is not a failure); 1 when the run cannot start (no fixtures
directory, ``--plot`` without matplotlib, a file that cannot be written); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import attrs

from ..benchmark.names import SCENARIOS, SECTIONS
from ..core.errors import ConfigError, WasihostError
from .common import UsageError

# The largest --batches accepted: more only makes a run longer, never the medians better.
MAX_BATCHES = 1000


@attrs.frozen
class Plan:
    """How much to measure; ``quick`` keeps the whole run near 15-20 s on 2 cores, the full
    run near 2.5 minutes (docs/bench.md)."""

    batches: int
    batch_s: float
    cold_batches: int
    compute_rounds: int
    overhead_batches: int
    overhead_batch_s: float
    compat_batches: int
    compat_batch_s: float
    scaling_calls: dict[str, int]
    scaling_rounds: int
    # The process section (benchmark/process_runtime.ProcessPlan): interleaved batches of the
    # per-call rows and their length, throughput rounds and the length of one measurement,
    # cold starts per runtime.
    process_batches: int
    process_batch_s: float
    process_rounds: int
    process_round_s: float
    process_cold_runs: int


QUICK = Plan(
    5, 0.015, 3, 300_000, 3, 0.03, 3, 0.01, {"noop": 4_000, "compute": 40}, 1,
    process_batches=5, process_batch_s=0.015, process_rounds=3, process_round_s=0.05,
    process_cold_runs=4,
)  # fmt: skip
FULL = Plan(
    15, 0.1, 15, 1_000_000, 9, 0.2, 5, 0.05, {"noop": 40_000, "compute": 400}, 3,
    process_batches=15, process_batch_s=0.1, process_rounds=9, process_round_s=0.2,
    process_cold_runs=10,
)  # fmt: skip


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="measure call cost, ABI compatibility, metering overhead, scaling and the process "
        "runtime",
        description="Measure wasihost beside raw wasmtime-py and Extism in one process "
        "(see docs/bench.md). Peers that are not installed are reported as skipped.",
    )
    p.add_argument("--quick", action="store_true", help="a ~15-20 s run instead of a few minutes")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the call-cost chart")
    p.add_argument(
        "--fixtures",
        type=Path,
        metavar="DIR",
        help="the fixtures directory (default: the source tree's fixtures/)",
    )
    p.add_argument(
        "--sections", metavar="S,...", help=f"only these sections ({','.join(SECTIONS)})"
    )
    p.add_argument(
        "--scenarios",
        metavar="S,...",
        help=f"only these call-cost scenarios ({','.join(SCENARIOS)})",
    )
    p.add_argument(
        "--batches",
        type=int,
        metavar="N",
        help="interleaved batches per call-cost scenario, and the process section's batches, "
        "rounds and cold starts (default 5 quick, 15 full)",
    )

    return p


def _subset(text: str | None, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if text is None:
        return known
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        raise UsageError(
            f"--{what}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(known)}"
        )
    return chosen


def _fixtures(given: Path | None) -> Path:
    if given is not None:
        candidates = [given]
    else:
        candidates = [
            Path(__file__).resolve().parent.parent.parent / "fixtures",
            Path.cwd() / "fixtures",
        ]
    for path in candidates:
        if (path / "echo" / "echo.wasm").is_file():
            return path
    raise ConfigError(
        f"no fixtures directory with echo/echo.wasm at {', '.join(map(str, candidates))}: run "
        "from a source checkout of wasihost or pass --fixtures DIR"
    )


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(args: argparse.Namespace) -> int:
    # Before wasmtime or extism load: an inherited RUST_BACKTRACE=1 makes every trap (and
    # Extism's calls) capture a backtrace, several times slower; it is noted in the results.
    inherited = os.environ.get("RUST_BACKTRACE")
    os.environ["RUST_BACKTRACE"] = "0"
    sections = _subset(args.sections, SECTIONS, "sections")
    scenarios = _subset(args.scenarios, SCENARIOS, "scenarios")
    if args.batches is not None and not 1 <= args.batches <= MAX_BATCHES:
        raise UsageError(f"--batches must be 1..{MAX_BATCHES}")
    if args.plot is not None:
        from ..benchmark.report import plot_unavailable

        why = plot_unavailable()
        if why is not None:
            raise ConfigError(f"--plot: {why}")
        if "call_cost" not in sections:
            raise UsageError("--plot draws the call-cost section; include it in --sections")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        # Refused before minutes of measuring, not after.
        if path is not None and not path.resolve().parent.is_dir():
            raise ConfigError(f"{flag} {path}: its directory does not exist")
    fixtures = _fixtures(args.fixtures)
    plan = QUICK if args.quick else FULL
    if args.batches is not None:
        n = args.batches
        plan = attrs.evolve(
            plan,
            batches=n,
            cold_batches=n,
            process_batches=n,
            process_rounds=n,
            process_cold_runs=n,
        )
    doc = measure(fixtures, plan, sections, scenarios, args.quick, inherited)
    from ..benchmark.report import plot, render, write_json

    print(render(doc))
    try:
        if args.json is not None:
            write_json(doc, args.json)
            print(f"wrote {args.json}")
        if args.plot is not None:
            plot(doc["call_cost"], args.plot)
            print(f"wrote {args.plot}")
    except OSError as exc:
        raise ConfigError(f"cannot write the results: {exc}") from None
    return 0


def _log(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def measure(
    fixtures: Path,
    plan: Plan,
    sections: tuple[str, ...],
    scenarios: tuple[str, ...],
    quick: bool,
    inherited: str | None,
) -> dict[str, Any]:
    import platform

    from ..benchmark.runner import Budget
    from ..benchmark.systems import extism_unavailable

    load_before = os.getloadavg()
    doc: dict[str, Any] = {
        "schema": "wasihost-bench/1",
        "machine": {},
        "settings": {
            "quick": quick,
            "batches": plan.batches,
            "batch_ms": plan.batch_s * 1000,
            "cold_batches": plan.cold_batches,
            "sections": list(sections),
            "scenarios": list(scenarios),
        },
        "call_cost": [],
        "compat": [],
        "overhead": [],
        "scaling": [],
        "process": {},
        "not_run": {s: "not selected (--sections)" for s in SECTIONS if s not in sections},
    }
    if "call_cost" in sections:
        from ..benchmark.scenarios import Contenders, call_cost

        contenders = Contenders(fixtures)
        try:
            doc["call_cost"] = call_cost(
                contenders, scenarios, Budget(plan.batches, plan.batch_s), plan.cold_batches, _log
            )
        finally:
            contenders.close()
    if "compat" in sections:
        from ..benchmark.compat import matrix

        _log("compatibility matrix")
        try:
            doc["compat"] = matrix(fixtures, Budget(plan.compat_batches, plan.compat_batch_s))
        except WasihostError as exc:
            doc["not_run"]["compat"] = f"failed: {exc.error_class}: {exc.message}"
    compute = fixtures / "compute" / "compute.wasm"
    for section in ("overhead", "scaling"):
        if section in sections and not compute.is_file():
            doc["not_run"][section] = f"{compute} is missing"
    if "overhead" in sections and "overhead" not in doc["not_run"]:
        from ..benchmark.overhead import overhead

        _log("fuel and limits overhead")
        try:
            doc["overhead"] = overhead(
                fixtures, plan.compute_rounds, Budget(plan.overhead_batches, plan.overhead_batch_s)
            )
        except WasihostError as exc:  # one section failing must not lose the others
            doc["not_run"]["overhead"] = f"failed: {exc.error_class}: {exc.message}"
    if "scaling" in sections and "scaling" not in doc["not_run"]:
        from ..benchmark.scaling import scaling

        try:
            doc["scaling"] = scaling(fixtures, plan.scaling_calls, plan.scaling_rounds, _log)
        except WasihostError as exc:
            doc["not_run"]["scaling"] = f"failed: {exc.error_class}: {exc.message}"
    if "process" in sections:
        _process(doc, fixtures, plan)
    missing = extism_unavailable()
    doc["machine"] = {
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "wasmtime": _version("wasmtime"),
        "extism": _version("extism") if missing is None else None,
        "extism_skipped": missing,
        "rust_backtrace_inherited": inherited,
    }
    return doc


def _process(doc: dict[str, Any], fixtures: Path, plan: Plan) -> None:
    """The process section into ``doc``, or why it did not run."""
    for fixture in ("echo", "hello"):
        wasm = fixtures / fixture / f"{fixture}.wasm"
        if not wasm.is_file():
            doc["not_run"]["process"] = f"{wasm} is missing"
            return
    from ..benchmark.process_runtime import ProcessPlan
    from ..benchmark.process_runtime import measure as measure_process

    process_plan = ProcessPlan(
        batches=plan.process_batches,
        batch_s=plan.process_batch_s,
        rounds=plan.process_rounds,
        round_s=plan.process_round_s,
        cold_runs=plan.process_cold_runs,
    )
    try:
        doc["process"] = measure_process(fixtures, process_plan, _log)
    except WasihostError as exc:  # a machine that cannot start a walled child, say
        doc["not_run"]["process"] = f"failed: {exc.error_class}: {exc.message}"
    except RuntimeError as exc:  # a fixture that did not answer what it should
        doc["not_run"]["process"] = f"failed: {exc}"
