"""Red-team review of the Call and Teardown phases (docs/security.md): hostile guests that
follow the ABI, and hostile embedder inputs, run through the real engine. Each test here
failed on the code before the fix it names (checked by reverting the fix once)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import cbor2
import pytest

from tests.host.test_host_functions import CAPS, LIMITS, fn_guest
from tests.support.common import ALL_CAPS, FIXTURES, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.core.errors import CallError, CodecError, ConfigError, FailureClass
from wasihost.core.serving import CallContext
from wasihost.core.status import Status
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import wasi_profile

WAIT_S = 10.0  # how long a test waits for another thread to reach a state before failing


def wait_for(predicate: Any, what: str) -> None:
    """Poll (a thread's progress, not the time) until ``predicate()``; fail after WAIT_S."""
    give_up = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError(f"never saw: {what}")
        time.sleep(0.001)


@pytest.fixture
def app() -> Iterator[Host]:
    with Host(Policy(allow=CAPS), cache_dir=None) as h:
        yield h


# -- a policy update is the effective grant at once -------------------------------------------


def test_a_policy_that_withdraws_a_capability_denies_its_host_calls_at_once(app: Host) -> None:
    # Break: the gate asked the grant table only, which holds what the operator granted and
    # not the policy. After Host.update_policy took "myapp.write" out of allow, the extension's
    # grant said frozenset() but every host call of the capability was still served and its
    # ctx.commit landed.
    committed: list[Any] = []

    @app.function("myapp.store", capability="myapp.write", commits=True, **LIMITS)
    def store(ctx: CallContext, request: Any) -> Any:
        ctx.commit(lambda: committed.append(request))
        return True

    ext = app.admit(bare(fn_guest("store")), grants=["myapp.write"])
    assert ext.call("run", 1) is True
    app.update_policy(Policy(allow=CAPS - {"myapp.write"}))
    assert ext.call("run", 2) == -Status.DENIED
    assert ext.call("run", 3) == -Status.DENIED  # and on the inlined path after it
    assert committed == [1]
    assert "myapp.write" not in ext.grant.capabilities
    # Allowed again: the grant table still holds the operator's grant, so it serves again.
    app.update_policy(Policy(allow=CAPS))
    assert ext.call("run", 4) is True
    assert committed == [1, 4]


# -- a policy update's limits reach the very next call ----------------------------------------

LOWER = {"max_input_bytes": 1024, "fuel_per_call": 1_000_000}


@pytest.fixture
def echo() -> Iterator[tuple[Host, Extension]]:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo")
        ext.call("echo", b"warm")  # an idle instance, and the inlined path's state seen
        yield host, ext


def test_the_first_call_after_a_policy_lowers_the_limits_meets_them(
    echo: tuple[Host, Extension],
) -> None:
    # Break: call() worked out the payload, its bound and the per-call budget from the limits
    # it read before the availability check, which is what applies a policy change: the first
    # call after Policy(ceilings=...) lowered max_input_bytes to 1 KiB echoed 4,000 bytes, and
    # one asking fuel=5e6 under a new 1e6 ceiling ran.
    host, ext = echo
    host.update_policy(Policy(allow=ALL_CAPS, ceilings={"max_input_bytes": 1024}))
    with pytest.raises(CodecError, match="exceeds 1024"):
        ext.call("echo", b"x" * 4000)
    host.update_policy(Policy(allow=ALL_CAPS, ceilings=LOWER))
    with pytest.raises(ConfigError, match=r"in 1\.\.1000000,"):
        ext.call("echo", b"x", fuel=5_000_000)
    assert ext.call("echo", b"x" * 1000) == b"x" * 1000  # within the new limits: served


def test_the_first_acall_after_a_policy_lowers_the_limits_meets_them(
    echo: tuple[Host, Extension],
) -> None:
    # The same through acall, whose ticket and deadline reach call() through the thread.
    host, ext = echo
    host.update_policy(Policy(allow=ALL_CAPS, ceilings=LOWER))
    with pytest.raises(CodecError, match="exceeds 1024"):
        asyncio.run(ext.acall("echo", b"x" * 4000))
    assert asyncio.run(ext.acall("echo", b"y" * 10)) == b"y" * 10


def test_a_call_waiting_for_an_instance_meets_the_limits_a_policy_set_meanwhile(
    app: Host,
) -> None:
    # Break: a call that found every instance busy worked out its payload before it waited;
    # a policy update made during the wait was applied when it woke (in _checkout), and the
    # call went on with an input over the new max_input_bytes.
    held, release = threading.Event(), threading.Event()

    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    def lookup(ctx: CallContext, request: Any) -> Any:
        if request == "hold":
            held.set()
            release.wait(WAIT_S)
        return 1

    ext = app.admit(bare(fn_guest("lookup")), grants=["myapp.read"], timeout_ms=30_000)
    assert ext.resources.max_concurrency == 1
    assert ext.call("run", "x" * 200) == 1
    holder = threading.Thread(target=ext.call, args=("run", "hold"))
    holder.start()
    assert held.wait(WAIT_S)
    outcome: list[BaseException | Any] = []

    def waiter() -> None:
        try:
            outcome.append(ext.call("run", "x" * 200))
        except BaseException as exc:  # the outcome is the assertion
            outcome.append(exc)

    waiting = threading.Thread(target=waiter)
    waiting.start()
    wait_for(lambda: ext._waiting == 1, "the second call waiting for the instance")
    app.update_policy(Policy(allow=CAPS, ceilings={"max_input_bytes": 64}))
    release.set()
    holder.join(WAIT_S)
    waiting.join(WAIT_S)
    assert len(outcome) == 1 and isinstance(outcome[0], CodecError), outcome
    assert "exceeds 64" in str(outcome[0])


# -- the shutdown hook is guest code like any call ---------------------------------------------

HOOK_POLICY = Policy(allow={"jobs", "log", "events"})  # what the jobs fixture (with a hook) needs


def hooked(messages: list[str]) -> tuple[Host, Extension]:
    """A host with the jobs fixture (``on_shutdown = "shutdown"``, which logs "shutdown")
    started: its live instance is where the hook runs."""
    host = Host(HOOK_POLICY, cache_dir=None, log_sink=lambda ext, r: messages.append(r.message))
    ext = host.load(FIXTURES / "jobs")
    ext.call("tick")
    return host, ext


def test_a_paused_extensions_shutdown_hook_does_not_run() -> None:
    # Break: Host.close(timeout_s=...) ran the hook of every extension with a live instance
    # that was not closed: one paused by the operator (or by a budget's pause) ran guest code
    # at shutdown that every call was refused.
    messages: list[str] = []
    host, ext = hooked(messages)
    ext.pause("operator")
    host.close(timeout_s=2.0)
    assert "shutdown" not in messages
    # The same host running: the hook does run (the test is not vacuous).
    messages.clear()
    host, ext = hooked(messages)
    host.close(timeout_s=2.0)
    assert messages[-1] == "shutdown"


def test_the_shutdown_hooks_fuel_counts_against_the_cpu_budget() -> None:
    # Break: the hook ran on a fuel_per_call of its own that no budget saw: an extension over
    # its CPU budget (or one about to be) burnt it for free at every shutdown.
    messages: list[str] = []
    host, ext = hooked(messages)
    before = ext.usage().cpu_fuel_last_minute
    host.close(timeout_s=2.0)
    assert messages[-1] == "shutdown"
    assert ext.usage().cpu_fuel_last_minute > before


# A plain WASI command (run_command) that spins until its fuel or deadline ends it.
SPINNING_COMMAND = build(
    '(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))'
)
LOW_FUEL = 1_000_000
SETTLE_SLACK = 200_000  # what a call may run past its fuel before it stops (SETTLE_FUEL, ticks)


def test_the_first_wasi_run_after_a_policy_lowers_its_fuel_runs_on_the_new_fuel() -> None:
    # Break: run_command made its budget from the limits before the availability check that
    # applies a policy change: the first run after Policy(ceilings=...) lowered fuel_per_call
    # to 1e6 spun on the 1e10 it was admitted with.
    with Host(Policy(allow=set()), cache_dir=None, profiles=[wasi_profile()]) as host:
        ext = host.admit(bare(SPINNING_COMMAND), fuel=10**10, timeout_ms=30_000)
        host.update_policy(Policy(allow=set(), ceilings={"fuel_per_call": LOW_FUEL}))
        with pytest.raises(CallError) as ran:
            ext.run_command()
        assert ran.value.failure is FailureClass.OUT_OF_FUEL
        assert ext.last_fuel_used <= LOW_FUEL + SETTLE_SLACK


# -- pointers at the exact edges of memory ------------------------------------------------------

MEMORY = 2 * 65536  # the skeleton guest's memory
EDGE_REQUEST = cbor2.dumps([2, "edge"])  # a log request (level 2, text)
N = len(EDGE_REQUEST)
REQUEST_AT = 40000  # a second copy of the request, away from the edge
RESPONSE_AT = 8192


def edge_guest(req_ptr: int, req_len: int, resp_ptr: int, resp_cap: int) -> bytes:
    """One ``log`` call with these i32 arguments; the request is stored at REQUEST_AT and in the
    memory's last N bytes."""
    body = (
        f"(drop (call $log (i32.const {req_ptr}) (i32.const {req_len}) (i32.const {resp_ptr}) "
        f"(i32.const {resp_cap}))) (call $ok_null)"
    )
    blob = escape(EDGE_REQUEST)
    extra = f'(data (i32.const {MEMORY - N}) "{blob}") (data (i32.const {REQUEST_AT}) "{blob}")'
    return build(guest_wat(body, imports=host_import("log"), extra=extra))


# (arguments, logged: True if served, None if it must trap as protocol)
EDGES: dict[str, tuple[tuple[int, int, int, int], bool | None]] = {
    "request ending at the last byte": ((MEMORY - N, N, RESPONSE_AT, 16), True),
    "request one byte past": ((MEMORY - N + 1, N, RESPONSE_AT, 16), None),
    "response ending at the last byte": ((REQUEST_AT, N, MEMORY - 16, 16), True),
    "response one byte past": ((REQUEST_AT, N, MEMORY - 15, 16), None),
    "request wrapping at 2**32": ((-1, 2, RESPONSE_AT, 16), None),
    "response wrapping at 2**32": ((REQUEST_AT, N, -1, 2), None),
    "negative request length": ((REQUEST_AT, -1, RESPONSE_AT, 16), None),
    "negative response room": ((REQUEST_AT, N, RESPONSE_AT, -1), None),
    "empty ranges at the end": ((MEMORY, 0, MEMORY, 0), False),
    "response overlapping the request's last byte": ((REQUEST_AT, N, REQUEST_AT + N - 1, 16), None),
    "response right after the request": ((REQUEST_AT, N, REQUEST_AT + N, 16), True),
}


@pytest.mark.parametrize("name", list(EDGES))
def test_pointers_at_the_edges_of_memory_are_served_or_trap_exactly(name: str) -> None:
    # Guards test_hostile.py's random pointers, which almost never land on an edge: a range
    # ending at the last byte is served, one byte further (or wrapping, or negative) traps as
    # protocol, and a response buffer touching the request is refused only when they overlap.
    args, logged = EDGES[name]
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.admit(bare(edge_guest(*args)), grants=["log"])
        if logged is None:
            with pytest.raises(CallError) as info:
                ext.call("run")
            assert info.value.failure is FailureClass.PROTOCOL
            assert ext.logs() == ()
        else:
            assert ext.call("run") is None
            assert [r.message for r in ext.logs()] == (["edge"] if logged else [])
