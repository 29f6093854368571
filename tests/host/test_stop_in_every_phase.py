"""Revocation, close and host close stop a guest in every phase, answer in the error the
caller expects (revoked or unavailable, never a LifecycleError), and a malformed output does
not poison the next call."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.common import ALL_CAPS, FIXTURES, bare, run_in_thread
from tests.support.guests import HEAP_START, build, guest_wat
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked, ExtensionUnavailable, State
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

SPIN = "(loop $forever (br $forever))"
# What "promptly" means for these tests: the target is 100 ms (a few epoch ticks); the bound
# leaves room for a loaded CI machine.
PROMPT_S = 0.5


def spinning_start() -> bytes:
    return build(guest_wat(extra=f"(func $init {SPIN})\n  (start $init)"))


def spinning_handshake() -> bytes:
    # wasihost_alloc runs first for hello: spinning there is spinning in the handshake.
    alloc = f"""
  (func (export "wasihost_alloc") (param $n i32) (result i32) {SPIN} (i32.const {HEAP_START}))"""
    return build(guest_wat(alloc=alloc))


def spinning_command() -> bytes:
    return build(guest_wat(f"{SPIN} (call $ok_null)"))


def stop_while_running(
    host: Host, ext: Extension, stop: Callable[[], None]
) -> tuple[float, BaseException]:
    worker, outcome = run_in_thread(lambda: ext.call("run"))
    time.sleep(0.2)
    stopped = time.monotonic()
    stop()
    worker.join(timeout=10)
    elapsed = time.monotonic() - stopped
    assert not worker.is_alive()
    assert outcome, "the call returned normally"
    return elapsed, outcome[0]


PHASES = {"start function": spinning_start, "handshake": spinning_handshake,
          "command": spinning_command}


@pytest.mark.parametrize("phase", list(PHASES))
def test_disable_stops_every_phase_promptly(phase: str) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.admit(bare(PHASES[phase]()), grants=(), fuel=10**10, timeout_ms=3000)
        if phase == "command":
            ext.start()
        elapsed, error = stop_while_running(host, ext, lambda: host.disable(ext.id, "incident"))
        assert isinstance(error, ExtensionRevoked), error
        assert "incident" in str(error)
        assert elapsed < PROMPT_S, elapsed
        assert ext.lifecycle.state is State.REVOKED


@pytest.mark.parametrize("phase", list(PHASES))
def test_close_interrupts_every_phase_instead_of_waiting(phase: str) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.admit(bare(PHASES[phase]()), grants=(), fuel=10**10, timeout_ms=20_000)
        elapsed, error = stop_while_running(host, ext, ext.close)
        assert isinstance(error, ExtensionUnavailable), error
        assert elapsed < PROMPT_S, elapsed
        with pytest.raises(ExtensionUnavailable, match="closed"):
            ext.call("run")


def test_host_close_stops_calls_and_later_calls_are_unavailable() -> None:
    host = Host(Policy(allow=ALL_CAPS), cache_dir=None)
    exts = [
        host.admit(bare(spinning_command()), grants=(), fuel=10**10, timeout_ms=200)
        for _ in range(3)
    ]
    for ext in exts:
        ext.start()
    workers = [run_in_thread(lambda e=ext: e.call("run")) for ext in exts[:2]]
    time.sleep(0.05)
    started = time.monotonic()
    host.close()
    assert time.monotonic() - started < PROMPT_S
    for worker, outcome in workers:
        worker.join(timeout=5)
        assert isinstance(outcome[0], (ExtensionUnavailable, CallError)), outcome
    for ext in exts:
        # Before: the call ran on with no deadline (the watchdog had stopped) for 5.8 s.
        started = time.monotonic()
        with pytest.raises(ExtensionUnavailable, match="closed"):
            ext.call("run")
        assert time.monotonic() - started < PROMPT_S
    with pytest.raises(Exception, match="host is closed"):
        host.load(FIXTURES / "echo")


def test_call_after_close_is_unavailable_not_a_lifecycle_error(host: Host) -> None:
    ext = host.load(FIXTURES / "echo")
    assert ext.call("echo", 1) == 1
    ext.close()
    with pytest.raises(ExtensionUnavailable, match="closed"):
        ext.call("echo", 1)
    with pytest.raises(ExtensionUnavailable, match="closed"):
        ext.start()


def test_a_malformed_output_does_not_poison_the_next_call(host: Host) -> None:
    # Command "bad" (3 bytes) answers status 0 with a body that is not CBOR; "ok" answers null.
    bad_body = "\\00\\00\\00\\00\\ff"
    wat = guest_wat(
        "(if (result i64) (i32.eq (local.get $cmd_len) (i32.const 3))"
        " (then (call $packed (i32.const 3000) (i32.const 5))) (else (call $ok_null)))",
        extra=f'(data (i32.const 3000) "{bad_body}")',
    )
    ext = host.admit(bare(build(wat)), grants=())
    for _ in range(2):
        with pytest.raises(CallError) as info:
            ext.call("bad")
        assert info.value.failure is FailureClass.PROTOCOL
        assert ext.lifecycle.state is State.FAILED
        # Before: "no transition from running on ready".
        assert ext.call("ok") is None
        assert ext.lifecycle.state is State.RUNNING


def test_a_start_that_fails_before_the_guest_runs_is_not_stuck_starting(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    ext = host.load(FIXTURES / "echo")
    real = ext._new_instance
    calls = []

    def failing_once() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a broker factory failed")
        return real()

    monkeypatch.setattr(ext, "_new_instance", failing_once)
    with pytest.raises(RuntimeError):
        ext.call("echo", 1)
    assert ext.lifecycle.state is State.FAILED
    assert ext.call("echo", 2) == 2  # before: ExtensionUnavailable (starting) for good
