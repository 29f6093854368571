"""Short calls keep the GIL, through the real engine: which calls do, and that the deadline,
other threads and a forked child are unharmed when they do (engine/ticker.py,
Instance.call)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.common import bare, run_in_thread
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.settings import EngineSettings
from wasihost.engine import Instance, ticker
from wasihost.engine.ticker import GIL_WANTED
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

# In-process mechanics (the GIL and the epoch ticker of the in-process engine):
# these run in-process under --runtime=process too.
pytestmark = pytest.mark.in_process

# "run" returns at once. "burn" loops BURN_ITERATIONS times: over the fuel line. "spins"
# returns at once for an input of CBOR false and loops forever for CBOR true (so it is first
# seen short, then spins while keeping the GIL).

BURN_ITERATIONS = 100_000
BODY = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 4))
      (then (global.set $i (i32.const 0)) (loop $l
        (global.set $i (i32.add (global.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (global.get $i) (i32.const {BURN_ITERATIONS}))))))
    (if (i32.and
          (i32.eq (local.get $cmd_len) (i32.const 5))
          (i32.eq (i32.load8_u (i32.add (local.get $ptr) (local.get $cmd_len))) (i32.const 0xf5)))
      (then (loop $spin (br $spin))))
    (call $ok_null)"""
WASM = build(guest_wat(BODY, extra="(global $i (mut i32) (i32.const 0))"))
TIMEOUT_MS = 400
# The call ends within a few ticks of its deadline; the rest is room for a loaded machine.
LATE_S = 1.5


def load(host: Host) -> Extension:
    ext = host.admit(bare(WASM), grants=(), timeout_ms=TIMEOUT_MS, fuel=10**10)
    ext.start()
    return ext


def only_instance(ext: Extension) -> Instance:
    (instance,) = ext._instances()
    return instance


def test_a_command_keeps_the_gil_once_seen_short_and_not_after_a_long_call() -> None:
    with Host(Policy(), cache_dir=None) as host:
        assert host.engine.keep_gil_below_fuel > 0  # the native ticker is there (Linux)
        ext = load(host)
        instance = only_instance(ext)
        assert not instance.keeps_gil(b"run")  # never seen: released
        ext.call("run")
        assert instance.keeps_gil(b"run")
        ext.call("burn")
        assert instance.last_call_fuel > host.engine.keep_gil_below_fuel
        assert not instance.keeps_gil(b"burn")
        ext.call("burn")  # it ran released, and is still long
        assert not instance.keeps_gil(b"burn")
        assert instance.keeps_gil(b"run")


def test_a_spinning_call_that_keeps_the_gil_ends_at_its_deadline_and_lets_threads_run() -> None:
    """The ticks need no GIL: a guest spinning while its thread keeps the GIL is still
    stopped at its deadline, other Python threads run at each tick meanwhile, and no call of
    that module keeps the GIL again, in this instance or a new one."""
    with Host(Policy(), cache_dir=None) as host:
        ext = load(host)
        ext.call("spins", False)
        assert only_instance(ext).keeps_gil(b"spins")
        beats: list[float] = []
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.is_set():
                beats.append(time.monotonic())
                time.sleep(0.001)

        thread = threading.Thread(target=heartbeat)
        thread.start()
        try:
            start = time.monotonic()
            with pytest.raises(CallError) as info:
                ext.call("spins", True)
            ended = time.monotonic()
        finally:
            stop.set()
            thread.join()
        assert info.value.failure is FailureClass.DEADLINE
        assert ended - start < TIMEOUT_MS / 1000 + LATE_S
        during = [t for t in beats if start < t < ended]
        # At 10 ms ticks a 400 ms spin yields about 40 times; a GIL never given up gives 0.
        assert len(during) >= 5, len(during)
        ext.call("run")
        ext.call("run")
        replacement = only_instance(ext)  # the deadline discarded the spinning instance
        assert not replacement.keeps_gil(b"run")


