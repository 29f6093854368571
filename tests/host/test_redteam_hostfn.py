"""Red-team review of embedder host functions and the small brokers: functions that misbehave
the way an application's code can (kept contexts, exceptions asyncio lets out of its loop),
called by real guests through the real engine. Each test here failed on the code before the
fix it names, or guards a promise no other test proves (see the branch's history)."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.host.test_host_functions import LIMITS, fn_guest
from tests.support.common import FIXTURES, bare, run_in_thread
from wasihost.core.errors import CallError, ConfigError, FailureClass
from wasihost.core.lifecycle import ExtensionUnavailable
from wasihost.core.serving import CallContext
from wasihost.core.status import GuestInterrupted, Status
from wasihost.engine.native import SETTLE_FUEL
from wasihost.host import functions as hostfn_module
from wasihost.host.inspect import abi_listing
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

WAIT_S = 30.0  # bounded waits only: generous for a loaded 2-core machine


@pytest.fixture
def app() -> Iterator[Host]:
    with Host(Policy(allow={"myapp.read"}), cache_dir=None) as h:
        yield h


def test_a_charge_after_its_call_ended_never_reaches_the_store(app: Host) -> None:
    # Break (red-team 2026-12-01): CallContext.charge went straight to the instance's fuel
    # debt and settled it on the Store whenever asked. An async function still running on the
    # loop thread after its call ended (its deadline passed in a stretch without an await),
    # or a context an application kept, paid into the Store of whatever the instance ran
    # next, or into a Store already freed by close (get_fuel/set_fuel on freed memory). Now a
    # charge is ordered against the end of its call and refused after it.
    release = threading.Event()
    outcome: list[BaseException | None] = []
    kept: list[CallContext] = []

    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        await asyncio.sleep(0)
        release.wait(WAIT_S)  # busy past the deadline without an await: cancelling waits
        try:
            ctx.charge(SETTLE_FUEL)  # enough to be settled on the Store at once
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        return None

    @app.function("myapp.keep", capability="myapp.read", **LIMITS)
    def keep(ctx: CallContext, request: Any) -> Any:
        kept.append(ctx)
        return 1

    ext = app.admit(bare(fn_guest("lookup"), name="slow"), grants=["myapp.read"])
    ext.start()  # so the short call below spends its 50 ms in the function, not starting up
    with pytest.raises(CallError) as err:
        ext.call("go", 1, timeout_ms=50)
    assert err.value.failure is FailureClass.DEADLINE
    ext.close()  # its Store is freed now
    release.set()
    for _ in range(int(WAIT_S / 0.01)):
        if outcome:
            break
        threading.Event().wait(0.01)
    assert outcome and isinstance(outcome[0], GuestInterrupted), outcome

    other = app.admit(bare(fn_guest("keep"), name="keeper"), grants=["myapp.read"])
    assert other.call("go", 1) == 1
    with pytest.raises(GuestInterrupted):
        kept[0].charge(SETTLE_FUEL)  # from the embedder's thread, after the call
    assert other.call("go", 1) == 1


def test_host_close_from_an_async_function_closes_the_host() -> None:
    # Break (red-team 2026-12-01): Host.close() called from an async host function runs on
    # the host's event-loop thread, and stopping the loop joined that thread from itself:
    # RuntimeError('cannot join current thread') out of close(), with the engine, the evictor
    # and the state left open and every later close() returning at once (closed was set).
    # A plain def's close is documented (security.md: it waits CLOSE_DRAIN_S for its own
    # call); the async one now closes the same way.
    outcome: list[BaseException | None] = []
    finished = threading.Event()
    host = Host(Policy(allow={"myapp.read"}), cache_dir=None)

    @host.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        try:
            host.close()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finished.set()
        return 1

    ext = host.admit(bare(fn_guest("lookup")), grants=["myapp.read"])
    with pytest.raises(ExtensionUnavailable):  # closed during its call
        ext.call("go", 1)
    assert finished.wait(WAIT_S)
    assert outcome == [None]
    thread = host.functions.loop._thread
    assert thread is not None
    thread.join(WAIT_S)  # the loop stops once the function's step returned
    assert not host.functions.loop.running


def _finishes(call: Callable[[], Any]) -> list[Any]:
    """Run ``call`` on a daemon thread: what it returned or raised, or [] if it was still
    running after WAIT_S (stuck: the thread is left behind, it cannot be stopped)."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(call())
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    return got


