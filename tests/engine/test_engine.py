"""The engine adapter through the real engine, with hand-written WAT guests."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any

import cbor2
import pytest

from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.core.errors import CallError, ConfigError, FailureClass
from wasihost.core.settings import EngineSettings
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host

REQ_AT = 8192
RESP_AT = 12288


def _data(at: int, blob: bytes) -> str:
    return f'(data (i32.const {at}) "{escape(blob)}")'


def log_guest(req: bytes, *, call: str | None = None, expect: int | None = None) -> bytes:
    """A guest whose command calls ``log`` once; with ``expect``, traps unless it gets it."""
    invoke = (
        call
        or f"(call $log (i32.const {REQ_AT}) (i32.const {len(req)}) (i32.const {RESP_AT}) (i32.const 16))"
    )
    check = (
        f"(if (i32.ne {invoke} (i32.const {expect})) (then unreachable))"
        if expect is not None
        else f"(drop {invoke})"
    )
    return build(
        guest_wat(f"{check} (call $ok_null)", imports=host_import("log"), extra=_data(REQ_AT, req))
    )


def load(host: Host, wasm: bytes, grants: tuple[str, ...] = ("log",), **kw: Any) -> Extension:
    return host.admit(bare(wasm), grants=grants, **kw)


def failure_of(ext: Extension, command: str = "run", value: Any = None) -> CallError:
    with pytest.raises(CallError) as info:
        ext.call(command, value)
    return info.value


def test_noop_call_round_trip_and_fuel(host: Host) -> None:
    ext = load(host, build(guest_wat()), grants=())
    assert ext.call("run", {"x": [1, 2, 3]}) is None
    assert ext.last_fuel_used > 0
    hs = ext.handshake
    assert hs is not None and hs.readiness == "ready" and len(hs.runtime_id) == 16


def test_log_host_call_records_and_charges_fuel(host: Host) -> None:
    ext = load(host, log_guest(cbor2.dumps([2, "hi there"]), expect=1))
    ext.call("run")
    assert [(r.level.name, r.message) for r in ext.logs()] == [("INFO", "hi there")]
    with_log = ext.last_fuel_used
    quiet = load(host, build(guest_wat()), grants=())
    quiet.call("run")
    assert with_log - quiet.last_fuel_used >= 500 + 2 * len(cbor2.dumps([2, "hi there"]))


@pytest.mark.parametrize(
    ("req", "status"),
    [
        (b"\xff\xff", -2),  # malformed CBOR
        (cbor2.dumps([9, "bad level"]), -2),  # wrong shape
        (cbor2.dumps({"level": 2}), -2),
    ],
)
def test_bad_requests_get_status_codes(host: Host, req: bytes, status: int) -> None:
    ext = load(host, log_guest(req, expect=status))
    assert ext.call("run") is None
    assert ext.logs() == ()


def test_request_over_the_entry_limit_is_refused_unread(host: Host) -> None:
    call = f"(call $log (i32.const {REQ_AT}) (i32.const 5000) (i32.const 32768) (i32.const 16))"
    ext = load(host, log_guest(b"", call=call, expect=-3))
    assert ext.call("run") is None


def test_response_buffer_too_small(host: Host) -> None:
    wasm = build(
        guest_wat(
            f"(if (i32.ne (call $random_bytes (i32.const {REQ_AT}) (i32.const 2) (i32.const {RESP_AT}) (i32.const 4)) (i32.const -4)) (then unreachable)) (call $ok_null)",
            imports=host_import("random_bytes"),
            extra=_data(REQ_AT, cbor2.dumps(100)),
        )
    )
    assert load(host, wasm, grants=("random",)).call("run") is None


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (
            "(call $log (i32.const 200000) (i32.const 8) (i32.const 0) (i32.const 0))",
            "outside memory",
        ),
        (
            "(call $log (i32.const -16) (i32.const 32) (i32.const 0) (i32.const 0))",
            "outside memory",
        ),
        (
            "(call $log (i32.const 0) (i32.const 0) (i32.const 131070) (i32.const 16))",
            "response buffer",
        ),
        (
            f"(call $log (i32.const {REQ_AT}) (i32.const 64) (i32.const {REQ_AT + 8}) (i32.const 16))",
            "overlap",
        ),
    ],
)
def test_wild_pointers_trap_as_protocol(host: Host, call: str, fragment: str) -> None:
    ext = load(host, log_guest(b"", call=call))
    err = failure_of(ext)
    assert err.failure is FailureClass.PROTOCOL
    assert fragment in err.message
    # the host is fine and the next call gets a fresh instance
    assert failure_of(ext).failure is FailureClass.PROTOCOL
    assert ext.starts == 2


def test_gate_is_checked_at_call_time(host: Host) -> None:
    ext = load(host, log_guest(cbor2.dumps([2, "x"]), expect=-1))
    ext.start()
    host.revoke(ext.id, "log")
    assert ext.call("run") is None
    assert ext.logs() == ()


def test_infinite_loop_runs_out_of_fuel(host: Host) -> None:
    ext = load(
        host, build(guest_wat("(loop $l (br $l)) (call $ok_null)")), grants=(), fuel=1_000_000
    )
    err = failure_of(ext)
    assert err.failure is FailureClass.OUT_OF_FUEL
    assert ext.last_fuel_used == 1_000_000


def test_infinite_loop_hits_the_deadline(host: Host) -> None:
    ext = load(
        host,
        build(guest_wat("(loop $l (br $l)) (call $ok_null)")),
        grants=(),
        fuel=10_000_000_000,
        timeout_ms=100,
    )
    ext.start()
    started = time.monotonic()
    err = failure_of(ext)
    elapsed = time.monotonic() - started
    assert err.failure is FailureClass.DEADLINE
    assert 0.09 <= elapsed < 2.0


def test_host_calls_cannot_buy_free_work(host: Host) -> None:
    req = cbor2.dumps([0, "x"])
    loop = f"(loop $l (drop (call $log (i32.const {REQ_AT}) (i32.const {len(req)}) (i32.const {RESP_AT}) (i32.const 16))) (br $l))"
    wasm = build(
        guest_wat(f"{loop} (call $ok_null)", imports=host_import("log"), extra=_data(REQ_AT, req))
    )
    ext = load(host, wasm, fuel=200_000)
    err = failure_of(ext)
    assert err.failure is FailureClass.OUT_OF_FUEL
    # at ~500 fuel per host call, 200k fuel buys a few hundred calls, not unbounded work
    assert ext.log.dropped + len(ext.logs()) < 400


def test_cbor_host_call_fuel_is_exact_at_the_boundary(host: Host) -> None:
    # Host calls charge a debt settled at the end of the call: the command must fail with one
    # unit less than it uses, and pass with exactly what it uses, every call included.
    req = cbor2.dumps([0, "x"])
    call = f"(drop (call $log (i32.const {REQ_AT}) (i32.const {len(req)}) (i32.const {RESP_AT}) (i32.const 16)))"
    wasm = build(
        guest_wat(
            f"{call * 5} (call $ok_null)", imports=host_import("log"), extra=_data(REQ_AT, req)
        )
    )
    probe = load(host, wasm, fuel=1_000_000)
    probe.start()
    probe.call("run")
    used = probe.last_fuel_used
    assert used > 5 * len(req)  # the five calls' prices are in it
    exact = load(host, wasm, fuel=used)
    exact.start()
    exact.call("run")
    assert exact.last_fuel_used == used
    short = load(host, wasm, fuel=used - 1)
    short.start()
    assert failure_of(short).failure is FailureClass.OUT_OF_FUEL


def test_start_function_runs_under_fuel_and_deadline(host: Host) -> None:
    wat = guest_wat(extra="(func $spin (loop $l (br $l))) (start $spin)")
    ext = load(host, build(wat), grants=(), fuel=1_000_000)
    with pytest.raises(CallError) as info:
        ext.start()
    assert info.value.failure is FailureClass.OUT_OF_FUEL


def test_unbounded_recursion_is_a_stack_overflow(host: Host) -> None:
    wat = guest_wat(
        "(call $down (i32.const 0)) (drop) (call $ok_null)",
        extra="(func $down (param i32) (result i32) (i32.add (call $down (i32.add (local.get 0) (i32.const 1))) (i32.const 1)))",
    )
    ext = load(host, build(wat), grants=(), fuel=10_000_000_000)
    assert failure_of(ext).failure is FailureClass.STACK_OVERFLOW


def test_memory_growth_past_the_limit_is_refused(host: Host) -> None:
    body = "(if (i32.ne (memory.grow (i32.const 1000)) (i32.const -1)) (then unreachable)) (call $ok_null)"
    ext = load(host, build(guest_wat(body)), grants=())
    assert ext.call("run") is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("(call $packed (i32.const 4096) (i32.const 2))", "no status"),
        ("(call $packed (i32.const 200000) (i32.const 8))", "outside memory"),
        ("(call $packed (i32.const 4096) (i32.const 4))", "empty payload"),
    ],
)
def test_bad_responses_are_protocol_errors(host: Host, body: str, fragment: str) -> None:
    ext = load(host, build(guest_wat(body)), grants=())
    err = failure_of(ext)
    assert err.failure is FailureClass.PROTOCOL
    assert fragment in err.message


def test_an_answer_over_the_output_limit_is_output_too_large(host: Host) -> None:
    """Its own class, naming the manifest's limit and where to raise it (issue 35 item 4: it
    was a protocol failure naming the engine's limit, max_output_bytes plus a CBOR head)."""
    ext = load(host, build(guest_wat("(call $packed (i32.const 0) (i32.const 100000))")), grants=())
    err = failure_of(ext)
    assert err.failure is FailureClass.OUTPUT_TOO_LARGE
    declared = ext.resources.max_output_bytes
    assert err.message == (
        f"the command's output of 99996 bytes is over its limit (max_output_bytes {declared})"
    )
    assert err.hint is not None and "raise [resources] max_output_bytes" in err.hint


