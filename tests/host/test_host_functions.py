"""Host functions through the one public API (issue 11, part 1): embedder functions in their
own versioned namespace, served through the same admission, gate, payload limits, fuel and
epochs as the core entries, and the built-in brokers registered the same way."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES, bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import AdmissionError, CallError, ConfigError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.core.registry import HostFunction
from wasihost.core.serving import CallContext
from wasihost.core.status import HostStatus, Status
from wasihost.host.extension import Extension
from wasihost.host.inspect import abi_listing
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

CAPS = frozenset({"log", "myapp.read", "myapp.write"})
RESP_AT = 8192
RESP_CAP = 16384
LIMITS: dict[str, Any] = {
    "max_request_bytes": 256,
    "max_response_bytes": 1024,
    "fuel_base": 500,
    "fuel_per_byte": 2,
}


def fn_guest(name: str, *, module: str = "myapp_v1", declared: str | None = "1.0") -> bytes:
    """A guest whose commands pass their CBOR input to ``module.name`` as the request and
    answer its response, or the negative status it returned as a CBOR integer."""
    section = f'(@custom "wasihost_abi.myapp" "{declared}")' if declared is not None else ""
    body = f"""
    (global.set $r (call $fn (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)
                             (i32.const {RESP_AT + 4}) (i32.const {RESP_CAP})))
    (i32.store (i32.const {RESP_AT}) (i32.const 0))
    (if (i32.lt_s (global.get $r) (i32.const 0))
      (then
        ;; -s as CBOR: major type 1 with argument s - 1 (s <= 24)
        (i32.store8 (i32.const {RESP_AT + 4}) (i32.sub (i32.const 0x1f) (global.get $r)))
        (return (call $packed (i32.const {RESP_AT}) (i32.const 5)))))
    (call $packed (i32.const {RESP_AT}) (i32.add (global.get $r) (i32.const 4)))"""
    return build(
        guest_wat(
            body,
            imports=f'(import "{module}" "{name}" (func $fn (param i32 i32 i32 i32) (result i32)))'
            + section,
            extra="(global $r (mut i32) (i32.const 0))",
        )
    )


@pytest.fixture
def app() -> Iterator[Host]:
    with Host(Policy(allow=CAPS), cache_dir=None) as h:
        yield h


def load(host: Host, wasm: bytes, grants: list[str], **kw: Any) -> Extension:
    return host.admit(bare(wasm), grants=grants, **kw)


def test_an_embedder_function_gets_the_decoded_request_and_a_context(app: Host) -> None:
    seen: list[tuple[str, int, frozenset[str], Any]] = []

    @app.function("myapp.lookup", capability="myapp.read", since="1.0", **LIMITS)
    def lookup(ctx: CallContext, request: Any) -> Any:
        seen.append((ctx.extension, ctx.epoch, ctx.grant.capabilities, request))
        return {"key": request["key"], "value": len(request["key"])}

    ext = load(app, fn_guest("lookup"), ["myapp.read"])
    assert ext.call("run", {"key": "abc"}) == {"key": "abc", "value": 3}
    assert seen == [(ext.id, ext.grant.epoch, frozenset({"myapp.read"}), {"key": "abc"})]
    assert lookup.__name__ == "lookup"  # the decorator hands the function back


def test_an_ungranted_embedder_import_refuses_the_module_by_name(app: Host) -> None:
    app.add_function("myapp.lookup", lambda ctx, req: req, capability="myapp.read", **LIMITS)
    with pytest.raises(AdmissionError) as info:
        load(app, fn_guest("lookup"), [])
    assert list(info.value.problems) == [
        "import myapp_v1.lookup: needs capability 'myapp.read', which is not granted "
        "(Host.load(..., grants=['myapp.read']) within the policy's allow)"
    ]
    assert info.value.ungranted == ("myapp.read",)


def test_a_guest_sees_only_the_namespace_minor_it_declares(app: Host) -> None:
    app.add_function("myapp.lookup", lambda ctx, req: 1, capability="myapp.read", **LIMITS)
    app.add_function(
        "myapp.lookup_many", lambda ctx, req: 2, capability="myapp.read", since="1.1", **LIMITS
    )
    assert load(app, fn_guest("lookup_many", declared="1.1"), ["myapp.read"]).call("run") == 2
    assert load(app, fn_guest("lookup", declared="1.0"), ["myapp.read"]).call("run") == 1
    cases = {
        fn_guest("lookup_many", declared="1.0"): (
            "import myapp_v1.lookup_many: added in myapp 1.1, but the module declares 1.0"
        ),
        fn_guest("lookup", declared=None): (
            "import myapp_v1.lookup: imports namespace myapp but the module declares no "
            "version of it (a 'wasihost_abi.myapp' custom section, e.g. '1.0')"
        ),
        fn_guest("lookup", declared="1.2"): (
            "module declares myapp 1.2; this host serves myapp 1.1"
        ),
        fn_guest("lookup", module="myapp_v2", declared="1.0"): (
            "import myapp_v2.lookup: unknown import module 'myapp_v2' (ABI 1.0 serves "
        ),
    }
    for wasm, problem in cases.items():
        with pytest.raises(AdmissionError) as info:
            load(app, wasm, ["myapp.read"])
        assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_payload_limits_and_statuses_reach_the_guest(app: Host) -> None:
    calls: list[Any] = []

    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    def lookup(ctx: CallContext, request: Any) -> Any:
        calls.append(request)
        if request == "missing":
            raise HostStatus(Status.NOT_FOUND)
        return "x" * request  # a response over max_response_bytes is the host's fault

    ext = load(app, fn_guest("lookup"), ["myapp.read"])
    assert ext.call("run", "y" * 300) == -Status.PAYLOAD_TOO_LARGE  # over 256: not decoded
    assert calls == []
    assert ext.call("run", "missing") == -Status.NOT_FOUND
    assert ext.call("run", 10) == "x" * 10
    with pytest.raises(CallError) as info:
        ext.call("run", 2000)
    assert info.value.failure is FailureClass.HOST_ERROR
    assert "over the entry's 1024" in info.value.message


def test_an_exception_is_host_error_and_its_text_stays_in_the_host_log(
    app: Host, caplog: pytest.LogCaptureFixture
) -> None:
    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    def lookup(ctx: CallContext, request: Any) -> Any:
        raise RuntimeError("secret host detail /etc/app.conf")

    ext = load(app, fn_guest("lookup"), ["myapp.read"])
    with caplog.at_level(logging.ERROR, logger="wasihost"), pytest.raises(CallError) as info:
        ext.call("run", 1)
    assert info.value.failure is FailureClass.HOST_ERROR
    assert "secret" not in str(info.value) and "/etc" not in str(info.value)
    assert all("secret" not in r.message for r in ext.logs())
    [record] = [r for r in caplog.records if r.name == "wasihost"]
    assert "myapp_v1.lookup" in record.getMessage() and ext.id in record.getMessage()
    assert record.exc_info is not None and "secret host detail" in str(record.exc_info[1])


def test_an_embedder_function_is_priced_like_a_core_entry(app: Host) -> None:
    @app.function(
        "myapp.lookup",
        capability="myapp.read",
        max_request_bytes=256,
        max_response_bytes=64,
        fuel_base=200_000,
        fuel_per_byte=1000,
    )
    def lookup(ctx: CallContext, request: Any) -> Any:
        return request

    ext = load(app, fn_guest("lookup"), ["myapp.read"])
    ext.start()
    assert ext.call("run", 0) == 0
    small = ext.last_fuel_used
    assert ext.call("run", "z" * 40) == "z" * 40
    # 41 request + 41 response bytes more, at 1000 each, on top of the 200,000 base.
    assert ext.last_fuel_used - small >= 80 * 1000
    assert small > 200_000
    poor = load(app, fn_guest("lookup"), ["myapp.read"], fuel=150_000)
    with pytest.raises(CallError) as info:
        poor.call("run", 0)
    assert info.value.failure is FailureClass.OUT_OF_FUEL


def test_a_commit_through_the_context_is_refused_after_a_revocation(app: Host) -> None:
    committed: list[int] = []

    @app.function("myapp.store", capability="myapp.write", commits=True, **LIMITS)
    def store(ctx: CallContext, request: Any) -> Any:
        if request == "revoke first":
            app.revoke(ctx.extension, "myapp.write")
        ctx.commit(lambda: committed.append(1))
        return None

    ext = load(app, fn_guest("store"), ["myapp.write"])
    assert ext.call("run", "ok") is None
    assert ext.call("run", "revoke first") == -Status.DENIED
    assert committed == [1]


def test_an_async_function_runs_on_the_hosts_loop_and_a_disable_interrupts_it(
    app: Host,
) -> None:
    started = threading.Event()
    loops: list[threading.Thread] = []

    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        loops.append(threading.current_thread())
        if request == "hang":
            started.set()
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        return request * 2

    assert app.registry.lookup("myapp_v1", "lookup").blocking  # type: ignore[union-attr]
    ext = load(app, fn_guest("lookup"), ["myapp.read"], timeout_ms=30_000)
    assert ext.call("run", 21) == 42
    assert loops[0] is not threading.current_thread()
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            ext.call("run", "hang")
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    t0 = time.monotonic()
    caller.start()
    assert started.wait(10)
    app.disable(ext.id, "test")
    caller.join(10)
    assert isinstance(outcome[0], ExtensionRevoked), outcome
    assert time.monotonic() - t0 < 5
    app.close()
    assert not app.functions.loop.running


def test_an_async_function_is_bounded_by_the_calls_deadline(app: Host) -> None:
    @app.function("myapp.lookup", capability="myapp.read", **LIMITS)
    async def lookup(ctx: CallContext, request: Any) -> Any:
        await asyncio.sleep(30)

    ext = load(app, fn_guest("lookup"), ["myapp.read"], timeout_ms=200)
    t0 = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("run", 1)
    assert info.value.failure is FailureClass.DEADLINE
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("wasihost.log", {}, "collides with the host's own import modules"),
        ("wasi.read", {}, "collides"),
        ("myapp", {}, "is not NAMESPACE.NAME"),
        ("MyApp.x", {}, "is not NAMESPACE.NAME"),
        ("myapp.lookup", {"capability": "log"}, "must be 'myapp' or start with 'myapp.'"),
        ("myapp.lookup", {"capability": "core"}, "must be 'myapp'"),
        ("myapp.lookup", {"since": "one"}, "is not MAJOR.MINOR"),
        ("myapp.lookup", {"fuel_base": 0}, "fuel_base=0"),
        ("myapp.lookup", {"fuel_per_byte": 0}, "fuel_per_byte=0"),
        ("myapp.lookup", {"max_request_bytes": 2**30}, "max_request_bytes"),
    ],
)
def test_registering_a_bad_function_is_a_config_error(
    app: Host, name: str, options: dict[str, Any], match: str
) -> None:
    kw: dict[str, Any] = {"capability": "myapp.read", **LIMITS, **options}
    with pytest.raises(ConfigError, match=match):
        app.add_function(name, lambda ctx, req: None, **kw)


def test_duplicates_and_late_registrations_are_config_errors(app: Host) -> None:
    app.add_function("myapp.lookup", lambda ctx, req: 1, capability="myapp.read", **LIMITS)
    with pytest.raises(ConfigError, match="registered twice"):
        app.add_function("myapp.lookup", lambda ctx, req: 1, capability="myapp.read", **LIMITS)
    load(app, fn_guest("lookup"), ["myapp.read"])
    with pytest.raises(ConfigError, match="register host functions before loading"):
        app.add_function("myapp.other", lambda ctx, req: 1, capability="myapp.read", **LIMITS)


def test_embedder_capabilities_are_known_to_manifests_policies_and_listings(
    app: Host, tmp_path: Path
) -> None:
    app.add_function(
        "myapp.lookup", lambda ctx, req: 1, capability="myapp.read", doc="Find it.", **LIMITS
    )
    assert "myapp.read" in app.registry.capabilities()
    listing = abi_listing(app.registry)
    assert listing["namespaces"] == {"myapp": ["1.0"]}
    [entry] = [f for f in listing["functions"] if f["module"] == "myapp_v1"]
    assert entry["name"] == "lookup" and entry["capability"] == "myapp.read"
    assert entry["doc"] == "Find it."
    # An unknown capability is still refused: only registered ones are grantable.
    with pytest.raises(AdmissionError, match="unknown capability 'myapp.nope'"):
        load(app, fn_guest("lookup"), ["myapp.nope"])


class CountingBroker:
    """A broker with per-extension state, to watch open and close."""

    name = "counting"
    capabilities = frozenset({"myapp.read"})

    def __init__(self, entry: HostFunction) -> None:
        self.functions = (entry.qualified_name,)
        self.opened: list[str] = []
        self.closed: list[dict[str, Any]] = []

    def open(self, ext: Extension) -> dict[str, Any]:
        self.opened.append(ext.id)
        return {"ext": ext.id, "calls": 0}

    def handler(self, entry: HostFunction, state: dict[str, Any]) -> Any:
        def handle(call: Any, request: Any) -> Any:
            state["calls"] += 1
            return state["calls"]

        return handle

    def close(self, state: dict[str, Any]) -> None:
        self.closed.append(state)


def test_a_broker_keeps_per_extension_state_across_restarts_until_close(app: Host) -> None:
    from wasihost.core.registry import embedder_function

    entry = embedder_function("myapp.count", capability="myapp.read", since="1.0", **LIMITS)
    app.registry.add_function(entry)
    broker = CountingBroker(entry)
    app.add_broker(broker)
    with pytest.raises(ConfigError, match="served twice"):
        app.add_broker(CountingBroker(entry))
    ext = load(app, fn_guest("count"), ["myapp.read"])
    assert ext.call("run") == 1
    ext.stop()  # the instance goes; the broker's state for this extension stays
    assert ext.call("run") == 2
    assert ext.starts == 2
    ext.close()
    assert broker.opened == [ext.id]
    assert broker.closed == [{"ext": ext.id, "calls": 2}]


def test_the_builtin_brokers_are_registered_brokers_and_extension_imports_none(
    app: Host,
) -> None:
    from wasihost.brokers.clock import ClockBroker
    from wasihost.brokers.core import CoreBroker
    from wasihost.brokers.log import LogBroker
    from wasihost.brokers.random import RandomBroker

    served = {
        name: type(app.functions.broker_for(app.registry.lookup("wasihost_v1", name)))  # type: ignore[arg-type]
        for name in ("abort", "log", "clock_now", "random_bytes")
    }
    assert served == {
        "abort": CoreBroker,
        "log": LogBroker,
        "clock_now": ClockBroker,
        "random_bytes": RandomBroker,
    }
    source = (Path(__file__).parents[2] / "wasihost" / "host" / "extension.py").read_text()
    assert "brokers" not in "".join(
        line for line in source.splitlines() if line.startswith(("from", "import"))
    )


def test_the_seeded_random_stream_continues_across_restarts(tmp_path: Path) -> None:
    seed = b"s" * 16
    outputs = []
    for _ in range(2):
        with Host(Policy(allow={"random"}, random_seed=seed), cache_dir=None) as host:
            body = f"""
            (drop (call $random_bytes (i32.const 9000) (i32.const 1) (i32.const {RESP_AT + 4})
                                      (i32.const 64)))
            (i32.store (i32.const {RESP_AT}) (i32.const 0))
            (call $packed (i32.const {RESP_AT}) (i32.const 13))"""
            wasm = build(
                guest_wat(
                    body,
                    imports='(import "wasihost_v1" "random_bytes" (func $random_bytes '
                    "(param i32 i32 i32 i32) (result i32)))",
                    extra='(data (i32.const 9000) "\\08")',
                )
            )
            ext = host.admit(bare(wasm, "seeded.wasm"), grants=["random"])
            first, second = ext.call("run"), ext.call("run")
            ext.stop()  # a restart keeps the extension's stream going, it does not replay it
            outputs.append([first, second, ext.call("run")])
    assert outputs[0] == outputs[1]  # the same seed reproduces the run
    assert len(set(outputs[0])) == 3
    assert all(isinstance(v, bytes) and len(v) == 8 for v in outputs[0])


def test_inspect_reports_embedder_imports_against_the_hosts_registry(app: Host) -> None:
    from wasihost.host.inspect import inspect_package

    app.add_function("myapp.lookup", lambda ctx, req: 1, capability="myapp.read", **LIMITS)
    report = inspect_package(bare(fn_guest("lookup")), app.registry, app.policy, ["myapp.read"])
    [row] = [r for r in report["imports"] if r["module"] == "myapp_v1"]
    assert row["entry"] == {
        "capability": "myapp.read",
        "max_request_bytes": 256,
        "max_response_bytes": 1024,
        "fuel_base": 500,
        "fuel_per_byte": 2,
    }
    assert report["admission"]["admitted"] is True


class FixedClock:
    """A clock broker of the embedder's: replaces the built-in of the same name."""

    name = "clock"
    functions = ("wasihost_v1.clock_now",)
    capabilities = frozenset({"clock"})

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.closed: list[str] = []

    def open(self, ext: Extension) -> str:
        self.opened.append(ext.id)
        return ext.id

    def handler(self, entry: HostFunction, state: str) -> Any:
        return lambda call, request: 1_234_000_000

    def close(self, state: str) -> None:
        self.closed.append(state)


def test_a_broker_passed_to_the_host_replaces_the_builtin_of_its_name() -> None:
    clock = FixedClock()
    with Host(Policy(allow={"clock", "random"}), cache_dir=None, brokers=[clock]) as host:
        assert host.broker("clock") is clock
        ext = host.load(FIXTURES / "clock-random")
        out = ext.call("run")
        assert out["realtime"] == out["monotonic"] == 1_234_000_000
        assert clock.opened == ["org.wasihost.fixtures.clock-random"]
        with pytest.raises(ConfigError, match="no broker named 'nope'"):
            host.broker("nope")
    assert clock.closed == ["org.wasihost.fixtures.clock-random"]
    with pytest.raises(ConfigError, match="two brokers named 'clock'"):
        Host(cache_dir=None, brokers=[FixedClock(), FixedClock()])
