"""The official WASI preview1 suite (wasi-testsuite, 72 tests) run in-process through
wasihost's WASI profile and through wasmtime's built-in WASI: total time of the whole run.

Each test runs as upstream's runner runs it: a fresh copy of its root preopened as ``/``, its
args and env, clocks and random granted; the verdict (exit code, stdout) is checked for both
hosts. A "run" of a test is instantiate + ``_start`` to its end; copying the root is done
before the clock starts, and compiling once, before any round (wasihost's module cache, the
reference's ``Module``; both engines have fuel and epoch interruption on). wasihost serves
every test from one Host, as tests/wasi/test_wasi_conformance.py does, each test admitted once (as
the reference compiles its ``Module`` once); the admission's own time is reported apart.
Rounds of the two alternate, so that drift on a shared machine falls on both alike; the figure
is the median round.
wasmtime's built-in WASI is the reference only; wasihost itself never uses it.

Usage: ``python benchmarks/bench_wasi_suite.py [--rounds R] [--json]``. Target (issue 10): the
whole run within 2x of the built-in.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # trap paths are slower with it; set before wasmtime loads

import wasmtime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.wasi_testsuite import SUITE, Outcome, SuiteRunner, SuiteTest, copy_root, discover

FUEL = 10_000_000_000
TARGET_RATIO = 2.0


class Reference:
    """wasmtime's built-in WASI: one engine and module per test, a fresh Store per run."""

    def __init__(self, tests: list[SuiteTest]) -> None:
        config = wasmtime.Config()
        config.consume_fuel = True
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        self.modules = {t.name: wasmtime.Module.from_file(self.engine, str(t.wasm)) for t in tests}

    def run(self, test: SuiteTest, root: Path | None, out: Path) -> Outcome:
        linker = wasmtime.Linker(self.engine)
        linker.define_wasi()
        store = wasmtime.Store(self.engine)
        store.set_fuel(FUEL)
        store.set_epoch_deadline(1_000_000)
        cfg = wasmtime.WasiConfig()
        cfg.argv = [test.wasm.name, *test.args]
        cfg.env = [[k, v] for k, v in test.env]
        cfg.stdout_file = str(out)
        cfg.stderr_file = os.devnull
        if root is not None:
            cfg.preopen_dir(str(root), "/")
        store.set_wasi(cfg)
        code = 0
        try:
            instance = linker.instantiate(store, self.modules[test.name])
            instance.exports(store)["_start"](store)
        except wasmtime.ExitTrap as exc:
            code = int(exc.code)
        except (wasmtime.Trap, wasmtime.WasmtimeError):
            return Outcome(None, out.read_bytes(), b"", "trap")
        return Outcome(code, out.read_bytes(), b"")


Runner = Callable[[SuiteTest, Path | None, Path], Outcome]


def _round(tests: list[SuiteTest], run: Runner, scratch: Path) -> tuple[float, int]:
    """Seconds spent in the runs of one whole pass over the suite, and how many passed."""
    spent = 0.0
    passed = 0
    for i, test in enumerate(tests):
        work = scratch / str(i)
        work.mkdir()
        root = copy_root(test, work / "root") if test.needs_directory else None
        start = time.perf_counter()
        outcome = run(test, root, work / "stdout")
        spent += time.perf_counter() - start
        passed += outcome.passes(test)
        shutil.rmtree(work)
    return spent, passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    tests = discover()
    if not tests:
        raise SystemExit(f"the WASI test suite is not at {SUITE}")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ours = SuiteRunner(scratch / "modules")
        for test in tests:
            ours.admit(test)  # compiles into the cache
        ours.close()
        # Admission (static checks, the module from the cache) once per test, as an embedder
        # loads an extension once and runs it many times; timed on its own.
        ours = SuiteRunner(scratch / "modules")
        start = time.perf_counter()
        for test in tests:
            ours.admit(test)
        admit_s = time.perf_counter() - start
        reference = Reference(tests)

        def wasihost_run(test: SuiteTest, root: Path | None, out: Path) -> Outcome:
            return ours.run(test, root)

        rounds: dict[str, list[float]] = {"wasihost": [], "builtin": []}
        passed: dict[str, int] = {}
        try:
            _round(tests, wasihost_run, scratch)  # warm-up: caches, first-touch page faults
            _round(tests, reference.run, scratch)
            for _ in range(args.rounds):
                for name, run in (("wasihost", wasihost_run), ("builtin", reference.run)):
                    spent, passed[name] = _round(tests, run, scratch)
                    rounds[name].append(spent)
        finally:
            ours.close()
    load_after = os.getloadavg()
    wasihost_s = statistics.median(rounds["wasihost"])
    builtin_s = statistics.median(rounds["builtin"])
    doc = {
        "wasmtime": importlib.metadata.version("wasmtime"),
        "tests": len(tests),
        "rounds": args.rounds,
        "passed": passed,
        "wasihost_s": round(wasihost_s, 3),
        "builtin_s": round(builtin_s, 3),
        "ratio": round(wasihost_s / builtin_s, 2),
        "wasihost_admission_s": round(admit_s, 3),
        "target_ratio": TARGET_RATIO,
        "within_target": wasihost_s / builtin_s <= TARGET_RATIO,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"wasi-testsuite, {len(tests)} tests, median of {args.rounds} rounds "
            f"(target: within {TARGET_RATIO}x)"
        )
        print(f"  wasihost: {wasihost_s * 1000:8.1f} ms  ({passed['wasihost']} passed)")
        print(f"  built-in: {builtin_s * 1000:8.1f} ms  ({passed['builtin']} passed)")
        mark = "" if doc["within_target"] else "  OVER TARGET"
        print(f"  ratio:    {doc['ratio']:8.2f}x{mark}")
        print(f"  (wasihost's one-time admission of the 72 modules, from the cache: "
              f"{admit_s * 1000:.1f} ms)")  # fmt: skip
        print(f"  load average before {doc['loadavg_before']}, after {doc['loadavg_after']} "
              f"on {doc['cpus']} CPUs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
