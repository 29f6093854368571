"""The guest SDK's ``native`` feature (issue 30, "Native plugins"): the fixture guests built as
host executables that speak the process runtime's channel, driven over a real socketpair by a
test playing the host (tests/support/native_driver.py). Every frame they send is read as the
host reads a child's: bounded, and shape-checked.

hello-native and storage-native are fixtures/hello and fixtures/storage's own sources; their
answers are the wasm guests' answers. hostile-native tries what the launcher's walls will have
to stop; here it runs without walls, so its report shows what an unwalled process can do (the
walled run belongs with the launcher).
"""

from __future__ import annotations

import errno
import platform
import subprocess
import sys
import time
from typing import Any

import cbor2
import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from tests.support.native_driver import (
    NativeDriver,
    Reply,
    Storage,
    entries,
    ok,
    program,
    started,
    status,
    stop,
)
from wasihost.core.channel import Kind
from wasihost.core.registry import CBOR_PARAMS, CBOR_RESULTS, AbiVersion, HostFunction
from wasihost.engine.process import ProcessBackend
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="the native fixtures are x86_64 Linux executables",
)

STORAGE = ("storage_get", "storage_put", "storage_delete", "storage_list", "storage_cas")
HELLO_ID = "org.wasihost.fixtures.hello"


def logs(into: list[Any]) -> Any:
    """A host handler that records each log request and answers null, as the log broker."""

    def handle(driver: NativeDriver, call: Any) -> list[Any]:
        assert call.entry.name == "log"
        into.append(call.value)
        return ok(None)

    return handle


def app_entries() -> list[HostFunction]:
    """hostile-native's application functions, as an application registers them."""
    cbor = HostFunction(
        module="myapp_v1",
        name="lookup",
        capability="myapp.read",
        since=AbiVersion(1, 0),
        params=CBOR_PARAMS,
        results=CBOR_RESULTS,
        max_request_bytes=64,
        max_response_bytes=1024,
        fuel_base=1000,
        fuel_per_byte=1,
        blocking=False,
    )
    native = HostFunction(
        module="myapp_v1",
        name="add",
        capability="myapp.read",
        since=AbiVersion(1, 0),
        params=("i64", "i64"),
        results=("i64",),
        max_request_bytes=0,
        max_response_bytes=0,
        fuel_base=100,
        fuel_per_byte=1,
        blocking=False,
        convention="native",
        signed_args=True,
        denied_result=-1,
    )
    return [cbor, native]


# -- start-up --------------------------------------------------------------------------------


def test_hello_echoes_the_secret_with_the_pid_and_no_walls_of_its_own() -> None:
    with NativeDriver(program("hello-native")) as driver:
        message = driver.hello()
        assert message == [Kind.HELLO, 1, driver.secret, driver.child.pid, []]


def test_hello_reports_the_walls_the_launcher_checked() -> None:
    walls = [["seccomp", "enforced", "allow-list"], ["landlock", "unavailable", "ENOSYS"]]
    with NativeDriver(program("hello-native"), walls=cbor2.dumps(walls)) as driver:
        assert driver.hello()[4] == walls
    # Anything but a list of text triples is no report at all (never a wall claimed).
    with NativeDriver(program("hello-native"), walls=cbor2.dumps([["seccomp", 1, "x"]])) as driver:
        assert driver.hello()[4] == []


def test_ready_names_exactly_the_entries_loaded_in_order() -> None:
    admitted = entries("storage_put", "log", "storage_get")
    with NativeDriver(program("storage-native")) as driver:
        driver.hello()
        names = driver.load(admitted)
        assert names == [
            ["wasihost_v1", "storage_put"],
            ["wasihost_v1", "log"],
            ["wasihost_v1", "storage_get"],
        ]
        assert driver.start().message == [Kind.DONE, 0, b"", 0, None, False, None]


def test_without_a_control_descriptor_it_says_how_it_is_started() -> None:
    proc = subprocess.run(
        [str(program("hello-native"))], capture_output=True, text=True, timeout=10, check=False
    )
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and HELLO_ID in proc.stderr


