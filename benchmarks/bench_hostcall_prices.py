"""Host CPU per fuel unit of every host-call entry's worst case, beside the guest's own.

A guest's fuel budget (per call, per minute) bounds the host CPU it makes the host spend only
if every host call is priced at least roughly like the guest's own instructions. For each
entry of the ABI registry (abi/v1/registry.json: the core entries and every built-in broker's)
this drives a worst-case request from a real guest (hand-written WAT below: a loop making N
host calls with a request fixed in its memory) and reports

- ``host ns/call``: this thread's CPU time per host call (the command making N calls minus the
  same command making none, divided by N: the cost of entering the guest cancels out);
- ``fuel/call``: the fuel the call was charged (the same difference, from the call's own fuel
  count; the loop's few instructions included);
- ``ns/fuel``: the two divided;
- ``x guest``: that over the guest's own ns per fuel unit, measured in the same rounds by a
  tight wasm loop (``spin``: i32 arithmetic and a branch, no host call).

A ratio of 10 means a guest spending its budget on that call makes the host spend ten times the
CPU time the same budget buys in guest code. Some rows are pairs (``file_temp`` then
``file_close`` of the handle it answered; ``jobs_schedule`` then ``jobs_cancel``): their fuel
and time are the pair's.

The host CPU is the calling thread's (``time.thread_time``): every broker here works on the
guest's thread; the machine's other load mostly drops out. ``abort`` is left out: it ends its
call, so it costs one trap per call, priced by the call's admission, not by fuel.

Usage: ``python benchmarks/bench_hostcall_prices.py [--rounds 5] [--calls 200] [--json]
[--only NAME,...]``. Method: rounds of every case, interleaved, the guest spin first in each;
the median over rounds of each case's ratio, with its range. The load average is printed.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

os.environ["RUST_BACKTRACE"] = "0"

import cbor2
import wasmtime

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from wasihost.benchmark.hosts import bench_policy
from wasihost.brokers.files import FilesBroker
from wasihost.brokers.http import HttpBroker
from wasihost.brokers.jobs import MAX_JOB_INPUT_ITEMS
from wasihost.brokers.secrets import SecretsBroker
from wasihost.brokers.storage import StorageBroker
from wasihost.core.event_classes import MAX_SELECTORS
from wasihost.core.manifest import parse_manifest
from wasihost.host.defaults import default_registry
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package
from wasihost.store.secrets import MemorySecretStore
from wasihost.wasi import limits as wasi_limits

REQ_AT = 65536  # requests are laid out from here, one after another
RESP_AT = 8192  # the response buffer (room for the largest response, 61,440 bytes)
RESP2_AT = 4096  # the second call's response of a pair
SPIN_LOOP_UNROLL = 4

MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "bench.prices"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["log", "clock", "random", "storage", "secrets", "files", "events", "jobs", "http"]

[commands]
job = {}
s0 = {}
COMMANDS

[jobs]
commands = ["job"]
max_jobs = 32

[events]
classes = EVENT_CLASSES
command = "job"

[http]
allowed_origins = ["ORIGIN"]
bytes_per_hour = 1_073_741_824
"""
# The manifest's event classes: the most a manifest may list (event_classes.MAX_SELECTORS), the
# one a subscription matches last, so that events_subscribe compares it with all of them.
EVENT_CLASSES = (
    "["
    + ", ".join(f'"bench{i:02d}.{"q" * 100}.*"' for i in range(MAX_SELECTORS - 1))
    + ', "bench.*"]'
)
HTTP_NAME = "api.bench"  # resolved to 127.0.0.1 by the benchmark's resolver
HTTP_BODY = 48 * 1024  # the registry's most: a 61,440-byte response holds it

KEY = "k" * 255  # a key of 255 bytes (the registry's bound is 256)
BIG = 32768
CHAIN_LINKS = wasi_limits.MAX_SYMLINK_FOLLOWS  # 40, the resolution's own bound
# 4 KiB requests of many data items (the codec's limit is 4,096): CBOR arrays of 4,091 empty
# arrays, of 1,280 float16s, and of 4,088 empty arrays then a text of invalid UTF-8.
ITEMS_EMPTY_ARRAYS = b"\x99\x0f\xfb" + b"\x80" * 4091
ITEMS_FLOAT16 = b"\x99\x05\x00" + b"\xf9\x3c\x00" * 1280
ITEMS_BAD_AT_END = b"\x99\x0f\xf9" + b"\x80" * 4088 + b"\x62\xff\xff"


