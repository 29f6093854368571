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
import ctypes
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
from wasmtime import _bindings as raw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wasihost.policy import Policy
from wasihost.runtime import Host

ECHO = ROOT / "fixtures" / "echo"
HOSTFLOOD = ROOT / "fixtures" / "hostflood"
HOST_CALLS = 1000  # log calls per timed command
UNSUPPORTED = -9
FUEL = 10_000_000
PAYLOAD = bytes(range(64))


def _engine() -> wasmtime.Engine:
    config = wasmtime.Config()
    config.consume_fuel = True
    config.epoch_interruption = True
    return wasmtime.Engine(config)


# The floor's host function: a bare unchecked callback that stores a status and returns.
_RAW_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)
_RAW_FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_RAW_CALLBACK  # type: ignore[untyped-decorator]
def _answer_unsupported(env: int, caller: int, args: int, nargs: int) -> int:
    ctypes.c_int32.from_address(args).value = UNSUPPORTED
    return 0


@_RAW_FINALIZER  # type: ignore[untyped-decorator]
def _no_finalizer(env: int) -> None:
    pass


class PublicGuest:
    """A guest driven through wasmtime-py's public, generic API; its imports answer
    UNSUPPORTED, through generic ``Func`` objects or (``raw_imports``) bare unchecked ones."""

    def __init__(self, wasm: bytes, *, raw_imports: bool = False) -> None:
        self.engine = _engine()
        self.store = wasmtime.Store(self.engine)
        module = wasmtime.Module(self.engine, wasm)
        imports = []
        for imp in module.imports:
            ty = imp.type
            assert isinstance(ty, wasmtime.FuncType)
            if raw_imports:
                imports.append(self._raw_func(ty))
            else:
                imports.append(wasmtime.Func(self.store, ty, lambda *a: UNSUPPORTED))
        self.store.set_fuel(FUEL)
        self.store.set_epoch_deadline(1_000_000)
        instance = wasmtime.Instance(self.store, module, imports)
        exports = instance.exports(self.store)
        self.memory = exports["memory"]
        self.alloc = exports["wasihost_alloc"]
        self.call_fn = exports["wasihost_call"]
        self.instance = instance

    def _raw_func(self, ty: wasmtime.FuncType) -> wasmtime.Func:
        new = raw.dll["wasmtime_func_new_unchecked"]
        new.restype = None
        vp = ctypes.c_void_p
        new.argtypes = [vp, vp, _RAW_CALLBACK, vp, _RAW_FINALIZER, vp]
        func = raw.wasmtime_func_t()
        ctx = ctypes.cast(self.store._context(), vp)
        new(ctx, ctypes.cast(ty.ptr(), vp), _answer_unsupported, None, _no_finalizer,
            ctypes.addressof(func))  # fmt: skip
        return wasmtime.Func._from_raw(func)

    def call(self, command: bytes, payload: bytes) -> bytes:
        store = self.store
        store.set_fuel(FUEL)
        store.set_epoch_deadline(1_000_000)
        total = len(command) + len(payload)
        ptr = self.alloc(store, total) & 0xFFFFFFFF
        self.memory.write(store, command + payload, ptr)
        packed = self.call_fn(store, ptr, len(command), len(payload)) & 0xFFFFFFFFFFFFFFFF
        rp, rl = packed >> 32, packed & 0xFFFFFFFF
        return bytes(self.memory.read(store, rp, rp + rl))


