"""Throttle that delays (budgets.ThrottleMode.DELAY) through the real engine and real guests:
a call over its extension's budget waits for room (bounded by its deadline and
MAX_THROTTLE_DELAY_S) instead of being refused; the wait holds no lock, ends at once on a
cancel, close or stop, works for ``acall`` without blocking the event loop, and is counted.

Time is a fake clock whose ``sleep`` is the governor's: nothing here waits for real time
but for a call to have reached its wait."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.support.common import FIXTURES, FakeClock, run_in_thread
from wasihost.cli import main
from wasihost.core.budgets import (
    MAX_THROTTLE_DELAY_S,
    BudgetPolicy,
    budget_for,
    stricter_mode,
)
from wasihost.core.call_ticket import CallTicket
from wasihost.core.errors import CallError, FailureClass, ManifestError
from wasihost.core.lifecycle import ExtensionUnavailable, State
from wasihost.core.limits import Resource, ThrottleMode
from wasihost.core.manifest import parse_manifest
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package
from wasihost.supervisor.governor import Governor, Throttled
from wasihost.supervisor.scheduling import HostBusy, Scheduler

COMPUTE = FIXTURES / "compute"
ECHO = FIXTURES / "echo"
SPIN = FIXTURES / "spin"
# compute's "run" with this many rounds burns about 2.5M fuel; two of them cross CPU_BUDGET.
HUNGRY_ROUNDS = 100_000
CPU_BUDGET = 3_000_000
# A deadline long enough for any wait the tests make (the fake clock moves, not real time).
LONG_TIMEOUT_MS = 60_000
# How long a test waits (real time) for a call to reach its wait, or to end once woken.
PROMPT_S = 5.0


def delaying(cache: Path, clock: FakeClock, mode: str = "delay") -> Host:
    budgets = BudgetPolicy(cpu_fuel_per_minute=CPU_BUDGET, throttle_mode=mode)
    return Host(
        Policy(allow={"log"}, budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock, sleep=clock.sleep),
    )


def compute(host: Host, *, throttle: str | None = None) -> Extension:
    """fixtures/compute with a long deadline, its manifest asking ``[budget] throttle``."""
    package = load_package(COMPUTE, host.registry.capabilities())
    assert package.manifest is not None
    resources = attrs.evolve(package.manifest.resources, timeout_ms=LONG_TIMEOUT_MS)
    manifest = attrs.evolve(package.manifest, resources=resources, throttle=throttle)
    return host.admit(attrs.evolve(package, manifest=manifest))


def throttled_for(ext: Extension, clock: FakeClock, wait_s: float) -> None:
    """Two hungry calls ``60 - wait_s`` seconds apart: the second crosses the budget, and
    room comes back ``wait_s`` seconds later (when the first call's bucket leaves)."""
    ext.call("run", {"n": HUNGRY_ROUNDS})
    clock.now += 60.0 - wait_s
    ext.call("run", {"n": HUNGRY_ROUNDS})  # crosses: runs to its end, then the throttle
    assert ext.lifecycle.state is State.THROTTLED


def test_a_delayed_call_waits_for_the_window_and_then_runs(
    cache: Path, clock: FakeClock
) -> None:
    with delaying(cache, clock) as host:
        ext = compute(host)
        throttled_for(ext, clock, 20.0)
        before = clock.now
        assert ext.call("run", {"n": 10}) == {"result": ext.call("run", {"n": 10})["result"]}
        # It waited once, as long as the hint said (the first bucket leaving), on the
        # governor's clock; then it ran, and the extension is back to running.
        (waited,) = clock.sleeps
        assert waited == pytest.approx(20.0, abs=1e-3)
        assert clock.now - before == pytest.approx(20.0, abs=1e-3)
        assert ext.lifecycle.state is State.RUNNING
        usage = ext.usage()
        assert (usage.delays, usage.refusals) == (1, 0)
        metrics = host.metrics()
        assert (metrics.throttle_delays, metrics.throttle_refusals) == (1, 0)
        assert metrics.budget_actions["throttle"] == 1
        assert metrics.to_json()["throttle_delays"] == 1
        assert usage.budget.throttle_mode is ThrottleMode.DELAY
        assert usage.to_json()["budget"]["throttle_mode"] == "delay"


def test_a_delay_is_bounded_by_the_deadline_and_the_maximum_else_refused(
    cache: Path, clock: FakeClock
) -> None:
    with delaying(cache, clock) as host:
        ext = compute(host)
        # Room only after a whole minute: past MAX_THROTTLE_DELAY_S, so refused at once.
        ext.call("run", {"n": HUNGRY_ROUNDS})
        ext.call("run", {"n": HUNGRY_ROUNDS})
        with pytest.raises(Throttled) as far:
            ext.call("run", {"n": 10})
        assert far.value.retry_after_s is not None
        assert far.value.retry_after_s > MAX_THROTTLE_DELAY_S
        assert clock.sleeps == []
        # Room in 20 s: beyond a 5 s deadline, so that call is refused without waiting...
        clock.now += 40.0
        with pytest.raises(Throttled) as short:
            ext.call("run", {"n": 10}, timeout_ms=5_000)
        assert short.value.retry_after_s == pytest.approx(20.0, abs=1e-3)
        assert clock.sleeps == []
        # ... and within the extension's own 60 s one, so this one waits and runs.
        ext.call("run", {"n": 10})
        assert len(clock.sleeps) == 1
        usage = ext.usage()
        assert (usage.delays, usage.refusals) == (1, 2)
        assert host.metrics().throttle_refusals == 2


def test_the_stricter_throttle_mode_of_host_and_manifest_applies(
    cache: Path, clock: FakeClock
) -> None:
    assert stricter_mode(ThrottleMode.DELAY, None) is ThrottleMode.DELAY
    assert stricter_mode(ThrottleMode.DELAY, ThrottleMode.REFUSE) is ThrottleMode.REFUSE
    assert stricter_mode(ThrottleMode.REFUSE, ThrottleMode.DELAY) is ThrottleMode.REFUSE
    assert stricter_mode(ThrottleMode.REFUSE, None) is ThrottleMode.REFUSE
    text = (COMPUTE / "extension.toml").read_text()
    asked = parse_manifest(text + '\n[budget]\nthrottle = "refuse"\n', frozenset())
    assert asked.throttle == "refuse"
    assert parse_manifest(text, frozenset()).throttle is None
    for bad in ('throttle = "sometimes"', "throttle = 1", 'wait = "delay"'):
        with pytest.raises(ManifestError) as refused:
            parse_manifest(text + f"\n[budget]\n{bad}\n", frozenset())
        assert refused.value.key.startswith("budget")
    delay = budget_for(asked.resources, asked, BudgetPolicy(throttle_mode="delay"), 16)
    assert delay.throttle_mode is ThrottleMode.REFUSE
    # Through the engine: a manifest asking "refuse" is refused at once on a delaying host.
    with delaying(cache, clock) as host:
        ext = compute(host, throttle="refuse")
        throttled_for(ext, clock, 20.0)
        with pytest.raises(Throttled):
            ext.call("run", {"n": 10})
        assert clock.sleeps == []
    # And on the default host (refuse), a manifest asking "delay" gets no wait either.
    with delaying(cache, clock, mode="refuse") as host:
        ext = compute(host, throttle="delay")
        clock.now += 3600
        throttled_for(ext, clock, 20.0)
        with pytest.raises(Throttled):
            ext.call("run", {"n": 10})
        assert clock.sleeps == []
        assert host.metrics().throttle_delays == 0


def waiting_call(ext: Extension, clock: FakeClock, call: Any) -> tuple[Any, list[BaseException]]:
    """``call`` on its own thread, once it waits for room (the clock holds its sleep)."""
    clock.sleeping.clear()
    worker, outcome = run_in_thread(call)
    assert clock.sleeping.wait(PROMPT_S), "the call never waited"
    return worker, outcome


def test_a_waiting_call_holds_no_lock_and_ends_at_once_on_cancel_stop_and_close(
    cache: Path, clock: FakeClock
) -> None:
    clock.hold = True
    with delaying(cache, clock) as host:
        ext = compute(host)
        other = host.load(ECHO / "echo.wasm", grants=[])  # bare: a grant of log changes it
        throttled_for(ext, clock, 20.0)

        # Cancelled: the call ends as cancelled.
        ticket = CallTicket(ext)
        worker, outcome = waiting_call(
            ext, clock, lambda: ext.call_cancellable(ticket, "run", {"n": 10})
        )
        # Meanwhile nothing of the host is held: another extension's calls, the metrics,
        # this extension's usage (its pool lock), a grant change, all go through.
        started = time.monotonic()
        assert other.call("echo", 7) == 7
        assert host.usage(ext.id).calls_in_flight == 0
        assert host.metrics().throttle_delays == 1
        host.grant(other.id, "log")
        assert time.monotonic() - started < PROMPT_S
        assert worker.is_alive()
        ticket.cancel()
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (cancelled,) = outcome
        assert isinstance(cancelled, CallError) and cancelled.failure is FailureClass.CANCELLED

        # Stopped: refused with the throttle's hint rather than waiting on.
        worker, outcome = waiting_call(ext, clock, lambda: ext.call("run", {"n": 10}))
        ext.stop()
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (stopped,) = outcome
        assert isinstance(stopped, Throttled) and stopped.retry_after_s is not None

        # Closed: refused as closed.
        worker, outcome = waiting_call(ext, clock, lambda: ext.call("run", {"n": 10}))
        ext.close()
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (closed,) = outcome
        assert isinstance(closed, ExtensionUnavailable) and closed.state is State.CLOSED
        assert host.metrics().throttle_delays == 3
        assert clock.now == pytest.approx(1040.0)  # no wait ran its course


def waits_again(clock: FakeClock, sleeps: int) -> None:
    """The waiting call was woken and has gone back to its wait (its ``sleeps + 1``-th)."""
    give_up = time.monotonic() + PROMPT_S
    while len(clock.sleeps) <= sleeps or not clock.sleeping.is_set():
        assert time.monotonic() < give_up, "the woken call never waited again"
        time.sleep(0.002)


def test_a_call_woken_by_a_pause_or_quarantine_gets_that_states_refusal(
    cache: Path, clock: FakeClock
) -> None:
    clock.hold = True
    with delaying(cache, clock) as host:
        ext = compute(host)
        throttled_for(ext, clock, 20.0)
        worker, outcome = waiting_call(ext, clock, lambda: ext.call("run", {"n": 10}))
        # The operator resumes it: still over its budget, so the call waits on...
        sleeps = len(clock.sleeps)
        ext.resume()
        waits_again(clock, sleeps)
        assert ext.lifecycle.state is State.RUNNING and worker.is_alive()
        # ... then pauses it: the wait ends with the pause's own refusal, as a fresh call's.
        ext.pause("the operator looks into it")
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (paused,) = outcome
        assert not isinstance(paused, Throttled)
        assert isinstance(paused, ExtensionUnavailable) and paused.state is State.PAUSED
        assert "the operator looks into it" in str(paused) and paused.retry_after_s is None
        with pytest.raises(ExtensionUnavailable) as fresh:
            ext.call("run", {"n": 10})  # over its budget too, and still refused as paused
        assert not isinstance(fresh.value, Throttled)
        assert (type(fresh.value), str(fresh.value)) == (type(paused), str(paused))

        ext.resume()
        worker, outcome = waiting_call(ext, clock, lambda: ext.call("run", {"n": 10}))
        ext.quarantine("crash loop")
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (quarantined,) = outcome
        assert not isinstance(quarantined, Throttled)
        assert isinstance(quarantined, ExtensionUnavailable)
        assert quarantined.state is State.QUARANTINED and "crash loop" in str(quarantined)
        assert clock.now == pytest.approx(1040.0)  # no wait ran its course
        # Those calls waited, and were refused by their state, not by the budget.
        assert (host.metrics().throttle_delays, ext.usage().refusals) == (2, 0)


def test_an_acall_waits_off_the_event_loop_and_its_cancellation_ends_the_wait(
    cache: Path, clock: FakeClock
) -> None:
    clock.hold = True
    with delaying(cache, clock) as host:
        ext = compute(host)
        other = host.load(ECHO)
        throttled_for(ext, clock, 20.0)

        async def scenario() -> int:
            task = asyncio.create_task(ext.acall("run", {"n": 10}))
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, clock.sleeping.wait, PROMPT_S)
            # The loop is free while the call waits: another acall runs to its end.
            answer = await asyncio.wait_for(other.acall("echo", 5), PROMPT_S)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert isinstance(answer, int)
            return answer

        assert asyncio.run(scenario()) == 5
        assert not clock.sleeping.is_set()  # the call thread left its wait
        assert host.metrics().throttle_delays == 1
        # Then, with the clock moving on its own again, an acall waits and runs.
        clock.hold = False

        async def waits() -> Any:
            return await ext.acall("run", {"n": 10})

        assert "result" in asyncio.run(waits())
        assert host.metrics().throttle_delays == 2
        assert ext.lifecycle.state is State.RUNNING


