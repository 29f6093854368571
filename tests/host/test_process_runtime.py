"""The process runtime (issue 30): extensions run in walled children, host calls come back
to the host, and whatever a child does, the host serves the next call. Every test runs real
children through a real Host; the hostile ones speak the channel with
tests/support/hostile_child.py."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.host.test_host_functions import LIMITS, fn_guest
from tests.support.common import ALL_CAPS, FIXTURES, bare, proc_status_field, run_in_thread
from tests.support.guests import build, guest_wat
from wasihost.core.errors import AdmissionError, CallError, ConfigError, FailureClass
from wasihost.core.serving import CallContext
from wasihost.core.status import Status
from wasihost.engine import StoreLimits
from wasihost.engine.process import (
    CPU_ALLOWANCE_NS,
    FUEL_PER_CPU_NS,
    ProcessBackend,
    ProcessInstance,
)
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HOSTILE = Path(__file__).resolve().parents[1] / "support" / "hostile_child.py"
SPIN = build(guest_wat("(loop $l (br $l)) (call $ok_null)"))
PROMPT_S = 10.0  # bounded waits: generous for a loaded 2-core machine


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow=ALL_CAPS | {"myapp.write"}), cache_dir=None) as h:
        yield h


def process_only(host: Host, source: Path | Any, **kw: Any) -> Extension:
    if isinstance(source, Path):
        return host.load(source, runtime="process-only", **kw)
    return host.admit(source, runtime="process-only", **kw)


def only_instance(ext: Extension) -> ProcessInstance:
    (instance,) = ext._instances()
    assert isinstance(instance, ProcessInstance)
    return instance


def _hostile(host: Host, mode: str) -> ProcessBackend:
    backend = host.backend_for("process-only")
    assert isinstance(backend, ProcessBackend)
    backend.program = [sys.executable, str(HOSTILE), mode]
    return backend


# -- the runtime works, walled ---------------------------------------------------------------


def test_an_extension_runs_in_a_walled_child_and_its_host_calls_come_back(host: Host) -> None:
    ext = process_only(host, FIXTURES / "hello")
    assert ext.runtime == "process-only"
    assert ext.call("greet", {"name": "ada"}) == {"greeting": "hello, ada"}
    child = only_instance(ext)
    assert child.pid != os.getpid()
    # The host's own view of the child: no new privileges, a seccomp filter, another network
    # namespace; and the child's report of each wall it checked from inside.
    assert proc_status_field(child.pid, "NoNewPrivs") == "1"
    assert proc_status_field(child.pid, "Seccomp") == "2"
    assert os.readlink(f"/proc/{child.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    walls = {w.name: w.state for w in child.walls}
    assert walls == dict.fromkeys(
        ("no_new_privs", "namespaces", "landlock", "rlimits", "seccomp"), "enforced"
    ), child.walls
    # The record the guest logged went through the host's log broker: the child has none.
    assert [record.message for record in ext.logs()] == ["greeting"]
    ext.close()
    assert _gone(child.pid)


def _gone(pid: int) -> bool:
    for _ in range(int(PROMPT_S / 0.01)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


def test_results_and_failures_are_the_same_as_in_process(host: Host) -> None:
    payload = {"a": [1, 2, b"x"], "b": None}
    answers = {}
    for mode in ("in-process", "process-only"):
        echo = host.load(FIXTURES / "echo", runtime=mode)
        traps = host.load(FIXTURES / "traps", runtime=mode)
        failures = []
        for kind in ("unreachable", "div_zero", "oob_load"):
            with pytest.raises(CallError) as info:
                traps.call("run", {"kind": kind})
            failures.append(info.value.failure)
            crashes = len(host.supervisor.crashes(traps.id))
        answers[mode] = (echo.call("echo", payload), failures, crashes)
        echo.close()
        traps.close()
    assert answers["in-process"] == answers["process-only"]
    assert answers["process-only"][0] == payload


def test_a_child_at_rest_burns_no_cpu(host: Host) -> None:
    # Break (2026-12-07): the seccomp filter refused rt_sigtimedwait, and glibc's timer
    # thread (the epoch ticker's) retried it at once, forever: a small call took 6x longer.
    ext = process_only(host, FIXTURES / "echo")
    ext.call("echo", b"x")
    child = only_instance(ext)
    before = child._cpu()
    time.sleep(0.5)
    assert child._cpu() - before < 50_000_000  # under 10% of a core while idle


def test_the_host_measures_the_childs_cpu_time(host: Host) -> None:
    ext = process_only(host, bare(SPIN, "spin.wasm"), fuel=10**11, timeout_ms=300)
    with pytest.raises(CallError) as info:
        ext.call("run")
    assert info.value.failure is FailureClass.DEADLINE
    instance = ext._instances()
    # Whatever the child claims, the host read its CPU time from the kernel.
    assert not instance or only_instance(ext).last_call_cpu_ns > 100_000_000


def test_a_child_claiming_less_fuel_than_its_cpu_time_is_charged_for_the_cpu(host: Host) -> None:
    # Trust runs one way: the fuel a child reports is its claim. This one burns half a second
    # of CPU and claims none; the rate budget is told what the CPU was worth beyond the claim.
    ext = process_only(host, FIXTURES / "echo")
    ext.call("echo", b"x")
    wired = only_instance(ext)._unclaimed
    assert wired is not None and getattr(wired, "__self__", None) is ext  # Extension wires it
    backend = _hostile(host, "burn")
    compiled = backend.compile((FIXTURES / "echo" / "echo.wasm").read_bytes())
    limits = StoreLimits(
        max_memory_bytes=1 << 24, max_table_elements=100, fuel=10**6, timeout_ms=5000
    )
    child = backend.new_instance(compiled, [], lambda entry: True, limits)
    assert isinstance(child, ProcessInstance)
    charged: list[int] = []
    child.charge_unclaimed(charged.append)
    try:
        assert child.call(b"echo", b"", 1024).fuel_used == 0
        assert child.last_call_cpu_ns > 400_000_000
        assert charged == [child.unclaimed_fuel]
        assert child.unclaimed_fuel >= (400_000_000 - CPU_ALLOWANCE_NS) * FUEL_PER_CPU_NS
    finally:
        child.close()


# -- selecting the runtime -------------------------------------------------------------------


def test_a_manifest_asking_for_the_process_runtime_is_never_run_in_process(
    host: Host, tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "hello"
    shutil.copytree(FIXTURES / "hello", root)
    toml = root / "extension.toml"
    text = toml.read_text()
    toml.write_text(
        text.replace('module = "hello.wasm"', 'module = "hello.wasm"\nruntime = "wasm-process"')
    )
    ext = host.load(root)
    assert ext.runtime == "process-only"
    assert ext.call("greet", {"name": "x"}) == {"greeting": "hello, x"}
    ext.close()
    with pytest.raises(AdmissionError, match="weaken its isolation"):
        host.load(root, runtime="in-process")
    # prefer-process would fall back in-process: for this package it means process-only.
    assert host.load(root, runtime="prefer-process").runtime == "process-only"


def test_an_unknown_runtime_mode_is_refused_naming_the_modes(host: Host) -> None:
    with pytest.raises(ConfigError, match="in-process, prefer-process, process-only"):
        host.load(FIXTURES / "echo", runtime="sandboxed")
    with pytest.raises(ConfigError, match="Policy: runtime 'x'"):
        Policy(runtime="x")
    assert Policy(runtime="process").runtime == "process-only"


def test_the_policy_and_the_environment_choose_the_default_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WASIHOST_RUNTIME", "process")
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h:
        assert h.load(FIXTURES / "echo").runtime == "process-only"
    with Host(Policy(allow=ALL_CAPS, runtime="in-process"), cache_dir=None) as h:
        assert h.load(FIXTURES / "echo").runtime == "in-process"
    monkeypatch.setenv("WASIHOST_RUNTIME", "nowhere")
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h, pytest.raises(ConfigError):
        h.load(FIXTURES / "echo")


def test_prefer_process_runs_in_process_only_when_no_child_can_start(host: Host) -> None:
    backend = host.backend_for("prefer-process")
    assert isinstance(backend, ProcessBackend)
    backend.program = ["/nonexistent/wasihost-child"]  # spawn fails: no guest code ran
    ext = host.load(FIXTURES / "echo", runtime="prefer-process")
    assert ext.call("echo", b"x") == b"x"
    assert not isinstance(ext._instances()[0], ProcessInstance)
    assert backend.fallbacks == 1
    # process-only has no fallback: the call fails, naming why.
    strict = host.backend_for("process-only")
    assert isinstance(strict, ProcessBackend)
    strict.program = ["/nonexistent/wasihost-child"]
    other = host.load(FIXTURES / "hello", runtime="process-only")
    with pytest.raises(CallError) as info:
        other.call("greet", {"name": "x"})
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "cannot start" in info.value.message


def test_a_call_that_may_have_committed_is_never_replayed(host: Host) -> None:
    # The child dies mid-host-call, right after the host committed the effect: the call fails
    # native_process_exit, the effect is there once, and the call is not run again anywhere.
    committed: list[int] = []

    @host.function("myapp.note", capability="myapp.write", **LIMITS)
    def note(ctx: CallContext, request: Any) -> Any:
        committed.append(request)
        child = only_instance(ext)
        os.kill(child.pid, signal.SIGKILL)
        time.sleep(0.2)
        return None

    ext = host.admit(
        bare(fn_guest("note"), name="noter"), grants=["myapp.write"], runtime="prefer-process"
    )
    with pytest.raises(CallError) as info:
        ext.call("go", 7)
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "SIGKILL" in info.value.message
    assert committed == [7]  # once, and not replayed in-process by prefer-process


# -- faults: each ends the child, never the host --------------------------------------------


def test_a_child_killed_mid_call_is_a_native_process_exit_and_the_next_call_is_served(
    host: Host,
) -> None:
    ext = process_only(host, bare(SPIN, "spin.wasm"), fuel=10**11, timeout_ms=20_000)
    ext.start()
    child = only_instance(ext)
    worker, outcome = run_in_thread(lambda: ext.call("run"))
    time.sleep(0.2)
    os.kill(child.pid, signal.SIGKILL)
    worker.join(PROMPT_S)
    assert not worker.is_alive()
    (failure,) = outcome
    assert isinstance(failure, CallError)
    assert failure.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert failure.message == "the extension's process was killed by SIGKILL"
    # A crash record of its own class, for the supervisor's restart policy and quarantine.
    (record,) = host.supervisor.crashes(ext.id)
    assert record.crash_class.value == "native_process_exit"
    # The extension restarts in a new child.
    with pytest.raises(CallError) as again:
        ext.call("run", timeout_ms=100)
    assert again.value.failure is FailureClass.DEADLINE  # its own deadline, in a new child


def test_a_child_that_crashed_between_calls_fails_the_next_one_and_is_replaced(
    host: Host,
) -> None:
    # The child dies between calls (an abort in its interpreter or engine): the host learns at
    # the next call, which fails naming the signal, never replayed on another child. (A
    # SIGSEGV sent with kill() does not do: wasmtime's handler takes it and carries on.)
    ext = process_only(host, FIXTURES / "echo")
    assert ext.call("echo", b"a") == b"a"
    child = only_instance(ext)
    os.kill(child.pid, signal.SIGABRT)
    assert _gone_or_zombie(child.pid)
    with pytest.raises(CallError) as info:
        ext.call("echo", b"b")
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "SIGABRT" in info.value.message
    assert ext.call("echo", b"c") == b"c"


def _gone_or_zombie(pid: int) -> bool:
    for _ in range(int(PROMPT_S / 0.01)):
        try:
            with open(f"/proc/{pid}/status") as f:
                if "zombie" in f.read():
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def test_a_recursing_guest_called_with_little_stack_left_cannot_crash_the_host(
    host: Host,
) -> None:
    # In-process, a recursing guest entered from a thread with little stack left killed the
    # host with SIGSEGV (reproduced 2026-12-06) until entries were refused; in a child the
    # guest runs on the child's own stack, and the host's thread does not matter.
    ext = process_only(host, FIXTURES / "recurse")
    answers: list[Any] = []
    threading.stack_size(256 * 1024)
    try:
        worker, outcome = run_in_thread(lambda: answers.append(ext.call("run")))
        worker.join(PROMPT_S)
    finally:
        threading.stack_size(0)
    assert not worker.is_alive()
    (failure,) = outcome
    assert isinstance(failure, CallError) and failure.failure is FailureClass.STACK_OVERFLOW


def test_a_child_past_its_cpu_limit_is_killed_and_the_next_call_is_served(host: Host) -> None:
    backend = host.backend_for("process-only")
    assert isinstance(backend, ProcessBackend)
    backend.rlimit_overrides = {"RLIMIT_CPU": 1}
    ext = process_only(host, bare(SPIN, "spin.wasm"), fuel=10**11, timeout_ms=20_000)
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("run")
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "SIGXCPU" in info.value.message or "SIGKILL" in info.value.message
    assert time.monotonic() - started < PROMPT_S
    backend.rlimit_overrides = {}
    assert process_only(host, FIXTURES / "echo").call("echo", b"ok") == b"ok"


def test_a_child_past_its_address_space_cannot_start_its_guest(host: Host) -> None:
    backend = host.backend_for("process-only")
    assert isinstance(backend, ProcessBackend)
    # Less than the guest memory's reservation: the child cannot map it.
    backend.rlimit_overrides = {"RLIMIT_AS": 600 << 20}
    ext = process_only(host, FIXTURES / "echo")
    with pytest.raises(CallError) as info:
        ext.call("echo", b"x")
    # wasmtime's mapping of the memory fails in the child, which says so; or the child dies.
    assert "Cannot allocate memory" in info.value.message or (
        info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    ), info.value
    backend.rlimit_overrides = {}
    assert process_only(host, FIXTURES / "hello").call("greet", {"name": "y"}) == {
        "greeting": "hello, y"
    }


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("garbage", "not bounded CBOR"),
        ("oversized", "a frame of 2147483647 bytes"),
        ("wrong-kind", "where DONE or FAIL was expected"),
        ("unknown-import", "import 99"),
        ("oversized-request", "over its"),
        ("fuel-lie", "claimed -5 fuel"),
        ("exit", "exited with status 3"),
    ],
)
def test_a_child_breaking_the_protocol_is_ended_and_the_host_serves_on(
    host: Host, mode: str, said: str
) -> None:
    backend = _hostile(host, mode)
    ext = process_only(host, FIXTURES / "hello")
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "x"})
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT, info.value
    assert said in info.value.message
    backend.program = None
    assert ext.call("greet", {"name": "x"}) == {"greeting": "hello, x"}


@pytest.mark.parametrize("mode", ["bad-secret", "wrong-imports"])
def test_a_child_that_is_not_the_one_started_or_loaded_something_else_is_refused(
    host: Host, mode: str
) -> None:
    _hostile(host, mode)
    ext = process_only(host, FIXTURES / "hello")
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "x"})
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT


def test_a_child_making_more_host_calls_than_its_fuel_pays_for_is_ended(host: Host) -> None:
    # Each host call costs at least its entry's base price: a call's fuel bounds how many it
    # makes, whatever the child says of its fuel.
    _hostile(host, "host-spam")
    ext = process_only(host, FIXTURES / "hello", fuel=1000)
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "x"})
    assert info.value.failure is FailureClass.NATIVE_PROCESS_EXIT
    assert "host calls in one call" in info.value.message


@pytest.mark.parametrize("mode", ["stderr-flood", "stdout-flood", "hang", "host-flood"])
def test_a_flooding_or_hanging_child_is_killed_at_the_deadline(host: Host, mode: str) -> None:
    _hostile(host, mode)
    ext = process_only(host, FIXTURES / "hello", timeout_ms=300)
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "x"})
    assert info.value.failure is FailureClass.DEADLINE
    assert time.monotonic() - started < PROMPT_S


def test_a_revocation_while_a_child_runs_holds_at_the_commit_point(host: Host) -> None:
    entered, release = threading.Event(), threading.Event()
    committed: list[object] = []

    @host.function("myapp.slow", capability="myapp.write", **LIMITS)
    def slow(ctx: CallContext, request: Any) -> Any:
        entered.set()
        release.wait(PROMPT_S)
        return ctx.commit(lambda: committed.append(request))

    ext = process_only(host, bare(fn_guest("slow"), name="slow"), grants=["myapp.write"])
    answers: list[Any] = []
    worker, outcome = run_in_thread(lambda: answers.append(ext.call("go", 1)))
    assert entered.wait(PROMPT_S)
    host.revoke(ext.id, "myapp.write")
    release.set()
    worker.join(PROMPT_S)
    assert not worker.is_alive()
    assert committed == []  # nothing commits after the revocation returned
    # The guest got DENIED for its commit (fn_guest answers the status), or its call ended.
    assert answers == [-int(Status.DENIED)] or outcome, (answers, outcome)


def test_ctrl_c_while_a_child_runs_ends_the_call_as_interrupted(host: Host) -> None:
    ext = process_only(host, bare(SPIN, "spin.wasm"), fuel=10**11, timeout_ms=20_000)
    ext.start()
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(CallError) as info:
            ext.call("run")
    finally:
        timer.cancel()
    assert info.value.failure is FailureClass.INTERRUPTED
