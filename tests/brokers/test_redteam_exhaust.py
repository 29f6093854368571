"""Red-team review of what a hostile guest that follows the ABI can make the host spend: memory
it keeps, CPU per fuel unit, disk, descriptors and threads, through the brokers and host calls,
run through the real engine. Each test here failed on the code before the fix it names, or
pins a bound that held (said so in its comment). CPU ratios are measured by
benchmarks/bench_hostcall_prices.py (the "items" rows); the tests here count fuel, never time."""

from __future__ import annotations

import gc
import hashlib
import logging
import sys
import tracemalloc
from typing import Any

import cbor2
import pytest

from tests.support.common import bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers import events as events_broker
from wasihost.brokers import jobs as jobs_broker
from wasihost.brokers.failure_log import FAILURE_LOG_INTERVAL_S
from wasihost.brokers.jobs import JobsBroker, ManualClock
from wasihost.core.event_classes import MAX_SELECTORS
from wasihost.core.extlog import LogRecord
from wasihost.core.manifest import parse_manifest
from wasihost.engine import hostcalls
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package

REQ_AT = 20000  # a fixed request, laid out by a data segment
RESP_AT = 8000


def looping_log_guest() -> bytes:
    """Every command passes its CBOR input to ``log`` as the request, again and again, until
    ``log`` refuses it (a full log answers QUOTA_EXCEEDED) or 200,000 times."""
    body = f"""
    (global.set $i (i32.const 0))
    (block $done (loop $again
      (br_if $done (i32.ge_u (global.get $i) (i32.const 200000)))
      (br_if $done (i32.lt_s
        (call $log (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)
                   (i32.const {RESP_AT}) (i32.const 16))
        (i32.const 0)))
      (global.set $i (i32.add (global.get $i) (i32.const 1)))
      (br $again)))
    (call $ok_null)"""
    return build(
        guest_wat(body, imports=host_import("log"), extra="(global $i (mut i32) (i32.const 0))")
    )


def held_bytes(record: LogRecord) -> int:
    """What one buffered record holds in the host's heap: the record, its text, its time stamp
    and its slot in the log's list (the level and source are shared objects)."""
    return sys.getsizeof(record) + sys.getsizeof(record.message) + sys.getsizeof(record.time_ns) + 8


# Break (red-team 2026-12-01): a log record was charged its UTF-8 length plus 32 bytes against
# max_log_bytes, but holds about 166 bytes besides its text in the host (the record, its time
# stamp, its list slot, the str header), and a str stores every character at the width of its
# widest (one emoji makes each ASCII character 4 bytes): a guest filling a 16 MiB log (the
# manifest's most) with short records made the host hold 79 MiB, with an emoji and 4,000 ASCII
# characters per record 64 MiB. Now a record is charged what it holds.
def test_a_full_log_holds_no_more_host_memory_than_its_budget() -> None:
    budget = 256 * 1024
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.admit(bare(looping_log_guest()), grants=["log"], fuel=10**10)
        for message in ("ab", "\U0001f600" + "x" * 1000):
            ext.log.drain()
            ext.log.max_bytes = budget
            ext.call("fill", [2, message])
            records = ext.logs()
            assert records and ext.log.dropped  # it was filled
            held = sum(held_bytes(r) for r in records)
            assert held <= budget, (message[:4], len(records), held)
            ext.log.dropped = 0


def log_guest(request: bytes) -> bytes:
    """A guest whose every command makes one ``log`` call with ``request`` (fixed in memory,
    whatever it is) and ignores the answer."""
    body = f"""
    (drop (call $log (i32.const {REQ_AT}) (i32.const {len(request)})
                     (i32.const {RESP_AT}) (i32.const 16)))
    (call $ok_null)"""
    return build(
        guest_wat(
            body,
            imports=host_import("log"),
            extra=f'(data (i32.const {REQ_AT}) "{escape(request)}")',
        )
    )


def fuel_of(host: Host, request: bytes) -> int:
    name = f"items-{hashlib.sha256(request).hexdigest()[:12]}"
    ext = host.admit(bare(log_guest(request), name), grants=["log"])
    ext.call("go")
    ext.call("go")
    fuel: int = ext.last_fuel_used
    ext.close()
    return fuel


