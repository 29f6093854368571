"""Per-call cost: wasihost against wasmtime-py's generic path and a raw-call floor, one run.

Into the guest (``noop``, ``echo64``): all three run the same guest (fixtures/echo, built on the
guest SDK) through the same ABI sequence: set fuel and deadline, ``wasihost_alloc``, write
command + CBOR input, ``wasihost_call``, read the response.

Out of the guest (``hostcall``): fixtures/hostflood calls its ``log`` import in a loop; the cost
of one host call is the time of a command making 1,000 of them less one making none, over 1,000.
The floor answers with a bare unchecked ctypes callback, generic with a wasmtime-py ``Func`` on
a Python function; both only return a status. wasihost does the whole host call: bounds and
overlap checks, fuel, the grant gate, CBOR decode with limits, and the log broker (answering
``QUOTA_EXCEEDED`` once the extension's log budget is full, as it soon is).

- ``floor``: that sequence with ``wasmtime_func_call_unchecked`` on pre-built raw arrays and no
  checks at all: the least any host on wasmtime-py can spend.
- ``generic``: the same sequence with wasmtime-py's public API (``Func.__call__``,
  ``Memory.read/write``), which converts every value on every call.
- ``wasihost``: ``Extension.call`` — bounds checks, CBOR encode/decode with limits, the lot.

``log64`` and ``embedder64``: a hand-written guest calls, in a loop, either the built-in ``log``
or an embedder function registered with ``Host.function`` (``bench.noop``, answering null),
with the same 64-byte request; per call as for ``hostcall``. Both are served through the same
public broker API: the difference is what each broker does, not how it is reached.

Usage: ``python benchmarks/bench_calls.py [--calls N] [--repeats R] [--only CASE...] [--json]``.
Targets from the core issue: wasihost no-op within 2x of the floor, and at least 5x faster
than generic.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # trap paths are slower with it; set before wasmtime loads

import cbor2
import wasmtime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wasihost.benchmark.guests import loop_guest_wat
from wasihost.benchmark.hosts import bench_policy
from wasihost.engine.benchraw import PublicGuest, RawFloor, RawModule
from wasihost.host.runtime import Host

ECHO = ROOT / "fixtures" / "echo"
HOSTFLOOD = ROOT / "fixtures" / "hostflood"
HOST_CALLS = 1000  # log calls per timed command
PAYLOAD = bytes(range(64))


def _time(fns: dict[str, Callable[[], object]], calls: int, repeats: int) -> dict[str, float]:
    """Per-call µs of each function: median over ``repeats`` rounds.

    Rounds interleave the contenders, so drift of the machine (frequency, a busy neighbour on
    the other core) hits all of them alike instead of whichever happened to run last.
    """
    for fn in fns.values():
        for _ in range(min(calls, 1000)):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def handshake(guest: PublicGuest | RawFloor) -> None:
    hello = {"host": "wasihost", "abi": ["1.0"]}
    guest.call(b"wasihost.hello", cbor2.dumps(hello))
    welcome = {"runtime_id": bytes(16), "granted": [], "epoch": 0}
    guest.call(b"wasihost.welcome", cbor2.dumps(welcome))


def host_calls(host: Host, calls: int, repeats: int) -> dict[str, float]:
    """Per host call µs: (a command making HOST_CALLS calls - one making none) / HOST_CALLS."""
    wasm = (HOSTFLOOD / "hostflood.wasm").read_bytes()
    module = RawModule(wasm)
    public = module.instantiate()
    floor_guest = module.instantiate(raw_imports=True)
    handshake(public)
    handshake(floor_guest)
    floor = RawFloor(floor_guest)
    ext = host.load(HOSTFLOOD)
    many, none = cbor2.dumps({"calls": HOST_CALLS}), cbor2.dumps({"calls": 0})
    assert ext.call("run", {"calls": HOST_CALLS}) == {"calls": HOST_CALLS}
    rounds = max(1, calls // HOST_CALLS)
    timed = _time(
        {
            "floor_many": lambda: floor.call(b"run", many),
            "floor_none": lambda: floor.call(b"run", none),
            "generic_many": lambda: public.call(b"run", many),
            "generic_none": lambda: public.call(b"run", none),
            "wasihost_many": lambda: ext.call("run", {"calls": HOST_CALLS}),
            "wasihost_none": lambda: ext.call("run", {"calls": 0}),
        },
        rounds,
        repeats,
    )
    row = {
        kind: (timed[f"{kind}_many"] - timed[f"{kind}_none"]) / HOST_CALLS
        for kind in ("floor", "generic", "wasihost")
    }
    row = {f"{kind}_us": value for kind, value in row.items()}
    row["wasihost_vs_floor"] = row["wasihost_us"] / row["floor_us"]
    row["generic_vs_wasihost"] = row["generic_us"] / row["wasihost_us"]
    return row


# [2, 60 characters]: a valid ``log`` request of exactly 64 bytes of CBOR.
REQUEST64 = cbor2.dumps([2, "x" * 60])
assert len(REQUEST64) == 64


def request_calls(calls: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per host call µs of ``log`` and of an embedder function, each with a 64-byte request."""
    from wasihost.packaging.package import Package

    host = Host(bench_policy({"log", "bench"}), cache_dir=None)
    host.add_function(
        "bench.noop",
        lambda ctx, request: None,
        capability="bench",
        max_request_bytes=4096,
        max_response_bytes=16,
        fuel_base=500,
        fuel_per_byte=2,
    )
    exts = {}
    for case, module, name, cap in (
        ("log64", "wasihost_v1", "log", "log"),
        ("embedder64", "bench_v1", "noop", "bench"),
    ):
        wasm = bytes(wasmtime.wat2wasm(loop_guest_wat(module, name, REQUEST64, "bench")))
        package = Package(f"{case}.wasm", None, wasm, hashlib.sha256(wasm).hexdigest())
        # 1,000 log calls at about 15,130 units each are more than the default budget of a call.
        exts[case] = host.admit(package, grants=[cap], fuel=100_000_000)
        assert exts[case].call("run", HOST_CALLS) is None
    rounds = max(1, calls // HOST_CALLS)
    fns: dict[str, Callable[[], object]] = {}
    for case, ext in exts.items():
        fns[f"{case}_many"] = lambda ext=ext: ext.call("run", HOST_CALLS)
        fns[f"{case}_none"] = lambda ext=ext: ext.call("run", 0)
    timed = _time(fns, rounds, repeats)
    host.close()
    return {
        case: {"wasihost_us": (timed[f"{case}_many"] - timed[f"{case}_none"]) / HOST_CALLS}
        for case in exts
    }


def run(calls: int, repeats: int, only: frozenset[str] = frozenset()) -> dict[str, object]:
    wasm = (ECHO / "echo.wasm").read_bytes()
    public = RawModule(wasm).instantiate()
    handshake(public)
    floor = RawFloor(public)
    null = cbor2.dumps(None)
    echo_in = cbor2.dumps(PAYLOAD)
    expected_noop = b"\0\0\0\0" + null
    expected_echo = b"\0\0\0\0" + echo_in
    assert public.call(b"noop", null) == expected_noop
    assert floor.call(b"noop", null) == expected_noop
    assert floor.call(b"echo", echo_in) == expected_echo

    host = Host(bench_policy({"log", "clock", "random"}), cache_dir=None)
    ext = host.load(ECHO)
    assert ext.call("noop") is None
    assert ext.call("echo", PAYLOAD) == PAYLOAD

    results: dict[str, dict[str, float]] = {}
    if not only or "hostcall" in only:
        results["hostcall"] = host_calls(host, calls, repeats)
    if not only or only & {"log64", "embedder64"}:
        results.update(request_calls(calls, repeats))
    for name, cmd, value, encoded in (
        ("noop", "noop", None, null),
        ("echo64", "echo", PAYLOAD, echo_in),
    ):
        if only and name not in only:
            continue
        bcmd = cmd.encode()
        timed = _time(
            {
                "floor_us": lambda: floor.call(bcmd, encoded),
                "generic_us": lambda: public.call(bcmd, encoded),
                "wasihost_us": lambda: ext.call(cmd, value),
            },
            calls,
            repeats,
        )
        row = dict(timed)
        row["wasihost_vs_floor"] = row["wasihost_us"] / row["floor_us"]
        row["generic_vs_wasihost"] = row["generic_us"] / row["wasihost_us"]
        results[name] = row
    host.close()
    return {
        "wasmtime": importlib.metadata.version("wasmtime"),
        "calls": calls,
        "repeats": repeats,
        "results": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--only", nargs="+", default=[], help="cases: hostcall noop echo64 log64 embedder64"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args.calls, args.repeats, frozenset(args.only))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"wasmtime {report['wasmtime']}, {args.calls} calls x {args.repeats} repeats (median)")
    print(
        f"{'case':8} {'floor µs':>9} {'generic µs':>11} {'wasihost µs':>12} {'vs floor':>9} "
        f"{'generic/wasihost':>17}"
    )
    for name, row in report["results"].items():  # type: ignore[attr-defined]
        if "floor_us" not in row:
            print(f"{name:8} {'':9} {'':11} {row['wasihost_us']:12.2f}")
            continue
        print(
            f"{name:8} {row['floor_us']:9.2f} {row['generic_us']:11.2f} {row['wasihost_us']:12.2f} "
            f"{row['wasihost_vs_floor']:8.2f}x {row['generic_vs_wasihost']:16.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
