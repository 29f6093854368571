"""Ctrl-C and other BaseExceptions while a guest runs.

A KeyboardInterrupt or SystemExit raised inside a host function is re-raised after the call,
and the instance it stopped at an arbitrary point is discarded with nothing left in its error
slots. Ctrl-C (SIGINT, sent here by a timer thread to this process while the guest runs on the
main thread) ends the call promptly as ``interrupted``, whether the guest spins (the epoch tick
notices) or hammers host calls (each call still runs: the guest checks every result, and a
skipped call would make it panic).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.common import bare, native_entry, run_child
from tests.support.guests import build, guest_wat, host_import
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.guestmem import GuestMemory
from wasihost.core.limits import MAX_FUEL_PER_CALL
from wasihost.core.registry import HostFunction, Profile
from wasihost.engine import sigint
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

MODULE = "ping_preview1"
PROFILE = Profile(
    name="ping",
    module=MODULE,
    functions=(native_entry(MODULE, "ping", ("i32",), ("i32",), "ping", fuel_per_byte=0),),
)
# Far beyond any interrupt, so that neither the deadline nor the fuel can end the call first.
LONG_MS = 20_000
MAX_FUEL = MAX_FUEL_PER_CALL
# Ctrl-C must end the call within this long of the signal: a few epoch ticks, on a busy box.
PROMPT_S = 1.5


class PingBinding:
    """``ping(n)`` answers ``n + 1``; ``raises`` makes the next ping raise it instead."""

    raises: BaseException | None = None
    calls = 0

    def __init__(self, ext: Extension) -> None:
        pass

    def handler(self, e: HostFunction) -> Callable[..., Any]:
        def ping(mem: GuestMemory, n: int) -> int:
            PingBinding.calls += 1
            exc, PingBinding.raises = PingBinding.raises, None
            if exc is not None:
                raise exc
            return n + 1

        return ping

    def close(self) -> None:
        pass


PING = f'(import "{MODULE}" "ping" (func $ping (param i32) (result i32)))'

# Counts its calls in a global and answers the count (a CBOR uint below 24 is one byte); with
# an input of 2 bytes or more it traps with `unreachable` after the ping instead.
COUNTING = build(
    guest_wat(
        """
    (global.set $count (i32.add (global.get $count) (i32.const 1)))
    (if (i32.ne (call $ping (i32.const 41)) (i32.const 42)) (then unreachable))
    (if (i32.ge_u (local.get $in_len) (i32.const 2)) (then unreachable))
    (i32.store8 (i32.const 8196) (global.get $count))
    (call $packed (i32.const 8192) (i32.const 5))""",
        imports=PING,
        extra="(global $count (mut i32) (i32.const 0))",
    )
)

# Pings forever, checking every answer: a skipped host call panics.
HAMMER = build(
    guest_wat(
        """
    (loop $l
      (if (i32.ne (call $ping (global.get $i)) (i32.add (global.get $i) (i32.const 1)))
        (then unreachable))
      (global.set $i (i32.add (global.get $i) (i32.const 1)))
      (br $l))
    (call $ok_null)""",
        imports=PING,
        extra="(global $i (mut i32) (i32.const 0))",
    )
)

# The same through the cbor convention: `log` never answers with its own request pointer.
HAMMER_CBOR = build(
    guest_wat(
        """
    (loop $l
      (if (i32.eq (call $log (i32.const 9000) (i32.const 1) (i32.const 9100) (i32.const 8))
                  (i32.const 9000))
        (then unreachable))
      (br $l))
    (call $ok_null)""",
        imports=host_import("log"),
        extra='(data (i32.const 9000) "\\f6")',
    )
)

SPIN = build(guest_wat("(loop $l (br $l)) (call $ok_null)"))


@pytest.fixture(autouse=True)
def python_handles_ctrl_c() -> Iterator[None]:
    """The Ctrl-C tests need what an interactive Python has: the default SIGINT handler. A
    test runner started in the background by a shell without job control inherits SIGINT
    ignored (and Python keeps it ignored), so set it for the test and restore it after."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)


@pytest.fixture
def host() -> Iterator[Host]:
    PingBinding.raises = None
    with Host(
        Policy(allow={"ping", "log"}), cache_dir=None, profiles=[(PROFILE, PingBinding)]
    ) as h:
        yield h


def load(host: Host, wasm: bytes, name: str) -> Extension:
    return host.admit(bare(wasm, name), grants=["ping", "log"], timeout_ms=LONG_MS, fuel=MAX_FUEL)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_base_exception_in_a_host_function_discards_the_instance(
    host: Host, exc: BaseException
) -> None:
    ext = load(host, COUNTING, "counting.wasm")
    assert ext.call("run") == 1
    assert ext.call("run") == 2
    PingBinding.raises = exc
    with pytest.raises(type(exc)):
        ext.call("run")
    # A fresh instance: its count starts again, and nothing of the aborted call is left.
    assert ext.call("run") == 1
    with pytest.raises(CallError) as info:
        ext.call("run", "xx")
    assert info.value.failure is FailureClass.PANIC, info.value