def test_a_delayed_call_holds_no_scheduler_slot_while_it_waits(
    cache: Path, clock: FakeClock
) -> None:
    clock.hold = True
    scheduler = Scheduler(max_concurrent_calls=1)
    budgets = BudgetPolicy(cpu_fuel_per_minute=CPU_BUDGET, throttle_mode="delay")
    with Host(
        Policy(allow={"log"}, budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock, sleep=clock.sleep),
        scheduler=scheduler,
    ) as host:
        ext = compute(host)
        other = host.load(ECHO)
        throttled_for(ext, clock, 20.0)
        worker, outcome = waiting_call(ext, clock, lambda: ext.call("run", {"n": 10}))
        # The host's only slot is free while the call waits for room: another extension's
        # call takes it at once (were it held, this would wait out its deadline: HostBusy).
        assert other.call("echo", 7) == 7  # its own deadline: 1 s
        assert scheduler.stats().running == 0
        assert worker.is_alive() and not outcome
        # Room comes: the call takes a slot again and runs in it.
        granted = scheduler.stats().granted
        clock.now += clock.sleeps[-1]  # the hint: 20 s (and a microsecond)
        worker.join(PROMPT_S)
        assert not worker.is_alive() and not outcome
        stats = scheduler.stats()
        assert (stats.running, stats.granted) == (0, granted + 1)
        assert ext.lifecycle.state is State.RUNNING
        assert host.metrics().throttle_delays == 1

        # Its deadline and ticket stay its own: a cancel ends the wait as cancelled, and
        # the slot it gave back is not taken again.
        throttled_for(ext, clock, 20.0)
        ticket = CallTicket(ext)
        worker, outcome = waiting_call(
            ext, clock, lambda: ext.call_cancellable(ticket, "run", {"n": 10})
        )
        assert scheduler.stats().running == 0
        ticket.cancel()
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (cancelled,) = outcome
        assert isinstance(cancelled, CallError) and cancelled.failure is FailureClass.CANCELLED
        assert scheduler.stats().running == 0