class Case(NamedTuple):
    """One row: the import called (and a second one fed the first's response, for a pair),
    the request, the response room, the host calls per command."""

    name: str
    entry: str
    request: bytes
    room: int
    calls: int
    then: str | None = None


def _cases(calls: int, origin: str = "http://api.bench:1") -> list[Case]:
    def c(name: str, entry: str, req: Any, room: int, n: int = calls, then: str | None = None):
        raw = req if isinstance(req, bytes) else cbor2.dumps(req)
        return Case(name, entry, raw, room, n, then)

    return [
        c("log 64 B", "log", [2, "x" * 60], 16),
        c("log 4 KiB", "log", [2, "x" * 4088], 16),
        # A request's decode costs the host per data item (engine/hostcalls.py,
        # FUEL_PER_REQUEST_ITEM): the slowest shapes the codec's 4,096-item limit lets into a
        # 4 KiB request, and one whose fault at its end makes the exact decoder run too.
        c("log items: empty arrays", "log", ITEMS_EMPTY_ARRAYS, 16),
        c("log items: float16s", "log", ITEMS_FLOAT16, 16),
        c("log items: bad at end", "log", ITEMS_BAD_AT_END, 16),
        c(
            "jobs_schedule items+cancel",
            "jobs_schedule",
            # An input of the most items a job's may hold (brokers/jobs.py).
            {"command": "job", "input": [[]] * (MAX_JOB_INPUT_ITEMS - 1), "delay_ms": 3_600_000},
            16,
            then="jobs_cancel",
        ),
        c("clock_now", "clock_now", "monotonic", 16),
        c("random_bytes 1", "random_bytes", 1, 16),
        c("random_bytes 4096", "random_bytes", 4096, 4099),
        c("storage_get 1 B key", "storage_get", "s", 32771),
        c("storage_get 32 KiB", "storage_get", KEY, 32771),
        c("storage_put 1 B", "storage_put", ["p", b"v"], 16),
        c("storage_put 32 KiB", "storage_put", [KEY, b"v" * BIG], 16),
        c("storage_delete", "storage_delete", "missing", 16),
        c("storage_list 100 keys", "storage_list", ["l", None, 100], 26624),
        c("storage_cas 32 KiB", "storage_cas", [KEY, b"v" * BIG, b"v" * BIG], 16),
        c("secret_hmac 1 B", "secret_hmac", ["tok", b"x"], 64),
        c("secret_hmac 16 KiB", "secret_hmac", ["tok", b"x" * 16384], 64),
        c("file_open chain", "file_open", ["m", "chain/end", "r"], 16),
        c("file_open 1 dir", "file_open", ["m", "none", "r"], 16),
        c("file_temp+close", "file_temp", b"\xf6", 16, max(1, calls // 4), then="file_close"),
        c("file_read 32 KiB", "file_read", [1, 0, BIG], 32771),
        c("file_read 1 B", "file_read", [1, 0, 1], 16),
        c("file_write 1 B", "file_write", [2, 0, b"x"], 16),
        c("file_write 32 KiB", "file_write", [2, 0, b"x" * BIG], 16),
        c("file_close missing", "file_close", 999, 16),
        c("events_subscribe 64 classes", "events_subscribe", "bench.a", 16),
        c("events_unsubscribe", "events_unsubscribe", "bench.none", 16),
        c(
            "jobs_schedule+cancel",
            "jobs_schedule",
            {"command": "job", "input": "x" * 4000, "delay_ms": 3_600_000},
            16,
            then="jobs_cancel",
        ),
        c("jobs_cancel missing", "jobs_cancel", 999, 16),
        c(
            "http_request 48 KiB",
            "http_request",
            {"method": "GET", "url": origin + "/big", "headers": [], "body": None},
            61440,
            max(1, calls // 4),
        ),
        c(
            "http_request 0 B",
            "http_request",
            {"method": "GET", "url": origin + "/", "headers": [], "body": None},
            61440,
            max(1, calls // 4),
        ),
    ]


class _Answer(http.server.BaseHTTPRequestHandler):
    """The benchmark's HTTP server: ``/big`` answers HTTP_BODY bytes, anything else none."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = b"x" * HTTP_BODY if self.path == "/big" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_http() -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{HTTP_NAME}:{server.server_address[1]}"


def _escape(blob: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in blob)


def guest_wat(cases: list[Case]) -> tuple[str, list[int]]:
    """The guest: command ``sN`` spins N loops; command ``cI`` with input N makes case I's
    call N times (``zI``: its loop with no call); each answers null."""
    entries = sorted({c.entry for c in cases} | {c.then for c in cases if c.then})
    imports = "".join(
        f'(import "wasihost_v1" "{e}" (func ${e} (param i32 i32 i32 i32) (result i32)))'
        for e in entries
    )
    data, at, offsets = [], REQ_AT, []
    for case in cases:
        offsets.append(at)
        data.append(f'(data (i32.const {at}) "{_escape(case.request)}")')
        at += (len(case.request) + 15) // 16 * 16
    pages = at // 65536 + 1
    bodies = []
    for i, (case, off) in enumerate(zip(cases, offsets, strict=True)):
        call = (
            f"(local.set $r (call ${case.entry} (i32.const {off}) (i32.const {len(case.request)})"
            f" (i32.const {RESP_AT}) (i32.const {case.room})))"
        )
        if case.then:
            call += (
                f"(drop (call ${case.then} (i32.const {RESP_AT}) (local.get $r)"
                f" (i32.const {RESP2_AT}) (i32.const 16)))"
            )
        bodies.append(
            f"""(if (i32.eq (local.get $id) (i32.const {i}))
      (then (block $done (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        (if (local.get $real) (then {call}))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again)))))"""
        )
    # A dependency chain the compiler cannot fold (an add folded into one would make guest
    # code look ~2x cheaper per unit than any real guest's): shifts, xors, adds, rotates.
    spin_body = (
        "(local.set $x (i32.xor (i32.add (local.get $x) (local.get $r))"
        " (i32.shl (local.get $x) (i32.const 3))))"
        "(local.set $r (i32.add (local.get $r) (i32.rotl (local.get $x) (i32.const 7))))"
    ) * SPIN_LOOP_UNROLL
    hello = b"\x00\x00\x00\x00" + cbor2.dumps(
        {"id": "bench.prices", "version": "0.1.0", "abi": "1.1", "features": []}
    )
    welcome = b"\x00\x00\x00\x00" + cbor2.dumps({"status": "ready"})
    wat = f"""(module
  (@custom "wasihost_abi" "1.1")
  {imports}
  (memory (export "memory") {pages})
  (data (i32.const 1024) "{_escape(hello)}")
  (data (i32.const 2048) "{_escape(welcome)}")
  (data (i32.const 3072) "\\00\\00\\00\\00\\f6")
  {"".join(data)}
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 32768))
  (func $uint (param $p i32) (param $n i32) (result i32)
    (local $b i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 0))))
    (local.set $b (i32.load8_u (local.get $p)))
    (if (i32.lt_u (local.get $b) (i32.const 24)) (then (return (local.get $b))))
    (if (i32.eq (local.get $b) (i32.const 24))
      (then (return (i32.load8_u offset=1 (local.get $p)))))
    (if (i32.eq (local.get $b) (i32.const 25))
      (then (return (i32.or (i32.shl (i32.load8_u offset=1 (local.get $p)) (i32.const 8))
                            (i32.load8_u offset=2 (local.get $p))))))
    (if (i32.eq (local.get $b) (i32.const 26))
      (then (return (i32.or
        (i32.or (i32.shl (i32.load8_u offset=1 (local.get $p)) (i32.const 24))
                (i32.shl (i32.load8_u offset=2 (local.get $p)) (i32.const 16)))
        (i32.or (i32.shl (i32.load8_u offset=3 (local.get $p)) (i32.const 8))
                (i32.load8_u offset=4 (local.get $p)))))))
    (i32.const 0))
  (func (export "wasihost_call") (param $ptr i32) (param $cmd_len i32) (param $in_len i32)
    (result i64)
    (local $n i32) (local $r i32) (local $x i32) (local $id i32) (local $real i32)
    (if (i32.eq (local.get $cmd_len) (i32.const 14))
      (then (return (i64.const {1024 << 32 | len(hello)}))))
    (if (i32.eq (local.get $cmd_len) (i32.const 16))
      (then (return (i64.const {2048 << 32 | len(welcome)}))))
    (local.set $n (call $uint (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)))
    (if (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 115))  ;; "s": spin
      (then
        (local.set $n (i32.mul (local.get $n) (i32.const 1000)))
        (block $done (loop $again
          (br_if $done (i32.eqz (local.get $n)))
          {spin_body}
          (local.set $n (i32.sub (local.get $n) (i32.const 1)))
          (br $again)))
        (return (i64.const {3072 << 32 | 5}))))
    (local.set $real (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 99)))  ;; "c": calls
    (local.set $x (i32.const 1))
    (block $parsed (loop $digit
      (br_if $parsed (i32.ge_u (local.get $x) (local.get $cmd_len)))
      (local.set $id (i32.add (i32.mul (local.get $id) (i32.const 10))
                              (i32.sub (i32.load8_u (i32.add (local.get $ptr) (local.get $x)))
                                       (i32.const 48))))
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (br $digit)))
    {"".join(bodies)}
    (i64.const {3072 << 32 | 5})))