def array_of_empty_arrays(n: int, last: bytes = b"\x80") -> bytes:
    return cbor2.dumps([[]] * n)[:-1] + last


# Break (red-team 2026-12-01): a host call's request was priced by its bytes only, but its
# decode costs the host by data items: a 4 KiB log request of 1,280 float16s took 0.58 ms of
# host CPU for 23,000 fuel units (349x guest code's CPU per fuel, the documented bound is
# about 10x), one of 4,091 empty arrays 1.3 ms, one with a fault at its end (so the exact
# decoder ran after the scan and cbor2) 3 ms, a map of 2,045 pairs with a duplicate key 157 us
# (92x: the scan and cbor2 read it all, the exact decoder refused it at its second pair). Now each item past FREE_REQUEST_ITEMS pays
# FUEL_PER_REQUEST_ITEM, a refused request for the items read.
def test_a_request_is_paid_per_data_item_it_decodes() -> None:
    per_item = hostcalls.FUEL_PER_REQUEST_ITEM
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        small = array_of_empty_arrays(100)
        large = array_of_empty_arrays(1000)
        refused = array_of_empty_arrays(1000, last=b"\x61\xff")  # invalid UTF-8, last
        # A map of 500 pairs whose second key repeats the first: the scan and cbor2 go
        # through all 1,001 items before the exact decoder names the fault at the second.
        duplicate = b"\xb9\x01\xf4" + b"\x00\x80" * 500
        fuel: dict[str, Any] = {
            "small": fuel_of(host, small),
            "large": fuel_of(host, large),
            "refused": fuel_of(host, refused),
            "duplicate": fuel_of(host, duplicate),
        }
        per_byte = 2  # log's fuel_per_byte (abi/v1/registry.json)
        assert fuel["large"] - fuel["small"] == 900 * per_item + per_byte * (
            len(large) - len(small)
        ), fuel
        assert fuel["refused"] - fuel["small"] >= 899 * per_item, fuel
        assert fuel["duplicate"] - fuel["small"] >= 899 * per_item, fuel


EVENTS_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.wat"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["events"]

[commands]
go = {}

[events]
classes = CLASSES
command = "go"
"""


def subscribe_fuel(classes: list[str]) -> int:
    """The fuel of a call making one ``events_subscribe`` of ``t.a``, under a manifest
    listing ``classes``."""
    request = cbor2.dumps("t.a")
    body = f"""
    (drop (call $events_subscribe (i32.const {REQ_AT}) (i32.const {len(request)})
                                  (i32.const {RESP_AT}) (i32.const 16)))
    (call $ok_null)"""
    wasm = build(
        guest_wat(
            body,
            marker="1.1",
            imports=host_import("events_subscribe"),
            extra=f'(data (i32.const {REQ_AT}) "{escape(request)}")',
        )
    )
    listed = "[" + ", ".join(f'"{c}"' for c in classes) + "]"
    manifest = parse_manifest(
        EVENTS_MANIFEST.replace("CLASSES", listed), default_registry().capabilities()
    )
    package = Package("events", manifest, wasm, hashlib.sha256(wasm).hexdigest())
    with Host(Policy(allow={"events"}), cache_dir=None) as host:
        ext = host.admit(package, grants=["events"])
        ext.call("go")
        ext.call("go")  # subscribed already: the same work as the first, but no set-up
        fuel: int = ext.last_fuel_used
    return fuel


# Break (red-team 2026-12-01): events_subscribe compares its request with every class of the
# manifest, then of the grant scope (the manifest's when the scope names none), up to
# MAX_SELECTORS (64) each, for the flat price: with 64 classes listed (the package chooses its
# manifest) a subscribe cost the host 61 us of CPU for 55,000 units, 15x what the same fuel
# buys in guest code. Now each selector compared is paid, before the comparisons.
def test_a_subscribe_is_paid_per_selector_it_is_compared_with() -> None:
    many = [f"x{i:02d}.*" for i in range(MAX_SELECTORS - 1)] + ["t.*"]
    difference = subscribe_fuel(many) - subscribe_fuel(["t.*"])
    # Two passes (the manifest's classes, then the scope's, here the manifest's again).
    assert difference == 2 * (MAX_SELECTORS - 1) * events_broker.FUEL_PER_SELECTOR_COMPARED


JOBS_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.wat"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["jobs"]

[commands]
go = {}
job = {}

[jobs]
commands = ["job"]
"""


