"""What the epoch tick costs when another Python thread wants the GIL, and how late a deadline
fires when one holds it.

Deadlines are one epoch tick long and renewed by a Python callback on the guest's thread
(docs/engine.md), which needs the GIL (the ticks themselves need none on Linux). Part 1 times
the same guest work under several tick settings, with the process otherwise idle, with a busy
Python thread (pure-Python work, contending for the GIL and a CPU) and with a busy Python
process (the same work in a child: contending for a CPU only), each against a baseline of a
1 s tick (next to no ticks) in the same run and condition:

- ``spin``: ``fixtures/spin`` burning a fixed fuel budget (it ends ``out_of_fuel``), a guest
  that never leaves wasm;
- ``noop``: a loop of no-op calls to ``fixtures/echo``, Python-heavy on the host side;
- the busy thread's own progress while the guest spins: what the ticks cost the application
  that embeds wasihost.

It also prints, per tick, the spinning guest beside the busy thread against the guest alone
and against the guest beside the busy process: how much of the busy thread's cost is the CPU
it takes, and how much the GIL the tick callbacks wait for.

Each measurement also runs a spinning guest into a 30 ms deadline three times and records how
late the call really ended: the deadline latency of that tick setting.

Part 2 holds the GIL in one C call (``sum`` over a long ``range``) in another thread while a
spinning guest has a 100 ms deadline, and reports when the call really ended.

Part 3 measures the CPU the watchdog alone takes from an idle process at each setting.

Usage: ``python benchmarks/bench_tick.py [--ticks 1,5,10,20,50] [--fuel 300000000]
[--calls 3000] [--repeats 5] [--hog-s 2] [--switch-interval-ms MS] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # trap paths are slower with it; set before wasmtime loads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wasihost.benchmark.hosts import bench_policy
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.settings import MAX_EPOCH_TICK_MS, EngineSettings
from wasihost.host.runtime import Host

SPIN = ROOT / "fixtures" / "spin"
ECHO = ROOT / "fixtures" / "echo"
BASELINE_TICK_MS = MAX_EPOCH_TICK_MS  # one tick a second: next to no tick overhead
LONG_TIMEOUT_MS = 600_000  # the spin call must end by fuel, never by its deadline
HOG_DEADLINE_MS = 100
OVERSHOOT_DEADLINE_MS = 30
IDLE_WINDOW_S = 1.0


def _pure_python_work(stop: threading.Event, done: list[int]) -> None:
    """Interpreted bytecode: gives the GIL up only when another thread asks for it. Counts
    its rounds in ``done[0]``: the embedding application's progress."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x = (x + i) % 7919
        done[0] += 1


# The busy process's work: the same bytecode as _pure_python_work, until it is killed.
_BUSY_PROCESS = "x = 0\nwhile True:\n    for i in range(1000):\n        x = (x + i) % 7919\n"
CONDITIONS = ("idle", "busy", "process")