"""
    return wat, offsets


def _make_links(mount: Path) -> None:
    (mount / "d").mkdir()
    run = "d/../" * ((wasi_limits.MAX_PATH_BYTES - 16) // 5)
    names = ["chain"] + [f"l{i}" for i in range(1, CHAIN_LINKS)]
    for i, name in enumerate(names):
        nxt = names[i + 1] if i + 1 < len(names) else "d"
        os.symlink(run + nxt, mount / name)


def measure_case(ext: Any, i: int, n: int) -> tuple[float, float]:
    """(thread CPU seconds, fuel) of N calls of case i, minus its loop without calls."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.thread_time()
        ext.call(f"c{i}", n)
        t1 = time.thread_time()
        f_many = ext.last_fuel_used
        ext.call(f"z{i}", n)
        t2 = time.thread_time()
        f_none = ext.last_fuel_used
    finally:
        gc.enable()
    return (t1 - t0) - (t2 - t1), f_many - f_none


def measure_spin(ext: Any, thousands: int) -> float:
    """Guest ns per fuel unit: a tight loop's CPU time over its fuel."""
    gc.disable()
    try:
        t0 = time.thread_time()
        ext.call("s0", thousands)
        t1 = time.thread_time()
        f = ext.last_fuel_used
        ext.call("s0", 0)
        t2 = time.thread_time()
        f0 = ext.last_fuel_used
    finally:
        gc.enable()
    return ((t1 - t0) - (t2 - t1)) * 1e9 / (f - f0)


