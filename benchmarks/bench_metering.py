"""What metering costs: fuel and epoch interruption, and what the compiled-module cache saves.

Part 1 runs the same CPU-bound guest command (fixtures/compute, ``run {"n": N}``) on four
engines that differ only in metering: none, fuel, epoch, both. wasihost always runs with both;
this shows the price. Part 2 times getting a runnable module three ways: compiling it, loading
it from wasihost's authenticated disk cache, and taking it from the in-memory cache.

Usage: ``python benchmarks/bench_metering.py [--n 30000000] [--repeats 7] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"

import cbor2
import wasmtime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wasihost.core.settings import EngineSettings
from wasihost.engine import WasmEngine

COMPUTE = ROOT / "fixtures" / "compute" / "compute.wasm"
BIG_FUEL = 10**15


def _guest(wasm: bytes, fuel: bool, epoch: bool) -> tuple[wasmtime.Store, dict[str, object]]:
    config = wasmtime.Config()
    config.consume_fuel = fuel
    config.epoch_interruption = epoch
    engine = wasmtime.Engine(config)
    store = wasmtime.Store(engine)
    module = wasmtime.Module(engine, wasm)
    imports = [wasmtime.Func(store, i.type, lambda *a: -9) for i in module.imports]
    if fuel:
        store.set_fuel(BIG_FUEL)
    if epoch:
        store.set_epoch_deadline(1_000_000)
    exports = wasmtime.Instance(store, module, imports).exports(store)
    return store, dict(exports)


def _call(store: wasmtime.Store, exports: dict[str, object], cmd: str, value: object) -> bytes:
    data = cmd.encode() + cbor2.dumps(value)
    alloc, call, memory = exports["wasihost_alloc"], exports["wasihost_call"], exports["memory"]
    ptr = alloc(store, len(data)) & 0xFFFFFFFF  # type: ignore[operator]
    memory.write(store, data, ptr)  # type: ignore[attr-defined]
    packed = call(store, ptr, len(cmd), len(data) - len(cmd)) & 0xFFFFFFFFFFFFFFFF  # type: ignore[operator]
    rp, rl = packed >> 32, packed & 0xFFFFFFFF
    return bytes(memory.read(store, rp, rp + rl))  # type: ignore[attr-defined]


def metering(n: int, repeats: int) -> dict[str, float]:
    wasm = COMPUTE.read_bytes()
    variants = {
        "none": (False, False),
        "fuel": (True, False),
        "epoch": (False, True),
        "fuel+epoch": (True, True),
    }
    guests = {}
    for name, (fuel, epoch) in variants.items():
        store, exports = _guest(wasm, fuel, epoch)
        hello = {"host": "wasihost", "abi": ["1.0"]}
        _call(store, exports, "wasihost.hello", hello)
        welcome = {"runtime_id": bytes(16), "granted": [], "epoch": 0}
        _call(store, exports, "wasihost.welcome", welcome)
        guests[name] = (store, exports, fuel, epoch)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    expected = None
    for _ in range(repeats):
        for name, (store, exports, fuel, epoch) in guests.items():
            if fuel:
                store.set_fuel(BIG_FUEL)
            if epoch:
                store.set_epoch_deadline(1_000_000)
            start = time.perf_counter()
            out = _call(store, exports, "run", {"n": n})
            samples[name].append(time.perf_counter() - start)
            expected = expected or out
            assert out == expected, "variants must compute the same result"
    base = statistics.median(samples["none"])
    return {name: statistics.median(s) / base for name, s in samples.items()} | {
        "none_ms": base * 1000
    }


FIB_WAT = """(module (func $fib (export "fib") (param i32) (result i32)
  (if (result i32) (i32.lt_u (local.get 0) (i32.const 2)) (then (local.get 0))
    (else (i32.add (call $fib (i32.sub (local.get 0) (i32.const 1)))
                   (call $fib (i32.sub (local.get 0) (i32.const 2))))))))"""


def call_heavy(n: int, repeats: int) -> dict[str, float]:
    """Recursive fib: almost nothing but calls, where metering checks weigh most."""
    wasm = wasmtime.wat2wasm(FIB_WAT)
    funcs = {}
    for name, (fuel, epoch) in {
        "none": (False, False),
        "fuel": (True, False),
        "epoch": (False, True),
        "fuel+epoch": (True, True),
    }.items():
        config = wasmtime.Config()
        config.consume_fuel = fuel
        config.epoch_interruption = epoch
        engine = wasmtime.Engine(config)
        store = wasmtime.Store(engine)
        instance = wasmtime.Instance(store, wasmtime.Module(engine, wasm), [])
        funcs[name] = (store, instance.exports(store)["fib"], fuel, epoch)
    samples: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(repeats):
        for name, (store, fib, fuel, epoch) in funcs.items():
            if fuel:
                store.set_fuel(BIG_FUEL)
            if epoch:
                store.set_epoch_deadline(1_000_000)
            start = time.perf_counter()
            fib(store, n)  # type: ignore[operator]
            samples[name].append(time.perf_counter() - start)
    base = statistics.median(samples["none"])
    return {name: statistics.median(s) / base for name, s in samples.items()} | {
        "none_ms": base * 1000
    }


def cache(repeats: int) -> dict[str, float]:
    wasm = COMPUTE.read_bytes()
    import hashlib

    sha = hashlib.sha256(wasm).hexdigest()
    compile_s, disk_s, memory_s = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            directory = Path(tmp) / f"c{i}"
            engine = WasmEngine(EngineSettings(), directory)
            t = time.perf_counter()
            engine.compile(wasm, sha)
            compile_s.append(time.perf_counter() - t)
            engine.close()
            engine = WasmEngine(EngineSettings(), directory)
            t = time.perf_counter()
            engine.compile(wasm, sha)
            disk_s.append(time.perf_counter() - t)
            assert engine.cache.disk_hits == 1
            t = time.perf_counter()
            engine.compile(wasm, sha)
            memory_s.append(time.perf_counter() - t)
            engine.close()
    c, d, m = (statistics.median(x) for x in (compile_s, disk_s, memory_s))
    return {
        "module_bytes": len(wasm),
        "compile_ms": c * 1000,
        "disk_cache_ms": d * 1000,
        "memory_cache_ms": m * 1000,
        "compile_vs_disk": c / d,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30_000_000, help="compute loop iterations")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = {
        "metering": metering(args.n, args.repeats),
        "call_heavy": call_heavy(30, args.repeats),
        "cache": cache(args.repeats),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    m = report["metering"]
    print(f"compute n={args.n}: unmetered {m['none_ms']:.1f} ms (median of {args.repeats})")
    for name in ("fuel", "epoch", "fuel+epoch"):
        print(f"  {name:11} {m[name]:.2f}x unmetered")
    f = report["call_heavy"]
    print(f"recursive fib(30): unmetered {f['none_ms']:.1f} ms")
    for name in ("fuel", "epoch", "fuel+epoch"):
        print(f"  {name:11} {f[name]:.2f}x unmetered")
    c = report["cache"]
    print(
        f"module of {c['module_bytes']} bytes: compile {c['compile_ms']:.1f} ms, "
        f"authenticated disk cache {c['disk_cache_ms']:.2f} ms, "
        f"memory {c['memory_cache_ms']:.3f} ms "
        f"(compile / disk = {c['compile_vs_disk']:.0f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
