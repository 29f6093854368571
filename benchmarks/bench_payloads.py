"""Payload throughput: a 64 KiB and a 1 MiB echo in one call, through each public API, in MB/s.

- ``wasihost bytes``: ``Extension.call("echo-bytes", data)`` on fixtures/rawecho, an ABI 1.1 raw
  byte command (manifest ``input = output = "bytes"``): one host copy in, the guest's copy, one
  host copy out, no CBOR.
- ``wasihost cbor``: ``Extension.call("echo", data)`` on the same guest, the value being one
  byte string: the host's CBOR codec and the guest SDK's on the way.
- ``extism``: Extism's Python SDK (when installed: ``pip install extism==1.1.1``) calling a WAT
  echo plugin that copies its input to its output through the kernel's ``input_load_u64`` and
  ``store_u64``, as Extism's own PDKs do, and ``output_set``.

Both wasihost cases run with the package's limits raised to 1 MiB (the defaults are 128 KiB in,
64 KiB out) and the default fuel. The cases are interleaved (each repeat runs every case once,
in turn) so that a change in machine load hits all of them alike; ``RUST_BACKTRACE=0``.

Usage: ``python benchmarks/bench_payloads.py [--calls N] [--repeats R] [--json]``.
Target (issue 12 section 1): a 1 MiB echo at >= 2 GB/s in one call through the public API.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # set before wasmtime loads

import wasmtime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wasihost.benchmark.guests import EXTISM_PLUGIN_WAT
from wasihost.benchmark.hosts import bench_policy
from wasihost.host.runtime import Host

RAWECHO = ROOT / "fixtures" / "rawecho"
SIZES = {"64KiB": 64 * 1024, "1MiB": 1024 * 1024}
TARGET_BYTES_PER_S = 2e9

def _package(tmp: Path) -> Path:
    """fixtures/rawecho with 1 MiB input and output limits."""
    package = tmp / "rawecho"
    package.mkdir()
    shutil.copy(RAWECHO / "rawecho.wasm", package / "rawecho.wasm")
    text = (RAWECHO / "extension.toml").read_text()
    limits = "[resources]\nmax_input_bytes = 1_048_576\nmax_output_bytes = 1_048_576\n\n"
    (package / "extension.toml").write_text(text.replace("[commands]", limits + "[commands]"))
    return package


def _extism() -> Callable[[bytes], bytes] | None:
    try:
        import extism  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    plugin = extism.Plugin(bytes(wasmtime.wat2wasm(EXTISM_PLUGIN_WAT)), wasi=False)
    return lambda data: bytes(plugin.call("echo", data))


def run(calls: int, repeats: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp, Host(bench_policy(), cache_dir=None) as h:
        ext = h.load(_package(Path(tmp)), grants=[])
        ext.start()
        peers: dict[str, Callable[[bytes], object]] = {
            "wasihost bytes": lambda data: ext.call("echo-bytes", data),
            "wasihost cbor": lambda data: ext.call("echo", data),
        }
        extism = _extism()
        if extism is not None:
            peers["extism"] = extism
        results: dict[str, object] = {}
        fuel: dict[str, int] = {}
        for label, size in SIZES.items():
            data = bytes(range(256)) * (size // 256)
            for name, fn in peers.items():
                assert fn(data) == data, name  # also warms each path up
                if name.startswith("wasihost"):
                    fuel[f"{name} {label}"] = ext.last_fuel_used
            samples: dict[str, list[float]] = {name: [] for name in peers}
            for _ in range(repeats):
                for name, fn in peers.items():
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn(data)
                    samples[name].append((time.perf_counter() - start) / calls)
            for name, times in samples.items():
                results[f"{name} {label}"] = {
                    "median_us": statistics.median(times) * 1e6,
                    "best_MBps": size / min(times) / 1e6,
                    "median_MBps": size / statistics.median(times) / 1e6,
                    "worst_MBps": size / max(times) / 1e6,
                }
        one_mib = results["wasihost bytes 1MiB"]
        assert isinstance(one_mib, dict)
        return {
            "results": results,
            "fuel": fuel,
            "target_met": one_mib["median_MBps"] * 1e6 >= TARGET_BYTES_PER_S,
            "load": os.getloadavg(),
            "wasmtime": wasmtime.__name__,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.calls, args.repeats)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"load average {report['load']}")
    results = report["results"]
    assert isinstance(results, dict)
    for case, r in results.items():
        print(
            f"{case:24} {r['median_us']:9.0f} us  {r['median_MBps']:7.0f} MB/s median "
            f"({r['worst_MBps']:.0f}-{r['best_MBps']:.0f})"
        )
    print(f"fuel: {report['fuel']}")
    print(f"1 MiB echo >= 2 GB/s: {'met' if report['target_met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
