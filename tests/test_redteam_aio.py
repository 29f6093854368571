"""Red team of the concurrency surface of the embedding API (2026-12-01), through the real
engine: ``acall`` cancelled in its phases, async embedder host functions that misbehave or
outlive their call, the instance pool, idle eviction and the scheduler under asyncio."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_host_functions import CAPS, LIMITS, fn_guest, load

from wasihost.aio import AsyncExtension
from wasihost.engine.native import SETTLE_FUEL
from wasihost.hostfn import CallContext
from wasihost.lifecycle import ExtensionUnavailable, State
from wasihost.policy import Policy
from wasihost.runtime import Host
from wasihost.status import GuestInterrupted

# A bounded wait for something that takes milliseconds: generous, for a loaded CI machine.
WAIT_S = 30.0
# Long enough that only the event under test (a cancel, an exception) ends a call here.
LONG_MS = 30_000


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