def test_no_call_keeps_the_gil_while_another_thread_runs_guest_code_without_it() -> None:
    """A thread whose guest returns must get the GIL back at once, not after a switch
    interval of another thread's short calls: while one is in guest code with the GIL
    released, short calls release it too."""
    with Host(Policy(), cache_dir=None) as host:
        ext = load(host)
        spinner = load(host)
        ext.call("run")
        ext.call("run")
        instance = only_instance(ext)
        assert instance.kept_gil
        # Never seen short: released.
        thread, failures = run_in_thread(lambda: spinner.call("spins", True))
        give_up = time.monotonic() + LATE_S
        while not GIL_WANTED and time.monotonic() < give_up:
            time.sleep(0.001)
        assert GIL_WANTED
        ext.call("run")
        assert instance.keeps_gil(b"run") and not instance.kept_gil
        thread.join(TIMEOUT_MS / 1000 + LATE_S)
        assert len(failures) == 1 and isinstance(failures[0], CallError)
        # The spinner's warm spare may be instantiating (released too) for a moment.
        give_up = time.monotonic() + LATE_S
        while GIL_WANTED and time.monotonic() < give_up:
            time.sleep(0.001)
        assert not GIL_WANTED
        ext.call("run")
        assert instance.kept_gil


def test_without_native_ticks_no_call_keeps_the_gil_and_deadlines_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ticker, "_TIMER", None)
    with Host(Policy(), cache_dir=None) as host:
        assert host.engine.keep_gil_below_fuel == 0
        ext = load(host)
        ext.call("spins", False)
        ext.call("spins", False)
        assert not only_instance(ext).keeps_gil(b"spins")
        start = time.monotonic()
        with pytest.raises(CallError) as info:
            ext.call("spins", True)
        assert info.value.failure is FailureClass.DEADLINE
        assert time.monotonic() - start < TIMEOUT_MS / 1000 + LATE_S


def test_the_setting_at_zero_keeps_no_call_on_the_gil() -> None:
    with Host(Policy(), cache_dir=None, settings=EngineSettings(keep_gil_below_fuel=0)) as host:
        ext = load(host)
        ext.call("run")
        ext.call("run")
        assert not only_instance(ext).keeps_gil(b"run")


def test_closed_and_dropped_hosts_delete_their_timers() -> None:
    gc.collect()
    before = len(ticker._RUNNING)
    for close in (True, False, True, False):
        host = Host(Policy(), cache_dir=None)
        load(host).call("run")
        assert len(ticker._RUNNING) == before + 1
        if close:
            host.close()
        del host
        gc.collect()
        assert len(ticker._RUNNING) == before


# Run in a fresh interpreter: forking this test process, with the other tests' threads in
# it, could leave the child waiting on a lock some thread held at the fork.
FORK_SCRIPT = """
import os, sys, time
sys.path[:0] = [sys.argv[1]]
from tests.support.guests import build, guest_wat
from tests.engine.test_short_calls import TIMEOUT_MS, WASM, bare, load
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host


with Host(Policy(), cache_dir=None) as host, Host(Policy(), cache_dir=None) as unused:
    ext = load(host)
    ext.call("spins", False)
    # Compiled before the fork (a compile in a forked child may wait on the parent's compile
    # threads), not started: its ticker first runs in the child.
    later = unused.admit(bare(WASM), grants=(), timeout_ms=TIMEOUT_MS, fuel=10**10)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            ext.call("spins", True)
        except CallError as exc:
            code = 0 if exc.failure is FailureClass.DEADLINE else 4
        except BaseException:
            code = 5
        # A host made before the fork and first used after it ticks from Python too.
        try:
            later.call("spins", True)
            code = code or 6
        except CallError as exc:
            code = code or (0 if exc.failure is FailureClass.DEADLINE else 7)
        if unused.engine._watchdog._fallback is None:
            code = code or 8
        # A compile in the child goes to a fresh worker: in-process, it would wait forever
        # for the parent's compile threads.
        try:
            unused.admit(bare(build(guest_wat(extra="(func $more)"))), grants=())
        except BaseException:
            code = code or 9
        os._exit(code)
    give_up = time.monotonic() + float(sys.argv[2])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > give_up:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("the child never finished: a spinning call past its deadline, or a compile")
            sys.exit(1)
        time.sleep(0.02)
    print("child exit", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_ticks_on_its_own() -> None:
    """A child inherits no timer and no compile threads: without ticks of its own a spinning
    call there would never end, and an in-process compile would wait forever. Hosts running
    at the fork, and hosts first used after it, tick from Python there; compiles go to a
    fresh worker process."""
    tests = str(Path(__file__).parents[2])
    wait = TIMEOUT_MS / 1000 + 10 * LATE_S
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, tests, str(wait)],
        capture_output=True,
        text=True,
        timeout=wait + 60,
        check=False,
    )
    assert done.stdout.strip() == "child exit 0", (done.stdout, done.stderr[-2000:])
