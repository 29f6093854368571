"""Start-up: whole fresh processes of wasihost's CLI against Extism's Python SDK doing the same
job, the processes of every contender alternating round by round.

Contenders, each one ``python`` process from exec to exit:

- ``extism``: ``import extism``, load a small plugin (the installed harness's
  ``EXTISM_PLUGIN_WAT``: an ``echo`` export using the ``extism:host/env`` kernel imports) and
  call it once with ``null``;
- ``run``: ``wasihost run fixtures/echo noop`` (a 44 KB Rust module, its compiled form in a
  warm disk cache);
- ``wasi``: ``wasihost wasi fixtures/wasi-libc/wasi-libc.wasm hello`` (a 48 KB C program on
  wasi-libc, the same warm cache);
- ``hello``: ``wasihost run fixtures/hello greet --input '{"name":"ada"}'``, issue 31's command
  (a 47 KB Rust module making one ``log`` host call, the same warm cache);
- for context, not targets: ``python -c pass`` (the interpreter and this machine's site
  packages) and ``python -c "import wasmtime"`` (wasmtime-py's import, which wasihost needs).

wasihost is started the way its console script starts it (``wasihost.cli.program``).
Bytecode is cached for everything (a private ``PYTHONPYCACHEPREFIX``, filled by the warm-up
rounds), as it is for an installed package; the warm-up also fills wasihost's module cache and
checks each contender's output. Wall time is what a user waits; CPU time (user + system of the
process and its children, from ``wait4``) is less disturbed by other load on a shared machine.
Each round's ratio is taken against Extism's process of the same round. ``RUST_BACKTRACE`` is
``0`` for every process.

With ``--baseline DIR`` (another wasihost source tree, e.g. ``git archive BASE wasihost |
tar -x -C DIR``), DIR's ``run`` and ``wasi`` join the same rounds, started from DIR with their
own module cache, and each round's ratio to them is printed: an A/B under one machine load.

Usage: ``python benchmarks/bench_startup.py [--rounds N] [--baseline DIR] [--json]``. Targets:
``run`` and ``wasi`` within 1.2x of Extism's whole process (issue 12), ``hello`` within 1.5x
(issue 31). Needs ``pip install -e '.[bench]'`` (Extism).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # trap paths are slower with it; set before wasmtime loads

import wasmtime

from wasihost.benchmark.guests import EXTISM_PLUGIN_WAT

ROOT = Path(__file__).resolve().parent.parent
# Each target command's bound, as a ratio to Extism's whole process: issue 12's for run and
# wasi, issue 31's for hello.
TARGETS = {"run": 1.2, "wasi": 1.2, "hello": 1.5}
BASELINE_SUFFIX = " (baseline)"
WARMUP_ROUNDS = 3

EXTISM_SCRIPT = """import sys
import extism
with open(sys.argv[1], "rb") as f:
    plugin = extism.Plugin(f.read())
