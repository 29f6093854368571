"""Operator metrics: host-call errors by class through the real engine, and the snapshot a live
host publishes for `wasihost status --json` in another process."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import cbor2
import pytest

from tests.support.common import FIXTURES, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.cli import main
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.store.state import SCHEMA_VERSION, StateStore
from wasihost.supervisor.opmetrics import LIVE_WITHIN_S, status_metrics
from wasihost.supervisor.scheduling import Scheduler

REQ_AT = 8192
RESP_AT = 12288


def log_guest(req: bytes, *, call: str | None = None, expect: int | None = None) -> bytes:
    """A guest whose command calls ``log`` once; with ``expect``, traps unless it gets it."""
    invoke = call or (
        f"(call $log (i32.const {REQ_AT}) (i32.const {len(req)}) (i32.const {RESP_AT}) "
        "(i32.const 16))"
    )
    check = (
        f"(if (i32.ne {invoke} (i32.const {expect})) (then unreachable))"
        if expect is not None
        else f"(drop {invoke})"
    )
    data = f'(data (i32.const {REQ_AT}) "{escape(req)}")'
    return build(guest_wat(f"{check} (call $ok_null)", imports=host_import("log"), extra=data))


CRASHER = build(guest_wat("(i64.load (i32.const -8))"))
SECRET = "user-secret-payload"
# Its request is outside memory: the host call ends the guest's call (protocol).
WILD_LOG = log_guest(
    b"", call=f"(call $log (i32.const -16) (i32.const 64) (i32.const {RESP_AT}) (i32.const 16))"
)


def test_host_call_refusals_and_failures_are_counted_by_class_and_nothing_else() -> None:
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        malformed = host.admit(bare(log_guest(b"\xff\xff", expect=-2)), grants=["log"])
        malformed.call("run", SECRET)  # INVALID_ARGUMENT, answered: the guest goes on
        logger = host.admit(bare(log_guest(cbor2.dumps([2, SECRET]), expect=1)), grants=["log"])
        logger.call("run")  # granted: no error counted
        assert host.metrics().host_call_errors == {
            "statuses": {"invalid_argument": 1},
            "failures": {},
        }
        host.revoke(logger.id, "log")  # a downgrade in place: the gate answers DENIED
        refused = host.admit(bare(log_guest(cbor2.dumps([2, "x"]), expect=-1)), grants=["log"])
        host.revoke(refused.id, "log")
        refused.call("run")
        wild = host.admit(bare(WILD_LOG), grants=["log"])
        with pytest.raises(CallError) as info:
            wild.call("run")
        assert info.value.failure is FailureClass.PROTOCOL
        metrics = host.metrics()
        assert metrics.host_call_errors == {
            "statuses": {"denied": 1, "invalid_argument": 1},
            "failures": {"protocol": 1},
        }
        assert metrics.crashes_by_class == {"protocol_violation": 1}
        text = json.dumps(metrics.to_json())
        # Counts by class only: no payload, log text, entry name or message.
        for leak in (SECRET, "wasihost_v1", "outside memory", malformed.id):
            assert leak not in text


def test_a_guest_panic_through_abort_is_a_crash_not_a_host_call_error(host: Host) -> None:
    panics = host.load(FIXTURES / "panics")
    with pytest.raises(CallError) as info:
        panics.call("run")
    assert info.value.failure is FailureClass.PANIC
    metrics = host.metrics()
    assert metrics.host_call_errors["failures"] == {} and metrics.crashes_by_class == {"panic": 1}


def status_json(state: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["status", "--json", "--state-dir", str(state)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def admit_logger(host: Host, name: str, request: bytes, expect: int) -> Extension:
    host.grant(name, "log")
    return host.admit(bare(log_guest(request, expect=expect), f"{name}.wasm"))


def test_status_json_shows_the_live_metrics_of_a_running_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    host = Host(Policy(allow={"log"}), cache_dir=None, state_dir=state, scheduler=Scheduler(2))
    try:
        ok = admit_logger(host, "ok", cbor2.dumps([2, SECRET]), 1)
        bad = admit_logger(host, "bad", b"\xff\xff", -2)
        crasher = host.admit(bare(CRASHER, "crasher.wasm"))
        ok.call("run")
        bad.call("run")
        with pytest.raises(CallError):
            crasher.call("run")
        assert host.publish_metrics()
        # Another process's view (the CLI opens the state directory on its own).
        doc = status_json(state, capsys)
        metrics = doc["metrics"]
        assert isinstance(metrics, dict)
        assert metrics["source"] == "live" and metrics["live_hosts"] == 1
        assert metrics["extensions_by_state"] == {"running": 2, "failed": 1}
        assert metrics["crashes_by_class"] == {"trap": 1}
        assert metrics["host_call_errors"] == {
            "statuses": {"invalid_argument": 1},
            "failures": {},
        }
        assert (metrics["throttles"], metrics["quarantines"], metrics["restarts"]) == (0, 0, 0)
        assert metrics["scheduler"]["granted"] == 3 and metrics["scheduler"]["refused"] == 0
        assert SECRET not in json.dumps(metrics)
        extensions = doc["extensions"]
        assert isinstance(extensions, list)
        assert {r["extension"] for r in extensions} >= {"ok", "bad", "crasher"}
        # The status run's own host counted nothing and published nothing over it.
        assert [s.host for s in StateStore(state).metrics_snapshots()] == [
            host._metrics_publisher.host_id  # type: ignore[union-attr]
        ]
    finally:
        host.close()
    doc = status_json(state, capsys)
    metrics = doc["metrics"]
    assert isinstance(metrics, dict)
    # The host closed: its last snapshot, with its extensions gone and its counts kept.
    assert metrics["source"] == "last host" and metrics["live_hosts"] == 0
    assert metrics["extensions_by_state"] == {} and metrics["crashes_by_class"] == {"trap": 1}
    assert main(["status", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "metrics (last published by a host now closed)" in out and "crashes 1" in out


def test_live_hosts_are_summed_and_a_silent_host_is_taken_for_dead(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = StateStore(state)
    one = {"crashes_by_class": {"trap": 1}, "host_call_errors": {"statuses": {"denied": 2}}}
    two = {"crashes_by_class": {"trap": 2, "panic": 1}, "throttles": 3}
    store.publish_metrics("a", 1, one, closed=False)
    store.publish_metrics("b", 2, two, closed=False)
    store.publish_metrics("c", 3, {"crashes_by_class": {"trap": 100}}, closed=True)
    now = store.metrics_snapshots()[0].published_at
    live = status_metrics(store, now)
    assert live["source"] == "live" and live["live_hosts"] == 2
    assert live["crashes_by_class"] == {"trap": 3, "panic": 1} and live["throttles"] == 3
    assert live["host_call_errors"] == {"statuses": {"denied": 2}, "failures": {}}
    later = now + int((LIVE_WITHIN_S + 1) * 1e9)
    stale = status_metrics(store, later)
    assert stale["source"] == "last host" and stale["live_hosts"] == 0
    for i in range(40):  # bounded: only the most recent hosts are kept
        store.publish_metrics(f"run-{i}", 4, {"restarts": 1}, closed=True)
    assert len(store.metrics_snapshots()) == 16
    store.close()


def test_without_any_snapshot_status_counts_from_the_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    with Host(Policy(), cache_dir=None, state_dir=state) as host:
        crasher = host.admit(bare(CRASHER, "crasher.wasm"))
        with pytest.raises(CallError):
            crasher.call("run")
    db = sqlite3.connect(state / "state.sqlite3")
    db.execute("DELETE FROM metrics_snapshots")
    db.commit()
    db.close()
    metrics = status_json(state, capsys)["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["source"] == "state" and metrics["crashes_by_class"] == {"trap": 1}
    assert metrics["extensions_by_state"] == {"closed": 1}


@pytest.mark.parametrize("old", ["1", "2"])
def test_an_older_state_schema_is_migrated(tmp_path: Path, old: str) -> None:
    state = tmp_path / "state"
    StateStore(state).close()
    db = sqlite3.connect(state / "state.sqlite3")
    db.execute("DROP TABLE metrics_snapshots")
    db.execute("UPDATE meta SET value=? WHERE key='schema'", (old,))
    db.commit()
    db.close()
    store = StateStore(state)
    store.publish_metrics("h", 1, {"restarts": 1}, closed=True)
    assert store.metrics_snapshots()[0].snapshot == {"restarts": 1}
    store.close()
    db = sqlite3.connect(state / "state.sqlite3")
    assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    db.close()


def test_the_publisher_writes_periodically_and_a_last_snapshot_as_it_closes(
    tmp_path: Path,
) -> None:
    from wasihost.supervisor.opmetrics import MetricsPublisher

    store = StateStore(tmp_path / "state")
    counts = {"restarts": 0}
    publisher = MetricsPublisher(store, lambda: dict(counts), interval_s=0.005)
    publisher.start()
    assert not publisher.publish()  # nothing counted yet: nothing written
    counts["restarts"] = 2
    end = time.monotonic() + 10
    while not store.metrics_snapshots():  # written by its thread, not by us
        assert time.monotonic() < end
        time.sleep(0.005)
    publisher.close()
    (last,) = store.metrics_snapshots()
    assert last.closed and last.snapshot == {"restarts": 2}
    assert not publisher.publish()  # closed for good
    store.close()