# -- hello: the handshake and a command --------------------------------------------------------


def test_the_handshake_answers_as_the_wasm_guest() -> None:
    with started("hello-native", entries("log")) as driver:
        hello, welcome = driver.handshake(["log", "clock"])
        assert hello == {
            "id": HELLO_ID,
            "version": "0.1.0",
            "abi": "1.0",
            "features": ["log", "clock"],
        }
        assert welcome == {"status": "ready"}
        _, degraded = driver.handshake(["log"])
        assert degraded == {"status": "degraded", "reason": "not granted: clock"}
        failed = driver.call("wasihost.welcome", {"granted": []}).value
        assert failed["status"] == "failed"


def test_greet_answers_and_logs_through_the_host() -> None:
    records: list[Any] = []
    with started("hello-native", entries("log")) as driver:
        reply = driver.call("greet", {"name": "ada"}, host=logs(records))
        assert reply.message == [
            Kind.DONE,
            0,
            cbor2.dumps({"greeting": "hello, ada"}),
            0,
            None,
            False,
            None,
        ]
        assert reply.value == {"greeting": "hello, ada"}
        assert records == [[1, "greeting"]]  # log::debug: level 1
        assert [(c.index, c.cap) for c in reply.calls] == [(0, 1)]
        # The same process serves call after call.
        assert driver.call("greet", {"name": "bo"}, host=logs(records)).value == {
            "greeting": "hello, bo"
        }


def test_guest_errors_and_unknown_commands_are_the_wasm_guests_answers() -> None:
    with started("hello-native", entries("log")) as driver:
        bad = driver.call("greet", {"name": 7})
        assert bad.status == 2  # INVALID_ARGUMENT
        assert bad.value == {"class": "invalid_input", "message": 'greet takes {"name": text}'}
        for name in ("nope", "wasihost.other"):
            unknown = driver.call(name)
            assert unknown.status == 8  # NOT_FOUND
            assert unknown.value["class"] == "unknown_command"
        malformed = driver.call("greet", payload=b"\xff")
        assert malformed.status == 2 and malformed.value["class"] == "invalid_input"


def test_an_answer_over_max_output_fails_output_too_large() -> None:
    with started("hello-native", entries("log")) as driver:
        reply = driver.call("greet", {"name": "ada"}, max_output=4, host=logs([]))
        assert reply.message == [
            Kind.FAIL,
            "output_too_large",
            "the command's output of 21 bytes is over its limit",
            0,
            None,
            True,
            None,
        ]


def test_a_host_function_not_loaded_answers_denied() -> None:
    with started("hello-native", []) as driver:
        # log::debug ignores its error: the greeting comes back, the refusal is tallied.
        reply = driver.call("greet", {"name": "ada"})
        assert reply.value == {"greeting": "hello, ada"} and reply.calls == []
        assert reply.message[6] == [-1, 1]
    with started("storage-native", entries("storage_get", "storage_put")) as driver:
        denied = driver.call("delete", {"key": "k"})
        assert denied.status == 1 and denied.value["class"] == "denied"


def test_a_capability_not_granted_now_is_refused_before_the_host() -> None:
    with started("storage-native", entries(*STORAGE)) as driver:
        reply = driver.call("get", {"key": "k"}, caps=[])
        assert reply.status == 1 and reply.value["class"] == "denied"
        assert reply.calls == []
        # The host records the refusal as asked for (the tally's "refused:" item).
        assert reply.message[6] == [-1, 1, "refused:storage", 1]


def test_between_calls_queries_answer_null() -> None:
    with started("hello-native", entries("log")) as driver:
        assert driver.query([Kind.QUERY, "memory"]) == [Kind.VALUE, None]
        assert driver.query([Kind.QUERY, "fuel"]) == [Kind.VALUE, None]
        assert driver.query([Kind.CAP_MEMORY, 1 << 20]) == [Kind.VALUE, None]


# -- storage: host calls served by the host's broker shapes -----------------------------------


