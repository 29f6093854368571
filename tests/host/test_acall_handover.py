"""The acall hand-over (issue 31, docs/engine.md "The acall hand-over"): the event loop's
thread watches, without the GIL, for a small call's outcome instead of sleeping until the loop
is woken, and a call thread that has just handed an outcome over stays awake for its next job
for a moment. Both are shortcuts of the same path: every answer, failure and cancellation must
be what the slow way gives, the loop must still run its other tasks, and a long call must come
back the usual way."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

from tests.support.common import FIXTURES
from wasihost.core.errors import CallError, FailureClass
from wasihost.engine import fastcall
from wasihost.host import acall, callworkers
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package


def admitted(host: Host, fixture: str, **resources: Any) -> Any:
    """``fixture`` admitted with its manifest's resources changed as given."""
    package = load_package(FIXTURES / fixture, host.registry.capabilities())
    assert package.manifest is not None
    changed = attrs.evolve(package.manifest.resources, **resources)
    return host.admit(
        attrs.evolve(package, manifest=attrs.evolve(package.manifest, resources=changed))
    )

pytestmark = pytest.mark.skipif(
    fastcall.WAIT_FLAG is None, reason=f"no C extension: {fastcall.WHY}"
)


def counting_quick(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every outcome that comes back the quick way."""
    taken: list[Any] = []
    real = acall._quick_outcome

    async def quick(ext: Any, outcome: tuple[bool, Any]) -> Any:
        taken.append(outcome)
        return await real(ext, outcome)

    monkeypatch.setattr(acall, "_quick_outcome", quick)
    return taken


# The watch is 50 µs: an in-process small call's, which a call to a child process
# (25-60 µs a round trip) beats only now and then, so under --runtime=process this flaked.
@pytest.mark.in_process
def test_small_calls_come_back_the_quick_way_with_the_same_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = counting_quick(monkeypatch)

    async def scenario(ext: Any) -> list[Any]:
        return [await ext.acall("echo", i) for i in range(200)]

    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo")
        assert asyncio.run(scenario(ext)) == list(range(200))
        # One call thread served them all: each next job reached it awake or asleep, and no
        # other thread was started for it.
        assert len(host.call_workers()._threads) == 1
    # Most came back the quick way (a busy machine may make a few miss the watch).
    assert len(taken) >= 100


@pytest.mark.in_process  # the 50 µs watch, as above
def test_a_failure_that_comes_back_quickly_is_the_failure_call_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = counting_quick(monkeypatch)
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(FIXTURES / "traps")
        with pytest.raises(CallError) as sync:
            ext.call("run", "div_zero")
        for _ in range(20):
            with pytest.raises(CallError) as info:
                asyncio.run(ext.acall("run", "div_zero"))
            assert (info.value.failure, info.value.message) == (
                sync.value.failure,
                sync.value.message,
            )
    assert taken and all(ok for ok, _ in taken)  # the job ran; the call failed inside it


def test_a_long_call_comes_back_the_usual_way_and_the_loop_runs_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call longer than the watch is delivered on the loop, and while it runs the loop
    serves its other tasks: the watch held the loop for QUICK_WAIT_NS at most."""
    taken = counting_quick(monkeypatch)

    async def scenario(ext: Any) -> tuple[Any, int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.ensure_future(ticker())
        try:
            with pytest.raises(CallError) as info:
                await ext.acall("run", timeout_ms=200)
        finally:
            stop.set()
            await beat
        return info.value.failure, ticks

    with Host(Policy(allow=frozenset()), cache_dir=None) as host:
        ext = admitted(host, "spin", fuel_per_call=10**11, timeout_ms=30_000)
        failure, ticks = asyncio.run(scenario(ext))
    assert failure is FailureClass.DEADLINE
    assert ticks >= 20  # ~200 ticks of 1 ms in 200 ms; anything near means the loop ran
    assert taken == []


def test_a_task_calling_in_a_loop_does_not_starve_the_other_tasks() -> None:
    """An outcome that comes back the quick way never suspended its task: it yields to the
    loop once, so another task still gets its turns."""

    async def scenario(ext: Any) -> int:
        beats = 0
        stop = False

        async def other() -> None:
            nonlocal beats
            while not stop:
                beats += 1
                await asyncio.sleep(0)

        beat = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        for i in range(300):
            assert await ext.acall("echo", i) == i
        stop = True
        await beat
        return beats

    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo")
        assert asyncio.run(scenario(ext)) >= 250


@pytest.mark.parametrize(("workers", "watched"), [(8, True), (1, True), (8, False)])
def test_concurrent_calls_get_their_own_outcomes(
    monkeypatch: pytest.MonkeyPatch, workers: int, watched: bool
) -> None:
    """Tasks on two loops (threads) and on one loop at once, the shortcuts racing the slow
    way: no outcome goes to another call. With one call thread most jobs queue (they are never
    watched for); unwatched, every outcome travels the slow way. (An outcome kept for a watch
    that never came once hung both loops.)"""
    if not watched:
        monkeypatch.setattr(acall, "WAIT_FLAG", None)
        monkeypatch.setattr(callworkers, "WAIT_FLAG", None)
    import threading

    async def many(ext: Any, base: int) -> list[int]:
        async def one(i: int) -> int:
            return int(await ext.acall("echo", base + i))

        return list(await asyncio.gather(*(one(i) for i in range(150))))

    with Host(Policy(allow={"log"}), cache_dir=None, async_workers=workers) as host:
        ext = admitted(host, "echo", max_concurrency=4)
        results: dict[int, list[int]] = {}

        def loop_thread(base: int) -> None:
            results[base] = asyncio.run(many(ext, base))

        threads = [threading.Thread(target=loop_thread, args=(b,)) for b in (0, 10_000)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results == {b: [b + i for i in range(150)] for b in (0, 10_000)}


def test_a_pool_closed_while_its_thread_is_awake_for_a_job_stops_it() -> None:
    """The stop reaches a thread in its short wait as it reaches a sleeping one."""
    import time

    pool = callworkers.CallWorkers(2)
    done: list[Any] = []
    job = pool.start(lambda: 7, (), lambda ok, value: done.append((ok, value)))
    assert not job.queued
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.0001)
    started = time.monotonic()
    pool.close()  # within its HOT_WAIT_NS or after: joined either way
    assert done == [(True, 7)]
    assert time.monotonic() - started < 2
    assert not any(t.is_alive() for t in pool._threads)