def failing_jobs_package() -> Package:
    """``go`` schedules ``job`` every second; ``job`` traps."""
    request = cbor2.dumps({"command": "job", "every_ms": 1000})
    body = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 3)) (then unreachable))  ;; job
    (drop (call $jobs_schedule (i32.const {REQ_AT}) (i32.const {len(request)})
                               (i32.const {RESP_AT}) (i32.const 16)))
    (call $ok_null)"""
    wasm = build(
        guest_wat(
            body,
            marker="1.1",
            imports=host_import("jobs_schedule"),
            extra=f'(data (i32.const {REQ_AT}) "{escape(request)}")',
        )
    )
    manifest = parse_manifest(JOBS_MANIFEST, default_registry().capabilities())
    return Package("jobs", manifest, wasm, hashlib.sha256(wasm).hexdigest())


# Break (red-team 2026-12-01): every failed job run wrote a warning to the host's ``wasihost``
# logger: a guest whose 32 periodic jobs trap at every run (once a second each) made the host
# write 32 lines a second for as long as it ran (measured: 231 lines in 8 s with one
# extension), an unbounded log on the embedder's disk. Now a job's failures are logged at most
# once per FAILURE_LOG_INTERVAL_S, the line counting those in between (JobStats counts all).
def test_a_job_failing_at_every_run_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    broker = JobsBroker(clock=clock)
    runs = 150
    with Host(Policy(allow={"jobs"}), cache_dir=None, brokers=[broker]) as host:
        ext = host.admit(failing_jobs_package(), grants=["jobs"])
        ext.call("go")
        with caplog.at_level(logging.WARNING, logger="wasihost"):
            for _ in range(runs):
                clock.advance(1.0)
                broker.tick()
                assert broker.drain(30.0)
        (stats,) = broker.stats(ext.id).values()
    assert stats.failed == runs
    lines = [r for r in caplog.records if r.getMessage().startswith("job ")]
    assert 1 <= len(lines) <= runs / FAILURE_LOG_INTERVAL_S + 1, len(lines)


# Break (red-team 2026-12-01), the same in the events broker: every failed delivery wrote a
# warning to the host's log, one line per event published to a guest that fails them all.
# Now a subscription's failures are logged at most once per FAILURE_LOG_INTERVAL_S.
def test_a_subscription_failing_every_delivery_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = cbor2.dumps("t.a")
    body = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 4)) (then unreachable))  ;; trap
    (drop (call $events_subscribe (i32.const {REQ_AT}) (i32.const {len(request)})
                                  (i32.const {RESP_AT}) (i32.const 16)))
    (call $ok_null)"""
    wasm = build(
        guest_wat(
            body,
            marker="1.1",
            imports=host_import("events_subscribe"),
            extra=f'(data (i32.const {REQ_AT}) "{escape(request)}")',
        )
    )
    text = (
        EVENTS_MANIFEST.replace("CLASSES", '["t.*"]')
        .replace('command = "go"', 'command = "trap"')
        .replace("go = {}", "go = {}\ntrap = {}")
    )
    manifest = parse_manifest(text, default_registry().capabilities())
    package = Package("events", manifest, wasm, hashlib.sha256(wasm).hexdigest())
    events = 50
    with Host(Policy(allow={"events"}), cache_dir=None) as host:
        ext = host.admit(package, grants=["events"])
        ext.call("go")
        broker = host.broker("events")
        assert isinstance(broker, events_broker.EventsBroker)
        with caplog.at_level(logging.WARNING, logger="wasihost"):
            for _ in range(events):
                assert broker.publish("t.a") == 1
                assert broker.drain(30.0)
        (stats,) = broker.stats(ext.id).values()
    assert stats.failed == events
    lines = [r for r in caplog.records if r.getMessage().startswith("event ")]
    assert len(lines) == 1, len(lines)


