"""The bounded CBOR codec against cbor2's C code, in one process, interleaved.

Each case is one value, encoded and decoded by:

- ``wasihost``: ``wasihost.core.codec`` with the limits it is used with (every bound checked);
- ``cbor2``: ``cbor2.dumps``/``cbor2.loads``, C, no bounds at all;
- ``before``: the codec before its fast paths, kept as the oracle in
  ``tests/support/reference_codec.py``.

Every round times each contender on each case in turn (the order rotates round by round), so
drift of the machine hits all of them alike. A batch is timed with the process CPU clock by
default (other work on a shared machine then costs the batch little); ``--clock wall`` uses
``perf_counter``. Reported: per-call µs, median over rounds, with the spread (lowest and highest
round), the per-round ratio wasihost / cbor2 (median and spread), and the load average before
and after.

Targets (issue 12, section 6): encode and decode of a 64-byte value at most 0.5 µs each, and of
a ~58 KiB structured value at most 2x cbor2.

``--echo``: the codec's share of a whole call instead. ``Extension.call("echo", 64 bytes)`` on
``fixtures/echo`` (the ``echo64`` case of ``bench_calls.py``), rounds alternating between the
codec as it is and the codec before (``wasihost.host.extension``'s ``encode``/``decode`` swapped for
``tests/support/reference_codec.py``'s), same process, same instance.

Usage: ``python benchmarks/bench_codec.py [--rounds 15] [--budget-ms 40] [--clock cpu|wall]
[--only CASE...] [--echo] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import reference_codec
from wasihost.core import codec
from wasihost.core.codec import CodecLimits

# The limits Extension.call uses for a command's input and output (max_bytes from the
# resources, the ABI's defaults for the rest): the bounds are part of what is timed.
LIMITS = CodecLimits(max_bytes=1024 * 1024)
TARGET_SMALL_US = 0.5
TARGET_STRUCTURED_RATIO = 2.0


def _record(index: int) -> dict[str, Any]:
    """One row of a typical structured answer: short text, numbers, a flag, a list, a blob."""
    return {
        "id": index,
        "name": f"user-{index:06d}",
        "email": f"user{index}@example.org",
        "active": index % 3 == 0,
        "score": index * 1.25,
        "tags": ["alpha", "beta", "gamma"][: index % 4],
        "avatar": bytes(400),
    }


# name -> (value, target): a target of µs for the small values, of a ratio to cbor2 for the
# structured ones; None for a case shown for context only.
CASES: dict[str, tuple[Any, tuple[str, float] | None]] = {
    # The echo benchmark's payload (benchmarks/bench_calls.py): 64 bytes, 66 encoded.
    "bytes64": (bytes(range(64)), ("us", TARGET_SMALL_US)),
    "text64": ("wasihost echo " * 4 + "64 bytes", ("us", TARGET_SMALL_US)),
    # A log-style request: a small map of scalars, 64 bytes encoded.
    "map64": (
        {"level": 2, "message": "disk 81% full on /var", "ok": True, "n": None, "t": 1.5},
        ("us", TARGET_SMALL_US),
    ),
    "null": (None, ("us", TARGET_SMALL_US)),
    "int": (7, ("us", TARGET_SMALL_US)),
    # 120 records, 59,448 bytes, 1,981 data items.
    "records58k": ([_record(i) for i in range(120)], ("ratio", TARGET_STRUCTURED_RATIO)),
    # The worst shape the default limits allow for its size: 4,001 items of 14 bytes each.
    "strings58k": ([f"s{i:013d}" for i in range(4000)], None),
}

# Each contender is called directly, as its users call it: (encode, decode, extra arguments).
CONTENDERS: dict[str, tuple[Callable[..., bytes], Callable[..., Any], tuple[Any, ...]]] = {
    "wasihost": (codec.encode, codec.decode, (LIMITS,)),
    "cbor2": (cbor2.dumps, cbor2.loads, ()),
    "before": (reference_codec.encode, reference_codec.decode, (LIMITS,)),
}


def _batch(
    fn: Callable[..., object], args: tuple[Any, ...], calls: int, clock: Callable[[], int]
) -> float:
    # Two loops, so that a contender without extra arguments is not charged for unpacking them.
    if len(args) == 1:
        only = args[0]
        start = clock()
        for _ in range(calls):
            fn(only)
    else:
        first, second = args
        start = clock()
        for _ in range(calls):
            fn(first, second)
    return (clock() - start) / calls / 1000


def run(rounds: int, budget_ms: float, clock_name: str, only: frozenset[str]) -> dict[str, Any]:
    clock = time.process_time_ns if clock_name == "cpu" else time.perf_counter_ns
    load_before = os.getloadavg()
    jobs: list[tuple[str, str, str, Callable[..., object], tuple[Any, ...]]] = []
    for case, (value, _) in CASES.items():
        if only and case not in only:
            continue
        encoded = codec.encode(value, LIMITS)
        # The contenders agree before anything is timed.
        assert encoded == reference_codec.encode(value, LIMITS) == cbor2.dumps(value), case
        assert codec.decode(encoded, LIMITS) == cbor2.loads(encoded) == value, case
        for name, (encode, decode, extra) in CONTENDERS.items():
            jobs.append((case, "encode", name, encode, (value, *extra)))
            jobs.append((case, "decode", name, decode, (encoded, *extra)))
    # Calls per batch: about budget_ms of work for the slowest contender, measured once.
    calls: dict[tuple[str, str], int] = {}
    for case, op, _name, fn, arg in jobs:
        one = _batch(fn, arg, 20, clock) / 1e3  # ms per call
        key = (case, op)
        calls[key] = max(10, min(calls.get(key, 10**6), int(budget_ms / max(one, 1e-6))))
    samples: dict[tuple[str, str, str], list[float]] = {(c, o, n): [] for c, o, n, _, _ in jobs}
    for index in range(rounds):
        shift = index % len(jobs)
        for case, op, name, fn, arg in jobs[shift:] + jobs[:shift]:
            samples[(case, op, name)].append(_batch(fn, arg, calls[(case, op)], clock))
    load_after = os.getloadavg()

    rows = []
    for case, (value, target) in CASES.items():
        if only and case not in only:
            continue
        for op in ("encode", "decode"):
            ours = samples[(case, op, "wasihost")]
            theirs = samples[(case, op, "cbor2")]
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            row: dict[str, Any] = {
                "case": case,
                "op": op,
                "bytes": len(codec.encode(value, LIMITS)),
                "calls_per_round": calls[(case, op)],
            }
            for name in CONTENDERS:
                values = samples[(case, op, name)]
                row[name] = {
                    "median_us": statistics.median(values),
                    "min_us": min(values),
                    "max_us": max(values),
                }
            row["ratio"] = {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            }
            if target is None:
                row["target"] = None
                row["met"] = None
            elif target[0] == "us":
                row["target"] = f"<= {target[1]} µs"
                row["met"] = row["wasihost"]["median_us"] <= target[1]
            else:
                row["target"] = f"<= {target[1]}x cbor2"
                row["met"] = row["ratio"]["median"] <= target[1]
            rows.append(row)
    return {
        "python": sys.version.split()[0],
        "cbor2": getattr(cbor2, "__version__", "?"),
        "clock": clock_name,
        "rounds": rounds,
        "load_before": load_before,
        "load_after": load_after,
        "cpus": os.cpu_count(),
        "rows": rows,
    }


def run_echo(rounds: int, calls: int, clock_name: str) -> dict[str, Any]:
    """Per-call µs of the 64-byte echo through Extension.call with each codec, interleaved."""
    os.environ["RUST_BACKTRACE"] = "0"
    from wasihost.benchmark.hosts import bench_policy
    from wasihost.host import extension
    from wasihost.host.runtime import Host

    clock = time.process_time_ns if clock_name == "cpu" else time.perf_counter_ns
    payload = bytes(range(64))
    codecs = {
        "wasihost": (codec.encode, codec.decode),
        "before": (reference_codec.encode, reference_codec.decode),
    }
    load_before = os.getloadavg()
    samples: dict[str, list[float]] = {name: [] for name in codecs}
    with Host(bench_policy({"log", "clock", "random"}), cache_dir=None) as host:
        ext = host.load(ROOT / "fixtures" / "echo")
        try:
            for index in range(rounds):
                order = list(codecs) if index % 2 == 0 else list(reversed(codecs))
                for name in order:
                    extension.encode, extension.decode = codecs[name]  # type: ignore[assignment]
                    assert ext.call("echo", payload) == payload
                    call = ext.call
                    start = clock()
                    for _ in range(calls):
                        call("echo", payload)
                    samples[name].append((clock() - start) / calls / 1000)
        finally:
            extension.encode, extension.decode = codec.encode, codec.decode
    ours, theirs = samples["wasihost"], samples["before"]
    return {
        "clock": clock_name,
        "rounds": rounds,
        "calls": calls,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "echo64": {
            name: {
                "median_us": statistics.median(values),
                "min_us": min(values),
                "max_us": max(values),
            }
            for name, values in samples.items()
        },
        "saved_us_per_round": {
            "median": statistics.median(b - a for a, b in zip(ours, theirs, strict=True)),
            "min": min(b - a for a, b in zip(ours, theirs, strict=True)),
            "max": max(b - a for a, b in zip(ours, theirs, strict=True)),
        },
    }


def _spread(stats: dict[str, float]) -> str:
    return f"{stats['median_us']:8.3f} ({stats['min_us']:.3f}-{stats['max_us']:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget-ms", type=float, default=40.0, help="time per timed batch")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--only", nargs="+", default=[], help=f"cases: {' '.join(CASES)}")
    parser.add_argument("--echo", action="store_true", help="the codec's share of a 64-byte echo")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round, --echo")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.echo:
        echo = run_echo(args.rounds, args.calls, args.clock)
        if args.json:
            print(json.dumps(echo, indent=2))
            return 0
        before = ", ".join(f"{x:.2f}" for x in echo["load_before"])
        after = ", ".join(f"{x:.2f}" for x in echo["load_after"])
        print(
            f"Extension.call('echo', 64 bytes), {echo['clock']} clock, {echo['rounds']} rounds x "
            f"{echo['calls']} calls; load average {before} -> {after}"
        )
        for name, stats in echo["echo64"].items():
            print(f"  codec {name:9} {_spread(stats)} µs per call")
        saved = echo["saved_us_per_round"]
        print(
            f"  saved per call, same round: {saved['median']:.3f} µs "
            f"({saved['min']:.3f} to {saved['max']:.3f})"
        )
        return 0
    report = run(args.rounds, args.budget_ms, args.clock, frozenset(args.only))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    before = ", ".join(f"{x:.2f}" for x in report["load_before"])
    after = ", ".join(f"{x:.2f}" for x in report["load_after"])
    print(
        f"Python {report['python']}, cbor2 {report['cbor2']}, {report['clock']} clock, "
        f"{report['rounds']} rounds; load average {before} -> {after} ({report['cpus']} CPUs)"
    )
    print("per call µs: median (lowest-highest round); ratio = wasihost / cbor2 per round")
    print(
        f"{'case':11} {'op':6} {'bytes':>6} {'wasihost':>24} {'cbor2':>24} {'before':>24} "
        f"{'ratio':>20} {'target':>15} met"
    )
    for row in report["rows"]:
        ratio = row["ratio"]
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(
            f"{row['case']:11} {row['op']:6} {row['bytes']:6} {_spread(row['wasihost']):>24} "
            f"{_spread(row['cbor2']):>24} {_spread(row['before']):>24} "
            f"{ratio['median']:5.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}) "
            f"{row['target'] or '-':>15} {met}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