class RawFloor:
    """The same sequence with unchecked raw calls and nothing else: the floor."""

    def __init__(self, guest: PublicGuest) -> None:
        self.guest = guest
        ctx = guest.store._context()
        self.ctx = ctypes.cast(ctx, ctypes.c_void_p).value
        vp = ctypes.c_void_p

        def fn(name: str, restype: object, *args: object) -> Callable[..., object]:
            f = raw.dll[name]
            f.restype = restype
            f.argtypes = list(args)
            return f  # type: ignore[no-any-return]

        self.call_unchecked = fn(
            "wasmtime_func_call_unchecked", vp, vp, vp, vp, ctypes.c_size_t, vp
        )
        self.mem_data = fn("wasmtime_memory_data", vp, vp, vp)
        self.set_fuel = fn("wasmtime_context_set_fuel", vp, vp, ctypes.c_uint64)
        self.set_deadline = fn("wasmtime_context_set_epoch_deadline", None, vp, ctypes.c_uint64)
        self.alloc = guest.alloc._func
        self.callf = guest.call_fn._func
        self.mem = guest.memory._memory
        self.alloc_addr = ctypes.addressof(self.alloc)
        self.call_addr = ctypes.addressof(self.callf)
        self.mem_addr = ctypes.addressof(self.mem)
        self.a1 = (raw.wasmtime_val_raw_t * 1)()
        self.a3 = (raw.wasmtime_val_raw_t * 3)()
        self.a1_addr = ctypes.addressof(self.a1)
        self.a3_addr = ctypes.addressof(self.a3)
        self.trap = ctypes.c_void_p(0)
        self.trap_addr = ctypes.addressof(self.trap)

    def call(self, command: bytes, payload: bytes) -> bytes:
        ctx = self.ctx
        self.set_fuel(ctx, FUEL)
        self.set_deadline(ctx, 1_000_000)
        data = command + payload
        self.a1[0].i32 = len(data)
        self.call_unchecked(ctx, self.alloc_addr, self.a1_addr, 1, self.trap_addr)
        ptr = self.a1[0].i32 & 0xFFFFFFFF
        base = self.mem_data(ctx, self.mem_addr)
        ctypes.memmove(base + ptr, data, len(data))
        a3 = self.a3
        a3[0].i32 = ptr
        a3[1].i32 = len(command)
        a3[2].i32 = len(payload)
        self.call_unchecked(ctx, self.call_addr, self.a3_addr, 3, self.trap_addr)
        packed = a3[0].i64 & 0xFFFFFFFFFFFFFFFF
        return ctypes.string_at(
            self.mem_data(ctx, self.mem_addr) + (packed >> 32), packed & 0xFFFFFFFF
        )


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
    public = PublicGuest(wasm)
    floor_guest = PublicGuest(wasm, raw_imports=True)
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


def _escaped(blob: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in blob)


def _loop_guest(module: str, name: str) -> bytes:
    """A guest whose command calls ``module.name`` with REQUEST64 as many times as its input
    (a CBOR uint below 65,536) says, and answers null."""
    status = b"\0\0\0\0"
    hello = status + cbor2.dumps({"id": "bench", "version": "0.1.0", "abi": "1.0", "features": []})
    welcome = status + cbor2.dumps({"status": "ready"})
    return bytes(
        wasmtime.wat2wasm(f"""
(module
  (@custom "wasihost_abi" "1.0")
  (@custom "wasihost_abi.bench" "1.0")
  (import "{module}" "{name}" (func $f (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 1024) "{_escaped(hello)}")
  (data (i32.const 2048) "{_escaped(welcome)}")
  (data (i32.const 3072) "\\00\\00\\00\\00\\f6")
  (data (i32.const 4096) "{_escaped(REQUEST64)}")
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 32768))
  (func $count (param $p i32) (param $n i32) (result i32)
    (local $b i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 0))))
    (local.set $b (i32.load8_u (local.get $p)))
    (if (i32.lt_u (local.get $b) (i32.const 24)) (then (return (local.get $b))))
    (if (i32.eq (local.get $b) (i32.const 24))
      (then (return (i32.load8_u offset=1 (local.get $p)))))
    (i32.or (i32.shl (i32.load8_u offset=1 (local.get $p)) (i32.const 8))
            (i32.load8_u offset=2 (local.get $p))))
  (func (export "wasihost_call")
    (param $ptr i32) (param $cmd_len i32) (param $in_len i32) (result i64)
    (local $n i32)
    (if (i32.eq (local.get $cmd_len) (i32.const 14))
      (then (return (i64.or (i64.shl (i64.const 1024) (i64.const 32))
                            (i64.const {len(hello)})))))
    (if (i32.eq (local.get $cmd_len) (i32.const 16))
      (then (return (i64.or (i64.shl (i64.const 2048) (i64.const 32))
                            (i64.const {len(welcome)})))))
    (local.set $n (call $count (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)))
    (block $done
      (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        (drop (call $f (i32.const 4096) (i32.const 64) (i32.const 8192) (i32.const 16)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again)))
    (i64.or (i64.shl (i64.const 3072) (i64.const 32)) (i64.const 5))))
""")
    )


def request_calls(calls: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per host call µs of ``log`` and of an embedder function, each with a 64-byte request."""
    from wasihost.package import Package

    host = Host(Policy(allow={"log", "bench"}), cache_dir=None)
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
        wasm = _loop_guest(module, name)
        package = Package(f"{case}.wasm", None, wasm, hashlib.sha256(wasm).hexdigest())
        exts[case] = host.admit(package, grants=[cap])
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
    public = PublicGuest(wasm)
    handshake(public)
    floor = RawFloor(public)
    null = cbor2.dumps(None)
    echo_in = cbor2.dumps(PAYLOAD)
    expected_noop = b"\0\0\0\0" + null
    expected_echo = b"\0\0\0\0" + echo_in
    assert public.call(b"noop", null) == expected_noop
    assert floor.call(b"noop", null) == expected_noop
    assert floor.call(b"echo", echo_in) == expected_echo

    host = Host(Policy(allow={"log", "clock", "random"}), cache_dir=None)
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