def test_error_slots_are_empty_after_a_reraised_base_exception(host: Host) -> None:
    # The Instance itself (whoever owns it) must not report the aborted call's error for a
    # later, unrelated trap.
    ext = load(host, COUNTING, "counting.wasm")
    assert ext.call("run") == 1
    (instance,) = ext._instances()
    PingBinding.raises = KeyboardInterrupt()
    with instance.lock, pytest.raises(KeyboardInterrupt):
        instance.call(b"run", b"\xf6", 1024)
    with instance.lock, pytest.raises(CallError) as info:
        instance.call(b"run", b"\x41\x00", 1024)  # two bytes of input: traps
    assert info.value.failure is FailureClass.PANIC, info.value


def _ctrl_c_during(ext: Extension, delay: float = 0.2) -> tuple[CallError, float]:
    """Run the extension's command on this (the main) thread, and send this process SIGINT
    from a timer thread ``delay`` seconds in. The call's error, and how long after the signal
    the call ended."""
    assert threading.current_thread() is threading.main_thread()
    sent: list[float] = []

    def send() -> None:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(delay, send)
    try:
        timer.start()
        with pytest.raises(CallError) as info:
            ext.call("run")
        ended = time.monotonic()
    except KeyboardInterrupt:  # pragma: no cover - the regression this file guards against
        pytest.fail("Ctrl-C escaped the guest call as a bare KeyboardInterrupt")
    finally:
        timer.cancel()
        timer.join()
    assert sent, "the call ended before the signal was sent"
    return info.value, ended - sent[0]


@pytest.mark.parametrize(
    ("wasm", "name"),
    [(SPIN, "spin.wasm"), (HAMMER, "hammer.wasm"), (HAMMER_CBOR, "hammer-cbor.wasm")],
    ids=["spinning", "native-host-calls", "cbor-host-calls"],
)
@pytest.mark.in_process
def test_ctrl_c_ends_a_guest_call_on_the_main_thread(host: Host, wasm: bytes, name: str) -> None:
    ext = load(host, wasm, name)
    ext.start()
    failure, after = _ctrl_c_during(ext)
    assert failure.failure is FailureClass.INTERRUPTED, failure
    assert after < PROMPT_S
    # The extension and the process carry on: a new instance runs the next call.
    counting = load(host, COUNTING, "counting.wasm")
    assert counting.call("run") == 1
    assert sigint.installed()


@pytest.mark.in_process
def test_ctrl_c_outside_a_guest_is_a_keyboard_interrupt(host: Host) -> None:
    load(host, COUNTING, "counting.wasm").call("run")  # the handler is installed by now
    assert sigint.installed()

    def ctrl_c_then_wait() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    with pytest.raises(KeyboardInterrupt):
        ctrl_c_then_wait()


# Another signal's handler (here SIGUSR1 raising SystemExit) would run at the entry of a
# callback too, and what it raises would escape there. The engine defers it to the end of the
# call: every host call runs (the guest checks each answer), the call completes, then the
# handler runs. Run in a child process: before the fix the process aborted.
PINGS = 200_000
BOUNDED_HAMMER = build(
    guest_wat(
        f"""
    (loop $l
      (if (i32.ne (call $ping (global.get $i)) (i32.add (global.get $i) (i32.const 1)))
        (then unreachable))
      (global.set $i (i32.add (global.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (global.get $i) (i32.const {PINGS}))))
    (global.set $i (i32.const 0))
    (call $ok_null)""",
        imports=PING,
        extra="(global $i (mut i32) (i32.const 0))",
    )
)

OTHER_SIGNAL = """
import collections, json, os, signal, sys, threading
sys.path.insert(0, ".")
from tests.engine.test_interrupts import BOUNDED_HAMMER, PROFILE, PingBinding, load
from wasihost.core.errors import CallError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

def leave(signum, frame):
    raise SystemExit(7)

signal.signal(signal.SIGUSR1, leave)
host = Host(Policy(allow={"ping", "log"}), cache_dir=None, profiles=[(PROFILE, PingBinding)])
outcomes = collections.Counter()
ext = load(host, BOUNDED_HAMMER, "hammer.wasm")
ext.call("run")
for i in range(6):
    PingBinding.calls = 0
    timer = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        ext.call("run")
        outcomes["returned"] += 1
    except SystemExit as exc:
        outcomes[f"SystemExit {exc.code} after {PingBinding.calls} pings"] += 1
    except CallError as exc:
        outcomes[exc.failure.value] += 1
    timer.join()
print(json.dumps(outcomes))
"""


@pytest.mark.in_process
def test_another_signal_handler_runs_after_the_call_not_inside_it() -> None:
    report, stderr = run_child(OTHER_SIGNAL)
    assert "Exception ignored" not in stderr
    assert report == {f"SystemExit 7 after {PINGS} pings": 6}