def test_malformed_cbor_response(host: Host) -> None:
    wat = guest_wat(
        "(call $packed (i32.const 8192) (i32.const 6))",
        extra=_data(8192, b"\x00\x00\x00\x00\x1f\x00"),
    )
    assert failure_of(load(host, build(wat), grants=())).failure is FailureClass.PROTOCOL


def test_an_input_block_in_a_page_wasihost_alloc_just_grew(host: Host) -> None:
    # Every wasihost_alloc grows memory by a page and hands out that page: the host's view of
    # memory is older than the block, so the input must be written through a fresh one (and
    # the answer, the input echoed from there, read back through it).
    alloc = """(func (export "wasihost_alloc") (param $n i32) (result i32)
                 (i32.mul (memory.grow (i32.const 1)) (i32.const 65536)))"""
    status_at = "(i32.sub (i32.add (local.get $ptr) (local.get $cmd_len)) (i32.const 4))"
    body = f"""(i32.store {status_at} (i32.const 0))
               (call $packed {status_at} (i32.add (local.get $in_len) (i32.const 4)))"""
    ext = load(host, build(guest_wat(body, alloc=alloc)), grants=())
    for value in (b"x" * 64, {"k": [1, 2, 3]}, b"y" * 4096, None, "text"):
        assert ext.call("echo-it", value) == value