def scheduled(cache: Path, clock: FakeClock, scheduler: Scheduler) -> tuple[Host, Extension]:
    """A delaying host with ``scheduler``, and fixtures/spin on it with time to spin long."""
    budgets = BudgetPolicy(cpu_fuel_per_minute=CPU_BUDGET, throttle_mode="delay")
    host = Host(
        Policy(allow={"log"}, budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock, sleep=clock.sleep),
        scheduler=scheduler,
    )
    package = load_package(SPIN, host.registry.capabilities())
    assert package.manifest is not None
    resources = attrs.evolve(
        package.manifest.resources, fuel_per_call=10**10, timeout_ms=LONG_TIMEOUT_MS
    )
    spin = host.admit(
        attrs.evolve(package, manifest=attrs.evolve(package.manifest, resources=resources))
    )
    return host, spin


def holds_the_slot(scheduler: Scheduler, spin: Extension) -> tuple[Any, list[BaseException]]:
    """A spinning call on its own thread, once it holds the scheduler's only slot."""
    spinner, spun = run_in_thread(lambda: spin.call("run"))
    give_up = time.monotonic() + PROMPT_S
    while scheduler.stats().running < 1 or spin.usage().calls_in_flight < 1:
        assert time.monotonic() < give_up, "the spinning call never took the slot"
        time.sleep(0.005)
    return spinner, spun