def passing_jobs_package() -> Package:
    """``go`` passes its CBOR input to ``jobs_schedule`` as the request (``job`` does nothing)."""
    body = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 2))  ;; go
      (then (drop (call $jobs_schedule (i32.add (local.get $ptr) (local.get $cmd_len))
                                       (local.get $in_len) (i32.const {RESP_AT}) (i32.const 16)))))
    (call $ok_null)"""
    wasm = build(guest_wat(body, marker="1.1", imports=host_import("jobs_schedule")))
    manifest = parse_manifest(JOBS_MANIFEST, default_registry().capabilities())
    return Package("jobs", manifest, wasm, hashlib.sha256(wasm).hexdigest())


# Break (red-team 2026-12-01): a job's input could hold the codec's 4,096 data items, and every
# run decodes it and encodes it again into the command's input, work no fuel pays for: 32
# periodic jobs with inputs of 4,080 empty arrays kept 12.4% of a core busy for as long as they
# were scheduled (0.6% with no input), while the runs' fuel was a few thousand units each.
# Now an input holds at most MAX_JOB_INPUT_ITEMS items (1.1% of a core at 127 arrays).
def test_a_job_input_of_more_than_its_item_limit_is_refused() -> None:
    limit = jobs_broker.MAX_JOB_INPUT_ITEMS
    broker = JobsBroker(clock=ManualClock())
    with Host(Policy(allow={"jobs"}), cache_dir=None, brokers=[broker]) as host:
        ext = host.admit(passing_jobs_package(), grants=["jobs"])
        for items in (limit, limit + 1, 4080):
            # The input array holds ``items`` items: itself and items - 1 zeros.
            request = {"command": "job", "every_ms": 1000, "input": [0] * (items - 1)}
            ext.call("go", request)
        (job,) = broker.stats(ext.id).values()  # only the first was scheduled
    assert job.kind == "every"


def churning_package() -> Package:
    """``go`` makes 500 rounds of storage_put and storage_delete of one key, events_subscribe
    and events_unsubscribe of one class, and a log call (the log is full: QUOTA_EXCEEDED)."""
    requests = [
        ("storage_put", cbor2.dumps(["k", b"v" * 64])),
        ("storage_delete", cbor2.dumps("k")),
        ("events_subscribe", cbor2.dumps("t.a")),
        ("events_unsubscribe", cbor2.dumps("t.a")),
        ("log", cbor2.dumps([2, "x" * 60])),
    ]
    calls, data = [], []
    for i, (name, request) in enumerate(requests):
        at = REQ_AT + 256 * i
        data.append(f'(data (i32.const {at}) "{escape(request)}")')
        calls.append(
            f"(drop (call ${name} (i32.const {at}) (i32.const {len(request)}) "
            f"(i32.const {RESP_AT}) (i32.const 16)))"
        )
    body = f"""
    (global.set $i (i32.const 0))
    (block $done (loop $again
      (br_if $done (i32.ge_u (global.get $i) (i32.const 500)))
      {" ".join(calls)}
      (global.set $i (i32.add (global.get $i) (i32.const 1)))
      (br $again)))
    (call $ok_null)"""
    wasm = build(
        guest_wat(
            body,
            marker="1.1",
            imports="".join(host_import(name) for name, _ in requests),
            extra="(global $i (mut i32) (i32.const 0))" + "".join(data),
        )
    )
    text = EVENTS_MANIFEST.replace("CLASSES", '["t.*"]').replace(
        'required = ["events"]', 'required = ["events", "log", "storage"]'
    )
    manifest = parse_manifest(text, default_registry().capabilities())
    return Package("churn", manifest, wasm, hashlib.sha256(wasm).hexdigest())


# Held (red-team 2026-12-01): host calls that each take and give back what they hold (a stored
# key, a subscription) or are refused (a full log) keep nothing per call in the host: 11,000
# rounds of five brokers' calls grew the traced heap by under 16 KiB. A generous bound here:
# nine times the rounds may not grow it by more than 256 KiB.
def test_host_calls_that_give_back_what_they_take_keep_no_host_memory() -> None:
    caps = {"events", "log", "storage"}
    with Host(Policy(allow=caps), cache_dir=None) as host:
        ext = host.admit(churning_package(), grants=sorted(caps), fuel=10**10)
        ext.log.max_bytes = 0  # full: every log call is refused
        for _ in range(3):
            ext.call("go")
        gc.collect()
        tracemalloc.start()
        try:
            ext.call("go")
            gc.collect()
            after_one = tracemalloc.get_traced_memory()[0]
            for _ in range(9):
                ext.call("go")
            gc.collect()
            after_ten = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    assert after_ten - after_one < 256 * 1024, after_ten - after_one
