"""The fair-share scheduler: the pure policy on an injected clock (with hypothesis), then the
same guarantees through the real engine with fixtures and WAT guests."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.common import FIXTURES, bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, ConfigError, FailureClass, ManifestError
from wasihost.core.lifecycle import ExtensionUnavailable
from wasihost.core.manifest import DEFAULT_PRIORITY, PRIORITY_NAMES
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.supervisor.scheduling import (
    MIN_CHARGE_S,
    WEIGHTS,
    HostBusy,
    Priority,
    Scheduler,
    Slot,
    Waiter,
    calls_as,
)

FG, BG, MT = Priority.INTERACTIVE, Priority.BACKGROUND, Priority.MAINTENANCE


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the pure policy ---------------------------------------------------------------------------


def drain(sched: Scheduler, first: Slot, clock: FakeClock, hold_s: float = 0.0) -> list[Waiter]:
    """Release ``first`` and then every slot handed on, ``hold_s`` each: the grant order."""
    order: list[Waiter] = []
    waiting = [w for c in sched._classes for q in c.queues.values() for w in q]
    slot: Slot | None = first
    while slot is not None:
        clock.now += hold_s
        sched.release(slot)
        granted = [w for w in waiting if w.slot is not None and w not in order]
        assert len(granted) <= 1  # one slot: one hand-over at a time
        slot = granted[0].slot if granted else None
        order += granted
    return order


def test_a_free_slot_is_granted_at_once_and_a_full_host_queues() -> None:
    clock = FakeClock()
    sched = Scheduler(2, clock=clock)
    a, b = sched.request("a", FG), sched.request("b", BG)
    assert a.slot is not None and b.slot is not None and not a.slot.queued
    c = sched.request("c", MT)
    assert c.slot is None and sched.stats().waiting == 1
    sched.release(a.slot)
    assert c.slot is not None and c.slot.queued and c.event.is_set()
    stats = sched.stats()
    assert (stats.running, stats.waiting, stats.granted, stats.waited) == (2, 0, 3, 1)
    assert stats.waited_by_class == {"maintenance": 1}


def test_the_interactive_waiter_is_served_before_the_background_ones() -> None:
    clock = FakeClock()
    sched = Scheduler(1, clock=clock)
    holder = sched.request("holder", MT).slot
    assert holder is not None
    bg = [sched.request(f"bg{i}", BG) for i in range(3)]
    fg = sched.request("fg", FG)
    assert drain(sched, holder, clock, 0.002) == [fg, *bg]


def test_within_a_class_the_extension_that_used_least_goes_first() -> None:
    clock = FakeClock()
    sched = Scheduler(1, clock=clock)
    hog = sched.request("hog", FG).slot
    assert hog is not None
    clock.now += 0.5  # the hog holds the only slot for half a second
    sched.release(hog)
    holder = sched.request("holder", MT).slot
    assert holder is not None
    hog_again = sched.request("hog", FG)
    modest = sched.request("modest", FG)  # arrives after the hog, served before it
    assert drain(sched, holder, clock) == [modest, hog_again]


def test_idle_time_is_not_saved_up_as_credit() -> None:
    """An extension back from idle is lifted to the floor of use: it does not take every slot
    until it has caught up with what the others used meanwhile."""
    clock = FakeClock()
    sched = Scheduler(1, clock=clock)
    holder = sched.request("holder", MT).slot
    assert holder is not None
    busy = [sched.request("busy", BG) for _ in range(20)]
    order = drain(sched, holder, clock, 0.01)
    assert order == busy
    holder = sched.request("holder", MT).slot
    assert holder is not None
    late = [sched.request("busy", BG), sched.request("newcomer", BG), sched.request("busy", BG)]
    newcomer = late[1]
    again = [sched.request("newcomer", BG)]
    order = drain(sched, holder, clock, 0.01)
    # The newcomer goes first (least use), then the two take turns: never all its calls first.
    assert order[0] is newcomer and order[1] is late[0] and set(order) == set(late + again)


def test_background_is_not_starved_by_an_interactive_flood() -> None:
    clock = FakeClock()
    sched = Scheduler(1, clock=clock)
    holder = sched.request("fg0", FG).slot  # the flood's first call holds the slot
    assert holder is not None
    flood = [sched.request(f"fg{i % 3}", FG) for i in range(40)]
    bg = sched.request("bg", BG)
    maint = sched.request("maint", MT)
    order = drain(sched, holder, clock, 0.0)
    assert set(order) == {*flood, bg, maint}
    # Weights 16:4:1 on equal calls: interactive's 4th call would finish after background's
    # 1st in virtual time, its 16th after maintenance's 1st. Neither waits for the flood.
    assert order.index(bg) == 3
    assert order.index(maint) == 16


def test_a_withdrawn_waiter_never_gets_a_slot_and_a_granted_one_cannot_withdraw() -> None:
    sched = Scheduler(1, clock=FakeClock())
    holder = sched.request("h", FG).slot
    assert holder is not None
    gone, kept = sched.request("a", FG), sched.request("b", FG)
    assert sched.withdraw(gone, refused=True) and sched.withdraw(gone, refused=True)
    sched.release(holder)
    assert gone.slot is None and kept.slot is not None
    assert not sched.withdraw(kept)
    sched.release(kept.slot)
    sched.release(kept.slot)  # idempotent: the slot is not freed twice
    stats = sched.stats()
    assert (stats.running, stats.waiting, stats.refused) == (0, 0, 1)
    assert stats.refused_by_class == {"interactive": 1}


def test_the_manifests_priority_names_are_the_classes_in_order() -> None:
    # The manifest's parser checks a claimed class against core.manifest.PRIORITY_NAMES,
    # without importing the scheduler: the two lists must be one.
    assert tuple(p.value for p in Priority) == PRIORITY_NAMES
    assert PRIORITY_NAMES[0] == DEFAULT_PRIORITY


def test_the_ceiling_caps_claims_and_the_operator_assigns_any_class() -> None:
    sched = Scheduler(1, ceiling="background")
    assert sched.class_of("x", FG) is BG and sched.class_of("x", MT) is MT
    sched.assign("x", "interactive")
    assert sched.class_of("x", MT) is FG
    sched.assign("x", None)
    assert sched.class_of("x", FG) is BG
    with pytest.raises(ConfigError, match="not one of interactive, background, maintenance"):
        sched.assign("x", "urgent")
    for bad in (0, 4097, True, 1.5):
        with pytest.raises(ConfigError, match="max_concurrent_calls"):
            Scheduler(bad)  # type: ignore[arg-type]


# A sequence of steps: request (extension index, class) or release the oldest held slot after
# some time.
_step = st.one_of(
    st.tuples(st.just("request"), st.integers(0, 4), st.sampled_from(list(Priority))),
    st.tuples(st.just("release"), st.floats(0, 0.05), st.none()),
)


@given(slots=st.integers(1, 3), steps=st.lists(_step, max_size=80))
def test_property_every_waiter_is_eventually_served(
    slots: int, steps: list[tuple[str, object, object]]
) -> None:
    clock = FakeClock()
    sched = Scheduler(slots, clock=clock)
    held: list[Slot] = []
    waiters: list[Waiter] = []
    seen: set[int] = set()

    def collect() -> None:
        for w in waiters:
            if w.slot is not None and id(w) not in seen:
                seen.add(id(w))
                held.append(w.slot)

    for kind, a, b in steps:
        if kind == "request":
            assert isinstance(a, int) and isinstance(b, Priority)
            waiters.append(sched.request(f"e{a}", b))
        elif held:
            assert isinstance(a, float)
            clock.now += a
            sched.release(held.pop(0))
        collect()
        stats = sched.stats()
        assert stats.running == len(held) <= slots
        assert stats.waiting == sum(1 for w in waiters if w.slot is None)
        assert stats.waiting == 0 or stats.running == slots  # no idle slot while calls wait
    while held:
        sched.release(held.pop(0))
        collect()
    assert all(w.slot is not None for w in waiters)
    stats = sched.stats()
    assert (stats.running, stats.waiting, stats.granted) == (0, 0, len(waiters))


@given(
    counts=st.fixed_dictionaries({p: st.integers(1, 40) for p in Priority}),
    holds=st.fixed_dictionaries({p: st.floats(0, 0.01) for p in Priority}),
)
def test_property_backlogged_classes_share_slot_time_by_weight(
    counts: dict[Priority, int], holds: dict[Priority, float]
) -> None:
    """While every class has waiters, each class's slot time over its weight stays within one
    call of every other's: no class gets ahead of its weighted share by more than a call."""
    clock = FakeClock()
    sched = Scheduler(1, clock=clock)
    holder = sched.request("holder", MT)
    assert holder.slot is not None
    pending = {
        p: [sched.request(f"{p.value}-{i % 2}", p) for i in range(n)] for p, n in counts.items()
    }
    used = dict.fromkeys(Priority, 0.0)
    used[MT] = MIN_CHARGE_S  # the holder's call
    slot: Slot | None = holder.slot
    first = True
    while slot is not None:
        if not first:
            cost = max(holds[slot.priority], MIN_CHARGE_S)
            clock.now += holds[slot.priority]
            used[slot.priority] += cost
        first = False
        backlogged = [p for p in Priority if any(w.slot is None for w in pending[p])]
        sched.release(slot)
        granted = [
            w for p in Priority for w in pending[p] if w.slot is not None and not w.slot.released
        ]
        slot = granted[0].slot if granted else None
        if slot is not None and len(backlogged) == len(Priority):
            p = slot.priority
            cost = max(holds[p], MIN_CHARGE_S)
            for q in Priority:
                if q is not p:
                    worst = max(holds[q], MIN_CHARGE_S)
                    assert used[p] / WEIGHTS[p] <= (used[q] + worst) / WEIGHTS[q] + 1e-9
    assert all(w.slot is not None for ws in pending.values() for w in ws)