def test_a_delayed_call_queues_for_a_slot_again_on_its_own_deadline(
    cache: Path, clock: FakeClock
) -> None:
    clock.hold = True
    scheduler = Scheduler(max_concurrent_calls=1)
    host, spin = scheduled(cache, clock, scheduler)
    with host:
        ext = compute(host)
        throttled_for(ext, clock, 0.5)  # room in half a (fake) second: within a 1 s deadline
        started = time.monotonic()
        worker, outcome = waiting_call(
            ext, clock, lambda: ext.call("run", {"n": 10}, timeout_ms=1_000)
        )
        # While it waits, a spinning call takes the only slot, and keeps it.
        spinner, spun = holds_the_slot(scheduler, spin)
        # Room comes: the delayed call queues for a slot, and at its own deadline (1 s from
        # its start, the wait for room included) it is refused busy, never run.
        clock.now += clock.sleeps[-1]
        worker.join(PROMPT_S)
        assert not worker.is_alive()
        (busy,) = outcome
        assert isinstance(busy, HostBusy) and busy.retry_after_s > 0
        assert time.monotonic() - started < PROMPT_S
        assert ext.usage().calls_in_flight == 0
        stats = scheduler.stats()
        assert (stats.running, stats.refused) == (1, 1)
        spin.stop_calls(CallError(FailureClass.CANCELLED, "the test is over"))
        spinner.join(PROMPT_S)
        assert not spinner.is_alive() and len(spun) == 1
        assert scheduler.stats().running == 0