def test_storage_put_then_get_through_the_host() -> None:
    store = Storage()
    with started("storage-native", entries(*STORAGE)) as driver:
        assert driver.call("put", {"key": "notes/1", "value": b"hello"}, host=store).value is None
        assert store.data == {"notes/1": b"hello"}
        got = driver.call("get", {"key": "notes/1"}, host=store)
        assert got.value == b"hello"
        assert [(c.entry.name, c.value) for c in got.calls] == [("storage_get", "notes/1")]
        # A key the store lacks: the broker's NOT_FOUND is the SDK's None.
        assert driver.call("get", {"key": "missing"}, host=store).value is None
        page = driver.call("list", {"prefix": "notes/", "after": None, "limit": 10}, host=store)
        assert page.value == {"keys": ["notes/1"], "next": None}
        swapped = driver.call(
            "cas", {"key": "notes/1", "expected": b"hello", "new": b"bye"}, host=store
        )
        assert swapped.value is True and store.data["notes/1"] == b"bye"
        assert driver.call("delete", {"key": "notes/1"}, host=store).value is True
        assert driver.call("delete", {"key": "notes/1"}, host=store).value is False


def test_a_value_over_the_first_buffer_is_fetched_again_with_the_entrys_limit() -> None:
    store = Storage({"big": b"v" * 5000})
    with started("storage-native", entries(*STORAGE)) as driver:
        got = driver.call("get", {"key": "big"}, host=store)
        assert got.value == b"v" * 5000
        # BUFFER_TOO_SMALL at the SDK's first 1027 bytes, then the entry's 32771, as in wasm.
        assert [c.cap for c in got.calls] == [1027, 32771]
        assert got.message[6] == [-4, 1]


def test_host_statuses_reach_the_guest_as_its_errors() -> None:
    with started("storage-native", entries(*STORAGE)) as driver:
        full = driver.call("put", {"key": "k", "value": b"v"}, host=lambda d, c: status(5))
        assert full.status == 5 and full.value["class"] == "quota_exceeded"
        filled = driver.call(
            "fill",
            {"prefix": "f", "size": 8},
            host=lambda d, c: ok(None) if len(c.request) <= 13 else status(5),  # f0 .. f9
        )
        assert filled.value == {"written": 10, "class": "quota_exceeded"}


@pytest.mark.parametrize(
    ("kind", "failure"),
    [
        ("out_of_fuel", ("out_of_fuel", "wasihost_v1.storage_put: out of fuel")),
        ("deadline", ("deadline", "wasihost_v1.storage_put: deadline reached")),
        ("interrupted", ("deadline", "wasihost_v1.storage_put: interrupted by the host")),
        ("error", ("host_error", "host function failed: KeyError")),
        ("abort", ("panic", "KeyError")),
    ],
)
def test_a_host_stop_ends_the_call_with_the_engines_class(
    kind: str, failure: tuple[str, str]
) -> None:
    with started("storage-native", entries(*STORAGE)) as driver:
        reply = driver.call(
            "put", {"key": "k", "value": b"v"}, host=lambda d, c: stop(kind, "KeyError")
        )
        assert reply.failure == failure
        assert reply.message[5] is True  # not to be entered again
        assert reply.message[6] == [failure[0], 1]


def test_memory_requests_are_answered_without_guest_memory() -> None:
    seen: list[list[Any]] = []

    def host(driver: NativeDriver, call: Any) -> list[Any]:
        seen.append(driver.memory("can_pay", [100]))
        seen.append(driver.memory("charge", [10]))
        seen.append(driver.memory("read", [0, 4]))
        seen.append(driver.memory("write_u32", [0, 1]))
        return ok(None)

    with started("storage-native", entries(*STORAGE)) as driver:
        assert driver.call("put", {"key": "k", "value": b"v"}, host=host).value is None
    gone = [Kind.MEM_FAULT, "gone", "a native plugin has no guest memory"]
    assert seen == [[Kind.MEM_OK, True, 0], [Kind.MEM_OK, None, 0], gone, gone]


# -- the control socket and the deadline -------------------------------------------------------