def run(rounds: int, calls: int, only: set[str] | None) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server, origin = serve_http()
        all_cases = _cases(calls, origin)
        setup_cases = [
            Case("setup open data", "file_open", cbor2.dumps(["m", "data", "r"]), 16, 1),
            Case("setup open out", "file_open", cbor2.dumps(["m", "out", "w"]), 16, 1),
            *[
                Case(f"setup put {i}", "storage_put", cbor2.dumps([f"l{i:03d}", b"v"]), 16, 1)
                for i in range(101)
            ],
        ]
        host, ext, _ = _setup_with(tmp, all_cases + setup_cases, origin)
        try:
            base = len(all_cases)
            for j in range(len(setup_cases)):
                ext.call(f"c{base + j}", 1)
            index = {c.name: i for i, c in enumerate(all_cases)}
            ext.call(f"c{index['storage_put 32 KiB']}", 1)
            ext.call(f"c{index['storage_put 1 B']}", 1)
            chosen = [c for c in all_cases if only is None or c.name in only]
            spin: list[float] = []
            per: dict[str, dict[str, list[float]]] = {
                c.name: {"ns": [], "fuel": [], "ratio": []} for c in chosen
            }
            for i in chosen:  # warm up
                measure_case(ext, index[i.name], max(1, i.calls // 10))
            for r in range(rounds):
                g = measure_spin(ext, 2000)
                spin.append(g)
                order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
                for case in order:
                    secs, fuel = measure_case(ext, index[case.name], case.calls)
                    ns = secs * 1e9 / case.calls
                    f = fuel / case.calls
                    per[case.name]["ns"].append(ns)
                    per[case.name]["fuel"].append(f)
                    per[case.name]["ratio"].append(ns / f / g if f > 0 else float("inf"))
                ext.log.drain()
        finally:
            host.close()
            server.shutdown()
    rows = {}
    for name, v in per.items():
        rows[name] = {
            "host_ns": statistics.median(v["ns"]),
            "fuel": statistics.median(v["fuel"]),
            "ns_per_fuel": statistics.median(v["ns"]) / max(1e-9, statistics.median(v["fuel"])),
            "ratio": statistics.median(v["ratio"]),
            "ratio_min": min(v["ratio"]),
            "ratio_max": max(v["ratio"]),
        }
    return {
        "rounds": rounds,
        "calls": calls,
        "guest_ns_per_fuel": statistics.median(spin),
        "guest_ns_per_fuel_range": [min(spin), max(spin)],
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }


def _setup_with(tmp: Path, cases: list[Case], origin: str) -> tuple[Host, Any, list[Case]]:
    wat, _ = guest_wat(cases)
    wasm = bytes(wasmtime.wat2wasm(wat))
    mount = tmp / "mount"
    mount.mkdir()
    _make_links(mount)
    (mount / "data").write_bytes(b"x" * BIG)
    files = FilesBroker(max_write_bytes=1 << 40, temp_dir=tmp)
    secrets = SecretsBroker(MemorySecretStore({"tok": b"s" * 32}))
    storage = StorageBroker(tmp / "storage.db")
    web = HttpBroker(resolver=lambda name, port: ["127.0.0.1"])
    caps = {"log", "clock", "random", "storage", "secrets", "files", "events", "jobs", "http"}
    host = Host(bench_policy(caps), cache_dir=None, brokers=[files, secrets, storage, web])
    commands = "\n".join(
        f"c{i} = {{}}" + ("" if c.name.startswith("setup") else f"\nz{i} = {{}}")
        for i, c in enumerate(cases)
    )
    text = (
        MANIFEST.replace("COMMANDS", commands)
        .replace("ORIGIN", origin)
        .replace("EVENT_CLASSES", EVENT_CLASSES)
    )
    manifest = parse_manifest(text, default_registry().capabilities())
    pkg = Package("bench-prices", manifest, wasm, hashlib.sha256(wasm).hexdigest())
    ext = host.admit(pkg, grants=sorted(caps), fuel=10**10, timeout_ms=600_000)
    host.grant(ext.id, "files", {"mounts": {"m": {"host": str(mount), "mode": "rw"}}})
    host.grant(ext.id, "secrets", {"names": ["tok"]})
    host.grant(ext.id, "http", {"allow_local_network": True, "origins": [origin]})
    ext.log.max_bytes = 1 << 30
    return host, ext, cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default=None, help="comma-separated row names")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    report = run(args.rounds, args.calls, only)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    lb = ", ".join(f"{x:.2f}" for x in report["load_before"])
    la = ", ".join(f"{x:.2f}" for x in report["load_after"])
    g0, g1 = report["guest_ns_per_fuel_range"]
    print(f"load average before {lb}, after {la} ({report['cpus']} CPUs); {args.rounds} rounds")
    print(
        f"guest (tight wasm loop): {report['guest_ns_per_fuel']:.3f} ns per fuel unit "
        f"[{g0:.3f}-{g1:.3f}]"
    )
    print(f"{'case':24} {'host ns/call':>12} {'fuel/call':>10} {'ns/fuel':>8} {'x guest':>8} range")
    worst = max(report["rows"].values(), key=lambda r: r["ratio"])
    for name, row in sorted(report["rows"].items(), key=lambda kv: -kv[1]["ratio"]):
        print(
            f"{name:24} {row['host_ns']:12.0f} {row['fuel']:10.0f} {row['ns_per_fuel']:8.2f} "
            f"{row['ratio']:8.1f} {row['ratio_min']:.1f}-{row['ratio_max']:.1f}"
        )
    print(f"worst: {worst['ratio']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