def test_the_hosts_shutdown_ends_a_delayed_calls_new_wait_for_a_slot(
    cache: Path, clock: FakeClock
) -> None:
    clock.hold = True
    scheduler = Scheduler(max_concurrent_calls=1)
    host, spin = scheduled(cache, clock, scheduler)
    with host:
        ext = compute(host)
        throttled_for(ext, clock, 0.5)
        worker, outcome = waiting_call(ext, clock, lambda: ext.call("run", {"n": 10}))
        spinner, _ = holds_the_slot(scheduler, spin)
        clock.now += clock.sleeps[-1]  # room: the call queues for the slot the spinner holds
        give_up = time.monotonic() + PROMPT_S
        while scheduler.stats().waiting < 1:
            assert time.monotonic() < give_up, "the delayed call never queued for a slot"
            time.sleep(0.005)
        started = time.monotonic()
        host.close()
        worker.join(PROMPT_S)
        assert not worker.is_alive() and time.monotonic() - started < PROMPT_S
        (refused,) = outcome
        assert isinstance(refused, ExtensionUnavailable)
        assert "the host is shutting down" in str(refused)
        spinner.join(PROMPT_S)
        assert not spinner.is_alive()


def test_terminate_never_delays(cache: Path, clock: FakeClock) -> None:
    budgets = BudgetPolicy(
        cpu_fuel_per_minute=CPU_BUDGET,
        throttle_mode="delay",
        actions={Resource.CPU_FUEL_PER_MINUTE: "terminate"},
    )
    with Host(
        Policy(allow={"log"}, budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock, sleep=clock.sleep),
    ) as host:
        ext = compute(host)
        ext.call("run", {"n": HUNGRY_ROUNDS})
        clock.now += 40.0
        with pytest.raises(CallError):
            ext.call("run", {"n": HUNGRY_ROUNDS})  # crosses: terminated
        with pytest.raises(Throttled) as refused:
            ext.call("run", {"n": 10})
        assert refused.value.state is State.FAILED
        assert clock.sleeps == []
        assert host.metrics().throttle_refusals == 1


def test_delays_and_level_actions_reach_the_operators_status_json(
    cache: Path, clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    budgets = BudgetPolicy(
        cpu_fuel_per_minute=CPU_BUDGET,
        throttle_mode="delay",
        actions={Resource.FUEL_PER_CALL: "warn"},
    )
    with Host(
        Policy(allow={"log"}, budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock, sleep=clock.sleep),
        state_dir=state,
    ) as host:
        ext = compute(host)
        throttled_for(ext, clock, 20.0)
        ext.call("run", {"n": 10})  # waits, then runs
        with pytest.raises(CallError):
            ext.call("run", {"n": HUNGRY_ROUNDS}, fuel=1000)  # a level: fuel per call
        assert host.publish_metrics()
        # Another process's view: the CLI opens the state directory on its own.
        assert main(["status", "--json", "--state-dir", str(state)]) == 0
        metrics = json.loads(capsys.readouterr().out)["metrics"]
        assert metrics["source"] == "live"
        assert metrics["throttle_delays"] == 1 and metrics["throttle_refusals"] == 0
        assert metrics["budget_actions"]["throttle"] == 1
        assert metrics["budget_actions"]["warn"] == 1