# -- through the real engine -------------------------------------------------------------------

SPIN = build(guest_wat("(loop $l (br $l)) (call $ok_null)"))


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll a condition another thread makes true (the scheduler's counts)."""
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.001)


@pytest.fixture
def sched_host() -> Iterator[Host]:
    with Host(Policy(allow={"log"}), cache_dir=None, scheduler=Scheduler(1)) as host:
        yield host


def scheduler_of(host: Host) -> Scheduler:
    assert host.scheduler is not None
    return host.scheduler


class Recorder:
    """Calls on threads; records the order in which they finish (one slot: their grant
    order)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.order: list[str] = []
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, label: str, ext: Extension, command: str, value: object = None) -> None:
        """Start the call and wait until it waits for a slot (so arrival order is fixed)."""
        before = scheduler_of(self.host).stats().waiting

        def run() -> None:
            try:
                ext.call(command, value)
            except BaseException as exc:  # the test looks
                self.errors.append(exc)
            with self._lock:
                self.order.append(label)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        wait_until(lambda: scheduler_of(self.host).stats().waiting == before + 1)

    def join(self) -> list[str]:
        for thread in self.threads:
            thread.join(10)
        assert not self.errors, self.errors
        return self.order


def hold_the_only_slot(host: Host) -> Slot:
    """The test takes the host's one slot itself (as maintenance, so that its time counts
    against no class under test)."""
    return scheduler_of(host).acquire("test-holder", MT, time.monotonic() + 5)


def test_engine_interactive_caller_is_served_before_background_ones(sched_host: Host) -> None:
    sched = scheduler_of(sched_host)
    compute = sched_host.load(FIXTURES / "compute")
    echo = sched_host.load(FIXTURES / "echo")
    fg = sched_host.admit(bare(build(guest_wat())))
    sched.assign(compute.id, "background")
    sched.assign(echo.id, "background")
    holder = hold_the_only_slot(sched_host)
    calls = Recorder(sched_host)
    calls.start("compute", compute, "run", {"n": 1000})
    calls.start("echo", echo, "echo", "hi")
    calls.start("interactive", fg, "run")
    sched.release(holder)
    assert calls.join() == ["interactive", "compute", "echo"]
    assert sched.stats().waited_by_class == {"interactive": 1, "background": 2}


def test_engine_an_extension_that_hogged_is_served_after_one_that_did_not(
    sched_host: Host,
) -> None:
    sched = scheduler_of(sched_host)
    hog = sched_host.load(FIXTURES / "compute")
    modest = sched_host.load(FIXTURES / "echo")
    hog.call("run", {"n": 200_000})  # slot time the modest extension has not used
    holder = hold_the_only_slot(sched_host)
    calls = Recorder(sched_host)
    calls.start("hog", hog, "run", {"n": 10})
    calls.start("modest", modest, "echo", "hi")
    sched.release(holder)
    assert calls.join() == ["modest", "hog"]


def test_engine_background_is_not_starved_by_interactive_callers(sched_host: Host) -> None:
    sched = scheduler_of(sched_host)
    fg = [sched_host.admit(bare(build(guest_wat()))) for _ in range(3)]
    bg = sched_host.load(FIXTURES / "echo")
    sched.assign(bg.id, "background")
    holder = hold_the_only_slot(sched_host)
    calls = Recorder(sched_host)
    calls.start("bg", bg, "echo", "hi")
    for i in range(9):
        calls.start(f"fg{i}", fg[i % 3], "run")
    sched.release(holder)
    order = calls.join()
    # Served after at most 4 interactive calls (weights 16:4, each call charged >= 1 ms), not
    # after all 9.
    assert 1 <= order.index("bg") <= 4


def test_engine_a_call_waiting_past_its_deadline_is_refused_and_holds_no_slot(
    sched_host: Host,
) -> None:
    sched = scheduler_of(sched_host)
    echo = sched_host.load(FIXTURES / "echo")
    holder = hold_the_only_slot(sched_host)
    started = time.monotonic()
    with pytest.raises(HostBusy) as info:
        echo.call("echo", "late", timeout_ms=30)
    assert time.monotonic() - started >= 0.03
    assert info.value.error_class == "busy" and info.value.retry_after_s > 0
    assert "1 of 1 slots in calls" in info.value.message and info.value.hint
    stats = sched.stats()
    assert (stats.running, stats.waiting, stats.refused) == (1, 0, 1)
    sched.release(holder)
    assert echo.call("echo", "now") == "now"
    assert sched.stats().running == 0


def test_engine_a_call_stopped_by_its_limits_in_the_guest_gives_its_slot_back(
    sched_host: Host,
) -> None:
    sched = scheduler_of(sched_host)
    spin = sched_host.load(FIXTURES / "spin")
    with pytest.raises(CallError) as info:
        spin.call("run", timeout_ms=20)
    assert info.value.failure in (FailureClass.DEADLINE, FailureClass.OUT_OF_FUEL)
    assert sched.stats().running == 0
    echo = sched_host.load(FIXTURES / "echo")
    assert echo.call("echo", 1) == 1


def test_engine_cancelling_a_waiting_acall_releases_nothing_and_a_running_one_its_slot(
    sched_host: Host,
) -> None:
    sched = scheduler_of(sched_host)
    echo = sched_host.load(FIXTURES / "echo")
    spin = sched_host.admit(bare(SPIN), fuel=10**10)  # stopped by its cancel, not its fuel

    async def until(predicate: Callable[[], bool]) -> None:
        end = time.monotonic() + 10
        while not predicate():
            assert time.monotonic() < end, "condition not reached"
            await asyncio.sleep(0.001)

    async def scenario() -> None:
        holder = hold_the_only_slot(sched_host)
        waiting = asyncio.ensure_future(echo.acall("echo", "x"))
        await until(lambda: sched.stats().waiting == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        stats = sched.stats()
        assert (stats.running, stats.waiting, stats.cancelled) == (1, 0, 1)
        sched.release(holder)
        running = asyncio.ensure_future(spin.acall("run"))
        await until(lambda: sched.stats().running == 1)
        await asyncio.sleep(0.02)  # in the guest's loop by now (its deadline is 1 s away)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert sched.stats().running == 0
        assert await echo.acall("echo", "after") == "after"

    asyncio.run(scenario())


def test_engine_a_nested_call_runs_in_its_callers_slot(tmp_path: Path) -> None:
    """A host function that calls another extension: with one slot, waiting for a second
    would deadlock; the nested call goes on in the slot of the call that made it."""
    with Host(Policy(allow={"app"}), cache_dir=None, scheduler=Scheduler(1)) as host:
        inner: list[Extension] = []

        @host.function(
            "app.nested",
            capability="app",
            max_request_bytes=64,
            max_response_bytes=64,
            fuel_base=100,
            fuel_per_byte=1,
        )
        def nested(ctx: object, request: object) -> object:
            return inner[0].call("echo", "inner")

        wasm = build(
            guest_wat(
                "(drop (call $n (i32.const 0) (i32.const 0) (i32.const 8192) (i32.const 64)))"
                " (call $ok_null)",
                imports='(@custom "wasihost_abi.app" "1.0") '
                '(import "app_v1" "nested" (func $n (param i32 i32 i32 i32) (result i32)))',
            )
        )
        inner.append(host.load(FIXTURES / "echo"))
        outer = host.admit(bare(wasm), grants=["app"])
        assert outer.call("run") is None  # with a second slot needed, a deadline error
        assert scheduler_of(host).stats().granted == 1


def test_engine_broker_work_runs_as_background_and_calls_as_lowers_a_class(
    sched_host: Host,
) -> None:
    gate = sched_host.call_gate
    assert gate is not None
    echo = sched_host.load(FIXTURES / "echo")
    assert gate.priority(echo) is FG
    with calls_as("maintenance"):
        assert gate.priority(echo) is MT
    from wasihost.brokers.dispatch import ExtensionDispatcher

    seen: list[Priority] = []

    class Probe(ExtensionDispatcher[object, int]):  # type: ignore[type-var]
        def _take(self, state: object) -> int | None:
            return None if seen else 1

        def _process(self, state: object, item: int) -> None:
            seen.append(gate.priority(echo))

        def _done(self, state: object, item: int) -> bool:
            return False

    class State:
        scheduled = False
        ext = echo

    probe = Probe("probe", 1)
    with probe._cond:
        probe._schedule(State())  # type: ignore[arg-type]
    assert probe.drain(5) and seen == [BG]
    with probe._cond:
        probe._stopping = True
        probe._cond.notify_all()


def test_manifest_claims_a_class_and_the_scheduler_caps_it(tmp_path: Path) -> None:
    package = tmp_path / "compute"
    shutil.copytree(FIXTURES / "compute", package)
    toml = package / "extension.toml"
    toml.write_text(toml.read_text() + '\n[scheduling]\npriority = "maintenance"\n')
    with Host(Policy(), cache_dir=None, scheduler=Scheduler(2, ceiling="background")) as host:
        ext = host.load(package)
        assert ext.manifest is not None and ext.manifest.priority == "maintenance"
        assert host.call_gate is not None and host.call_gate.priority(ext) is MT
        plain = host.load(FIXTURES / "echo")  # claims interactive, capped to background
        assert host.call_gate.priority(plain) is BG
        assert ext.call("run", {"n": 5})["result"] > 0
    toml.write_text(toml.read_text().replace('"maintenance"', '"urgent"'))
    with pytest.raises(ManifestError) as info, Host(Policy(), cache_dir=None) as host:
        host.load(package)
    assert info.value.key == "scheduling.priority"


def test_without_a_scheduler_calls_take_no_slot(host: Host) -> None:
    ext = host.load(FIXTURES / "echo")
    assert host.scheduler is None and host.call_gate is None
    assert ext.call("echo", "free") == "free"
    assert host.metrics().scheduler == {}
    with pytest.raises(ConfigError, match="scheduler must be"):
        Host(Policy(), cache_dir=None, scheduler=4)  # type: ignore[arg-type]


def test_engine_host_close_wakes_calls_waiting_for_a_slot() -> None:
    """Shutdown stays bounded: a call waiting for a slot is refused at once, not at its own
    deadline (here 1 s)."""
    host = Host(Policy(), cache_dir=None, scheduler=Scheduler(1))
    echo = host.load(FIXTURES / "echo")
    holder = hold_the_only_slot(host)
    calls = Recorder(host)
    calls.start("waiting", echo, "echo", "x")
    started = time.monotonic()
    host.close()
    calls.threads[0].join(5)
    assert time.monotonic() - started < 0.5
    (refused,) = calls.errors
    assert isinstance(refused, ExtensionUnavailable) and "shutting down" in str(refused)
    scheduler_of(host).release(holder)
    assert scheduler_of(host).stats().waiting == 0
