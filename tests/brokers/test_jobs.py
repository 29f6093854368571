"""The jobs broker through the real engine: the `jobs` Rust fixture schedules jobs and records
each run in its log; WAT guests send hostile requests. Time is a ManualClock the tests move:
nothing here sleeps, and a run that must be still going is held inside a real host call (the
log) by a gate in the host's log sink."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from tests.support.common import FIXTURES, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers.events import ExtensionEvents
from wasihost.brokers.jobs import (
    MAX_DELAY_MS,
    MAX_JOB_INPUT_BYTES,
    MIN_PERIOD_MS,
    ExtensionJobs,
    JobsBroker,
    ManualClock,
)
from wasihost.core.errors import AdmissionError, CallError, ConfigError, ManifestError
from wasihost.core.extlog import LogRecord
from wasihost.core.manifest import parse_manifest
from wasihost.core.status import Status
from wasihost.host.defaults import default_registry
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

POLICY = Policy(allow={"jobs", "log", "events"})
# Generous: a drain or a gate only waits this long when something is broken.
WAIT_S = 10.0
JOBS = FIXTURES / "jobs"


class Gate:
    """A log sink that records every message and, once armed, holds the next record until
    opened: the job command logs, so its run is held inside a real host call."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.messages: list[str] = []

    def __call__(self, extension: str, record: LogRecord) -> None:
        self.messages.append(record.message)
        if self.armed and not self.entered.is_set():
            self.entered.set()
            self.opened.wait(WAIT_S)

    def runs(self) -> list[str]:
        return [m for m in self.messages if m.startswith("run ")]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def host(cache: Path, clock: ManualClock, gate: Gate) -> Iterator[Host]:
    with Host(POLICY, cache_dir=cache, brokers=[JobsBroker(clock=clock)], log_sink=gate) as h:
        yield h


def jobs_of(host: Host) -> JobsBroker:
    broker = host.broker("jobs")
    assert isinstance(broker, JobsBroker)
    return broker


def schedule(ext: Extension, **request: Any) -> int:
    job = ext.call("schedule", {"command": "tick", **request})
    assert isinstance(job, int)
    return job


def refused(ext: Extension, command: str, value: Any) -> str:
    with pytest.raises(CallError) as info:
        ext.call(command, value)
    assert info.value.guest_class is not None
    return info.value.guest_class


def ticked(host: Host, clock: ManualClock, seconds: float) -> int:
    """Move the clock, tick, and wait for the runs to finish; how many were queued."""
    clock.advance(seconds)
    queued = jobs_of(host).tick()
    assert jobs_of(host).drain(WAIT_S)
    return queued


# -- one-shot, periodic, event-driven, cancel ------------------------------------------------


