"""asyncio: ``await ext.acall(...)`` and ``AsyncHost``, through the real engine with the spin and
echo fixtures."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Coroutine
from typing import Any

import attrs
import pytest

from tests.support.common import ALL_CAPS, FIXTURES, bare
from tests.support.guests import build, guest_wat
from wasihost import AsyncHost
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.lifecycle import ExtensionUnavailable, State
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package

ECHO = FIXTURES / "echo"
SPIN = FIXTURES / "spin"
# What "promptly" means for an interrupt: a few epoch ticks, with room for a loaded machine.
PROMPT_S = 0.5
# Long enough that only an interrupt or a cancellation ends a spinning call in these tests.
LONG_MS = 30_000
SPIN_FUEL = 10**11


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def spin(host: Host, n: int = 1, fuel: int = SPIN_FUEL) -> Extension:
    package = load_package(SPIN, host.registry.capabilities())
    assert package.manifest is not None
    resources = attrs.evolve(
        package.manifest.resources, max_concurrency=n, fuel_per_call=fuel, timeout_ms=LONG_MS
    )
    manifest = attrs.evolve(package.manifest, resources=resources)
    return host.admit(attrs.evolve(package, manifest=manifest))


async def started(task: asyncio.Task[Any], ext: Extension, instances: int) -> None:
    """Until ``instances`` calls of ``ext`` are in the guest (started, handshake done)."""
    give_up = time.monotonic() + 5
    while len(ext._instances()) < instances or ext.lifecycle.state is not State.RUNNING:
        assert not task.done() and time.monotonic() < give_up
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)


def test_acall_returns_the_value_and_its_fuel_per_task(host: Host) -> None:
    ext = host.load(ECHO)

    async def main() -> tuple[Any, int, int]:
        out = await ext.acall("echo", {"x": [1, 2, 3]})
        mine = ext.last_fuel_used
        await ext.acall("noop")
        return out, mine, ext.last_fuel_used

    out, first, second = run(main())
    assert out == {"x": [1, 2, 3]}
    assert first > second > 0


def test_guest_code_never_blocks_the_event_loop() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.load(SPIN, fuel=SPIN_FUEL, timeout_ms=600)

        async def main() -> tuple[int, BaseException | None]:
            ticks = 0
            call = asyncio.ensure_future(ext.acall("run"))
            while not call.done():
                await asyncio.sleep(0.01)
                ticks += 1
            return ticks, call.exception()

        ticks, error = run(main())
        assert isinstance(error, CallError) and error.failure is FailureClass.DEADLINE
        # 600 ms of spinning, the loop woke every 10 ms: blocked, it would have ticked ~once.
        assert ticks >= 20, ticks


def test_cancelling_the_task_stops_the_guest_as_cancelled() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        # A call ended at an epoch tick is charged its whole fuel (wasmtime cannot tell what it
        # burnt, docs/budgets.md): 2e10 a call keeps the cancelled call and the one after it
        # under the default 6e10 a minute, so the extension is not throttled for them.
        ext = spin(host, fuel=2 * 10**10)

        async def main() -> tuple[float, BaseException | None]:
            task = asyncio.ensure_future(ext.acall("run"))
            await started(task, ext, 1)
            cancelled_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError) as info:
                await task
            return time.monotonic() - cancelled_at, info.value.__cause__

        elapsed, cause = run(main())
        assert elapsed < PROMPT_S, elapsed
        assert isinstance(cause, CallError) and cause.failure is FailureClass.CANCELLED
        # The caller gave up; the extension did nothing wrong: no crash, instance replaced.
        assert ext.lifecycle.state is State.RUNNING
        assert ext._instances() == ()
        with pytest.raises(CallError) as late:
            ext.call("run", timeout_ms=50)
        assert late.value.failure is FailureClass.DEADLINE
        assert ext.starts == 2


def test_cancelling_one_call_leaves_the_other_running() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = spin(host, 2)

        async def main() -> BaseException | None:
            first = asyncio.ensure_future(ext.acall("run"))
            second = asyncio.ensure_future(ext.acall("run", timeout_ms=1500))
            await started(first, ext, 2)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert not second.done()  # only the cancelled call's instance was stopped
            assert len(ext._instances()) == 1
            await asyncio.wait({second})
            return second.exception()

        error = run(main())
        assert isinstance(error, CallError) and error.failure is FailureClass.DEADLINE


def test_a_cancelled_call_waiting_for_an_instance_never_runs() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = spin(host, 1)

        async def main() -> None:
            first = asyncio.ensure_future(ext.acall("run", timeout_ms=2000))
            await started(first, ext, 1)
            waiting = asyncio.ensure_future(ext.acall("run"))
            await asyncio.sleep(0.1)
            started_before = ext.starts
            cancelled_at = time.monotonic()
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert time.monotonic() - cancelled_at < PROMPT_S
            assert not first.done() and ext.starts == started_before
            host.disable(ext.id, "done")
            await asyncio.wait({first})

        run(main())


def test_a_call_waits_for_a_thread_no_longer_than_its_deadline() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, async_workers=1) as host:
        spinning = spin(host)
        echo = host.load(ECHO)

        async def main() -> None:
            hog = asyncio.ensure_future(spinning.acall("run", timeout_ms=1000))
            await started(hog, spinning, 1)
            begun = time.monotonic()
            with pytest.raises(CallError, match="no call thread free") as info:
                await echo.acall("echo", 1, timeout_ms=150)
            assert info.value.failure is FailureClass.DEADLINE
            assert time.monotonic() - begun < 0.15 + PROMPT_S
            hog.cancel()
            with pytest.raises(asyncio.CancelledError):
                await hog
            assert await echo.acall("echo", 2) == 2

        run(main())


def test_async_host_loads_calls_and_closes() -> None:
    async def main() -> None:
        async with AsyncHost(Policy(allow=ALL_CAPS), cache_dir=None) as host:
            ext = await host.load(ECHO)
            assert (await ext.astart()).readiness == "ready"
            results = await asyncio.gather(*(ext.acall("echo", i) for i in range(20)))
            assert results == list(range(20))
            assert ext.last_fuel_used > 0
            assert host.extension(ext.id) is not None
            spinning = await host.load(SPIN, fuel=SPIN_FUEL, timeout_ms=LONG_MS)
            hog = asyncio.ensure_future(spinning.acall("run"))
            await started(hog, spinning.sync, 1)
        # Leaving the block closed the host: the spinning call was interrupted, not waited out.
        await asyncio.wait({hog}, timeout=PROMPT_S)
        assert hog.done() and isinstance(hog.exception(), ExtensionUnavailable)
        with pytest.raises(ExtensionUnavailable):
            await ext.acall("echo", 1)

    run(main())


def test_cancelling_during_start_up_stops_the_start_function() -> None:
    # The start function spins: the call is cancelled before the handshake ever runs.
    wasm = build(guest_wat(extra="(func $init (loop $l (br $l)))\n  (start $init)"))
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.admit(bare(wasm), grants=(), fuel=SPIN_FUEL, timeout_ms=LONG_MS)

        async def main() -> tuple[float, BaseException | None]:
            task = asyncio.ensure_future(ext.acall("run"))
            give_up = time.monotonic() + 5
            while ext._instances() == ():
                assert not task.done() and time.monotonic() < give_up
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            cancelled_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError) as info:
                await task
            return time.monotonic() - cancelled_at, info.value.__cause__

        elapsed, cause = run(main())
        assert elapsed < PROMPT_S, elapsed
        assert isinstance(cause, CallError) and cause.failure is FailureClass.CANCELLED
        # Start-up did not finish: the extension is failed (not stuck starting), nothing kept.
        assert ext.lifecycle.state is State.FAILED and ext._instances() == ()


def test_call_threads_stop_with_their_host_closed_or_dropped() -> None:
    def calls(host: Host) -> None:
        ext = host.load(ECHO)

        async def main() -> list[Any]:
            return await asyncio.gather(*(ext.acall("echo", i) for i in range(4)))

        assert run(main()) == list(range(4))

    gc.collect()
    before = threading.active_count()
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as closed:
        calls(closed)
    assert threading.active_count() <= before + 1  # the watchdog may linger one tick
    dropped = Host(Policy(allow=ALL_CAPS), cache_dir=None)
    calls(dropped)
    del dropped
    gc.collect()
    give_up = time.monotonic() + 2
    while threading.active_count() > before and time.monotonic() < give_up:
        # A call thread may still have been letting go of its last job at the first collect.
        gc.collect()
        time.sleep(0.01)
    assert threading.active_count() <= before