out = plugin.call("echo", b"null")
assert out == b"null", out
print(out.decode())
"""

# As the console script starts the command (wasihost.cli:program); a --baseline tree older than
# that entry point has only main.
WASIHOST_SCRIPT = (
    "import sys\nimport wasihost.cli as cli\nsys.exit(getattr(cli, 'program', cli.main)())\n"
)


def wasihost_cases(cache: Path, suffix: str = "") -> dict[str, tuple[list[str], str]]:
    """The target commands, named ``run``, ``wasi`` and ``hello`` plus ``suffix``."""
    cli = [sys.executable, "-c", WASIHOST_SCRIPT]
    cache_flag = ["--cache-dir", str(cache)]
    hello_input = ["--input", '{"name":"ada"}']
    return {
        f"run{suffix}": (
            [*cli, "run", str(ROOT / "fixtures/echo"), "noop", *cache_flag],
            "null\n",
        ),
        f"wasi{suffix}": (
            [*cli, "wasi", *cache_flag, str(ROOT / "fixtures/wasi-libc/wasi-libc.wasm"), "hello"],
            "hello: hello from wasi-libc\n",
        ),
        f"hello{suffix}": (
            [*cli, "run", str(ROOT / "fixtures/hello"), "greet", *hello_input, *cache_flag],
            '{"greeting": "hello, ada"}\n',
        ),
    }


def contenders(
    plugin: Path, cache: Path, baseline: Path | None = None
) -> dict[str, tuple[list[str], str, Path]]:
    """name -> (argv, the stdout the process must print, the source tree it runs from)."""
    py = sys.executable
    cases = {"extism": ([py, "-c", EXTISM_SCRIPT, str(plugin)], "null\n")}
    cases.update(wasihost_cases(cache))
    cases["python"] = ([py, "-c", "pass"], "")
    cases["import wasmtime"] = ([py, "-c", "import wasmtime"], "")
    found = {name: (argv, out, ROOT) for name, (argv, out) in cases.items()}
    if baseline is not None:
        for name, (argv, out) in wasihost_cases(cache / "baseline", BASELINE_SUFFIX).items():
            found[name] = (argv, out, baseline)
    return found


def child_env(pycache: Path, root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    # ``root`` first: the editable install points at another checkout.
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(root), *others])
    env["RUST_BACKTRACE"] = "0"
    return env


def one_process(
    argv: list[str], env: dict[str, str], cwd: Path = ROOT
) -> tuple[float, float, str]:
    """(wall ms, CPU ms, stdout) of one process, exec to exit, run in ``cwd`` (``-c`` puts it
    first on the module path). The process is reaped with ``wait4`` for its own resource usage
    (its children's included)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = (time.perf_counter() - start) * 1000
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[-3:]} exited {proc.returncode}: {err.read().decode()}")
        return wall, (usage.ru_utime + usage.ru_stime) * 1000, out.read().decode()


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def measure(rounds: int, baseline: Path | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        plugin = Path(tmp) / "echo-plugin.wasm"
        plugin.write_bytes(bytes(wasmtime.wat2wasm(EXTISM_PLUGIN_WAT)))
        cases = contenders(plugin, Path(tmp) / "modules", baseline)
        envs = {root: child_env(Path(tmp) / "pycache", root) for _, _, root in cases.values()}
        names = list(cases)
        # Warm-up: bytecode, wasihost's module cache, Extism's own cache; outputs checked.
        for _ in range(WARMUP_ROUNDS):
            for name, (argv, expected, root) in cases.items():
                _, _, stdout = one_process(argv, envs[root], root)
                if stdout != expected:
                    raise SystemExit(f"{name} printed {stdout!r}, expected {expected!r}")
        load_before = os.getloadavg()
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            # Each round starts with a different contender, so none always runs first.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                argv, _, root = cases[name]
                w, c, _ = one_process(argv, envs[root], root)
                wall[name].append(w)
                cpu[name].append(c)
        load_after = os.getloadavg()
    results = {}
    for name in names:
        row: dict[str, object] = {"wall_ms": spread(wall[name]), "cpu_ms": spread(cpu[name])}
        if name != "extism":
            wall_ratio = [a / b for a, b in zip(wall[name], wall["extism"], strict=True)]
            cpu_ratio = [a / b for a, b in zip(cpu[name], cpu["extism"], strict=True)]
            row["wall_ratio"] = spread(wall_ratio)
            row["cpu_ratio"] = spread(cpu_ratio)
            if name in TARGETS:
                row["target_ratio"] = TARGETS[name]
                row["within_target"] = statistics.median(wall_ratio) <= TARGETS[name]
            if name + BASELINE_SUFFIX in wall:
                base_wall, base_cpu = wall[name + BASELINE_SUFFIX], cpu[name + BASELINE_SUFFIX]
                row["wall_vs_baseline"] = spread(
                    [a / b for a, b in zip(wall[name], base_wall, strict=True)]
                )
                row["cpu_vs_baseline"] = spread(
                    [a / b for a, b in zip(cpu[name], base_cpu, strict=True)]
                )
        results[name] = row
    return {
        "python": sys.version.split()[0],
        "wasmtime": importlib.metadata.version("wasmtime"),
        "extism": importlib.metadata.version("extism"),
        "rounds": rounds,
        "baseline": str(baseline) if baseline is not None else None,
        "target_ratios": TARGETS,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
        "results": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another wasihost source tree whose run and wasi join the same rounds",
    )
    args = parser.parse_args()
    try:
        importlib.metadata.version("extism")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            "extism is not installed (pip install -e '.[bench]', or pip install extism==1.1.1)"
        ) from None
    doc = measure(args.rounds, args.baseline)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"Whole-process start-up, {doc['rounds']} alternating rounds (python {doc['python']}, "
        f"wasmtime {doc['wasmtime']}, extism {doc['extism']}); load average "
        f"{doc['load_before'][0]} -> {doc['load_after'][0]} on {doc['cpus']} CPUs"
    )
    print(
        f"{'process':<16} {'wall ms median (min-max)':>26} {'CPU ms median (min-max)':>26} "
        f"{'wall / extism':>20} {'CPU / extism':>20}"
    )
    results = doc["results"]
    assert isinstance(results, dict)
    for name, row in results.items():
        w, c = row["wall_ms"], row["cpu_ms"]
        line = (
            f"{name:<16} {w['median']:>10.1f} ({w['min']:.1f}-{w['max']:.1f})".ljust(43)
            + f" {c['median']:>10.1f} ({c['min']:.1f}-{c['max']:.1f})".ljust(27)
        )
        if "wall_ratio" in row:
            wr, cr = row["wall_ratio"], row["cpu_ratio"]
            line += (
                f" {wr['median']:>6.2f}x ({wr['min']:.2f}-{wr['max']:.2f})"
                f" {cr['median']:>6.2f}x ({cr['min']:.2f}-{cr['max']:.2f})"
            )
        if row.get("within_target") is False:
            line += f"  OVER the {row['target_ratio']}x target"
        print(line)
    for name, row in results.items():
        if "wall_vs_baseline" in row:
            wb, cb = row["wall_vs_baseline"], row["cpu_vs_baseline"]
            print(
                f"{name} / {name}{BASELINE_SUFFIX}, per round: wall {wb['median']:.3f}x "
                f"({wb['min']:.3f}-{wb['max']:.3f}), CPU {cb['median']:.3f}x "
                f"({cb['min']:.3f}-{cb['max']:.3f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
