"""The host-call trampolines (issue 31, engine/_fastcall.c): host calls come back through C
callbacks instead of ctypes ones, and a native import with integer parameters is served by a
``NativeEntry``, with no Python frame of the engine's. Each differential test runs the same real
guests on the native entry or the generic C trampoline and on the ctypes callback, and compares
everything a caller sees: answers, failure classes and messages, fuel, the capabilities refused,
and what the host functions saw."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.host.test_native_functions import NATIVEFNS, app_host, native_guest
from tests.support.wasi import PROBE, run_wasihost
from wasihost.core.errors import CallError
from wasihost.core.serving import CallContext
from wasihost.engine import fastcall, hostcalls, native, sigint
from wasihost.host.runtime import Host
from wasihost.wasi import Mount

pytestmark = [
    pytest.mark.in_process,  # the trampolines are the in-process engine's own
    pytest.mark.skipif(fastcall.NATIVE_ENTRY is None, reason=f"no C extension: {fastcall.WHY}"),
]

CAPS = {"myapp.math", "myapp.write"}


def on_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Serve the host calls of every instance made from now on the ``path`` way."""
    if path in ("trampoline", "ctypes"):
        monkeypatch.setattr(native, "NATIVE_ENTRY", None)
    if path == "ctypes":
        monkeypatch.setattr(hostcalls, "HOST_TRAMPOLINE", 0)


def observe(ext: Any, command: str, value: Any) -> tuple[Any, ...]:
    """What a caller sees of one call: its answer or its failure, and the fuel it used."""
    try:
        answer: tuple[Any, ...] = ("ok", ext.call(command, value))
    except CallError as exc:
        answer = ("failed", exc.failure.value, exc.message)
    return (*answer, ext.last_fuel_used)


def native_functions_run() -> list[Any]:
    """The nativefns plugin through docs/host-functions.md's application: signed integers,
    every way a function can misbehave, commits and a revocation before one, and a budget
    that runs out part-way through a loop of host calls."""
    seen: list[Any] = []
    with app_host(CAPS) as host:
        ext = host.load(NATIVEFNS)
        for args in ([2, 40], [-5, 3], [-(2**63), 0], [666, 1], [777, 1], [888, 1], [999, 1]):
            seen.append(observe(ext, "add", args))
        for count in (0, 10, 200):
            seen.append(observe(ext, "add_many", count))
        for amount in (5, 7, 99, 1):  # 99 revokes myapp.write before its own commit
            seen.append(observe(ext, "tally", amount))
        seen.append(sorted(ext.denied_capabilities))
        ext.close()
        poor = host.load(NATIVEFNS, fuel=20_000 * 50)
        seen.append(observe(poor, "add_many", 1000))
        seen.append([args for _, _, *args in host.seen])  # type: ignore[attr-defined]
        seen.append(host.tallies)  # type: ignore[attr-defined]
    return without_handshakes(seen)


def without_handshakes(seen: list[Any]) -> list[Any]:
    """The fuel of a call right after a failed one left out: the failed instance's successor
    may or may not have made its handshake in the background by then (its fuel is charged to
    the first call it serves), on any path."""
    kept: list[Any] = []
    after_failure = False
    for item in seen:
        is_call = isinstance(item, tuple)
        kept.append((*item[:-1], "?") if is_call and after_failure else item)
        after_failure = is_call and item[0] == "failed"
    return kept


@pytest.mark.parametrize("path", ["native-entry", "trampoline"])
def test_native_calls_answer_alike_on_every_path(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    with monkeypatch.context() as ctypes_path:
        on_path(ctypes_path, "ctypes")
        expected = native_functions_run()
    on_path(monkeypatch, path)
    assert native_functions_run() == expected
    assert any(s[0] == "failed" for s in expected if isinstance(s, tuple))  # misbehaviour ran


# The probe's steps whose output does not depend on the clock or the random source: reads,
# writes, directories and links on a mount, and faults.
PROBE_STEPS = [
    "open:3:f.txt::r:n", "read:$0:5", "tell:$0", "seek:$0:-3:2", "read:$0:10", "pread:$0:4:6",
    "fstat:$0", "fdstat:$0", "close:$0", "open:3:new.txt:c:rw:n", "write:$0:abcdef",
    "pwrite:$0:ZZ:1", "pread:$0:10:0", "setsize:$0:3", "mkdir:3:d1", "rmdir:3:d1",
    "stat:3:f.txt:n", "readlink:3:f.txt:10", "open:3:../x::r:n", "args", "env", "prestat:3",
]  # fmt: skip


def probe_run(root: Path) -> tuple[Any, ...]:
    root.mkdir()
    (root / "f.txt").write_text("hello world\nsecond line\n")
    run = run_wasihost(
        PROBE, ["prog", *PROBE_STEPS], mounts=[Mount(root, "/m", True)], env=[("LANG", "C")]
    )
    assert run.ext is not None
    return run.code, run.stdout, run.stderr, run.ext.last_fuel_used


@pytest.mark.parametrize("path", ["native-entry", "trampoline"])
def test_wasi_programs_run_alike_on_every_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: str
) -> None:
    """A WASI program makes two dozen native imports, most of them native entries."""
    with monkeypatch.context() as ctypes_path:
        on_path(ctypes_path, "ctypes")
        expected = probe_run(tmp_path / "ctypes")
    on_path(monkeypatch, path)
    assert probe_run(tmp_path / path) == expected
    assert b"hello" in expected[1]