def test_a_one_shot_job_runs_once_after_its_delay(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    job = schedule(ext, input="hello", delay_ms=5000)
    assert ticked(host, clock, 4.999) == 0
    assert gate.runs() == []
    assert ticked(host, clock, 0.001) == 1
    assert gate.runs() == [f"run job={job} run=1 skipped=0 input=hello event=-"]
    assert ticked(host, clock, 3600) == 0  # once means once
    assert jobs_of(host).stats(ext.id) == {}
    assert jobs_of(host).runs == 1


def test_a_periodic_job_runs_every_period_and_the_minimum_period_is_enforced(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    assert refused(ext, "schedule", {"command": "tick", "every_ms": MIN_PERIOD_MS - 1}) == (
        "invalid_argument"
    )
    job = schedule(ext, every_ms=MIN_PERIOD_MS)
    assert ticked(host, clock, 0.5) == 0
    assert ticked(host, clock, 0.5) == 1
    assert ticked(host, clock, 1.0) == 1
    # The clock jumps 3.5 periods: one run, which is told of the two ticks it missed.
    assert ticked(host, clock, 3.5) == 1
    assert gate.runs() == [
        f"run job={job} run=1 skipped=0 input=- event=-",
        f"run job={job} run=2 skipped=0 input=- event=-",
        f"run job={job} run=3 skipped=2 input=- event=-",
    ]
    stats = jobs_of(host).stats(ext.id)[job]
    assert (stats.kind, stats.every_ms, stats.runs, stats.failed, stats.skipped) == (
        "every",
        MIN_PERIOD_MS,
        3,
        0,
        2,
    )


def test_a_periodic_job_whose_run_is_still_going_skips_the_tick_instead_of_piling_up(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    job = schedule(ext, every_ms=1000)
    broker = jobs_of(host)
    gate.armed = True
    clock.advance(1)
    assert broker.tick() == 1
    assert gate.entered.wait(WAIT_S)  # the run is inside its log host call
    for _ in range(3):
        clock.advance(1)
        assert broker.tick() == 0
    gate.opened.set()
    assert broker.drain(WAIT_S)
    assert ticked(host, clock, 1) == 1
    assert gate.runs()[-1] == f"run job={job} run=2 skipped=3 input=- event=-"
    assert broker.stats(ext.id)[job].skipped == 3


def test_an_event_driven_job_runs_on_each_published_event_of_its_class(
    host: Host, gate: Gate
) -> None:
    ext = host.load(JOBS)
    job = schedule(ext, on_event="orders.created", input=7)
    assert host.publish("orders.created", {"id": 1}) == 1
    assert jobs_of(host).drain(WAIT_S)
    assert host.publish("orders.paid", {"id": 1}) == 0
    assert jobs_of(host).trigger("orders.created") == 1
    assert jobs_of(host).drain(WAIT_S)
    assert gate.runs() == [
        f"run job={job} run=1 skipped=0 input=7 event=orders.created",
        f"run job={job} run=2 skipped=0 input=7 event=orders.created",
    ]
    # Only classes the manifest's [events] table (and the operator's scope) cover.
    assert refused(ext, "schedule", {"command": "tick", "on_event": "audit.login"}) == "denied"
    host.grant(ext.id, "events", {"classes": ["orders.paid"]})
    assert host.publish("orders.created") == 0  # the narrowed grant no longer covers it


def test_cancel_stops_a_job_and_answers_whether_it_cancelled_one(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    job = schedule(ext, every_ms=1000)
    other = schedule(ext, delay_ms=1000)
    assert ext.call("cancel", job) is True
    assert ext.call("cancel", job) is False
    assert ext.call("cancel", 999) is False
    assert ticked(host, clock, 5) == 1
    assert gate.runs() == [f"run job={other} run=1 skipped=0 input=- event=-"]


def test_only_the_manifests_job_commands_may_be_jobs(host: Host) -> None:
    ext = host.load(JOBS)
    assert refused(ext, "schedule", {"command": "schedule", "delay_ms": 0}) == "denied"
    assert refused(ext, "schedule", {"command": "nope", "delay_ms": 0}) == "denied"


# -- budgets and bounds --------------------------------------------------------------------------


def test_a_spinning_job_is_ended_by_its_deadline_and_the_job_keeps_its_schedule(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    job = schedule(ext, every_ms=1000, delay_ms=0)
    spin = ext.call("schedule", {"command": "spin", "every_ms": 1000, "delay_ms": 0})
    started = time.monotonic()
    assert ticked(host, clock, 0) == 2
    # max_runtime_ms = 200 in the fixture's [jobs] table, far under its 5 s timeout_ms.
    assert time.monotonic() - started < 3.0
    stats = jobs_of(host).stats(ext.id)
    assert stats[spin].failed == 1 and stats[spin].last_failure is not None
    assert re.match("deadline", stats[spin].last_failure)
    assert stats[job].runs == 1
    assert ticked(host, clock, 1) == 2  # not retried early, not dropped: on schedule
    assert jobs_of(host).stats(ext.id)[spin].failed == 2


def test_an_extension_holds_at_most_its_max_jobs(host: Host) -> None:
    ext = host.load(JOBS)
    ids = [schedule(ext, delay_ms=60_000) for _ in range(4)]  # max_jobs = 4
    assert len(set(ids)) == 4
    assert refused(ext, "schedule", {"command": "tick", "delay_ms": 0}) == "quota_exceeded"
    assert ext.call("cancel", ids[0]) is True
    schedule(ext, delay_ms=0)


# -- jobs of an extension that is not running ------------------------------------------------------


def test_jobs_of_a_paused_or_quarantined_extension_do_not_run(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    job = schedule(ext, every_ms=1000)
    ext.pause("maintenance")
    assert ticked(host, clock, 1) == 1  # queued, then skipped at the state check
    ext.resume()
    assert ticked(host, clock, 1) == 1
    assert gate.runs() == [f"run job={job} run=1 skipped=1 input=- event=-"]
    ext.quarantine("operator")
    assert ticked(host, clock, 1) == 1
    assert len(gate.runs()) == 1
    stats = jobs_of(host).stats(ext.id)[job]
    assert (stats.runs, stats.skipped, stats.failed) == (1, 2, 0)


def test_jobs_of_a_revoked_extension_end_without_running(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    schedule(ext, every_ms=1000)
    schedule(ext, on_event="orders.created")
    host.disable(ext.id, "compromised")
    assert jobs_of(host).stats(ext.id) == {}  # ended by the revocation, not by a run
    assert ticked(host, clock, 1) == 0
    assert host.publish("orders.created") == 0
    assert gate.runs() == []
    assert jobs_of(host).stats(ext.id) == {}


def test_jobs_end_when_the_jobs_capability_is_revoked(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    schedule(ext, every_ms=1000)
    host.revoke(ext.id, "jobs")
    assert ticked(host, clock, 1) == 0  # ended by the revocation: nothing left to queue
    assert gate.runs() == []
    assert jobs_of(host).stats(ext.id) == {}
    assert refused(ext, "schedule", {"command": "tick", "delay_ms": 0}) == "denied"


def test_revoking_jobs_ends_them_at_once_a_new_grant_does_not_revive_them(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    """Issue 28 item 19: a revocation was noticed at the job's next run; revoked and granted
    again within one period, the broker saw jobs granted and the periodic job ran on."""
    ext = host.load(JOBS)
    schedule(ext, every_ms=1000)
    schedule(ext, on_event="orders.created")
    assert len(jobs_of(host).stats(ext.id)) == 2
    host.revoke(ext.id, "jobs")
    assert jobs_of(host).stats(ext.id) == {}  # at once, before any tick
    host.grant(ext.id, "jobs")
    assert ticked(host, clock, 1) == 0
    assert host.publish("orders.created") == 0
    assert gate.runs() == []
    # A job scheduled under the new grant runs.
    schedule(ext, every_ms=1000)
    assert ticked(host, clock, 1) == 1


def test_a_policy_no_longer_allowing_jobs_ends_them_and_allowing_it_again_does_not_revive_them(
    host: Host, clock: ManualClock, gate: Gate
) -> None:
    ext = host.load(JOBS)
    schedule(ext, every_ms=1000)
    host.update_policy(Policy(allow=POLICY.allow - {"jobs"}))
    assert jobs_of(host).stats(ext.id) == {}
    host.update_policy(POLICY)
    assert ticked(host, clock, 1) == 0
    assert gate.runs() == []


def test_withdrawing_events_ends_the_event_driven_jobs_and_a_new_grant_does_not_revive_them(
    host: Host, clock: ManualClock, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event-driven job is a subscription run as a command: revoked and granted events
    again, it ran on the next event, where a subscription had ended (docs/events.md). Its
    queued run ends with it; the other jobs, under jobs alone, go on."""
    ext = host.load(JOBS)
    periodic = schedule(ext, every_ms=1000)
    schedule(ext, on_event="orders.created")
    broker = jobs_of(host)
    # No worker takes the extension's queue until the grant has changed twice: a worker free
    # at the publish could otherwise run the event's run before the revoke (it did, under load).
    held: list[Any] = []
    monkeypatch.setattr(broker, "_schedule", held.append)
    assert host.publish("orders.created") == 1  # queued, not yet run
    host.revoke(ext.id, "events")
    assert set(broker.stats(ext.id)) == {periodic}  # at once, before any run
    host.grant(ext.id, "events")
    assert host.publish("orders.created") == 0
    monkeypatch.undo()
    with broker._cond:
        for state in held:
            broker._schedule(state)
    assert broker.drain(WAIT_S)
    assert gate.runs() == []
    assert ticked(host, clock, 1) == 1
    assert [r.split()[1] for r in gate.runs()] == [f"job={periodic}"]


def test_a_publish_that_looked_before_the_events_grant_narrowed_queues_no_run(
    host: Host, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red-team pass on items 18-19: a publish looks at the events grant, then queues under
    the broker's lock. Narrowed between the two to classes that no longer cover the job's,
    the stale look queued the run, and the job ran with an event its grant no longer
    covered; a stale look now is looked at again."""
    ext = host.load(JOBS)
    schedule(ext, on_event="orders.created")
    listening = ext._broker_states[id(jobs_of(host))][1].events
    looked = ExtensionEvents.allowed
    raced: list[bool] = []

    def allowed_then_narrowed(self: ExtensionEvents) -> tuple[str, ...] | None:
        seen = looked(self)
        if self is listening and not raced:
            raced.append(True)
            host.grant(ext.id, "events", {"classes": ["orders.paid"]})
        return seen

    monkeypatch.setattr(ExtensionEvents, "allowed", allowed_then_narrowed)
    assert host.publish("orders.created") == 0
    assert raced
    assert jobs_of(host).drain(WAIT_S)
    assert gate.runs() == []


def test_a_run_taken_before_a_revocation_and_a_new_grant_does_not_start(
    host: Host, clock: ManualClock, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red-team pass on item 19: a worker takes a queued run, sees the job not ended, then asks
    the grant table whether jobs is granted. Revoked and granted again in between, it was
    granted, and the ended job's run started after the revocation had returned."""
    ext = host.load(JOBS)
    schedule(ext, every_ms=1000)
    asked = ExtensionJobs.granted
    raced: list[bool] = []

    def granted_after_a_revocation(self: ExtensionJobs) -> bool:
        if self.ext is ext and not raced:
            raced.append(True)
            host.revoke(ext.id, "jobs")
            host.grant(ext.id, "jobs")
        return asked(self)

    monkeypatch.setattr(ExtensionJobs, "granted", granted_after_a_revocation)
    assert ticked(host, clock, 1) == 1
    assert raced
    assert gate.runs() == []
    assert jobs_of(host).stats(ext.id) == {}


def test_jobs_of_a_closed_extension_end_with_it(host: Host, clock: ManualClock, gate: Gate) -> None:
    ext = host.load(JOBS)
    schedule(ext, every_ms=1000)
    schedule(ext, on_event="orders.created")
    ext.close()
    assert jobs_of(host).stats(ext.id) == {}
    assert ticked(host, clock, 1) == 0
    assert host.publish("orders.created") == 0
    assert gate.runs() == []


def test_the_system_clock_runs_jobs_without_ticks(cache: Path) -> None:
    """The default broker has its own timer thread: a one-shot due now runs by itself."""
    ran = threading.Event()
    messages: list[str] = []

    def sink(extension: str, record: LogRecord) -> None:
        messages.append(record.message)
        ran.set()

    with Host(POLICY, cache_dir=cache, log_sink=sink) as host:
        ext = host.load(JOBS)
        job = schedule(ext, delay_ms=0)
        assert ran.wait(WAIT_S)
        assert messages == [f"run job={job} run=1 skipped=0 input=- event=-"]


# -- hostile requests, the embedder's mistakes, bad manifests ------------------------------------


def status_guest(marker: str = "1.1", request: bytes | None = None) -> bytes:
    """A WAT guest: ``schedule`` (8 bytes) passes its input (or ``request``) to
    ``jobs_schedule``, any other command to ``jobs_cancel``; it answers the status returned
    (negative) or the number of response bytes written."""
    if request is None:
        req = "(i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)"
        extra = ""
    else:
        req = f"(i32.const 60000) (i32.const {len(request)})"
        extra = f'(data (i32.const 60000) "{escape(request)}")'
    body = f"""
        (if (i32.eq (local.get $cmd_len) (i32.const 8))
          (then (local.set $r (call $jobs_schedule {req} (i32.const 12288) (i32.const 16))))
          (else (local.set $r (call $jobs_cancel {req} (i32.const 12288) (i32.const 16)))))
        (i32.store (i32.const 12800) (i32.const 0))
        (i32.store8 (i32.const 12804)
          (select (local.get $r) (i32.add (i32.const 0x20) (i32.sub (i32.const -1) (local.get $r)))
                  (i32.ge_s (local.get $r) (i32.const 0))))
        (call $packed (i32.const 12800) (i32.const 5))"""
    wat = guest_wat(
        body,
        marker=marker,
        imports=host_import("jobs_schedule") + host_import("jobs_cancel"),
        extra=extra,
    )
    return build(
        wat.replace("(result i64)\n    ;; free", "(result i64) (local $r i32)\n    ;; free")
    )


def _req(**fields: Any) -> dict[str, Any]:
    return {"command": "tick", **fields}


@pytest.mark.parametrize(
    "request_value",
    [
        1,
        None,
        "tick",
        [],
        {},
        {"command": 1, "delay_ms": 0},
        _req(),
        _req(every_ms=None, delay_ms=None, on_event=None),
        _req(every_ms=MIN_PERIOD_MS - 1),
        _req(every_ms=-1),
        _req(every_ms=True),
        _req(every_ms=1500.0),
        _req(delay_ms=-1),
        _req(delay_ms=MAX_DELAY_MS + 1),
        _req(on_event="Orders"),
        _req(on_event=1),
        _req(on_event="orders.x", every_ms=1000),
        _req(on_event="orders.x", delay_ms=0),
        _req(delay_ms=0, extra=1),
        _req(delay_ms=0, input=b"x" * MAX_JOB_INPUT_BYTES),
    ],
)
def test_malformed_schedule_requests_get_invalid_argument(host: Host, request_value: Any) -> None:
    """Before any work: the bare module has no [jobs] table, so a well-formed request would be
    DENIED; these never get that far."""
    ext = host.admit(bare(status_guest()), grants=["jobs"])
    assert ext.call("schedule", request_value) == -Status.INVALID_ARGUMENT
    assert ext.call("schedule", _req(delay_ms=0)) == -Status.DENIED


@pytest.mark.parametrize("request_value", [-1, None, "1", True, 1.0, [1]])
def test_malformed_cancel_requests_get_invalid_argument(host: Host, request_value: Any) -> None:
    ext = host.admit(bare(status_guest()), grants=["jobs"])
    assert ext.call("cancel", request_value) == -Status.INVALID_ARGUMENT
    assert ext.call("cancel", 1) == 1  # one response byte: false


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (cbor2.dumps({"command": "tick", "input": "x" * 5000}), Status.PAYLOAD_TOO_LARGE),
        (b"\xa1\x67command", Status.INVALID_ARGUMENT),  # truncated map
        (b"\xff", Status.INVALID_ARGUMENT),
        (b"", Status.INVALID_ARGUMENT),
    ],
    ids=["oversized", "truncated", "break", "empty"],
)
def test_hostile_request_bytes_get_their_status(
    host: Host, request_bytes: bytes, status: Status
) -> None:
    ext = host.admit(bare(status_guest(request=request_bytes)), grants=["jobs"])
    assert ext.call("schedule") == -status


def test_a_1_0_guest_importing_jobs_is_refused_at_admission(host: Host) -> None:
    with pytest.raises(AdmissionError) as info:
        host.admit(bare(status_guest(marker="1.0")), grants=["jobs"])
    assert "jobs_schedule" in str(info.value) and "1.1" in str(info.value)


@pytest.mark.parametrize(
    ("args", "match"),
    [(("Orders", 1), "event class"), (("orders.x", b"x" * 20_000), "payload")],
)
def test_trigger_refuses_bad_arguments(host: Host, args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        jobs_of(host).trigger(*args)


def test_the_broker_refuses_a_bad_thread_count() -> None:
    with pytest.raises(ConfigError):
        JobsBroker(max_threads=0)


MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.jobs"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["jobs"]

[resources]
timeout_ms = 1000
fuel_per_call = 1000000

[commands]
tick = {}
"""


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ('[jobs]\ncommands = ["nope"]', "jobs.commands[0]", "not one of"),
        ("[jobs]\ncommands = []", "jobs.commands", "non-empty"),
        ('[jobs]\ncommands = ["tick", "tick"]', "jobs.commands[1]", "duplicate"),
        ('[jobs]\ncommands = ["tick"]\nmax_runtime_ms = 1001', "jobs.max_runtime_ms", "1..1000"),
        ('[jobs]\ncommands = ["tick"]\nfuel = 1000001', "jobs.fuel", "outside"),
        ('[jobs]\ncommands = ["tick"]\nmax_jobs = 33', "jobs.max_jobs", "1..32"),
        ('[jobs]\ncommands = ["tick"]\nmax_jobs = true', "jobs.max_jobs", "integer"),
        ('[jobs]\ncommands = ["tick"]\nevery = 1', "jobs.every", ""),
        ('[lifecycle]\non_shutdown = "nope"', "lifecycle.on_shutdown", "not one of"),
    ],
)
def test_bad_jobs_and_lifecycle_tables_are_refused(extra: str, key: str, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(MANIFEST + extra, default_registry().capabilities())
    assert info.value.key == key and message in str(info.value)


def test_a_jobs_table_needs_the_jobs_capability() -> None:
    text = MANIFEST.replace('required = ["jobs"]', "required = []") + '[jobs]\ncommands = ["tick"]'
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, default_registry().capabilities())
    assert info.value.key == "jobs"


def test_the_jobs_table_defaults_to_the_extensions_budget() -> None:
    manifest = parse_manifest(
        MANIFEST + '[jobs]\ncommands = ["tick"]', default_registry().capabilities()
    )
    assert manifest.jobs is not None
    assert (manifest.jobs.max_jobs, manifest.jobs.max_runtime_ms, manifest.jobs.fuel) == (
        8,
        1000,
        1_000_000,
    )
