"""Red team of the supervisor (2026-12-01), through the real engine with a fake clock: operator
actions and grant changes that must not reset a crash loop's restart budget or backoff."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.host.test_pool import APPFNS, WAIT_S, pooled
from tests.supervisor.test_supervision import CRASHER, crash, host_with, refused
from tests.support.common import APPFNS_LOOKUP, APPFNS_REMEMBER, FakeClock, bare, run_in_thread
from wasihost.core.errors import CallError, WasihostError
from wasihost.core.lifecycle import State
from wasihost.core.serving import CallContext
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.supervisor.supervision import BoundedRetry, Never, Supervisor


@pytest.fixture
def bounded(clock: FakeClock) -> Iterator[Host]:
    budget = BoundedRetry(max_restarts=3, window_s=60.0, backoff_s=1.0, max_backoff_s=10.0)
    with host_with(budget, clock) as host:
        yield host


def test_release_of_an_extension_not_quarantined_keeps_its_budget_and_backoff(
    bounded: Host, clock: FakeClock
) -> None:
    ext = bounded.admit(bare(CRASHER))
    crash(ext)
    crash(ext)  # restart 1, crash 2: backing off 1 s
    assert ext.lifecycle.state is State.FAILED
    with pytest.raises(WasihostError):
        bounded.release(ext.id)  # not quarantined: refused
    assert refused(ext).retry_after_s == pytest.approx(1.0)  # still backing off
    clock.now += 1.0
    crash(ext)
    clock.now += 2.0
    crash(ext)  # restart 3, crash 4: over the budget, release or not
    assert ext.lifecycle.state is State.QUARANTINED


def test_a_stop_after_a_crash_neither_skips_the_backoff_nor_the_budget(
    bounded: Host, clock: FakeClock
) -> None:
    ext = bounded.admit(bare(CRASHER))
    crash(ext)
    for _ in range(3):
        ext.stop()  # failed -> stopped: the next call is still a restart after a crash
        clock.now += 10.0  # past every backoff, within the window
        crash(ext)
    assert ext.lifecycle.state is State.QUARANTINED
    assert bounded.metrics().restarts == 3


def test_a_stop_during_the_backoff_does_not_end_it(bounded: Host, clock: FakeClock) -> None:
    ext = bounded.admit(bare(CRASHER))
    crash(ext)
    crash(ext)  # backing off 1 s
    ext.stop()
    assert refused(ext).retry_after_s == pytest.approx(1.0)


def test_a_policy_change_after_a_crash_does_not_end_its_backoff(
    bounded: Host, clock: FakeClock
) -> None:
    ext = bounded.admit(bare(CRASHER))
    crash(ext)
    crash(ext)  # backing off 1 s
    # Lower ceilings: the extension is re-admitted under them and stopped (failed -> stopped).
    bounded.update_policy(Policy(ceilings={"fuel_per_call": ext.resources.fuel_per_call // 2}))
    wait = refused(ext)
    assert ext.lifecycle.state is State.STOPPED and wait.retry_after_s == pytest.approx(1.0)
    clock.now += 1.0
    crash(ext)
    assert bounded.metrics().restarts == 2


def test_two_calls_crashing_at_once_are_two_crashes_and_one_quarantine(clock: FakeClock) -> None:
    supervisor = Supervisor(Never(), clock=clock)
    host = Host(Policy(allow={"myapp.read", "myapp.write"}), cache_dir=None, supervisor=supervisor)
    inside = threading.Semaphore(0)
    go = threading.Event()

    @host.function("myapp.lookup", **APPFNS_LOOKUP)
    def lookup(ctx: CallContext, request: Any) -> Any:
        if request == "hold":  # the first call waits in here until the second has crashed
            inside.release()
            go.wait(WAIT_S)
        raise KeyError("deliberate")

    @host.function("myapp.remember", **APPFNS_REMEMBER)
    def remember(ctx: CallContext, request: Any) -> Any:
        return None

    try:
        ext = pooled(host, APPFNS, 2)
        held, errors = run_in_thread(lambda: ext.call("lookup", "hold"))
        assert inside.acquire(timeout=WAIT_S)
        with pytest.raises(CallError):
            ext.call("lookup", "now")  # crash 1: Never quarantines it
        assert ext.lifecycle.state is State.QUARANTINED
        go.set()
        held.join(WAIT_S)
        assert len(errors) == 1 and isinstance(errors[0], CallError)  # crash 2, in flight
        metrics = host.metrics()
        assert metrics.crashes_by_class == {"host_call_failure": 2}
        assert metrics.quarantines == 1
    finally:
        go.set()
        host.close()
