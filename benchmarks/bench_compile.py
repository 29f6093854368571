"""The worst compile cost per KB that the code-shape pre-check admits.

Builds modules of the costliest shapes at (or just under) the limits of ``wasihost.core.codeshape``,
checks that the pre-check admits them, and compiles each in a fresh process with the host's
engine configuration (fuel and epoch instrumentation on), reporting wall and CPU time, peak
RSS and address space, and each per KB of module. Ordinary code (the wasi-std fixture) is the
reference. Run it on a quiet machine and quote ``uptime`` with the numbers:

    PYTHONPATH=. python3 benchmarks/bench_compile.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RUST_BACKTRACE", "0")

from wasihost.core import codeshape as cs
from wasihost.core.codeshape import scan_code
from wasihost.core.settings import EngineSettings
from wasihost.engine import compiler as comp
from wasihost.engine.wasm_engine import engine_options

ROOT = Path(__file__).resolve().parent.parent


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def section(sid: int, payload: bytes) -> bytes:
    return bytes([sid]) + uleb(len(payload)) + payload


def module(bodies: list[bytes], locals_: bytes = b"\x00") -> bytes:
    """A module of ``() -> ()`` functions with the given bodies (without locals and `end`),
    and one funcref table for the table instructions."""
    types = section(1, b"\x01\x60\x00\x00")
    funcs = section(3, uleb(len(bodies)) + b"\x00" * len(bodies))
    table = section(4, b"\x01\x70\x00\x01")
    codes = b""
    for body in bodies:
        full = locals_ + body + b"\x0b"
        codes += uleb(len(full)) + full
    return (
        b"\x00asm\x01\x00\x00\x00" + types + funcs + table + section(10, uleb(len(bodies)) + codes)
    )


LOOP, BLOCK, END = b"\x03\x40", b"\x02\x40", b"\x0b"
IF = b"\x41\x00\x04\x40"  # i32.const 0; if
TABLE_COPY = b"\x41\x00\x41\x00\x41\x01\xfc\x0e\x00\x00"  # table.copy 0 0 (0, 0, 1)
CALL_INDIRECT = b"\x41\x00\x11\x00\x00"  # call_indirect (type 0) (i32.const 0)
# block; try_table (catch_all 0); end; end: two branches (the try_table and its catch)
TRY_TABLE = b"\x02\x40\x1f\x40\x01\x02\x00\x0b\x0b"
DEPTH = cs.MAX_CONTROL_DEPTH - 1  # the body itself is one level
PER_FN = cs.MAX_LOOPS_PER_FUNCTION
FNS_FOR_LOOPS = cs.MAX_LOOPS // PER_FN


def in_process_worst() -> bytes:
    """The costliest module the compiler still compiles in-process (engine/compiler.py)."""
    n = comp.IN_PROCESS_MAX_LOCALS
    loops = comp.IN_PROCESS_MAX_LOCALS_X_BLOCKS // n
    touch = b"".join(b"\x20" + uleb(i) + b"\x21" + uleb(i) for i in range(n))
    body = LOOP * loops + touch + END * loops
    count = min(comp.IN_PROCESS_MAX_LOOPS // loops, 64 * 1024 // (len(body) + 8))
    return module([body] * count, b"\x01" + uleb(n) + b"\x7e")


def shapes(quick: bool) -> dict[str, bytes]:
    scale = 4 if quick else 1
    body_cap = cs.MAX_FUNCTION_BODY_BYTES // scale
    nested_ifs = IF * DEPTH + END * DEPTH
    nested_blocks = BLOCK * DEPTH + END * DEPTH
    in_process_depth = comp.IN_PROCESS_MAX_DEPTH - 1
    in_process_ifs = IF * in_process_depth + END * in_process_depth
    targets = cs.MAX_BR_TABLE_TARGETS
    br_tables = BLOCK + b"\x41\x00\x0e" + uleb(targets) + b"\x00" * (targets + 1) + END

    # Every local read and written inside nested loops: each is live around every loop.
    def touch(n: int) -> bytes:
        return b"".join(b"\x20" + uleb(i) + b"\x21" + uleb(i) for i in range(n))

    def live_locals(n: int, loops: int) -> bytes:
        return module([LOOP * loops + touch(n) + END * loops], b"\x01" + uleb(n) + b"\x7e")

    return {
        "sequential loops, MAX_LOOPS over functions of MAX_LOOPS_PER_FUNCTION": module(
            [(LOOP + END) * PER_FN] * (FNS_FOR_LOOPS // scale)
        ),
        "nested loops at MAX_CONTROL_DEPTH, 2 nests per function": module(
            [(LOOP * DEPTH + END * DEPTH) * (PER_FN // DEPTH)] * (FNS_FOR_LOOPS // scale)
        ),
        "nested ifs at MAX_CONTROL_DEPTH filling MAX_FUNCTION_BODY_BYTES": module(
            [nested_ifs * (body_cap // len(nested_ifs))]
        ),
        "nested blocks at MAX_CONTROL_DEPTH filling MAX_FUNCTION_BODY_BYTES": module(
            [nested_blocks * (body_cap // len(nested_blocks))]
        ),
        "MAX_FUNCTIONS empty functions": module([b""] * (cs.MAX_FUNCTIONS // scale)),
        "MAX_LOCALS locals, live across nested loops up to MAX_LOCALS_X_BLOCKS": live_locals(
            cs.MAX_LOCALS, cs.MAX_LOCALS_X_BLOCKS // cs.MAX_LOCALS
        ),
        "MAX_LOCALS_X_BLOCKS as 1,000 locals across 250 nested loops": live_locals(1000, 250),
        "br_tables of MAX_BR_TABLE_TARGETS targets": module([br_tables * (8 // scale)]),
        "in-process worst: functions at the IN_PROCESS_ locals and loops limits": (
            in_process_worst()
        ),
        "in-process worst: 64 KB of ifs nested IN_PROCESS_MAX_DEPTH deep": module(
            [in_process_ifs * (63 * 1024 // len(in_process_ifs))]
        ),
        "in-process worst: ifs, IN_PROCESS_MAX_BRANCHES in each function, 64 KB": module(
            [(IF + END) * comp.IN_PROCESS_MAX_BRANCHES] * (64 * 1024 // (5 * 1000 + 8))
        ),
        "in-process worst: IN_PROCESS_MAX_INDIRECT table.copy in one function, ifs after": (
            module(
                [TABLE_COPY * comp.IN_PROCESS_MAX_INDIRECT]
                + [(IF + END) * comp.IN_PROCESS_MAX_BRANCHES] * 12
            )
        ),
        "in-process worst: try_tables with a catch, IN_PROCESS_MAX_BRANCHES per function": (
            module([TRY_TABLE * (comp.IN_PROCESS_MAX_BRANCHES // 2)] * (63 * 1024 // 4508))
        ),
        "worker: 6,000 table.copy in one function": module([TABLE_COPY * 6000]),
        "worker: 6,000 call_indirect in one function": module([CALL_INDIRECT * 6000]),
        "reference: fixtures/wasi-std (ordinary Rust)": (
            ROOT / "fixtures" / "wasi-std" / "wasi-std.wasm"
        ).read_bytes(),
    }


CHILD = r"""
import json, resource, sys, time, wasmtime
sys.path.insert(0, sys.argv[1])
from wasihost.engine.compile_worker import build_config
options = json.loads(sys.argv[2])
wasm = sys.stdin.buffer.read()
engine = wasmtime.Engine(build_config(options))
t0, c0 = time.perf_counter(), time.process_time()
artifact = wasmtime.Module(engine, wasm).serialize()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
print(json.dumps({"wall": wall, "cpu": cpu, "artifact": len(artifact),
                  "rss_kb": int(status["VmHWM"].split()[0]),
                  "vm_kb": int(status["VmPeak"].split()[0])}))