def probing_host(body: Any) -> tuple[Host, Any]:
    """The application's host with ``myapp.probe(i64) -> i64`` running ``body(ctx, x)``, and
    a WAT guest whose every command calls it with 7 and answers null."""
    host = app_host(CAPS)
    host.function(
        "myapp.probe",
        capability="myapp.math",
        convention="native",
        params=("i64",),
        results=("i64",),
        fuel_base=100,
    )(body)
    package = native_guest(
        '(import "myapp_v1" "probe" (func $probe (param i64) (result i64)))',
        "(drop (call $probe (i64.const 7))) (call $ok_null)",
    )
    return host, package


def test_the_native_entry_serves_its_calls_with_no_engine_frame() -> None:
    """Not a path that silently falls back: the import is a native entry, the function's
    caller is the C trampoline (its frame's parent is the entry point's), and the thread is
    inside a host call while it runs, and not after."""
    callers: list[str] = []
    inside: list[bool] = []

    def probe(ctx: CallContext, x: int) -> int:
        assert fastcall.IN_HOST_CALL is not None
        inside.append(fastcall.IN_HOST_CALL())
        callers.append(sys._getframe(2).f_code.co_name)  # above the embedder's wrapper
        return x

    host, package = probing_host(probe)
    with host:
        ext = host.admit(package, grants=["myapp.math"])
        assert ext.call("go") is None
        fast = [f for inst in ext._instances() for f in inst.context.fast if f is not None]
        assert [type(f) for f in fast] == [fastcall.NATIVE_ENTRY]
    assert inside == [True]
    assert callers and "dispatch" not in callers[0]
    assert fastcall.IN_HOST_CALL is not None and not fastcall.IN_HOST_CALL()


def test_an_exception_no_closure_can_answer_stops_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If even the engine's answer to a raising function fails, the guest gets a trap and the
    unraisable hook stops its instance: the call fails, never carrying on with a made-up
    result."""
    sigint.install_unraisable_hook()
    reported: list[Any] = []
    monkeypatch.setitem(sigint._state, "unraisable", reported.append)

    def probe(ctx: CallContext, x: int) -> int:
        raise KeyError("the application's bug")

    def answer_fails(self: Any, exc: BaseException) -> int:
        raise RuntimeError("no answer either")

    host, package = probing_host(probe)
    with host:
        ext = host.admit(package, grants=["myapp.math"])
        monkeypatch.setattr(hostcalls.HostContext, "crashed", answer_fails)
        with pytest.raises(CallError) as info:
            ext.call("go")
        monkeypatch.undo()
    assert info.value.failure.value == "host_error"
    assert "aborted on entry by RuntimeError" in info.value.message
    # The hook was handed the closure that failed, one of the engine's callbacks.
    assert [r.exc_value.args for r in reported] == [("no answer either",)]
    assert reported[0].object.__code__ in sigint.CALLBACK_CODES


def test_host_call_depth_is_per_thread() -> None:
    """in_host_call() belongs to the thread in the host call: another thread, here the test's
    while a worker's guest waits in a host function, is not inside one (a signal on the main
    thread must not be taken for a guest's)."""
    assert fastcall.IN_HOST_CALL is not None
    started, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def probe(ctx: CallContext, x: int) -> int:
        assert fastcall.IN_HOST_CALL is not None
        seen.append(fastcall.IN_HOST_CALL())
        started.set()
        release.wait(10)
        return x

    host, package = probing_host(probe)
    with host:
        ext = host.admit(package, grants=["myapp.math"])
        worker = threading.Thread(target=ext.call, args=("go",))
        worker.start()
        assert started.wait(10)
        here = fastcall.IN_HOST_CALL()
        release.set()
        worker.join(10)
    assert seen == [True] and here is False


def ctrl_c_run() -> list[Any]:
    """Ctrl-C arriving while a native function runs on the main thread (as a terminal's would,
    between two bytecodes of the function): the call must end ``interrupted``, not with the
    KeyboardInterrupt raised inside the function, and the extension serves the next call."""
    import os
    import signal

    calls = [0]

    def probe(ctx: CallContext, x: int) -> int:
        calls[0] += 1
        if calls[0] == 2:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at a bytecode boundary in here
                pass
        return x

    seen: list[Any] = []
    host, package = probing_host(probe)
    with host:
        ext = host.admit(package, grants=["myapp.math"])
        for _ in range(3):
            try:
                seen.append(("ok", ext.call("go")))
            except CallError as exc:
                seen.append(("failed", exc.failure.value, exc.message))
    return seen


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
def test_ctrl_c_in_a_native_entry_ends_its_call_as_on_ctypes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as ctypes_path:
        on_path(ctypes_path, "ctypes")
        expected = ctrl_c_run()
    assert expected[1][:2] == ("failed", "interrupted") and expected[2] == ("ok", None)
    assert ctrl_c_run() == expected
    # Without the thread's host-call depth the signal finds no engine frame above the function
    # and the KeyboardInterrupt is raised inside it instead: the depth is what decides.
    monkeypatch.setattr(sigint, "IN_HOST_CALL", None)
    with pytest.raises(KeyboardInterrupt):
        ctrl_c_run()
