"""Crash containment through the real engine: crash records, restart budgets with backoff,
quarantine with its report, release, metrics. Time is a fake clock: nothing sleeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.common import FakeClock, bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, ConfigError, CrashClass, FailureClass
from wasihost.core.lifecycle import ExtensionUnavailable, State
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.supervisor.supervision import BoundedRetry, Never, OnCrash, Supervisor

# Every command traps (a load past the end of memory), except "ok" (2 characters), which
# answers null.
CRASHER = build(
    guest_wat(
        """
    (if (i32.eq (local.get $cmd_len) (i32.const 2)) (then (return (call $ok_null))))
    (i64.load (i32.const -8))"""
    )
)


def host_with(default: Never | OnCrash | BoundedRetry | None, clock: FakeClock) -> Host:
    supervisor = Supervisor(default, clock=clock, wall_clock=lambda: 1_767_225_600.0)
    return Host(Policy(), cache_dir=None, supervisor=supervisor)


@pytest.fixture
def bounded(clock: FakeClock) -> Iterator[Host]:
    budget = BoundedRetry(max_restarts=3, window_s=60.0, backoff_s=1.0, max_backoff_s=10.0)
    with host_with(budget, clock) as host:
        yield host


def crash(ext: Extension) -> None:
    with pytest.raises(CallError) as info:
        ext.call("boom")
    assert info.value.failure is FailureClass.TRAP


def refused(ext: Extension) -> ExtensionUnavailable:
    with pytest.raises(ExtensionUnavailable) as info:
        ext.call("ok")
    return info.value


def test_a_crash_loop_is_quarantined_after_exactly_its_restart_budget(
    bounded: Host, clock: FakeClock
) -> None:
    ext = bounded.admit(bare(CRASHER))
    crash(ext)  # crash 1: the first restart is at once
    crash(ext)  # restart 1, crash 2: the next restart waits 1 s
    wait = refused(ext)
    assert wait.state is State.FAILED and wait.retry_after_s == pytest.approx(1.0)
    clock.now += 1.0
    crash(ext)  # restart 2, crash 3: then 2 s
    clock.now += 1.9
    assert refused(ext).retry_after_s == pytest.approx(0.1)
    clock.now += 0.1
    crash(ext)  # restart 3, crash 4: a 4th restart would exceed the budget of 3
    assert ext.lifecycle.state is State.QUARANTINED
    assert ext.starts == 4
    quarantined = refused(ext)
    assert quarantined.state is State.QUARANTINED and quarantined.retry_after_s is None
    assert "after 3 restarts within 60 s (its budget is 3)" in str(quarantined)

    report = bounded.quarantine_report(ext.id)
    assert [c.crash_class for c in report.crashes] == [CrashClass.TRAP] * 4
    assert "budget is 3" in report.why and "Host.release" in report.what_to_do
    metrics = bounded.metrics()
    assert metrics.extensions_by_state == {"quarantined": 1}
    assert metrics.crashes_by_class == {"trap": 4}
    assert (metrics.restarts, metrics.quarantines, metrics.backoff_refusals) == (3, 1, 2)


def test_released_it_starts_afresh_with_a_new_budget(bounded: Host, clock: FakeClock) -> None:
    ext = bounded.admit(bare(CRASHER))
    for _ in range(4):
        crash(ext)
        clock.now += 10.0
    assert ext.lifecycle.state is State.QUARANTINED
    bounded.release(ext.id)
    assert ext.call("ok") is None and ext.lifecycle.state is State.RUNNING
    crash(ext)
    assert ext.call("ok") is None  # the first restart of a new budget is at once


def test_crashes_further_apart_than_the_window_never_quarantine(
    bounded: Host, clock: FakeClock
) -> None:
    ext = bounded.admit(bare(CRASHER))
    for _ in range(10):
        crash(ext)
        clock.now += 61.0
    assert ext.lifecycle.state is State.FAILED
    assert ext.call("ok") is None


def test_never_quarantines_at_the_first_crash_and_on_crash_never_does(clock: FakeClock) -> None:
    with host_with(Never(), clock) as host:
        ext = host.admit(bare(CRASHER))
        crash(ext)
        assert ext.lifecycle.state is State.QUARANTINED
        assert "restart policy is Never" in str(refused(ext))
    with host_with(None, clock) as host:  # the default: OnCrash
        ext = host.admit(bare(CRASHER))
        for _ in range(25):
            crash(ext)
        assert ext.call("ok") is None


def test_one_extension_crashing_leaves_the_others_running(
    bounded: Host, clock: FakeClock
) -> None:
    bad = bounded.admit(bare(CRASHER, "bad.wasm"))
    good = bounded.admit(bare(CRASHER, "good.wasm"))
    bounded.supervisor.set_policy(bad.id, Never())
    crash(bad)
    assert bad.lifecycle.state is State.QUARANTINED
    assert good.call("ok") is None and good.lifecycle.state is State.RUNNING
    assert bounded.metrics().extensions_by_state == {"quarantined": 1, "running": 1}


def test_a_start_that_fails_its_handshake_is_a_crash_too(clock: FakeClock) -> None:
    broken = build(guest_wat(hello={"id": "x", "version": 1}))
    with host_with(Never(), clock) as host:
        ext = host.admit(bare(broken))
        with pytest.raises(CallError) as info:
            ext.call("ok")
        assert info.value.failure is FailureClass.HANDSHAKE
        assert ext.lifecycle.state is State.QUARANTINED
        assert host.supervisor.crashes(ext.id)[0].crash_class is CrashClass.PROTOCOL_VIOLATION


def test_bad_restart_policies_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_restarts=0"):
        BoundedRetry(max_restarts=0)
    with pytest.raises(ConfigError, match="window_s"):
        BoundedRetry(window_s=-1.0)
    with pytest.raises(ConfigError, match="not Never, OnCrash or BoundedRetry"):
        Supervisor().set_policy("x", "bounded")  # type: ignore[arg-type]


def test_status_reports_quarantine_and_crashes_by_class_from_the_state(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    from wasihost.cli import main

    state = tmp_path / "state"
    supervisor = Supervisor(BoundedRetry(max_restarts=1, window_s=60.0), clock=clock)
    with Host(Policy(), cache_dir=None, state_dir=state, supervisor=supervisor) as host:
        ext = host.admit(bare(CRASHER, "crasher.wasm"))
        crash(ext)
        crash(ext)  # the one restart of the budget is spent: quarantined
        assert ext.lifecycle.state is State.QUARANTINED
    assert main(["status", "crasher", "--json", "--state-dir", str(state)]) == 0
    (report,) = json.loads(capsys.readouterr().out)["extensions"]
    assert report["state"] == "quarantined" and "its budget is 1" in report["why"]
    assert report["crashes_by_class"] == {"trap": 2}
    assert main(["status", "crasher", "--state-dir", str(state)]) == 0
    assert "crashes in the journal: trap 2" in capsys.readouterr().out


def test_a_quarantine_survives_a_host_restart_until_the_operator_releases_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    package = tmp_path / "crasher"
    package.mkdir()
    (package / "crasher.wasm").write_bytes(CRASHER)
    (package / "extension.toml").write_text(
        '[extension]\nschema = "wasihost-manifest/1"\nid = "org.test.wat"\n'
        'version = "0.1.0"\nabi = "1.0"\nmodule = "crasher.wasm"\n\n'
        '[commands]\nboom = {}\nok = {}\n'
    )
    state = tmp_path / "state"
    with Host(Policy(), cache_dir=None, state_dir=state, supervisor=Supervisor(Never())) as host:
        host.install(package)
        ext = host.load_installed("org.test.wat")
        crash(ext)
        assert ext.lifecycle.state is State.QUARANTINED
    with Host(Policy(), cache_dir=None, state_dir=state) as again:  # a new process, say
        ext = again.load_installed("org.test.wat")
        assert ext.lifecycle.state is State.QUARANTINED
        assert "restart policy is Never" in str(refused(ext))
        again.release(ext.id)
        assert ext.call("ok") is None
