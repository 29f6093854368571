"""The seven levels of a budget fire the policy's action (budgets.py, governor.py) through the
real engine and real guests: storage bytes, open handles, background jobs, event-queue depth,
concurrent calls, fuel per call and memory. Each static limit still refuses as it always did;
the refusal is reported to the governor, which applies the level's action (warn by default)
once per episode of budgets.LEVEL_COOL_OFF_S.

Time is a fake clock: nothing here sleeps but the wait for a spinning call to be in flight."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.common import FIXTURES, FakeClock, bare, run_in_thread
from tests.support.guests import build, guest_wat
from tests.support.strategies import level_steps
from wasihost.brokers.events import EventsBroker
from wasihost.brokers.files import FilesBroker
from wasihost.core.budgets import (
    LEVEL_COOL_OFF_S,
    LEVELS,
    Account,
    BudgetPolicy,
    budget_for,
)
from wasihost.core.errors import CallError, ConfigError, CrashClass, FailureClass
from wasihost.core.lifecycle import ExtensionUnavailable, State
from wasihost.core.limits import MAX_OPEN_FILES, Action, Resource
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package, load_package
from wasihost.supervisor.governor import Governor, Throttled
from wasihost.wasi import wasi_profile

STORAGE = FIXTURES / "storage"
FILES = FIXTURES / "files"
JOBS = FIXTURES / "jobs"
EVENTS = FIXTURES / "events"
SPIN = FIXTURES / "spin"
COMPUTE = FIXTURES / "compute"
ECHO = FIXTURES / "echo"
# How long a test waits (real time) for a call to be in flight, or to end once stopped.
PROMPT_S = 5.0
# A bare guest that grows its memory a page at a time until refused, then traps, as a guest
# whose allocator fails aborts; and one that traps with its memory far from the limit.
MEMORY_EATER = build(
    guest_wat(
        "(loop $grow (br_if $grow (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))"
        " (unreachable)"
    )
)
PLAIN_TRAP = build(guest_wat("(unreachable)"))
# A plain WASI command (run_command) that spins until its fuel or deadline ends it.
SPINNING_COMMAND = build(
    '(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))'
)


def levels_host(
    cache: Path,
    clock: FakeClock,
    actions: dict[Resource, Action],
    allow: Iterable[str] = ("log",),
    mode: str = "refuse",
    **options: Any,
) -> Host:
    budgets = BudgetPolicy(actions=actions, throttle_mode=mode)
    return Host(
        Policy(allow=set(allow), budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock, sleep=clock.sleep),
        **options,
    )


def with_resources(host: Host, source: Path, **resources: int) -> Package:
    package = load_package(source, host.registry.capabilities())
    assert package.manifest is not None
    changed = attrs.evolve(package.manifest.resources, **resources)
    return attrs.evolve(package, manifest=attrs.evolve(package.manifest, resources=changed))


def budget_lines(host: Host, ext: Extension) -> list[str]:
    assert host.state is not None
    return [e.detail for e in host.state.events(ext.id, 200) if e.kind == "budget"]


def in_flight(ext: Extension, calls: int) -> None:
    give_up = time.monotonic() + PROMPT_S
    while ext.usage().calls_in_flight < calls:
        assert time.monotonic() < give_up, "the spinning call never started"
        time.sleep(0.01)


# -- storage bytes: throttle, and the warn default ----------------------------------------------


def test_a_storage_quota_crossing_throttles_calls_for_the_cool_off(
    cache: Path, clock: FakeClock, tmp_path: Path
) -> None:
    with levels_host(
        cache,
        clock,
        {Resource.STORAGE_BYTES: Action.THROTTLE},
        allow={"storage", "log"},
        state_dir=tmp_path / "s",
    ) as host:
        host.grant("org.wasihost.fixtures.storage", "storage")
        ext = host.admit(with_resources(host, STORAGE, storage_max_bytes=4096))
        # The broker refuses the write past the quota, as it always did; the guest sees it.
        filled = ext.call("fill", {"prefix": "k", "size": 1000})
        assert filled["class"] == "quota_exceeded" and filled["written"] >= 3
        assert ext.lifecycle.state is State.THROTTLED
        with pytest.raises(Throttled) as refused:
            ext.call("get", {"key": "k0"})
        assert refused.value.resource is Resource.STORAGE_BYTES
        assert refused.value.retry_after_s == pytest.approx(LEVEL_COOL_OFF_S, abs=1e-3)
        usage = ext.usage()
        assert usage.actions_fired["throttle"] == 1 and usage.refusals == 1
        assert usage.retry_after_s == pytest.approx(LEVEL_COOL_OFF_S, abs=1e-3)
        (line,) = budget_lines(host, ext)
        assert "storage_bytes limit 4096 reached" in line and "action throttle" in line
        clock.now += LEVEL_COOL_OFF_S / 2
        with pytest.raises(Throttled) as again:
            ext.call("get", {"key": "k0"})
        assert again.value.retry_after_s == pytest.approx(LEVEL_COOL_OFF_S / 2, abs=1e-3)
        clock.now += LEVEL_COOL_OFF_S / 2
        value = ext.call("get", {"key": "k0"})
        assert isinstance(value, bytes) and len(value) == 1000
        assert ext.lifecycle.state is State.RUNNING
        metrics = host.metrics()
        assert metrics.budget_actions["throttle"] == 1
        assert metrics.throttle_refusals == 2


def test_levels_warn_by_default_once_per_episode_and_refuse_nothing_more(
    cache: Path, clock: FakeClock, tmp_path: Path
) -> None:
    with levels_host(cache, clock, {}, allow={"storage", "log"}, state_dir=tmp_path / "s") as host:
        host.grant("org.wasihost.fixtures.storage", "storage")
        ext = host.admit(with_resources(host, STORAGE, storage_max_bytes=4096))
        assert ext.usage().budget.actions[Resource.STORAGE_BYTES] is Action.WARN
        for _ in range(3):  # the guest retries: one episode, one warning
            assert ext.call("fill", {"prefix": "k", "size": 1000})["class"] == "quota_exceeded"
        assert ext.lifecycle.state is State.RUNNING
        assert ext.call("get", {"key": "nothing"}) is None  # nothing refused
        assert len(budget_lines(host, ext)) == 1
        clock.now += LEVEL_COOL_OFF_S
        assert ext.call("fill", {"prefix": "k", "size": 1000})["class"] == "quota_exceeded"
        lines = budget_lines(host, ext)
        assert len(lines) == 2 and all("action warn" in line for line in lines)
        usage = ext.usage()
        assert usage.actions_fired["warn"] == 2 and usage.refusals == 0
        assert usage.retry_after_s is None
        assert host.metrics().budget_actions["warn"] == 2


# -- open handles: pause --------------------------------------------------------------------------


def test_the_open_handles_limit_pauses_the_extension_until_resumed(
    cache: Path, clock: FakeClock, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_bytes(b"hello")
    (tmp_path / "tmp").mkdir()
    files = FilesBroker(clock=clock, temp_dir=tmp_path / "tmp")
    with levels_host(
        cache,
        clock,
        {Resource.OPEN_HANDLES: Action.PAUSE},
        allow={"files", "log"},
        brokers=[files],
    ) as host:
        ext = host.load(FILES)
        host.grant(
            ext.id, "files", {"mounts": {"data": {"host": str(tmp_path / "data"), "mode": "rw"}}}
        )
        many = {"mount": "data", "path": "a.txt", "n": MAX_OPEN_FILES + 2}
        assert ext.call("open-many", many) == {"opened": MAX_OPEN_FILES, "error": "quota_exceeded"}
        assert ext.lifecycle.state is State.PAUSED
        with pytest.raises(ExtensionUnavailable) as refused:
            ext.call("read", {"mount": "data", "path": "a.txt"})
        assert refused.value.state is State.PAUSED
        assert "open_handles limit 16 reached" in str(refused.value)
        clock.now += 3600  # the cool-off is long over: a pause waits for the operator
        with pytest.raises(ExtensionUnavailable):
            ext.call("read", {"mount": "data", "path": "a.txt"})
        ext.resume()
        assert ext.call("read", {"mount": "data", "path": "a.txt"}) == b"hello"
        assert host.metrics().budget_actions["pause"] == 1


# -- background jobs: terminate -----------------------------------------------------------------


def test_the_jobs_limit_under_terminate_ends_the_call_and_crashes_the_extension(
    cache: Path, clock: FakeClock
) -> None:
    with levels_host(
        cache, clock, {Resource.BACKGROUND_JOBS: Action.TERMINATE}, allow={"jobs", "log"}
    ) as host:
        ext = host.load(JOBS)
        for _ in range(4):  # max_jobs = 4
            ext.call("schedule", {"command": "tick", "delay_ms": 600_000})
        with pytest.raises(CallError) as ended:
            ext.call("schedule", {"command": "tick", "delay_ms": 600_000})
        assert ended.value.failure is FailureClass.OUT_OF_FUEL
        assert "terminated: background_jobs limit 4 reached" in ended.value.message
        assert ext.lifecycle.state is State.FAILED
        assert {c.crash_class for c in host.supervisor.crashes(ext.id)} == {
            CrashClass.RESOURCE_LIMIT
        }
        # No restart during the cool-off; then it starts afresh.
        with pytest.raises(Throttled) as refused:
            ext.call("cancel", 1)
        assert refused.value.state is State.FAILED
        assert refused.value.resource is Resource.BACKGROUND_JOBS
        clock.now += LEVEL_COOL_OFF_S
        assert ext.call("cancel", 10_000) is False
        assert host.metrics().budget_actions["terminate"] == 1


# -- event-queue depth: throttle ------------------------------------------------------------------


def test_a_full_event_queue_throttles_its_subscriber(cache: Path, clock: FakeClock) -> None:
    with levels_host(
        cache, clock, {Resource.EVENT_QUEUE_DEPTH: Action.THROTTLE}, allow={"events", "log"}
    ) as host:
        ext = host.load(EVENTS)
        bystander = host.load(ECHO)
        assert ext.call("subscribe", {"class": "orders.*"}) is None
        broker = host.broker("events")
        assert isinstance(broker, EventsBroker)
        broker.hold()  # a consumer that is not keeping up
        for n in range(4):  # queue_depth = 4: these fit
            host.publish("orders.created", n)
        assert ext.lifecycle.state is State.RUNNING
        host.publish("orders.created", 4)  # the queue is full: dropped, as its policy says
        assert ext.lifecycle.state is State.THROTTLED
        with pytest.raises(Throttled) as refused:
            ext.call("received")
        assert refused.value.resource is Resource.EVENT_QUEUE_DEPTH
        for n in range(5, 20):  # the same episode: nothing fires again
            host.publish("orders.created", n)
        assert ext.usage().actions_fired["throttle"] == 1
        assert bystander.call("echo", 1) == 1  # the publisher's host and others go on
        clock.now += LEVEL_COOL_OFF_S
        assert isinstance(ext.call("received"), list)
        assert ext.lifecycle.state is State.RUNNING


# -- concurrent calls: terminate --------------------------------------------------------------


def test_the_concurrency_limit_under_terminate_stops_the_calls_in_flight(
    cache: Path, clock: FakeClock
) -> None:
    with levels_host(cache, clock, {Resource.CONCURRENT_CALLS: Action.TERMINATE}) as host:
        package = with_resources(
            host, SPIN, max_concurrency=1, fuel_per_call=10**10, timeout_ms=30_000
        )
        ext = host.admit(package)
        worker, spinning = run_in_thread(lambda: ext.call("run"))
        in_flight(ext, 1)
        started = time.monotonic()
        # No free instance before this call's deadline: refused as always (deadline)...
        with pytest.raises(CallError) as refused:
            ext.call("run", timeout_ms=5)
        assert refused.value.failure is FailureClass.DEADLINE
        assert "max_concurrency 1" in refused.value.message
        # ... and the crossing stops the call that held the instance, at its next tick.
        worker.join(PROMPT_S)
        assert not worker.is_alive() and time.monotonic() - started < PROMPT_S
        (stopped,) = spinning
        assert isinstance(stopped, CallError) and stopped.failure is FailureClass.OUT_OF_FUEL
        assert "terminated: concurrent_calls limit 1 reached" in stopped.message
        assert ext.lifecycle.state is State.FAILED
        with pytest.raises(Throttled):
            ext.call("run", fuel=1000)
        clock.now += LEVEL_COOL_OFF_S
        with pytest.raises(CallError) as fresh:
            ext.call("run", fuel=1000)  # restarted: it spins out of its own small fuel
        assert fresh.value.failure is FailureClass.OUT_OF_FUEL
        assert "terminated" not in fresh.value.message


def test_a_wasi_command_finding_no_free_instance_crosses_the_concurrency_level(
    cache: Path, clock: FakeClock
) -> None:
    with levels_host(
        cache, clock, {Resource.CONCURRENT_CALLS: Action.TERMINATE}, profiles=[wasi_profile()]
    ) as host:
        ext = host.admit(bare(SPINNING_COMMAND), fuel=10**10, timeout_ms=30_000)
        assert ext.plan.is_command and ext.resources.max_concurrency == 1
        worker, spinning = run_in_thread(ext.run_command)
        in_flight(ext, 1)
        give_up = time.monotonic() + PROMPT_S
        while not ext._instances():  # registered: the terminate below can reach it
            assert time.monotonic() < give_up, "the spinning run never started"
            time.sleep(0.01)
        started = time.monotonic()
        # No free instance before this run's deadline: refused as always (deadline)...
        with pytest.raises(CallError) as refused:
            ext.run_command(timeout_ms=5)
        assert refused.value.failure is FailureClass.DEADLINE
        assert "max_concurrency 1" in refused.value.message
        with pytest.raises(ConfigError):
            ext.run_command(timeout_ms=60_000)  # a run may lower its deadline, never raise it
        # ... and reported as the level's crossing, as for a call: terminate stops the run
        # that held the instance, at its next tick.
        assert ext.usage().actions_fired["terminate"] == 1
        worker.join(PROMPT_S)
        assert not worker.is_alive() and time.monotonic() - started < PROMPT_S
        (stopped,) = spinning
        assert isinstance(stopped, CallError) and stopped.failure is FailureClass.OUT_OF_FUEL
        assert "terminated: concurrent_calls limit 1 reached" in stopped.message
        # No run during the cool-off; after it, a run goes (and spins out of its own fuel).
        with pytest.raises(Throttled) as cooling:
            ext.run_command(fuel=1000)
        assert cooling.value.resource is Resource.CONCURRENT_CALLS
        clock.now += LEVEL_COOL_OFF_S
        with pytest.raises(CallError) as fresh:
            ext.run_command(fuel=1000)
        assert fresh.value.failure is FailureClass.OUT_OF_FUEL
        assert "terminated" not in fresh.value.message
        assert host.metrics().budget_actions["terminate"] == 1


# -- fuel per call: throttle, delayed through the cool-off ----------------------------------


def test_running_out_of_fuel_throttles_and_a_delaying_host_waits_out_the_cool_off(
    cache: Path, clock: FakeClock
) -> None:
    with levels_host(
        cache, clock, {Resource.FUEL_PER_CALL: Action.THROTTLE}, mode="delay"
    ) as host:
        ext = host.admit(with_resources(host, COMPUTE, timeout_ms=60_000))
        with pytest.raises(CallError) as out:
            ext.call("run", {"n": 100_000}, fuel=100_000)
        assert out.value.failure is FailureClass.OUT_OF_FUEL  # as always
        assert ext.usage().actions_fired["throttle"] == 1
        before = clock.now
        assert "result" in ext.call("run", {"n": 10})  # waited out the cool-off, then ran
        assert clock.now - before == pytest.approx(LEVEL_COOL_OFF_S, abs=1e-3)
        assert clock.sleeps == [pytest.approx(LEVEL_COOL_OFF_S, abs=1e-3)]
        metrics = host.metrics()
        assert (metrics.throttle_delays, metrics.throttle_refusals) == (1, 0)
        # The governor's own terminate is not taken for the guest's fuel running out.
        assert ext.usage().actions_fired["throttle"] == 1


# -- memory: pause ----------------------------------------------------------------------------


def test_a_guest_that_dies_at_its_memory_limit_fires_the_memory_action(
    cache: Path, clock: FakeClock
) -> None:
    with levels_host(cache, clock, {Resource.MEMORY_BYTES: Action.PAUSE}) as host:
        eater = host.admit(bare(MEMORY_EATER))
        with pytest.raises(CallError) as died:
            eater.call("run")
        assert died.value.failure in (FailureClass.TRAP, FailureClass.PANIC)  # as always
        assert eater.lifecycle.state is State.PAUSED
        assert "memory_bytes limit" in (eater.lifecycle.reason or "")
        # A trap far from the memory limit is not memory's doing: nothing fires.
        trapper = host.admit(bare(PLAIN_TRAP))
        with pytest.raises(CallError):
            trapper.call("run")
        assert trapper.lifecycle.state is not State.PAUSED
        assert sum(trapper.usage().actions_fired.values()) == 0
        assert host.metrics().budget_actions["pause"] == 1


# -- the property: a level's action fires once per episode, and refuses exactly then -----------


@settings(max_examples=200, deadline=None)
@given(
    actions=st.fixed_dictionaries({r: st.sampled_from(list(Action)) for r in LEVELS}),
    steps=level_steps(LEVELS),
)
def test_a_level_fires_once_per_episode_and_refuses_calls_only_under_throttle_or_terminate(
    actions: dict[Resource, Action], steps: list[tuple[str, Any]]
) -> None:
    clock = FakeClock()
    package = load_package(ECHO, frozenset())
    assert package.manifest is not None
    budget = budget_for(
        package.manifest.resources, package.manifest, BudgetPolicy(actions=actions), 16
    )
    account = Account(budget, clock)
    episode_end: dict[Resource, float] = {}
    fired = 0
    for kind, arg in steps:
        if kind == "tick":
            clock.now += arg
        elif kind == "cross":
            crossing = account.level_crossed(arg, 1, 1, "test")
            new_episode = clock.now >= episode_end.get(arg, float("-inf"))
            assert (crossing is not None) == new_episode
            if crossing is not None:
                assert crossing.fired and crossing.action is actions[arg]
                episode_end[arg] = clock.now + LEVEL_COOL_OFF_S
                fired += 1
        else:
            refusing = [
                r
                for r, end in episode_end.items()
                if clock.now < end and actions[r] in (Action.THROTTLE, Action.TERMINATE)
            ]
            refusal = account.admit_call()
            assert (refusal is not None) == bool(refusing)
            if refusal is not None:
                assert refusal.refused and refusal.resource in refusing
                # The hint is when the last refusing episode ends, never past a cool-off.
                longest = max(episode_end[r] for r in refusing) - clock.now
                assert refusal.retry_after_s == pytest.approx(longest, abs=1e-5)
                assert 0 < refusal.retry_after_s <= LEVEL_COOL_OFF_S + 1e-5
    assert sum(account.fired.values()) == fired
