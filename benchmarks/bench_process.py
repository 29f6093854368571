"""The process runtime (issue 30) beside the in-process one: ``wasihost bench``'s ``process``
section (``wasihost/benchmark/process_runtime.py``) with more batches, rounds and cold starts,
optionally several times over, and a look at where a warm call's time goes.

Issue 30's targets, each measured beside the in-process baseline, interleaved:

1. added cost per small call on a warm child (``fixtures/echo``'s ``noop`` and ``echo`` of 64
   bytes): <= 30 us; ``fixtures/hello``'s ``greet`` (one host call per call) is reported too;
2. small calls, two ``process-only`` extensions each driven by its own thread over one driven
   by one thread: >= 1.7x (the same on in-process, for context);
3. a cold child, spawn to first answer (a fresh ``host.load`` and its first call): <= 150 ms,
   median and range over the runs, with its phases (spawn + walls + HELLO, LOAD,
   instantiate + handshake, the first call).

Two controls are measured in the same batches and rounds: a 16-byte round trip to a bare child
process over a socketpair (what any call that crosses to another process pays on this machine
now), and two threads of GIL-free hashing over one (how many cores were free). On a shared
machine read them first: the process runtime's figures move with them.

``--profile N`` then times N warm ``noop`` calls of a process-only extension: wall clock, the
host process's CPU time and the child's (as the host reads it, ``/proc/PID/schedstat``), per
call, and the host side's cProfile (the functions that took the most time of their own).

Usage: ``python benchmarks/bench_process.py [--batches 25] [--batch-ms 100] [--rounds 15]
[--round-ms 200] [--cold-runs 15] [--runs 1] [--profile N] [--json FILE]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

os.environ["RUST_BACKTRACE"] = "0"  # trap paths are slower with it; set before wasmtime loads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wasihost.benchmark.hosts import bench_policy
from wasihost.benchmark.process_runtime import PROCESS, ProcessPlan, measure
from wasihost.benchmark.report import process_table
from wasihost.host.runtime import Host

FIXTURES = ROOT / "fixtures"


def log(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def profile(calls: int) -> dict[str, Any]:
    """Per warm ``noop`` call of a process-only extension: wall µs, the host's CPU µs, the
    child's CPU µs; and the host side's profile (top 15 by own time)."""
    with Host(bench_policy(), cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo", runtime=PROCESS)
        for _ in range(200):  # warm: the child started, both ends' code paths hot
            ext.call("noop")
        (instance,) = ext._instances()
        child_before = instance.cpu_ns
        cpu_before = time.process_time()
        start = time.perf_counter()
        for _ in range(calls):
            ext.call("noop")
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu_before
        child = (instance.cpu_ns - child_before) / 1e9
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            ext.call("noop")
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    return {
        "calls": calls,
        "wall_us": round(wall / calls * 1e6, 2),
        "host_cpu_us": round(cpu / calls * 1e6, 2),
        "child_cpu_us": round(child / calls * 1e6, 2),
        "load": [round(x, 2) for x in os.getloadavg()],
        "profile": text.getvalue(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=25)
    parser.add_argument("--batch-ms", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-ms", type=float, default=200.0)
    parser.add_argument("--cold-runs", type=int, default=15)
    parser.add_argument("--runs", type=int, default=1, help="the whole measurement, N times")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--json", type=Path, metavar="FILE")
    args = parser.parse_args()
    plan = ProcessPlan(
        batches=args.batches,
        batch_s=args.batch_ms / 1000,
        rounds=args.rounds,
        round_s=args.round_ms / 1000,
        cold_runs=args.cold_runs,
    )
    doc: dict[str, Any] = {"runs": []}
    for run in range(args.runs):
        result = measure(FIXTURES, plan, log)
        doc["runs"].append(result)
        print(f"\n== run {run + 1} of {args.runs} ==")
        print("\n".join(process_table(result)))
    if args.runs > 1:
        print("\n== targets, run by run ==")
        for row in doc["runs"][0]["targets"]:
            figures = [
                next(t["measured"] for t in r["targets"] if t["target"] == row["target"])
                for r in doc["runs"]
            ]
            print(f"  {row['target']:<64} {', '.join(figures)}  ({row['bound']})")
    if args.profile:
        log(f"profiling {args.profile} warm noop calls")
        doc["profile"] = profile(args.profile)
        p = doc["profile"]
        print(
            f"\nwarm process-only noop, {p['calls']} calls at load {p['load'][0]:.2f}: "
            f"{p['wall_us']} µs wall, {p['host_cpu_us']} µs host CPU, "
            f"{p['child_cpu_us']} µs child CPU per call"
        )
        print(p["profile"])
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