@contextmanager
def contender(condition: str) -> Iterator[list[int]]:
    """Nothing (``idle``), a busy Python thread of this process (``busy``: its rounds are
    counted) or a busy Python process (``process``) beside the guest."""
    done = [0]
    if condition == "process":
        child = subprocess.Popen([sys.executable, "-c", _BUSY_PROCESS])
        try:
            yield done
        finally:
            child.kill()
            child.wait()
        return
    if condition != "busy":
        yield done
        return
    stop = threading.Event()
    thread = threading.Thread(target=_pure_python_work, args=(stop, done), daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()


def _spin_once(host: Host, fuel: int) -> float:
    ext = host.load(SPIN, fuel=fuel, timeout_ms=LONG_TIMEOUT_MS)
    start = time.perf_counter()
    try:
        ext.call("run")
    except CallError as exc:
        if exc.failure is not FailureClass.OUT_OF_FUEL:
            raise
    elapsed = time.perf_counter() - start
    ext.close()
    return elapsed


def _overshoot(host: Host) -> float:
    """How long after its deadline a spinning call really ended (start-up included)."""
    ext = host.load(SPIN, fuel=10_000_000_000, timeout_ms=OVERSHOOT_DEADLINE_MS)
    start = time.perf_counter()
    try:
        ext.call("run")
    except CallError as exc:
        if exc.failure is not FailureClass.DEADLINE:
            raise
    elapsed = time.perf_counter() - start
    ext.close()
    return elapsed - OVERSHOOT_DEADLINE_MS / 1000


def _noop_calls(host: Host, calls: int) -> float:
    ext = host.load(ECHO)
    ext.call("noop")  # start-up out of the timing
    start = time.perf_counter()
    for _ in range(calls):
        ext.call("noop")
    elapsed = (time.perf_counter() - start) / calls
    ext.close()
    return elapsed


def tick_overhead(
    ticks: list[int], fuel: int, calls: int, repeats: int, cache_dir: Path
) -> dict[str, dict[str, dict[str, float]]]:
    """{condition: {workload: {tick: median seconds}}}; ticks interleaved round by round.

    Each measurement gets its own Host (its own engine and watchdog), closed before the next,
    so no other setting's watchdog ticks meanwhile. The disk cache keeps compiling out of it
    (the tick is not part of the compiled code).
    """
    settings = [*ticks, BASELINE_TICK_MS]
    samples: dict[tuple[str, str, int], list[float]] = {}
    for round_ in range(repeats):
        for condition in CONDITIONS:
            # A different setting goes first each round, so drift within a round (the
            # machine's other load) does not always land on the same one.
            shift = round_ % len(settings)
            for tick in settings[shift:] + settings[:shift]:
                host = Host(
                    bench_policy(), settings=EngineSettings(epoch_tick_ms=tick), cache_dir=cache_dir
                )
                try:
                    with contender(condition) as done:
                        before = done[0]
                        spin = _spin_once(host, fuel)
                        app_rate = (done[0] - before) / spin
                        noop = _noop_calls(host, calls)
                        late = [_overshoot(host) for _ in range(3)]
                finally:
                    host.close()
                samples.setdefault((condition, "spin", tick), []).append(spin)
                if condition == "busy":
                    samples.setdefault((condition, "app_rate", tick), []).append(app_rate)
                samples.setdefault((condition, "noop", tick), []).append(noop)
                samples.setdefault((condition, "overshoot", tick), []).extend(late)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (condition, workload, tick), values in samples.items():
        out.setdefault(condition, {}).setdefault(workload, {})[str(tick)] = statistics.median(
            values
        )
        if workload == "overshoot":
            out[condition].setdefault("overshoot_max", {})[str(tick)] = max(values)
    return out


def idle_cost(ticks: list[int], cache_dir: Path) -> dict[str, float]:
    """CPU the watchdog takes from an otherwise idle process (it ticks from the first call on,
    whether or not a guest runs), in percent of one CPU, per tick setting."""
    out = {}
    for tick in ticks:
        settings = EngineSettings(epoch_tick_ms=tick)
        host = Host(bench_policy(), settings=settings, cache_dir=cache_dir)
        try:
            host.load(ECHO).call("noop")
            cpu = time.process_time()
            time.sleep(IDLE_WINDOW_S)
            out[str(tick)] = (time.process_time() - cpu) / IDLE_WINDOW_S * 100
        finally:
            host.close()
    return out


def _calibrate_hog(target_s: float) -> Callable[[], None]:
    """A function holding the GIL in one C call for about ``target_s`` seconds."""
    n = 10**6
    start = time.perf_counter()
    sum(range(n))
    per_item = (time.perf_counter() - start) / n
    items = max(n, int(target_s / per_item))
    return lambda: (sum(range(items)), None)[1]


def gil_hog(hog_s: float, cache_dir: Path) -> dict[str, float]:
    """A 100 ms deadline while another thread holds the GIL in one C call."""
    hog = _calibrate_hog(hog_s)
    start = time.perf_counter()
    hog()
    alone = time.perf_counter() - start
    host = Host(bench_policy(), cache_dir=cache_dir)
    try:
        ext = host.load(SPIN, fuel=10_000_000_000, timeout_ms=HOG_DEADLINE_MS)

        hog_ended: list[float] = []

        def run_hog() -> None:
            time.sleep(0.02)  # let the guest enter wasm (it releases the GIL) first
            hog()
            hog_ended.append(time.perf_counter() - start)

        thread = threading.Thread(target=run_hog, daemon=True)
        start = time.perf_counter()
        thread.start()
        try:
            ext.call("run")
        except CallError as exc:
            failure = exc.failure.value
        else:
            failure = "none"
        ended = time.perf_counter() - start
        thread.join()
    finally:
        host.close()
    return {
        "deadline_ms": HOG_DEADLINE_MS,
        "hog_alone_s": alone,
        "hog_ended_s": hog_ended[0],
        "call_ended_s": ended,
        "failure": failure,  # type: ignore[dict-item]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ticks", default="1,5,10,20,50", help="tick settings in ms")
    parser.add_argument("--fuel", type=int, default=300_000_000, help="fuel of one spin call")
    parser.add_argument("--calls", type=int, default=3000, help="no-op calls per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hog-s", type=float, default=2.0, help="GIL hold of part 2")
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="the interpreter's GIL switch interval (sys.setswitchinterval); default: as is",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    ticks = [int(t) for t in args.ticks.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        cache_dir = Path(tmp) / "cache"
        cache_dir.mkdir(mode=0o700)
        overhead = tick_overhead(ticks, args.fuel, args.calls, args.repeats, cache_dir)
        hog = gil_hog(args.hog_s, cache_dir)
        watchdog_cpu = idle_cost(ticks, cache_dir)
    report = {
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "switch_interval_ms": sys.getswitchinterval() * 1000,
        "overhead": overhead,
        "gil_hog": hog,
        "idle_cpu_percent": watchdog_cpu,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in report['load_after'])} ({report['cpus']} CPUs); "
        f"GIL switch interval {report['switch_interval_ms']:.1f} ms"
    )
    base = str(BASELINE_TICK_MS)
    for workload, unit, scale in (("spin", "ms", 1e3), ("noop", "µs/call", 1e6)):
        idle, busy = overhead["idle"][workload], overhead["busy"][workload]
        process = overhead["process"][workload]
        print(
            f"{workload}: baseline ({base} ms tick) idle {idle[base] * scale:.1f} {unit}, "
            f"busy thread {busy[base] * scale:.1f} {unit}, busy process "
            f"{process[base] * scale:.1f} {unit} (median of {args.repeats})"
        )
        for tick in ticks:
            t = str(tick)
            print(
                f"  tick {tick:>4} ms: idle {idle[t] / idle[base]:.2f}x, "
                f"busy thread {busy[t] / busy[base]:.2f}x, "
                f"busy process {process[t] / process[base]:.2f}x"
            )
    print("the spinning guest beside the busy thread, against it alone / beside the busy process:")
    for tick in [*ticks, BASELINE_TICK_MS]:
        t = str(tick)
        busy_spin = overhead["busy"]["spin"][t]
        print(
            f"  tick {tick:>4} ms: {busy_spin / overhead['idle']['spin'][t]:.2f}x / "
            f"{busy_spin / overhead['process']['spin'][t]:.2f}x"
        )
    app = overhead["busy"]["app_rate"]
    print("the busy Python thread's own progress while the guest spins, vs the baseline tick:")
    print("  " + ", ".join(f"tick {t} ms {app[str(t)] / app[base]:.2f}x" for t in ticks))
    print(
        f"deadline of {OVERSHOOT_DEADLINE_MS} ms on a spinning guest, ended late by (median, max):"
    )
    for tick in [*ticks, BASELINE_TICK_MS]:
        t = str(tick)
        cells = [
            f"{condition} {overhead[condition]['overshoot'][t] * 1e3:.1f}, "
            f"{overhead[condition]['overshoot_max'][t] * 1e3:.1f} ms"
            for condition in ("idle", "busy")
        ]
        print(f"  tick {tick:>4} ms: " + "; ".join(cells))
    print(
        "CPU of an idle process whose engine has run a guest (the watchdog): "
        + ", ".join(f"tick {t} ms {watchdog_cpu[str(t)]:.2f}%" for t in ticks)
    )
    print(
        f"GIL held in one C call ({hog['hog_alone_s']:.2f} s alone) until "
        f"{hog['hog_ended_s']:.2f} s: a {hog['deadline_ms']} ms deadline ended the call "
        f"({hog['failure']}) after {hog['call_ended_s']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