def test_a_grant_change_from_inside_a_commit_is_refused_not_a_deadlock() -> None:
    # Break (red-team 2026-12-01): a commit action runs holding its extension's grant lock (a
    # plain Lock), and a ctx.commit action or a log sink that revoked or disabled that same
    # extension (a sink silencing a noisy plugin, a function taking back a one-time right)
    # waited on its own thread for that lock forever: the guest's call hung out of reach of
    # its deadline, close() gave up on it, and every later grant change of the id hung too.
    # Now the change is refused with a ConfigError naming the id; the call ends as the
    # documented failure of what raised it.
    holder: list[Host] = []

    def sink(extension: str, record: Any) -> None:
        holder[0].disable(extension, reason="noisy")

    with Host(Policy(allow={"log", "myapp.write"}), cache_dir=None, log_sink=sink) as host:
        holder.append(host)

        @host.function("myapp.remember", capability="myapp.write", **LIMITS)
        def remember(ctx: CallContext, request: Any) -> Any:
            return ctx.commit(lambda: host.revoke(ctx.extension, "myapp.write", reason="once"))

        ext = host.admit(bare(fn_guest("remember")), grants=["myapp.write"])
        got = _finishes(lambda: ext.call("go", 1))
        assert got and isinstance(got[0], CallError), got
        assert got[0].failure is FailureClass.HOST_ERROR
        assert "myapp.write" in host.grants.current(ext.id).entries  # nothing half-done
        assert host.revoke(ext.id, "myapp.write") > 0  # the id's lock is free again

        logger = host.load(FIXTURES / "logger", grants=["log"])
        got = _finishes(lambda: logger.call("run", {"lines": 1}))
        assert got == [{"logged": 1}]  # the record is lost (the sink raised), not the call
        assert logger.log.sink_errors == 1


@pytest.mark.parametrize(
    ("name", "options", "named"),
    [
        (123, {}, "must be a string"),
        ("myapp.lookup", {"commits": "no"}, "commits"),
        ("myapp.lookup", {"commits": 1}, "commits"),
        ("myapp.lookup", {"request": b"x"}, "request"),
        ("myapp.lookup", {"doc": 5}, "doc"),
    ],
)
def test_registration_arguments_of_the_wrong_kind_are_config_errors(
    app: Host, name: Any, options: dict[str, Any], named: str
) -> None:
    # Break (red-team 2026-12-01): add_function took a name that is not a string with a raw
    # AttributeError, turned commits="no" into a committing entry (bool("no")), and took a
    # bytes request description that later broke `wasihost abi --json` (TypeError). Each is
    # now a ConfigError naming the argument, and nothing is registered.
    with pytest.raises(ConfigError, match=named):
        app.add_function(
            name, lambda ctx, request: request, capability="myapp.read", **LIMITS, **options
        )
    assert app.registry.namespaces == {}
    json.dumps(abi_listing(app.registry))


def test_payload_limits_hold_at_the_exact_byte_and_the_price_comes_before_the_work(
    app: Host,
) -> None:
    # Held (red-team 2026-12-01), kept as the only test of the exact edges for an embedder
    # function: a request of exactly max_request_bytes is served and one byte more is
    # PAYLOAD_TOO_LARGE unread; a response of exactly max_response_bytes is delivered and one
    # byte more ends the call host_error; a guest that cannot pay the price gets no work done,
    # and what it paid is counted in the per-minute account.
    ran: list[Any] = []

    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    def lookup(ctx: CallContext, request: Any) -> Any:
        ran.append(request)
        return b"r" * request if isinstance(request, int) else len(request)

    ext = app.admit(bare(fn_guest("lookup")), grants=["myapp.read"])
    assert LIMITS["max_request_bytes"] == 256 and LIMITS["max_response_bytes"] == 1024
    assert ext.call("go", "x" * 254) == 254  # 2 bytes of head + 254: exactly 256
    assert ext.call("go", "x" * 255) == -Status.PAYLOAD_TOO_LARGE  # 257
    assert ran == ["x" * 254]
    assert ext.call("go", 1021) == b"r" * 1021  # 3 bytes of head + 1021: exactly 1024
    with pytest.raises(CallError) as err:
        ext.call("go", 1022)
    assert err.value.failure is FailureClass.HOST_ERROR

    pricey = Host(Policy(allow={"myapp.read"}), cache_dir=None)
    try:
        pricey.add_function(
            "myapp.lookup",
            lookup,
            capability="myapp.read",
            max_request_bytes=64,
            max_response_bytes=64,
            fuel_base=3_000_000,
            fuel_per_byte=1,
        )
        buyer = pricey.admit(bare(fn_guest("lookup")), grants=["myapp.read"])
        ran.clear()
        with pytest.raises(CallError) as err:
            buyer.call("go", "a", fuel=2_000_000)
        assert err.value.failure is FailureClass.OUT_OF_FUEL and ran == []
        assert buyer.call("go", "b", fuel=3_100_000) == 1 and ran == ["b"]
        assert pricey.usage(buyer.id).cpu_fuel_last_minute >= 2_000_000 + 3_000_000
    finally:
        pricey.close()