"""


def compile_in_child(wasm: bytes, options: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), options],
        input=wasm,
        capture_output=True,
        check=True,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"},
    )
    result: dict[str, float] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of each shape")
    parser.add_argument("--only", default="", help="only the shapes whose name contains this")
    args = parser.parse_args()
    options = json.dumps(engine_options(EngineSettings()))
    print(f"load: {os.getloadavg()}  cpus: {os.cpu_count()}")
    base = compile_in_child(module([b""]), options)
    print(
        f"a worker compiling an empty function peaks at {base['rss_kb'] / 1024:.0f} MB RSS, "
        f"{base['vm_kb'] / 1024:.0f} MB of address space; +RSS below is over that"
    )
    print(f"{'shape':<72} {'KB':>7} {'scan ms':>8} {'wall s':>7} {'cpu s':>6} {'+RSS MB':>7}"
          f" {'VM MB':>6} {'ms/KB':>6} {'MB/KB':>6}")  # fmt: skip
    for name, wasm in shapes(args.quick).items():
        if args.only not in name:
            continue
        t0 = time.perf_counter()
        scan_code(wasm)  # raises if the pre-check would refuse it
        scan_ms = (time.perf_counter() - t0) * 1000
        r = compile_in_child(wasm, options)
        kb = len(wasm) / 1024
        grown = (r["rss_kb"] - base["rss_kb"]) / 1024
        print(
            f"{name:<72} {kb:7.0f} {scan_ms:8.0f} {r['wall']:7.2f} {r['cpu']:6.2f} "
            f"{grown:7.0f} {r['vm_kb'] / 1024:6.0f} {r['cpu'] * 1000 / kb:6.1f} "
            f"{grown / kb:6.2f}"
        )


if __name__ == "__main__":
    main()
