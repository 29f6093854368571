"""Scaling: throughput of N extensions (each its own instance of fixtures/echo or
fixtures/compute) called from 1 thread (round robin), from N threads (one extension each),
and from N processes (one extension each, started together behind a barrier)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WORKERS = 2
# The workloads: many small calls (where the GIL hand-off dominates) and compute-bound calls.
WORKLOADS = {"noop": ("echo", "noop", None), "compute": ("compute", "run", {"n": 200_000})}
# How long a scaling worker process may take to load and run before it is abandoned.
WORKER_TIMEOUT_S = 120


def _load(fixtures: Path, workload: str, copies: int) -> tuple[Any, list[Any]]:
    import hashlib

    from ..host.runtime import Host
    from ..packaging.package import Package
    from .hosts import bench_policy

    fixture, _, _ = WORKLOADS[workload]
    host = Host(bench_policy(), cache_dir=None)
    wasm = (fixtures / fixture / f"{fixture}.wasm").read_bytes()
    digest = hashlib.sha256(wasm).hexdigest()
    # One id is admitted once per host: each copy is the bare module under its own name.
    exts = [host.admit(Package(f"{fixture}-{i}.wasm", None, wasm, digest)) for i in range(copies)]
    return host, exts


def _loop(ext: Any, command: str, value: Any, calls: int, errors: list[BaseException]) -> None:
    try:
        for _ in range(calls):
            ext.call(command, value)
    except Exception as exc:  # handed to the measuring thread, which raises it
        errors.append(exc)


def threads(fixtures: Path, workload: str, calls: int, n_threads: int) -> float:
    """Calls per second of WORKERS extensions driven by ``n_threads`` threads."""
    _, command, value = WORKLOADS[workload]
    host, exts = _load(fixtures, workload, WORKERS)
    try:
        for ext in exts:
            ext.call(command, value)
        per = calls // WORKERS
        if n_threads == 1:
            start = time.perf_counter()
            for _ in range(per):
                for ext in exts:
                    ext.call(command, value)
            return per * WORKERS / (time.perf_counter() - start)
        errors: list[BaseException] = []
        workers = [
            threading.Thread(target=_loop, args=(ext, command, value, per, errors)) for ext in exts
        ]
        start = time.perf_counter()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        took = time.perf_counter() - start
        if errors:
            raise errors[0]
        return per * WORKERS / took
    finally:
        host.close()


def processes(fixtures: Path, workload: str, calls: int) -> float:
    """Calls per second of WORKERS processes, each with its own extension; each process
    loads, says ready, waits for go, then times its own calls and prints the seconds they
    took; the slowest worker's time is the run's (they start together)."""
    per = calls // WORKERS
    env = dict(os.environ, RUST_BACKTRACE="0")
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    argv = [
        sys.executable,
        "-c",
        "from wasihost.benchmark.scaling import worker; worker()",
        str(fixtures),
        workload,
        str(per),
    ]
    procs = [
        subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a scaling worker failed to start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=WORKER_TIMEOUT_S)[0] for proc in procs]
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError("a scaling worker failed")
        took = max(float(out.strip()) for out in outputs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return per * WORKERS / took


def worker() -> None:
    fixtures, workload, per = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    _, command, value = WORKLOADS[workload]
    host, exts = _load(fixtures, workload, 1)
    exts[0].call(command, value)
    print("ready", flush=True)
    sys.stdin.readline()
    errors: list[BaseException] = []
    start = time.perf_counter()
    _loop(exts[0], command, value, per, errors)
    took = time.perf_counter() - start
    host.close()
    if errors:
        raise errors[0]
    print(took, flush=True)


def scaling(fixtures: Path, calls: dict[str, int], rounds: int, log: Any) -> list[dict[str, Any]]:
    """Each mode ``rounds`` times, the modes alternating round by round; median rates, and
    each mode's ratio to 1 thread round by round, so that a row whose rounds spread more than
    its effect is flagged rather than read as a result (:func:`settled`)."""
    import statistics

    rows: list[dict[str, Any]] = []
    for workload, n in calls.items():
        log(f"scaling: {workload}")
        ones, twos, many = [], [], []
        skipped = None
        for _ in range(rounds):
            ones.append(threads(fixtures, workload, n, 1))
            twos.append(threads(fixtures, workload, n, 2))
            if skipped is None:
                try:
                    many.append(processes(fixtures, workload, n))
                except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
                    skipped = f"worker processes failed: {exc}"
        one = statistics.median(ones)
        by_mode: dict[str, list[float] | None] = {
            "1 thread": ones,
            "2 threads": twos,
            "2 processes": many if skipped is None else None,
        }
        for mode, rates in by_mode.items():
            row: dict[str, Any] = {
                "workload": workload,
                "extensions": WORKERS,
                "mode": mode,
                "calls": n,
                "calls_per_s": None,
                "vs_1_thread": None,
                "ratio_by_round": None,
                "settled": None,
                "skipped": skipped if rates is None else None,
            }
            if rates is not None:
                ratios = [r / o for r, o in zip(rates, ones, strict=False)]
                rate = statistics.median(rates)
                row.update(
                    calls_per_s=round(rate, 1),
                    vs_1_thread=round(rate / one, 3),
                    ratio_by_round=[round(x, 3) for x in ratios],
                    settled=mode == "1 thread" or settled(ratios),
                )
            rows.append(row)
    return rows


def settled(ratios: list[float]) -> bool:
    """Whether a mode's ratio to 1 thread, round by round, says anything: its rounds must
    spread (max - min) less than its effect (how far the median is from 1.0). A row measured
    while the machine was busy elsewhere spreads over both sides of 1.0, and its median is
    then noise, not a speed-up or a slow-down."""
    import statistics

    if len(ratios) < 2:
        return False
    effect = abs(statistics.median(ratios) - 1.0)
    return max(ratios) - min(ratios) < effect
