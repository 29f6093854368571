"""Red team of the concurrency surface of the embedding API (2026-12-01), through the real
engine: ``acall`` cancelled in its phases, async embedder host functions that misbehave or
outlive their call, the instance pool, idle eviction and the scheduler under asyncio."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.host.test_host_functions import CAPS, LIMITS, fn_guest, load
from tests.supervisor.test_density import echo, evicting_host, live
from tests.support.common import FIXTURES, bare, run_in_thread
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.lifecycle import ExtensionUnavailable, State
from wasihost.core.limits import MAX_FUEL_PER_CALL
from wasihost.core.serving import CallContext
from wasihost.core.status import GuestInterrupted
from wasihost.engine.native import SETTLE_FUEL
from wasihost.host.aio import AsyncExtension, AsyncHost
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.supervisor.scheduling import HostBusy, Priority, Scheduler, calls_as

# A bounded wait for something that takes milliseconds: generous, for a loaded CI machine.
WAIT_S = 30.0
# Long enough that only the event under test (a cancel, an exception) ends a call here.
LONG_MS = 30_000
# The nested-call host function's registry limits (its request and answer are tiny).
NESTED_LIMITS: dict[str, Any] = {
    "max_request_bytes": 64,
    "max_response_bytes": 64,
    "fuel_base": 100,
    "fuel_per_byte": 1,
}


@pytest.fixture
def app() -> Iterator[Host]:
    with Host(Policy(allow=CAPS), cache_dir=None) as h:
        yield h


# -- async embedder host functions --------------------------------------------------------


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_an_async_function_raising_systemexit_ends_its_call_and_spares_the_hosts_loop(
    app: Host, raised: type[BaseException]
) -> None:
    # Break (red-team 2026-12-01): asyncio lets a task's SystemExit or KeyboardInterrupt out
    # of run_forever, so one async host function that raised it stopped the host's private
    # event loop for good: its own call hung until its deadline, and every later async host
    # function of every extension failed (the loop was closed), crashing its callers into a
    # crash loop. A synchronous function raising it only ends its own call.
    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        if request == "exit":
            raise raised
        return request * 2

    ext = load(app, fn_guest("lookup"), ["myapp.read"], timeout_ms=LONG_MS)
    other = load(app, fn_guest("lookup"), ["myapp.read"], timeout_ms=LONG_MS)
    assert ext.call("run", 1) == 2
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            ext.call("run", "exit")
        except BaseException as exc:  # what a synchronous function's raise gives: the same
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(WAIT_S)  # at once with the fix; without it, the whole LONG_MS deadline
    assert not caller.is_alive() and [type(e) for e in outcome] == [raised], outcome
    assert app.functions.loop.running
    assert other.call("run", 21) == 42  # the loop serves every extension still
    assert ext.call("run", 3) == 6  # and the one whose function raised, restarted
    assert ext.lifecycle.state is State.RUNNING


def test_a_context_used_after_its_call_was_cancelled_reaches_no_store(app: Host) -> None:
    # Break (red-team 2026-12-01): CallContext.charge settles fuel on the Store of the call's
    # instance through its raw context address. An async function that outlived its call (it
    # went on after its task was cancelled: a cleanup step, a shielded await) and then
    # charged read and wrote the fuel of a Store already freed, since the cancelled call's
    # instance is dropped (use after free; or the fuel of the next call on a reused
    # instance). Once its call is over a context charges nothing: GuestInterrupted.
    started, dropped, done = threading.Event(), threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        if request != "hang":
            return request * 2
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.to_thread(dropped.wait, WAIT_S)  # the call's instance is freed
            try:
                ctx.charge(SETTLE_FUEL)  # enough to settle: it reads the Store's fuel
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
            done.set()
            raise
        return None

    ext = load(app, fn_guest("lookup"), ["myapp.read"], timeout_ms=LONG_MS)

    async def main() -> None:
        task = asyncio.ensure_future(ext.acall("run", "hang"))
        assert await asyncio.to_thread(started.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ext._instances() == ()  # dropped: its Store is freed
        dropped.set()
        assert await asyncio.to_thread(done.wait, WAIT_S)
        assert await ext.acall("run", 2) == 4

    asyncio.run(main())
    assert len(outcome) == 1 and isinstance(outcome[0], GuestInterrupted), outcome


# -- AsyncHost / AsyncExtension ----------------------------------------------------------


def test_aclose_interrupts_the_calls_that_hold_every_call_thread() -> None:
    # Break (red-team 2026-12-01): AsyncExtension.aclose ran Extension.close on one of the
    # host's call threads, queued behind the very calls it was to interrupt: with every call
    # thread in a call of the extension, the close waited for them to end by themselves
    # (their deadlines), and they ended `deadline`, not interrupted.
    started = threading.Event()
    with Host(Policy(allow=CAPS), cache_dir=None, async_workers=1) as host:

        @host.function("myapp.lookup", capability="myapp.read", **LIMITS)
        async def lookup(ctx: CallContext, request: Any) -> Any:
            started.set()
            await asyncio.Event().wait()  # until the call is interrupted

        ext = AsyncExtension(load(host, fn_guest("lookup"), ["myapp.read"], timeout_ms=10_000))

        async def main() -> BaseException | None:
            call = asyncio.ensure_future(ext.acall("run", 1))
            assert await asyncio.to_thread(started.wait, WAIT_S)
            await asyncio.wait_for(ext.aclose(), WAIT_S)
            await asyncio.wait({call}, timeout=WAIT_S)
            return call.exception()

        error = asyncio.run(main())
        assert isinstance(error, ExtensionUnavailable), error
        assert ext.lifecycle.state is State.CLOSED


# -- the scheduler ---------------------------------------------------------------------------


def test_a_nested_call_from_an_async_host_function_takes_a_slot_of_its_own() -> None:
    # Doc fix (red-team 2026-12-01): docs/scheduling.md said a host function's call into
    # another extension goes on in its caller's slot. That holds for a plain `def`, on the
    # caller's thread; an `async def` runs on the host's loop thread, so its nested call
    # queues for a slot of its own: with one slot, it fails `busy` at its deadline.
    nested = build(
        guest_wat(
            "(drop (call $n (i32.const 0) (i32.const 0) (i32.const 8192) (i32.const 64)))"
            " (call $ok_null)",
            imports='(@custom "wasihost_abi.app" "1.0") '
            '(import "app_v1" "nested" (func $n (param i32 i32 i32 i32) (result i32)))',
        )
    )
    with Host(Policy(allow={"app"}), cache_dir=None, scheduler=Scheduler(1)) as host:
        inner: list[Extension] = []
        refused: list[BaseException] = []

        @host.function("app.nested", capability="app", **NESTED_LIMITS)
        async def call_inner(ctx: CallContext, request: Any) -> Any:
            try:
                return await inner[0].acall("echo", "inner")
            except HostBusy as exc:
                refused.append(exc)
                raise

        inner.append(host.load(FIXTURES / "echo", timeout_ms=200))
        outer = host.admit(bare(nested), grants=["app"], timeout_ms=LONG_MS)
        with pytest.raises(CallError) as info:
            outer.call("run")
        assert info.value.failure is FailureClass.HOST_ERROR
        assert len(refused) == 1
        assert inner[0].call("echo", "alone") == "alone"  # the slot is free again


# -- idle eviction ---------------------------------------------------------------------------


def test_an_extension_called_while_it_is_evicted_stays_in_the_eviction_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Break (red-team 2026-12-01): the evictor dropped a victim's instances, then took it out
    # of its least-recently-used order. A call of the victim in between (it needs a new
    # instance, and its end puts the victim back in the order) was undone by that removal:
    # the victim's new instance, idle, was never evicted again (neither for room nor by the
    # idle sweep) until its next call, and under max_live_instances=1 every other extension
    # was refused HostFull ("every one is in a call") meanwhile. The call is made from inside
    # evict() here, to land in that window every time.
    host, clock = evicting_host(limit=1, idle_s=60.0)
    with host:
        victim, other = echo(host), echo(host)
        assert victim.call("echo", b"v") == b"v"
        evict = victim.evict
        raced: list[bytes] = []

        def evict_then_call() -> int | None:
            dropped = evict()
            if dropped and not raced:  # the evictor's thread is preempted here
                worker, errors = run_in_thread(lambda: raced.append(victim.call("echo", b"r")))
                worker.join(WAIT_S)
                assert not worker.is_alive() and errors == []
            return dropped

        monkeypatch.setattr(victim, "evict", evict_then_call)
        # The victim's call took the room back, but its instance is idle again: evicted too.
        assert other.call("echo", b"o") == b"o"
        assert raced == [b"r"] and live(victim) == 0 and live(other) == 1
        monkeypatch.undo()
        clock.now += 3600  # and both stay in the order: the idle sweep finds the other
        assert host.evictor is not None and host.evictor.sweep() == 1
        assert live(other) == 0


# -- the call threads ------------------------------------------------------------------------


def test_a_crashing_extensions_warm_spare_takes_no_call_thread_from_acall() -> None:
    # Break (red-team 2026-12-01): after a crash, the warm spare (a new instance whose start
    # function and handshake run ahead of need, under a budget of its own: up to the whole
    # timeout_ms) was started on one of the host's call threads, the bounded pool every acall
    # of every extension runs on. A guest that crashes and starts slowly (taking a spare
    # schedules the next, so one per crash) held a call thread per such extension: with
    # async_workers of them, every other extension's acall failed "no call thread free".
    # Here the spare's start function waits in a host function until the test lets it go.
    entered, release = threading.Event(), threading.Event()
    holds: list[int] = []
    crasher_wasm = build(
        guest_wat(
            "(unreachable)",
            imports='(@custom "wasihost_abi.app" "1.0") '
            '(import "app_v1" "hold" (func $hold (param i32 i32 i32 i32) (result i32)))',
            extra="(func $init (drop (call $hold (i32.const 0) (i32.const 0) "
            "(i32.const 8192) (i32.const 64))))\n  (start $init)",
        )
    )
    with Host(Policy(allow={"app"}), cache_dir=None, async_workers=1) as host:

        @host.function("app.hold", capability="app", **NESTED_LIMITS)
        def hold(ctx: CallContext, request: Any) -> None:
            holds.append(1)
            if len(holds) > 1:  # not the first start (the call's own): the spare's
                entered.set()
                release.wait(WAIT_S)

        crasher = host.admit(bare(crasher_wasm), grants=["app"], timeout_ms=LONG_MS)
        echo_ext = host.load(FIXTURES / "echo", timeout_ms=10_000)
        with pytest.raises(CallError) as crash:
            crasher.call("run")
        assert crash.value.failure is FailureClass.PANIC
        try:
            assert entered.wait(WAIT_S)  # the spare's start-up is under way, and waits

            async def main() -> Any:
                return await echo_ext.acall("echo", 1)

            assert asyncio.run(main()) == 1
        finally:
            release.set()
        assert crasher.wait_for_spare(WAIT_S)


def test_an_interactive_acall_is_served_before_background_acalls_that_hold_the_call_threads() -> (
    None
):
    # Break (red-team 2026-12-01): an acall waited for its host call slot on a call thread.
    # Background acalls waiting for the slot held every call thread, so an interactive acall
    # could not even queue for the slot: it waited for a thread behind them (first come,
    # first served), against the scheduler's promise that a fresh interactive waiter is
    # served before the background ones, and failed "no call thread free" at its deadline.
    # Two call threads, one slot: the first background call holds the slot in a host
    # function until the test lets it go, two more (of two other background extensions)
    # wait.
    entered, proceed = threading.Semaphore(0), threading.Semaphore(0)
    with Host(Policy(allow=CAPS), cache_dir=None, async_workers=2, scheduler=Scheduler(1)) as host:

        @host.function("myapp.lookup", capability="myapp.read", **LIMITS)
        def lookup(ctx: CallContext, request: Any) -> Any:
            entered.release()
            assert proceed.acquire(timeout=WAIT_S)
            return request

        assert host.scheduler is not None
        background = [
            load(host, fn_guest("lookup"), ["myapp.read"], timeout_ms=LONG_MS) for _ in range(3)
        ]
        for ext in background:
            host.scheduler.assign(ext.id, "background")
        interactive = host.load(FIXTURES / "echo", timeout_ms=10_000)
        sched, threads = host.scheduler, host.call_workers()._shared

        async def until(predicate: Callable[[], bool]) -> None:
            assert await asyncio.to_thread(wait_until, predicate)

        async def main() -> list[str]:
            order: list[str] = []

            def call(ext: Extension, label: str, command: str) -> asyncio.Task[Any]:
                task = asyncio.ensure_future(ext.acall(command, label))
                task.add_done_callback(lambda _: order.append(label))
                return task

            first = call(background[0], "b1", "run")
            assert await asyncio.to_thread(entered.acquire, True, WAIT_S)  # b1 holds the slot
            rest = [call(background[1], "b2", "run"), call(background[2], "b3", "run")]
            await until(lambda: sched.stats().waiting + len(threads.queue) == 2)
            urgent = call(interactive, "i", "echo")
            await until(lambda: sched.stats().waiting + len(threads.queue) == 3)
            proceed.release()  # b1 ends: the slot is the interactive call's
            assert await urgent == "i"
            for _ in rest:
                proceed.release()
            await asyncio.gather(first, *rest)
            return order

        order = asyncio.run(main())
        # b1's and i's results may reach the loop in either order (b1 gives its slot back
        # before its result is handed over); what matters is that b2 and b3 come last.
        assert sorted(order[:2]) == ["b1", "i"] and sorted(order[2:]) == ["b2", "b3"], order


def wait_until(predicate: Callable[[], bool]) -> bool:
    """Poll ``predicate`` (state of other threads with no event to wait on) for WAIT_S."""
    give_up = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.001)
    return True


def test_calls_as_around_an_acall_lowers_its_class() -> None:
    # The acall takes its slot in the awaiting task's context (see the test above), so the
    # class calls_as sets there is the one it queues in (before, on a call thread, it was
    # lost: docs/scheduling.md listed it as not done).
    with Host(Policy(allow=CAPS), cache_dir=None, scheduler=Scheduler(1)) as host:
        sched = host.scheduler
        assert sched is not None
        ext = host.load(FIXTURES / "echo")

        async def main() -> Any:
            holder = sched.acquire("test-holder", Priority.MAINTENANCE, time.monotonic() + 5)
            with calls_as("background"):
                task = asyncio.ensure_future(ext.acall("echo", "x"))
            assert await asyncio.to_thread(wait_until, lambda: sched.stats().waiting == 1)
            sched.release(holder)
            return await task

        assert asyncio.run(main()) == "x"
        assert dict(sched.stats().waited_by_class) == {"background": 1}


def test_host_close_refuses_an_acall_waiting_for_a_slot_on_its_loop_at_once() -> None:
    # The promise of docs/scheduling.md ("Shutdown") on the acall's own wait (see above):
    # Host.close wakes it, and it is refused as a call waiting on a thread is.
    host = Host(Policy(allow=CAPS), cache_dir=None, scheduler=Scheduler(1))
    sched = host.scheduler
    assert sched is not None
    ext = host.load(FIXTURES / "echo", timeout_ms=LONG_MS)

    async def main() -> BaseException | None:
        holder = sched.acquire("test-holder", Priority.MAINTENANCE, time.monotonic() + 5)
        task = asyncio.ensure_future(ext.acall("echo", "x"))
        assert await asyncio.to_thread(wait_until, lambda: sched.stats().waiting == 1)
        closer, errors = run_in_thread(host.close)
        done, _ = await asyncio.wait({task}, timeout=WAIT_S)  # not at its 30 s deadline
        closer.join(WAIT_S)
        assert errors == [] and done == {task}
        sched.release(holder)
        return task.exception()

    error = asyncio.run(main())
    assert isinstance(error, ExtensionUnavailable) and "shutting down" in str(error), error
    assert sched.stats().running == 0


def test_a_backlog_of_acalls_on_one_extension_leaves_call_threads_for_the_others() -> None:
    # Break (red-team 2026-12-01): an acall waited for a free instance of its extension on a
    # call thread. A backlog of acalls on one extension (max_concurrency 1, its one call
    # held in a host function) held every call thread with calls waiting for that instance,
    # and an idle extension's acall failed "no call thread free": calls on different
    # extensions were to run in parallel. An extension's acalls beyond its max_concurrency
    # now wait on their loop.
    entered, release = threading.Event(), threading.Event()
    with Host(Policy(allow=CAPS), cache_dir=None, async_workers=2) as host:

        @host.function("myapp.lookup", capability="myapp.read", **LIMITS)
        def lookup(ctx: CallContext, request: Any) -> Any:
            entered.set()
            assert release.wait(WAIT_S)
            return request

        busy = load(host, fn_guest("lookup"), ["myapp.read"], timeout_ms=LONG_MS)
        idle = host.load(FIXTURES / "echo", timeout_ms=10_000)

        async def main() -> tuple[Any, list[Any]]:
            backlog = [asyncio.ensure_future(busy.acall("run", i)) for i in range(4)]
            # The backlog's tasks all started before this (they ran first, in order).
            assert await asyncio.to_thread(entered.wait, WAIT_S)
            try:
                answer = await idle.acall("echo", "free")
            finally:
                release.set()
            return answer, await asyncio.gather(*backlog)

        assert asyncio.run(main()) == ("free", [0, 1, 2, 3])


def test_a_loop_closed_while_its_acall_waits_for_a_turn_keeps_no_turn() -> None:
    # The wait above is on the acall's loop. A loop closed (its tasks never cancelled) while
    # one of its acalls waited must not keep the turn granted to it later: nobody runs it,
    # and with max_concurrency 1 every later acall of the extension would wait in vain.
    entered, release = threading.Event(), threading.Event()
    with Host(Policy(allow=CAPS), cache_dir=None) as host:

        @host.function("myapp.lookup", capability="myapp.read", **LIMITS)
        def lookup(ctx: CallContext, request: Any) -> Any:
            if request == "hold":
                entered.set()
                assert release.wait(WAIT_S)
            return request

        ext = load(host, fn_guest("lookup"), ["myapp.read"], timeout_ms=10_000)
        loop = asyncio.new_event_loop()

        async def begin() -> list[asyncio.Task[Any]]:
            held = asyncio.ensure_future(ext.acall("run", "hold"))
            assert await asyncio.to_thread(entered.wait, WAIT_S)
            queued = asyncio.ensure_future(ext.acall("run", "queued"))
            turns = ext._acall_turns
            assert await asyncio.to_thread(wait_until, lambda: len(turns.waiting) == 1)
            return [held, queued]

        pending = loop.run_until_complete(begin())
        loop.close()  # with both calls pending
        release.set()  # the held call ends; its turn goes to the closed loop's waiter
        assert wait_until(lambda: ext._acall_turns.running == 0)

        async def later() -> Any:
            return await ext.acall("run", "later")

        assert asyncio.run(later()) == "later"
        del pending


def test_a_loop_closed_while_its_acall_waits_for_a_slot_keeps_no_slot() -> None:
    # The same for the host call slot: kept, it would be the host's for good.
    with Host(Policy(allow=CAPS), cache_dir=None, scheduler=Scheduler(1)) as host:
        sched = host.scheduler
        assert sched is not None
        ext = host.load(FIXTURES / "echo", timeout_ms=10_000)
        holder = sched.acquire("test-holder", Priority.MAINTENANCE, time.monotonic() + 5)
        loop = asyncio.new_event_loop()

        async def begin() -> asyncio.Task[Any]:
            task = asyncio.ensure_future(ext.acall("echo", "queued"))
            assert await asyncio.to_thread(wait_until, lambda: sched.stats().waiting == 1)
            return task

        pending = loop.run_until_complete(begin())
        loop.close()  # with the call waiting
        sched.release(holder)  # the slot goes to the closed loop's waiter, and back
        assert sched.stats().running == 0
        assert ext.call("echo", "later") == "later"
        del pending


def test_an_acall_woken_after_its_host_closed_is_refused_as_unavailable() -> None:
    # An acall that waited for its turn (or slot) on its loop may wake after Host.close has
    # closed the call threads: refused as the closed extension refuses calls, not with the
    # call threads' own ConfigError ("this host is closed").
    started = threading.Event()
    host = Host(Policy(allow=CAPS), cache_dir=None)

    @host.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        if request == "hold":
            started.set()
            await asyncio.Event().wait()  # until the close interrupts it
        return request

    ext = load(host, fn_guest("lookup"), ["myapp.read"], timeout_ms=LONG_MS)

    async def main() -> tuple[BaseException | None, BaseException | None]:
        held = asyncio.ensure_future(ext.acall("run", "hold"))
        assert await asyncio.to_thread(started.wait, WAIT_S)
        queued = asyncio.ensure_future(ext.acall("run", 1))
        turns = ext._acall_turns
        assert await asyncio.to_thread(wait_until, lambda: len(turns.waiting) == 1)
        host.close()  # on the loop: the queued call wakes only once it has returned
        done, _ = await asyncio.wait({held, queued}, timeout=WAIT_S)
        assert done == {held, queued}
        return held.exception(), queued.exception()

    held_error, queued_error = asyncio.run(main())
    assert isinstance(held_error, ExtensionUnavailable), held_error
    assert isinstance(queued_error, ExtensionUnavailable), queued_error


def test_cancelling_astart_stops_a_spinning_start_function(cache: Any) -> None:
    # Break (red-team 2026-12-01): AsyncExtension.astart ran Extension.start on a call thread
    # with nothing to stop it: cancelling the awaiting task left the start function spinning
    # there to its deadline (here 30 s), holding a call thread. Now a cancelled astart stops
    # it at the next epoch tick, as a cancelled acall's, and the extension starts again later.
    from tests.host.test_stop_in_every_phase import spinning_start

    with Host(Policy(allow=CAPS), cache_dir=cache) as host:
        # The most fuel a call may have: a spin burns it in about 10 s on an idle machine.
        ext = host.admit(
            bare(spinning_start(), name="slowstart"), fuel=MAX_FUEL_PER_CALL, timeout_ms=LONG_MS
        )
        aext = AsyncExtension(ext)

        async def main() -> float:
            task = asyncio.ensure_future(aext.astart())
            while not ext._slots:  # the instance exists: its start function is running
                assert not task.done(), task
                await asyncio.sleep(0.005)
            cancelled = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return cancelled

        cancelled = asyncio.run(main())
        assert ext.wait_idle(WAIT_S)
        # A few epoch ticks, not the fuel's 10 s or the 30 s deadline (generous for a loaded CI).
        assert time.monotonic() - cancelled < 5.0
        assert ext.lifecycle.state is not State.QUARANTINED


def test_an_async_load_does_not_wait_behind_calls_holding_every_call_thread() -> None:
    # Break (red-team 2026-12-01): AsyncHost.load, load_installed and update ran on the
    # host's call threads: with each of them in a long call (here one, spinning for 30 s),
    # loading another extension waited for that call to end. They run no guest code, so they
    # now run on the loop's default executor.
    from tests.host.test_aio import ECHO, SPIN, SPIN_FUEL, started

    async def main() -> None:
        async with AsyncHost(Policy(allow=CAPS), cache_dir=None, async_workers=1) as host:
            spinning = await host.load(SPIN, fuel=SPIN_FUEL, timeout_ms=LONG_MS)
            hog = asyncio.ensure_future(spinning.acall("run"))
            await started(hog, spinning.sync, 1)  # the one call thread is taken
            echo = await asyncio.wait_for(host.load(ECHO), WAIT_S / 3)
            assert echo.id != spinning.id
            hog.cancel()
            with pytest.raises(asyncio.CancelledError):
                await hog

    asyncio.run(main())