def test_an_interrupt_ends_the_command_at_its_next_host_call() -> None:
    store = Storage()

    def host(driver: NativeDriver, call: Any) -> list[Any]:
        answer = store(driver, call)
        if len(store.calls) == 3:
            driver.interrupt()
            time.sleep(0.2)  # the plugin's control thread sees the byte before the answer
        return answer

    with started("storage-native", entries(*STORAGE)) as driver:
        reply = driver.call("fill", {"prefix": "f", "size": 8}, host=host)
        assert reply.failure == ("deadline", "wasihost_v1.storage_put: interrupted by the host")
        assert len(store.data) == 3
        # Interrupted stays interrupted: the next call ends at once.
        again = driver.call("get", {"key": "f0"}, host=store)
        assert again.failure == ("deadline", "interrupted by the host") and again.calls == []


def test_a_host_call_past_the_calls_deadline_ends_it() -> None:
    with started("storage-native", entries(*STORAGE)) as driver:
        reply = driver.call("put", {"key": "k", "value": b"v"}, seconds=0.0)
        assert reply.failure == ("deadline", "wasihost_v1.storage_put: deadline reached")
        assert reply.calls == []


def test_the_end_of_the_channel_or_of_the_control_socket_ends_the_process() -> None:
    with started("hello-native", entries("log")) as driver:
        driver.close_channel()
        assert driver.wait() == (0, "")
    with started("hello-native", entries("log")) as driver:
        driver.control.close()
        assert driver.wait()[0] == 0


def test_an_unknown_message_kind_ends_the_process_saying_why() -> None:
    with started("hello-native", entries("log")) as driver:
        driver.send([99, "what"])
        code, said = driver.wait()
        assert code == 1
        assert "unexpected message kind 99" in said


def test_a_call_before_load_ends_the_process() -> None:
    with NativeDriver(program("hello-native")) as driver:
        driver.hello()
        driver.send([Kind.CALL, b"greet", b"", 100, True, 0, 1.0, []])
        code, said = driver.wait()
        assert code == 1 and "a call before LOAD" in said


# -- panics and aborts ---------------------------------------------------------------------


def test_a_panic_fails_the_call_and_the_process_serves_on() -> None:
    with started("hostile-native", []) as driver:
        reply = driver.call("panic")
        failure, message = reply.failure
        assert failure == "panic"
        assert message.startswith(
            "deliberate panic (at /build/fixtures/hostile-native/src/main.rs:"
        )
        assert reply.message[5] is True
        aborted = driver.call("abort")
        assert aborted.failure == ("panic", "deliberate abort")
        assert driver.call("ping").value == "pong"


def test_a_panic_is_reported_through_abort_when_it_is_loaded() -> None:
    def host(driver: NativeDriver, call: Any) -> list[Any]:
        assert call.entry.name == "abort" and call.cap == 0
        return stop("abort", call.value)  # the abort broker logs it, then ends the call

    with started("hostile-native", entries("abort")) as driver:
        reply = driver.call("panic", host=host)
        assert reply.failure[0] == "panic"
        assert [c.value for c in reply.calls] == [reply.failure[1]]
        assert reply.failure[1].startswith("deliberate panic (at ")
        assert reply.message[6] == ["panic", 1]


# -- an application's own functions --------------------------------------------------------


def test_an_applications_cbor_and_native_functions_are_host_calls() -> None:
    def host(driver: NativeDriver, call: Any) -> list[Any]:
        assert call.entry.name == "lookup"
        return ok({"found": call.value})

    with started("hostile-native", app_entries()) as driver:
        found = driver.call("lookup", {"sku": 1}, host=host)
        assert found.value == {"found": {"sku": 1}}
        assert found.calls[0].entry.name == "lookup" and found.calls[0].cap == 4096

        # A native-convention call carries its integers, not a request (HOST [9, i, a, b]).
        driver.send(
            [Kind.CALL, b"add", cbor2.dumps({"a": 2, "b": -5}), 100, True, 0, 5.0, ["myapp.read"]]
        )
        message = driver.receive()
        assert message == [Kind.HOST, 1, 2, -5]
        driver.send([Kind.HOST_OK, cbor2.dumps(-3), None, 0, 0])
        reply = Reply(driver.receive(), [])
        assert reply.value == -3

        # Not granted: the entry's denied result, without asking the host.
        assert driver.call("add", {"a": 1, "b": 1}, caps=[]).value == -1
        # Refused by the host's gate after the call began: the same.
        driver.send(
            [Kind.CALL, b"add", cbor2.dumps({"a": 1, "b": 1}), 100, True, 0, 5.0, ["myapp.read"]]
        )
        assert driver.receive()[0] == Kind.HOST
        driver.send([Kind.HOST_STOP, "denied", "not granted", 0, 0])
        assert Reply(driver.receive(), []).value == -1

        # Over the entry's own request limit: PAYLOAD_TOO_LARGE, never sent to the host.
        big = driver.call("lookup", "x" * 100, host=host)
        assert big.status == 3 and big.calls == []