def test_alloc_returning_null_is_protocol(host: Host) -> None:
    wat = guest_wat(alloc='(func (export "wasihost_alloc") (param i32) (result i32) (i32.const 0))')
    ext = load(host, build(wat), grants=())
    with pytest.raises(CallError) as info:
        ext.start()
    assert info.value.failure is FailureClass.HANDSHAKE
    assert "wasihost_alloc" in info.value.message


def test_unreachable_is_a_panic_and_the_instance_is_replaced(host: Host) -> None:
    wat = guest_wat(
        "(global.set $calls (i32.add (global.get $calls) (i32.const 1)))"
        "(if (i32.eq (global.get $calls) (i32.const 2)) (then unreachable))"
        "(call $ok_null)",
        extra="(global $calls (mut i32) (i32.const 0))",
    )
    ext = load(host, build(wat), grants=())
    ext.call("run")
    assert failure_of(ext).failure is FailureClass.PANIC
    ext.call("run")  # a fresh instance: its counter starts again at 1, so no trap
    assert ext.starts == 2
    assert failure_of(ext).failure is FailureClass.PANIC  # and counts to 2 again


@pytest.mark.parametrize(
    ("hello", "welcome", "fragment"),
    [
        ({"id": "x", "version": "1", "abi": "1.1", "features": []}, None, "marker says 1.0"),
        ("not a map", None, "not a map"),
        ({"id": "x", "version": "1", "abi": "1.0"}, None, "'features'"),
        (None, {"status": "failed", "reason": "no config"}, "no config"),
        (None, {"status": "sleepy"}, "bad answer"),
    ],
)
def test_handshake_failures(host: Host, hello: Any, welcome: Any, fragment: str) -> None:
    ext = load(host, build(guest_wat(hello=hello, welcome=welcome)), grants=())
    with pytest.raises(CallError) as info:
        ext.call("run")
    assert info.value.failure is FailureClass.HANDSHAKE
    assert fragment in info.value.message