class _FixedClock:
    def realtime_ns(self) -> int:
        return 1_234_567_891_234

    def monotonic_ns(self) -> int:
        return 9_876_543_219


def test_a_policy_coarsening_the_clock_reaches_a_running_extension() -> None:
    # Break (red-team 2026-12-01): the clock broker fixes the policy's clock_resolution_ns
    # when an instance starts, and a policy update that changed nothing else left the
    # instance in place (a grant "downgraded in place"): after update_policy coarsened the
    # clock to a second, the running extension went on reading the host's realtime to the
    # microsecond. A policy update is a barrier for the calls after it (security.md): a
    # changed resolution now restarts the instances at the next call.
    policy = Policy(allow={"clock"}, clock_resolution_ns=1_000)
    with Host(policy, cache_dir=None, clock=_FixedClock()) as host:
        ext = host.admit(
            bare(fn_guest("clock_now", module="wasihost_v1", declared=None)), grants=["clock"]
        )
        assert ext.call("go", "realtime") == 1_234_567_891_000
        host.update_policy(Policy(allow={"clock"}, clock_resolution_ns=1_000_000_000))
        assert ext.call("go", "realtime") == 1_234_000_000_000
        assert ext.call("go", "monotonic") == 9_000_000_000


def test_an_async_callable_object_is_awaited_and_a_returned_coroutine_is_refused_clearly(
    app: Host, caplog: pytest.LogCaptureFixture
) -> None:
    # Break (red-team 2026-12-01): a host function was async only if it was itself an async
    # def. An object whose __call__ is async def ran as a plain function: its coroutine went
    # to the encoder, the guest got host_error "cannot encode a value of type coroutine", and
    # Python warned "coroutine was never awaited". Now such an object is awaited on the loop
    # like an async def; a plain function that returns a coroutine (a sync wrapper round an
    # async def) has it closed unrun, and the host log says how to register it.
    class Lookup:
        async def __call__(self, ctx: CallContext, request: Any) -> Any:
            await asyncio.sleep(0)
            return ["awaited", request]

    async def inner(ctx: CallContext, request: Any) -> Any:
        return request

    app.add_function("myapp.lookup", Lookup(), capability="myapp.read", **LIMITS)
    def wrapper(ctx: CallContext, request: Any) -> Any:
        return inner(ctx, request)  # a plain def: nothing awaits what it returns

    app.add_function("myapp.wrapped", wrapper, capability="myapp.read", **LIMITS)
    ext = app.admit(bare(fn_guest("lookup"), name="objects"), grants=["myapp.read"])
    assert ext.call("go", 7) == ["awaited", 7]
    wrapped = app.admit(bare(fn_guest("wrapped"), name="wrapper"), grants=["myapp.read"])
    with (
        caplog.at_level("ERROR", logger="wasihost"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")  # a coroutine left unawaited would warn
        with pytest.raises(CallError) as info:
            wrapped.call("go", 1)
    assert info.value.failure is FailureClass.HOST_ERROR
    assert "cannot encode" not in info.value.message
    assert any("returned a coroutine" in r.getMessage() for r in caplog.records)


def test_an_admission_never_sees_a_function_half_registered(
    app: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Break (red-team 2026-12-01): register() added the registry entry, then its broker, and
    # an admission on another thread could seal the registry in between: the guest was
    # admitted against an entry nobody served. Now the two steps and the seal are one change
    # under the registry's lock: the admission waits for the registration, then serves it.
    halfway, go = threading.Event(), threading.Event()
    real_add_broker = hostfn_module.HostFunctions.add_broker

    def slow_add_broker(self: Any, broker: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            halfway.set()
            assert go.wait(WAIT_S)
        real_add_broker(self, broker)

    monkeypatch.setattr(hostfn_module.HostFunctions, "add_broker", slow_add_broker)
    worker, failures = run_in_thread(
        lambda: app.add_function(
            "myapp.lookup", lambda ctx, request: request, capability="myapp.read", **LIMITS
        )
    )
    try:
        assert halfway.wait(WAIT_S)  # the entry is in the registry, its broker not yet
        admitted: list[Any] = []
        admitting, admit_failures = run_in_thread(
            lambda: admitted.append(
                app.admit(bare(fn_guest("lookup"), name="racer"), grants=["myapp.read"])
            )
        )
        admitting.join(0.2)  # the admission waits for the registration to end
        assert admitting.is_alive() or admit_failures, "admitted half-way through"
    finally:
        go.set()
        worker.join(WAIT_S)
    admitting.join(WAIT_S)
    assert not failures and not admit_failures, (failures, admit_failures)
    assert admitted[0].call("go", 5) == 5