# -- hostile, unwalled -----------------------------------------------------------------------


def test_hostile_unwalled_does_everything_the_walls_must_stop() -> None:
    """Without walls (the launcher applies them, not this runtime): a socket opens (nobody
    listens on the discard port: refused, not denied), a shell runs, /etc/passwd reads, and 64
    copies of itself start; and the secret is not in its environment."""
    with started("hostile-native", []) as driver:
        report = driver.call("run", seconds=30.0).value
    socket_report = report["socket"]
    assert socket_report["ok"] or socket_report["errno"] == errno.ECONNREFUSED, socket_report
    assert report["listen"]["ok"] and report["listen"]["detail"] > 0
    assert report["exec"] == {"ok": True, "errno": None, "error": None, "detail": 7}
    assert report["read"]["ok"] and report["read"]["detail"] > 0
    assert report["fork"] == {"ok": True, "errno": None, "error": None, "detail": 64}
    assert "WASIHOST_CHILD_SECRET" not in report["env"]


# -- the real process runtime ------------------------------------------------------------------


def test_the_process_runtime_drives_a_native_plugin_in_place_of_its_wasm_child() -> None:
    """A preview of the next step, with no new host code: ProcessBackend(program=...) starts the
    executable where it would start its wasm child. The package is the wasm fixture's (its
    manifest, its imports); the plugin ignores the module LOAD carries, and the host's real
    brokers (log, storage) serve its host calls. No wall is applied: that is the launcher's."""
    with Host(Policy(allow=ALL_CAPS | {"storage"}), cache_dir=None) as host:
        backend = host.backend_for("process-only")
        assert isinstance(backend, ProcessBackend)
        backend.program = [str(program("hello-native"))]
        hello = host.load(FIXTURES / "hello", runtime="process-only", grants=["clock"])
        assert hello.call("greet", {"name": "ada"}) == {"greeting": "hello, ada"}
        assert hello.handshake is not None and hello.handshake.readiness == "ready"
        assert [r.message for r in hello.logs()] == ["greeting"]

        backend.program = [str(program("storage-native"))]
        store = host.load(FIXTURES / "storage", runtime="process-only")
        assert store.call("put", {"key": "notes/1", "value": b"hello"}) is None
        assert store.call("get", {"key": "notes/1"}) == b"hello"
        assert store.call("get", {"key": "missing"}) is None
        assert store.call("list", {"prefix": "notes/", "after": None, "limit": 10}) == {
            "keys": ["notes/1"],
            "next": None,
        }


def test_the_launchers_walls_report_is_the_cbor_the_plugin_echoes() -> None:
    """walls.walls_cbor is hand-written (the launcher imports no codec): cbor2 reads it as the
    list of [name, state, detail] text triples the SDK checks, details cut as the host's."""
    from wasihost.engine import walls

    report = [
        walls.Wall("landlock", "enforced", "x" * 400),
        walls.Wall("seccomp", "unavailable", "é"),
    ]
    decoded = cbor2.loads(walls.walls_cbor(report))
    assert decoded == [
        ["landlock", "enforced", "x" * (walls.MAX_DETAIL_CHARS - 3) + "..."],
        ["seccomp", "unavailable", "\\xe9"],
    ]
    assert walls.WALLS_ENV == "WASIHOST_CHILD_WALLS"  # the SDK's WALLS_ENV (native.rs)
