"""Concurrency: what a second thread buys, on two extensions and on one pooled extension, and
what the asyncio path adds to a call.

Throughput (calls per second of wall clock) of:

- ``one``: one thread calling one extension;
- ``two extensions``: two threads, each calling its own extension (issue 16 target: >= 1.8x
  ``one``);
- ``pooled``: two threads calling one extension whose manifest says ``max_concurrency = 2``
  (target: >= 1.7x ``one``);
- ``serialised``: two threads calling one extension with the default ``max_concurrency = 1``
  (for reference: the old behaviour of every extension).

each for two workloads: ``small`` (``fixtures/echo``'s ``noop``, a few microseconds, mostly
host-side Python) and ``compute`` (``fixtures/compute`` running ``--rounds`` xorshift rounds,
a few milliseconds of guest code per call). Both threads start together at a barrier; a
scenario's time is from the barrier to the last thread's end. ``small, GIL released`` repeats
the small calls on a second host with ``keep_gil_below_fuel=0`` (every call releases the GIL
across guest code, as before short calls kept it), and ``compute calls beside a thread of
small calls`` says what a compute thread keeps of its throughput next to a small-call loop,
under either setting.

The asyncio path: ``await ext.acall("noop")`` in a loop against ``ext.call("noop")`` in a loop
on the same extension, one after the other on the event loop's thread; the difference per call
is what the async path adds (target: <= 20 us).

The control: two threads of GIL-free hashing over one, each round. On a shared machine it says
how many cores the round really had; a 2-thread ratio is only as good as the control beside it.

Every round runs every scenario, in an order that rotates round by round, so that drift on a
shared machine falls on all of them; ratios are taken within a round, and the median and the
range over rounds are reported. ``RUST_BACKTRACE=0``. The load average is printed before and
after.

Usage: ``python benchmarks/bench_concurrency.py [--rounds 7] [--small-calls 4000]
[--compute-calls 30] [--compute-rounds 1500000] [--async-calls 3000] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

os.environ["RUST_BACKTRACE"] = "0"  # trap paths are slower with it; set before wasmtime loads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attrs

import wasihost.engine.instance as instance_module
from wasihost.benchmark.hosts import bench_policy
from wasihost.core.settings import EngineSettings
from wasihost.host.extension import Extension
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package, load_package

ECHO = ROOT / "fixtures" / "echo"
COMPUTE = ROOT / "fixtures" / "compute"
# Enough fuel for the compute rounds asked for, with room: fuel is not what is measured.
COMPUTE_FUEL = 2_000_000_000
COMPUTE_TIMEOUT_MS = 60_000


def pooled(host: Host, fixture: Path, concurrency: int, **resources: int) -> Extension:
    """``fixture`` as its package, with ``max_concurrency`` (and other resources) set in its
    manifest."""
    package = load_package(fixture, host.registry.capabilities())
    assert package.manifest is not None
    wanted = attrs.evolve(package.manifest.resources, max_concurrency=concurrency, **resources)
    manifest = attrs.evolve(package.manifest, resources=wanted)
    return host.admit(attrs.evolve(package, manifest=manifest))


def copy(host: Host, fixture: Path, name: str, **resources: int) -> Extension:
    """Another extension running ``fixture``'s module: a bare module of its own id (a host
    admits an id once), granted what the package requests, with the default
    ``max_concurrency`` of 1."""
    package = load_package(fixture, host.registry.capabilities())
    assert package.manifest is not None
    bare = Package(f"{name}.wasm", None, package.wasm, package.sha256)
    manifest = package.manifest
    return host.admit(
        bare,
        grants=manifest.required | manifest.optional,
        fuel=resources.get("fuel_per_call"),
        timeout_ms=resources.get("timeout_ms"),
    )


def timed(workers: list[Callable[[], None]]) -> tuple[float, float]:
    """Wall time of ``workers`` run on threads of their own, started together, and the CPU
    the process used meanwhile over that wall time (how many cores it really had)."""
    barrier = threading.Barrier(len(workers) + 1)
    done: list[float] = []

    def run(work: Callable[[], None]) -> None:
        barrier.wait()
        work()

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    cpu = time.process_time()
    for t in threads:
        t.join()
    done.append(time.perf_counter() - start)
    return done[0], (time.process_time() - cpu) / done[0]


def loop(ext: Extension, command: str, value: Any, calls: int) -> Callable[[], None]:
    def work() -> None:
        for _ in range(calls):
            ext.call(command, value)

    return work


# The control: GIL-free C work (hashlib releases the GIL for buffers over 2 KiB), what two
# threads get from this machine now whatever wasihost does.
CONTROL_BUFFER = b"\x5a" * (1 << 20)
CONTROL_HASHES = 40


def control_round() -> float:
    """Two threads of GIL-free hashing over one: how many cores the machine gives now."""

    def work() -> None:
        for _ in range(CONTROL_HASHES):
            hashlib.sha256(CONTROL_BUFFER).digest()

    one, _ = timed([work])
    two, _ = timed([work, work])
    return 2 * one / two


def throughput_round(
    exts: dict[str, Extension], command: str, value: Any, calls: int, order: int
) -> dict[str, tuple[float, float]]:
    """Calls per second of each scenario, and the cores it used, in a rotated order."""
    scenarios: dict[str, list[Callable[[], None]]] = {
        "one": [loop(exts["a"], command, value, calls)],
        "two extensions": [
            loop(exts["a"], command, value, calls),
            loop(exts["b"], command, value, calls),
        ],
        "pooled": [loop(exts["pool"], command, value, calls)] * 2,
        "serialised": [loop(exts["single"], command, value, calls)] * 2,
    }
    names = list(scenarios)
    names = names[order % len(names) :] + names[: order % len(names)]
    result = {}
    for name in names:
        workers = scenarios[name]
        wall, cores = timed(workers)
        result[name] = (len(workers) * calls / wall, cores)
    return result


# A thread hand-off slower than this is a stall (a sleeping CPU woken, a thread descheduled),
# not the hand-off's own cost: counted apart, so that a mean the stalls dominate is read so.
STALL_S = 1e-3


class AsyncRound(NamedTuple):
    """One round of the asyncio comparison, in seconds per call."""

    sync: float  # mean of the synchronous path
    acall: float  # mean of ``await ext.acall``
    hand_off: float  # mean of the bare hand-off
    loop_only: float  # median of the loop's own part of any hand-off, with no thread at all
    sync_p50: float
    acall_p50: float
    acall_p99: float
    stalls: float  # share of acalls over STALL_S


def async_round(ext: Extension, calls: int, order: int) -> AsyncRound:
    """Seconds per call of the synchronous and the asyncio path, on the loop's thread, and
    the floor of any thread hand-off: a Python no-op through the same call threads. Each call
    of the first two is also timed alone, for the medians and the stalls."""

    def nothing() -> None:
        pass

    async_times: list[float] = []
    sync_times: list[float] = []
    clock = time.perf_counter

    async def main() -> tuple[float, float, float, float]:
        async def via_async() -> float:
            start = clock()
            for _ in range(calls):
                began = clock()
                await ext.acall("noop")
                async_times.append(clock() - began)
            return (clock() - start) / calls

        def via_sync() -> float:
            start = clock()
            for _ in range(calls):
                began = clock()
                ext.call("noop")
                sync_times.append(clock() - began)
            return (clock() - start) / calls

        async def hand_off() -> float:
            # The mechanism acall uses: a job on a call thread, its outcome handed back with
            # one call_soon_threadsafe.
            workers = ext.host.call_workers()
            loop = asyncio.get_running_loop()
            start = time.perf_counter()
            for _ in range(calls):
                future: asyncio.Future[Any] = loop.create_future()

                def done(ok: bool, result: Any, future: asyncio.Future[Any] = future) -> None:
                    loop.call_soon_threadsafe(future.set_result, result)

                workers.start(nothing, (), done)
                await future
            return (time.perf_counter() - start) / calls

        async def loop_only() -> float:
            # What any hand-off back to the loop costs before a thread is involved: a future,
            # call_soon_threadsafe (its self-pipe write and the loop's wake-up read) and the
            # task's resumption, all on the loop's own thread.
            loop = asyncio.get_running_loop()
            times = []
            for _ in range(calls):
                began = clock()
                future: asyncio.Future[None] = loop.create_future()
                loop.call_soon_threadsafe(future.set_result, None)
                await future
                times.append(clock() - began)
            return statistics.median(times)

        await ext.acall("noop")  # the call thread exists before timing
        if order % 2:
            a = await via_async()
            s = via_sync()
            h = await hand_off()
            o = await loop_only()
        else:
            o = await loop_only()
            h = await hand_off()
            s = via_sync()
            a = await via_async()
        return s, a, h, o

    s, a, h, o = asyncio.run(main())
    async_times.sort()
    return AsyncRound(
        sync=s,
        acall=a,
        hand_off=h,
        loop_only=o,
        sync_p50=statistics.median(sync_times),
        acall_p50=statistics.median(async_times),
        acall_p99=async_times[int(len(async_times) * 0.99)],
        stalls=sum(1 for t in async_times if t > STALL_S) / len(async_times),
    )


def released_share(ext: Extension, calls: int) -> float:
    """The share of a no-op call spent inside its two guest entries (``call_unchecked`` or
    ``call_keeping_gil``), less the timer's own cost. Were the GIL released there, the rest of
    each call would still hold it, so two threads need at least 2 x (1 - share) of one call's
    time per two calls: at most min(2, 1 / (1 - share)) times one thread's throughput,
    whatever the GIL hand-offs cost."""
    inside = [0.0]
    clock = time.perf_counter

    def clocked(real: Callable[..., Any]) -> Callable[..., Any]:
        def timed_entry(*args: Any) -> Any:
            start = clock()
            result = real(*args)
            inside[0] += clock() - start
            return result

        return timed_entry

    start = clock()
    for _ in range(calls):
        clock()
        clock()
    timer_cost = (clock() - start) / calls
    names = ("call_unchecked", "call_keeping_gil")
    reals = {name: getattr(instance_module, name) for name in names}
    for name, real in reals.items():
        setattr(instance_module, name, clocked(real))
    try:
        start = clock()
        for _ in range(calls):
            ext.call("noop")
        total = clock() - start
    finally:
        for name, real in reals.items():
            setattr(instance_module, name, real)
    return max(0.0, inside[0] - 2 * calls * timer_cost) / total


def beside_small_calls(compute: Extension, small: Extension, value: Any, calls: int) -> float:
    """What a thread of compute calls keeps of its throughput while another thread loops on
    small calls: its time alone over its time beside them. Short calls that keep the GIL
    give it up only at the interpreter's switch interval, like any Python loop."""
    start = time.perf_counter()
    for _ in range(calls):
        compute.call("run", value)
    alone = time.perf_counter() - start
    stop = threading.Event()

    def small_loop() -> None:
        while not stop.is_set():
            small.call("noop")

    thread = threading.Thread(target=small_loop)
    thread.start()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            compute.call("run", value)
        beside = time.perf_counter() - start
    finally:
        stop.set()
        thread.join()
    return alone / beside


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--small-calls", type=int, default=4000)
    parser.add_argument("--compute-calls", type=int, default=30)
    parser.add_argument("--compute-rounds", type=int, default=1_500_000)
    parser.add_argument("--async-calls", type=int, default=3000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    report: dict[str, Any] = {"load_before": load_before, "cpus": os.cpu_count()}
    # The same small calls on a host whose calls always release the GIL across guest code
    # (keep_gil_below_fuel=0): what keeping it for short calls changes, in the same rounds.
    released = Host(
        bench_policy({"log", "clock", "random"}),
        cache_dir=None,
        settings=EngineSettings(keep_gil_below_fuel=0),
    )
    with released, Host(bench_policy({"log", "clock", "random"}), cache_dir=None) as host:
        workloads: dict[str, tuple[dict[str, Extension], str, Any, int]] = {}
        for name, fixture, command, value, calls, resources in (
            ("small", ECHO, "noop", None, args.small_calls, {}),
            ("small, GIL released", ECHO, "noop", None, args.small_calls, {}),
            (
                "compute",
                COMPUTE,
                "run",
                {"n": args.compute_rounds},
                args.compute_calls,
                {"fuel_per_call": COMPUTE_FUEL, "timeout_ms": COMPUTE_TIMEOUT_MS},
            ),
        ):
            on = released if "released" in name else host
            exts = {
                "a": copy(on, fixture, f"{name}-a", **resources),
                "b": copy(on, fixture, f"{name}-b", **resources),
                "single": copy(on, fixture, f"{name}-single", **resources),
                "pool": pooled(on, fixture, 2, **resources),
            }
            for ext in exts.values():
                ext.call(command, value)
            # The pool's second instance, started before timing.
            timed([loop(exts["pool"], command, value, 2)] * 2)
            workloads[name] = (exts, command, value, calls)
        echo = copy(host, ECHO, "echo-async")
        echo.call("noop")
        ratios: dict[str, dict[str, list[float]]] = {
            w: {"two extensions": [], "pooled": [], "serialised": []} for w in workloads
        }
        absolute: dict[str, dict[str, list[float]]] = {w: {} for w in workloads}
        cores: dict[str, dict[str, list[float]]] = {w: {} for w in workloads}
        # CPU seconds per call: what contention costs, whether or not a core was free.
        cpu: dict[str, dict[str, list[float]]] = {w: {} for w in workloads}
        mixed: dict[str, list[float]] = {"short calls keep the GIL": [], "GIL released": []}
        async_added: list[float] = []
        async_added_p50: list[float] = []
        async_p99: list[float] = []
        async_stalls: list[float] = []
        sync_cost: list[float] = []
        hand_offs: list[float] = []
        loop_only: list[float] = []
        shares: list[float] = []
        controls: list[float] = []
        for r in range(args.rounds):
            controls.append(control_round())
            for name, (exts, command, value, calls) in workloads.items():
                result = throughput_round(exts, command, value, calls, r)
                for scenario, (rate, used) in result.items():
                    absolute[name].setdefault(scenario, []).append(rate)
                    cores[name].setdefault(scenario, []).append(used)
                    cpu[name].setdefault(scenario, []).append(used / rate)
                    if scenario != "one":
                        ratios[name][scenario].append(rate / result["one"][0])
            compute_exts, _, compute_value, compute_calls = workloads["compute"]
            for scenario, small_ext in (
                ("short calls keep the GIL", workloads["small"][0]["a"]),
                ("GIL released", workloads["small, GIL released"][0]["a"]),
            ):
                mixed[scenario].append(
                    beside_small_calls(compute_exts["a"], small_ext, compute_value, compute_calls)
                )
            timing = async_round(echo, args.async_calls, r)
            sync_cost.append(timing.sync)
            async_added.append(timing.acall - timing.sync)
            hand_offs.append(timing.hand_off)
            loop_only.append(timing.loop_only)
            async_added_p50.append(timing.acall_p50 - timing.sync_p50)
            async_p99.append(timing.acall_p99)
            async_stalls.append(timing.stalls)
            shares.append(released_share(echo, args.async_calls))
    load_after = os.getloadavg()
    report["load_after"] = load_after
    report["throughput"] = {
        w: {s: spread(v) for s, v in scen.items()} for w, scen in absolute.items()
    }
    report["ratios"] = {w: {s: spread(v) for s, v in scen.items()} for w, scen in ratios.items()}
    report["cores"] = {w: {s: spread(v) for s, v in scen.items()} for w, scen in cores.items()}
    report["cpu_per_call_us"] = {
        w: {s: spread([x * 1e6 for x in v]) for s, v in scen.items()} for w, scen in cpu.items()
    }
    report["compute_beside_small_calls"] = {k: spread(v) for k, v in mixed.items()}
    report["async_added_us"] = spread([x * 1e6 for x in async_added])
    report["hand_off_us"] = spread([x * 1e6 for x in hand_offs])
    report["loop_only_us"] = spread([x * 1e6 for x in loop_only])
    report["async_added_p50_us"] = spread([x * 1e6 for x in async_added_p50])
    report["async_p99_us"] = spread([x * 1e6 for x in async_p99])
    report["async_stalls"] = spread(async_stalls)
    report["released_share"] = spread(shares)
    report["control"] = spread(controls)
    report["sync_call_us"] = spread([x * 1e6 for x in sync_cost])
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f} "
        f"on {os.cpu_count()} CPUs; {args.rounds} rounds, median [min - max]"
    )
    control = report["control"]
    print(
        f"control (GIL-free hashing): 2 threads {control['median']:.2f}x one "
        f"[{control['min']:.2f} - {control['max']:.2f}]: the cores this machine gave"
    )
    targets = {"two extensions": 1.8, "pooled": 1.7, "serialised": None}
    for w in workloads:
        one = report["throughput"][w]["one"]
        print(
            f"{w}: one thread {one['median']:.0f} calls/s [{one['min']:.0f} - {one['max']:.0f}]"
            f", {report['cores'][w]['one']['median']:.2f} cores busy, "
            f"{report['cpu_per_call_us'][w]['one']['median']:.1f} us CPU per call"
        )
        for scenario, stats in report["ratios"][w].items():
            target = targets[scenario]
            met = "" if target is None else (" met" if stats["median"] >= target else " MISSED")
            print(
                f"  2 threads, {scenario}: {stats['median']:.2f}x "
                f"[{stats['min']:.2f} - {stats['max']:.2f}], "
                f"{report['cores'][w][scenario]['median']:.2f} cores busy, "
                f"{report['cpu_per_call_us'][w][scenario]['median']:.1f} us CPU per call"
                + (f" (target >= {target}x{met})" if target else "")
            )
    for scenario, stats in report["compute_beside_small_calls"].items():
        print(
            f"compute calls beside a thread of small calls ({scenario}): "
            f"{stats['median']:.2f}x their throughput alone "
            f"[{stats['min']:.2f} - {stats['max']:.2f}]"
        )
    share = report["released_share"]
    print(
        f"share of a no-op call inside the guest: {share['median']:.0%} "
        f"[{share['min']:.0%} - {share['max']:.0%}]: releasing the GIL there, two threads on "
        f"such calls could reach at most {min(2.0, 1 / (1 - share['median'])):.2f}x"
    )
    a = report["async_added_us"]
    s = report["sync_call_us"]
    h = report["hand_off_us"]
    print(
        f"asyncio: a sync no-op call {s['median']:.1f} us; acall adds {a['median']:.1f} us "
        f"[{a['min']:.1f} - {a['max']:.1f}] (target <= 20 us"
        f"{' met' if a['median'] <= 20 else ' MISSED'}); the hand-off floor (a Python no-op "
        f"through the same call threads) {h['median']:.1f} us [{h['min']:.1f} - {h['max']:.1f}]"
    )
    o = report["loop_only_us"]
    print(
        f"asyncio's own part of any hand-off, no thread at all (a future resolved through "
        f"call_soon_threadsafe on the loop's thread): {o['median']:.1f} us "
        f"[{o['min']:.1f} - {o['max']:.1f}] of the 20 us"
    )
    p50 = report["async_added_p50_us"]
    p99 = report["async_p99_us"]
    stalls = report["async_stalls"]
    print(
        f"asyncio, call by call: acall adds {p50['median']:.1f} us at the median "
        f"[{p50['min']:.1f} - {p50['max']:.1f}]; an acall's p99 {p99['median']:.0f} us; "
        f"{stalls['median']:.1%} of acalls over {STALL_S * 1e3:.0f} ms "
        f"[{stalls['min']:.1%} - {stalls['max']:.1%}] (a stalled thread wake-up: an idle "
        "virtual CPU wakes slowly, see benchmarks/README.md)"
    )


if __name__ == "__main__":
    main()
