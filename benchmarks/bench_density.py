"""Density: how many extensions one process holds, and what closing them gives back.

    python benchmarks/bench_density.py [--n 2000] [--repeats 1] [--configs a,b] [--json]

N extensions of ``fixtures/echo`` are admitted into one Host and each answers a first call
(instantiate, handshake, ``echo``), from the in-memory module cache; then every one is closed.
Each configuration runs in a fresh interpreter of its own (a child process), so that what one
leaves in the allocator does not count against the next. Reported, as differences from the
child's baseline (its host made and one extension loaded and closed, to warm the caches):

- live: RSS (``/proc/self/status`` VmRSS), memory maps (lines of ``/proc/self/maps``) and
  address space (VmSize), in total and per extension; load + first call per extension;
- closed: what is left after every extension is closed (and a cyclic GC), then once the
  closed extensions' budget windows have emptied (their rate accounts go then; the governor's
  clock is moved an hour on rather than slept out), then after the C heap is trimmed
  (``malloc_trim``), then after ``Host.close()``.

The bare module is admitted under N ids (a manifest's id must match what the guest says in its
handshake, so the ids come from bare modules' names); it is the same module, compiled once.

Configurations: ``cow`` (copy-on-write data images: main's engine before this benchmark),
``default`` (today's defaults), ``pooling`` (wasmtime's pooling allocator, N + 16 slots),
``reserve64m`` (64 MiB reservations: growth past it fails, so only for small memories),
``guard0`` (no guard region), ``evict`` (``max_live_instances`` = N/10: idle extensions are
evicted as new ones start), ``python`` (``default`` under tracemalloc: the Python objects'
share, slow).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
# Past the longest budget window (the network's hour): every closed extension's account empty.
WINDOWS_S = 3601.0
KiB = 1024

CONFIGS: dict[str, dict[str, Any]] = {
    "cow": {"memory_init_cow": True},
    "default": {},
    "pooling": {"pooling_instances": "n+16"},
    "reserve64m": {"memory_reservation": 64 * MiB},
    "guard0": {"memory_guard_size": 0},
    "evict": {"evict": True},
    "python": {"tracemalloc": True},
    "reload": {"reload": True},
}
DEFAULT_CONFIGS = ("cow", "default", "pooling", "reserve64m", "guard0")


def usage() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmSize"):
            out[key] = int(value.split()[0]) * KiB
    with open("/proc/self/maps", "rb") as maps:
        out["maps"] = sum(1 for _ in maps)
    return out


def child(name: str, n: int) -> dict[str, Any]:
    import gc
    import tracemalloc

    from wasihost.core.settings import EngineSettings
    from wasihost.engine.density import trim_native_heap
    from wasihost.host.policy import Policy
    from wasihost.host.runtime import Host
    from wasihost.packaging.package import Package, load_package
    from wasihost.supervisor.eviction import EvictionPolicy
    from wasihost.supervisor.governor import Governor

    spec = dict(CONFIGS[name])
    evict = bool(spec.pop("evict", False))
    reload = bool(spec.pop("reload", False))
    trace = bool(spec.pop("tracemalloc", False))
    if spec.get("pooling_instances") == "n+16":
        spec["pooling_instances"] = n + 16
    base = load_package(ROOT / "fixtures" / "echo", frozenset(), None, None)
    eviction = EvictionPolicy(max_live_instances=max(1, n // 10)) if evict else None
    # The rate accounts of closed extensions stay until their windows empty (a minute for the
    # CPU one): the governor's clock is moved past them after the closes, not slept out.
    skew = [0.0]
    governor = Governor(clock=lambda: time.monotonic() + skew[0])
    host = Host(
        Policy(),
        settings=EngineSettings(**spec),
        cache_dir=None,
        eviction=eviction,
        governor=governor,
    )

    def admit(ident: str) -> Any:
        return host.admit(Package(f"{ident}.wasm", None, base.wasm, base.sha256), grants=())

    warm = admit("warm")
    assert warm.call("echo", b"x") == b"x"
    warm.close()
    del warm
    skew[0] += WINDOWS_S
    governor.prune()
    gc.collect()
    if trace:
        tracemalloc.start()
    before = usage()
    exts = []
    # Not a list of floats: a float object made between two extensions' objects would keep
    # the allocator's arena under them after they close (see docs/density.md).
    times = array.array("d")
    clock = time.perf_counter
    for i in range(n):
        start = clock()
        ext = admit(f"echo{i}")
        if ext.call("echo", b"x") != b"x":
            raise AssertionError("echo answered wrongly")
        times.append(clock() - start)
        exts.append(ext)
    live = usage()
    traced = tracemalloc.get_traced_memory()[0] if trace else 0
    if evict:  # every extension still answers, re-created on demand
        for ext in exts[:: max(1, n // 100)]:
            assert ext.call("echo", b"y") == b"y"
    for ext in exts:
        ext.close()
    del exts, ext
    gc.collect()
    closed = usage()
    skew[0] += WINDOWS_S
    governor.prune()
    gc.collect()
    expired = usage()
    trim_native_heap()
    trimmed = usage()
    reload_live = 0
    if reload:  # the same again: does the second round reuse what the first freed?
        again = []
        for i in range(n):
            ext = admit(f"again{i}")
            assert ext.call("echo", b"x") == b"x"
            again.append(ext)
        reload_live = usage()["VmRSS"] - before["VmRSS"]
        for ext in again:
            ext.close()
        del again, ext
        skew[0] += WINDOWS_S
        governor.prune()
        gc.collect()
    host.close()
    gc.collect()
    after_host = usage()

    def diff(now: dict[str, int]) -> dict[str, int]:
        return {key: now[key] - before[key] for key in before}

    return {
        "config": name,
        "n": n,
        "load_ms_mean": statistics.fmean(times) * 1000,
        "load_ms_median": statistics.median(times) * 1000,
        "live": diff(live),
        "live_total_rss": live["VmRSS"],
        "live_total_maps": live["maps"],
        "closed": diff(closed),
        "expired": diff(expired),
        "trimmed": diff(trimmed),
        "host_closed": diff(after_host),
        "python_bytes": traced,
        "reload_live_rss": reload_live,
        "load": os.getloadavg()[0],
    }


def startup_ratio(batches: int, batch: int) -> dict[str, Any]:
    """Copy-on-write data images on vs off, in one process, interleaved batch by batch:
    admit + first call + close of one echo extension, median per batch."""
    import gc

    from wasihost.core.settings import EngineSettings
    from wasihost.host.policy import Policy
    from wasihost.host.runtime import Host
    from wasihost.packaging.package import Package, load_package

    base = load_package(ROOT / "fixtures" / "echo", frozenset(), None, None)
    hosts = {
        cow: Host(Policy(), settings=EngineSettings(memory_init_cow=cow), cache_dir=None)
        for cow in (True, False)
    }
    times: dict[bool, list[float]] = {True: [], False: []}
    count = 0
    gc.disable()
    try:
        for _ in range(batches):
            for cow, host in hosts.items():
                start = time.perf_counter()
                for _ in range(batch):
                    count += 1
                    package = Package(f"s{count}.wasm", None, base.wasm, base.sha256)
                    ext = host.admit(package, grants=())
                    ext.call("echo", b"x")
                    ext.close()
                times[cow].append((time.perf_counter() - start) / batch)
            gc.collect()
    finally:
        gc.enable()
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {
        "cow_us": on * 1e6,
        "nocow_us": off * 1e6,
        "ratio_nocow_over_cow": off / on,
        "load": os.getloadavg()[0],
    }


def call_ratio(batches: int, batch: int) -> dict[str, Any]:
    """A no-op call with idle eviction on (``max_live_instances``, each call then touches the
    LRU order) vs off, in one process, interleaved batch by batch; median per batch."""
    import gc

    from wasihost.host.policy import Policy
    from wasihost.host.runtime import Host
    from wasihost.packaging.package import Package, load_package
    from wasihost.supervisor.eviction import EvictionPolicy

    base = load_package(ROOT / "fixtures" / "echo", frozenset(), None, None)
    exts = {}
    for on in (False, True):
        eviction = EvictionPolicy(max_live_instances=1000) if on else None
        host = Host(Policy(), cache_dir=None, eviction=eviction)
        exts[on] = host.admit(Package("c.wasm", None, base.wasm, base.sha256), grants=())
        exts[on].call("noop")
    times: dict[bool, list[float]] = {False: [], True: []}
    gc.disable()
    try:
        for _ in range(batches):
            for on, ext in exts.items():
                call = ext.call
                start = time.perf_counter()
                for _ in range(batch):
                    call("noop")
                times[on].append((time.perf_counter() - start) / batch)
    finally:
        gc.enable()
    off, on_ = statistics.median(times[False]), statistics.median(times[True])
    return {
        "off_us": off * 1e6,
        "on_us": on_ * 1e6,
        "ratio_on_over_off": on_ / off,
        "load": os.getloadavg()[0],
    }


def run(name: str, n: int) -> dict[str, Any]:
    env = {**os.environ, "RUST_BACKTRACE": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--n", str(n)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return format(low, fmt) if len(values) == 1 or low == high else f"{low:{fmt}}-{high:{fmt}}"


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    print(
        "| config | N | load+first call | RSS live | per ext | maps live | per ext | "
        "RSS after close | windows expired | after trim | maps after close | total RSS live |"
    )
    print("|" + " --- |" * 12)
    for name, runs in results.items():
        n = runs[0]["n"]

        def col(key: str, sub: str, scale: float, fmt: str, runs: list[dict[str, Any]] = runs):
            return span([r[key][sub] / scale for r in runs], fmt)

        print(
            f"| {name} | {n:,} | {span([r['load_ms_mean'] for r in runs], '.2f')} ms "
            f"| {col('live', 'VmRSS', MiB, '.0f')} MiB "
            f"| {span([r['live']['VmRSS'] / n / KiB for r in runs], '.1f')} KiB "
            f"| {col('live', 'maps', 1, '.0f')} "
            f"| {span([r['live']['maps'] / n for r in runs], '.2f')} "
            f"| {col('closed', 'VmRSS', MiB, '.0f')} MiB "
            f"| {col('expired', 'VmRSS', MiB, '.0f')} MiB "
            f"| {col('trimmed', 'VmRSS', MiB, '.0f')} MiB "
            f"| {col('closed', 'maps', 1, '.0f')} "
            f"| {span([r['live_total_rss'] / MiB for r in runs], '.0f')} MiB |"
        )
        again = [r["reload_live_rss"] / MiB for r in runs if r["reload_live_rss"]]
        if again:
            print(f"|   second round of {n:,} live: {span(again, '.0f')} MiB |")
        traced = [r["python_bytes"] for r in runs if r["python_bytes"]]
        if traced:
            print(f"|   Python objects: {span([t / n / KiB for t in traced], '.1f')} KiB/ext |")
    loads = [r["load"] for runs in results.values() for r in runs]
    print(f"\nload average during the runs: {span(loads, '.2f')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--startup-ratio",
        action="store_true",
        help="copy-on-write on vs off: load + first call + close, interleaved in one process",
    )
    parser.add_argument(
        "--call-ratio",
        action="store_true",
        help="no-op call cost with idle eviction on vs off, interleaved in one process",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    if args.call_ratio:
        for _ in range(args.repeats):
            print(json.dumps(call_ratio(batches=21, batch=2000)))
        return
    if args.startup_ratio:
        for _ in range(args.repeats):
            print(json.dumps(startup_ratio(batches=15, batch=40)))
        return
    names = [c for c in args.configs.split(",") if c]
    for name in names:
        if name not in CONFIGS:
            raise SystemExit(f"unknown config {name!r}; known: {', '.join(CONFIGS)}")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for _ in range(args.repeats):  # interleaved: drift hits every configuration alike
        for name in names:
            results[name].append(run(name, args.n))
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        report(results)


if __name__ == "__main__":
    main()