def test_reserved_and_bad_command_names(host: Host) -> None:
    ext = load(host, build(guest_wat()), grants=())
    with pytest.raises(ConfigError, match="reserved"):
        ext.call("wasihost.hello")
    with pytest.raises(ConfigError, match="exceeds"):
        ext.call("x" * 300)


def test_host_function_exceptions_stay_with_their_own_thread(host: Host) -> None:
    """wasmtime-py's trampoline hands one thread's exception to another; ours must not."""
    req = cbor2.dumps([2, "x"])
    wasm = log_guest(req)
    exts = [load(host, wasm), load(host, wasm)]

    def raising(exc_type: type[Exception]) -> Any:
        def handler(call: Any, request: Any) -> Any:
            raise exc_type("boom")

        return handler

    exts[0]._handler = lambda entry: raising(ValueError)  # type: ignore[method-assign]
    errors: list[str] = []
    rounds = 300

    def hammer_raising() -> None:
        for _ in range(rounds):
            try:
                exts[0].call("run")
                errors.append("raising call succeeded")
            except CallError as exc:
                if exc.failure is not FailureClass.HOST_ERROR or "ValueError" not in exc.message:
                    errors.append(f"A got {exc.failure}: {exc.message}")

    def hammer_clean() -> None:
        for _ in range(rounds):
            try:
                exts[1].call("run")
            except CallError as exc:
                errors.append(f"B got {exc.failure}: {exc.message}")
            exts[1].log.drain()

    threads = [threading.Thread(target=hammer_raising), threading.Thread(target=hammer_clean)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_keyboard_interrupt_in_a_host_function_reaches_the_caller(host: Host) -> None:
    ext = load(host, log_guest(cbor2.dumps([2, "x"])))

    def handler(call: Any, request: Any) -> Any:
        raise KeyboardInterrupt

    ext._handler = lambda entry: handler  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        ext.call("run")
    assert ext.call is not None  # the process is alive; a new instance serves the next call


def test_settings_that_would_abort_the_process_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_wasm_stack"):
        EngineSettings(max_wasm_stack=4 * 1024 * 1024)
    with pytest.raises(ConfigError, match="epoch_tick_ms"):
        EngineSettings(epoch_tick_ms=0)
    with pytest.raises(ConfigError, match="opt_level"):
        EngineSettings(opt_level="fast")


def test_disk_cache_round_trip_and_tamper_detection(tmp_path: Path) -> None:
    wasm = build(guest_wat())
    cache = tmp_path / "cache"
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as h1:
        h1.admit(bare(wasm)).call("run")
        assert h1.engine.cache.compiles == 1
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as h2:
        h2.admit(bare(wasm)).call("run")
        assert (h2.engine.cache.compiles, h2.engine.cache.disk_hits) == (0, 1)
    entry = next(cache.glob("*.cwasm"))
    blob = bytearray(entry.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    entry.write_bytes(bytes(blob))
    with Host(Policy(allow=ALL_CAPS), cache_dir=cache) as h3:
        with pytest.warns(UserWarning, match="failed authentication"):
            ext = h3.admit(bare(wasm))
        ext.call("run")
        assert h3.engine.cache.compiles == 1


def test_insecure_cache_dir_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.warns(UserWarning, match="it must be 0700"):
        h = Host(Policy(), cache_dir=cache)
    with h:
        assert h.engine.cache.directory is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(cache.iterdir()) == []


def test_an_interrupt_before_the_call_is_armed_is_not_lost(host: Host) -> None:
    """Disable can land after the revocation check and before the call re-arms its deadline;
    the interrupt must still stop the call."""
    ext = load(
        host,
        build(guest_wat("(loop $l (br $l)) (call $ok_null)")),
        grants=(),
        fuel=10_000_000_000,
        timeout_ms=30_000,
    )
    ext.start()
    (instance,) = ext._instances()
    instance.interrupt()
    started = time.monotonic()
    err = failure_of(ext)
    assert err.failure is FailureClass.DEADLINE
    assert time.monotonic() - started < 2


def test_response_from_memory_grown_during_the_call(host: Host) -> None:
    # The host's view of memory was made before the call; the response lies in a page the
    # guest grew during it, which the host must read rather than refuse.
    body = """(drop (memory.grow (i32.const 1)))
              (i32.store (i32.const 131072) (i32.const 0))
              (i32.store8 (i32.const 131076) (i32.const 7))
              (call $packed (i32.const 131072) (i32.const 5))"""
    ext = load(host, build(guest_wat(body)), grants=())
    ext.start()
    assert ext.call("run") == 7
    assert ext.call("run") == 7  # and again, from the same (now larger) memory
