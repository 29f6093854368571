"""Embedder host functions of the native convention (issue 12, section 2): integers in and out,
no CBOR, through the same admission, gate, fuel, epochs and commits as every entry. Called
from a Rust plugin on the guest SDK (fixtures/nativefns, ``wasihost_guest::import!`` with
typed functions) and from WAT guests for the hostile cases."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.common import FIXTURES, bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import AdmissionError, CallError, ConfigError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.core.serving import CallContext
from wasihost.core.status import HostStatus, Status
from wasihost.host.inspect import abi_listing, inspect_package, render_abi_text
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package, load_package

NATIVEFNS = FIXTURES / "nativefns"
ADD_FUEL = 20_000
TALLY_FUEL = 1_000
CAPS = {"myapp.math", "myapp.write"}


def app_host(allow: set[str]) -> Host:
    """The application of docs/host-functions.md's native example: ``add`` computes, ``tally``
    commits the amount through the grant table, and a few magic arguments misbehave."""
    host = Host(Policy(allow=allow), cache_dir=None)
    host.tallies = {}  # type: ignore[attr-defined]
    host.seen = []  # type: ignore[attr-defined]

    @host.function(
        "myapp.add",
        capability="myapp.math",
        convention="native",
        params=("i64", "i64"),
        results=("i64",),
        fuel_base=ADD_FUEL,
    )
    def add(ctx: CallContext, a: int, b: int) -> int:
        """Add two numbers."""
        host.seen.append((ctx.extension, ctx.epoch, a, b))  # type: ignore[attr-defined]
        if a == 666:
            raise KeyError("internal table /srv/math.db is corrupt")
        if a == 777:
            raise HostStatus(Status.NOT_FOUND)
        if a == 888:
            return 1 << 64  # over any i64
        if a == 999:
            return "42"  # type: ignore[return-value]
        return a + b

    @host.function(
        "myapp.tally",
        capability="myapp.write",
        convention="native",
        params=("i64",),
        results=("i64",),
        fuel_base=TALLY_FUEL,
    )
    def tally(ctx: CallContext, amount: int) -> int:
        if amount == 99:
            host.revoke(ctx.extension, "myapp.write")  # lands before the commit below

        def land() -> int:
            total: int = host.tallies.get(ctx.extension, 0) + amount  # type: ignore[attr-defined]
            host.tallies[ctx.extension] = total  # type: ignore[attr-defined]
            return total

        return ctx.commit(land)

    return host


@pytest.fixture
def app() -> Iterator[Host]:
    with app_host(CAPS) as host:
        yield host


def test_a_rust_plugin_calls_native_functions_with_signed_integers(app: Host) -> None:
    ext = app.load(NATIVEFNS)
    assert ext.call("add", [2, 40]) == 42
    assert ext.call("add", [-5, 3]) == -2
    assert ext.call("add", [-(2**63), 0]) == -(2**63)
    assert app.seen[-2][1:] == (ext.grant.epoch, -5, 3)  # type: ignore[attr-defined]
    assert app.seen[0][0] == ext.id  # type: ignore[attr-defined]
    assert ext.call("tally", 5) == 5
    assert ext.call("tally", 7) == 12
    assert app.tallies == {ext.id: 12}  # type: ignore[attr-defined]


def test_each_native_call_is_charged_its_price(app: Host) -> None:
    ext = app.load(NATIVEFNS)
    ext.start()  # the handshake's fuel is charged to the first call, not to these
    ext.call("add_many", 0)
    none = ext.last_fuel_used
    assert ext.call("add_many", 100) == 100
    many = ext.last_fuel_used
    # The guest's own loop costs a few hundred units; the price is most of it.
    assert 100 * ADD_FUEL <= many - none < 100 * ADD_FUEL + 100_000
    poor = app_host(CAPS)
    try:
        small = poor.load(NATIVEFNS, fuel=ADD_FUEL * 50)
        with pytest.raises(CallError) as info:
            small.call("add_many", 1000)
        assert info.value.failure is FailureClass.OUT_OF_FUEL
    finally:
        poor.close()


def test_an_ungranted_native_import_refuses_the_plugin_by_name() -> None:
    with app_host({"myapp.math"}) as host, pytest.raises(AdmissionError) as info:
        host.load(NATIVEFNS)
    assert any(
        p.startswith("import myapp_v1.tally: needs capability 'myapp.write'")
        for p in info.value.problems
    ), info.value.problems


def native_guest(imports: str, body: str = "(call $ok_null)", declared: str = "1.0") -> Package:
    section = f'(@custom "wasihost_abi.myapp" "{declared}")'
    return bare(build(guest_wat(body, imports=section + imports)))


@pytest.mark.parametrize(
    "signature",
    [
        "(param i32 i32) (result i32)",
        "(param i64 i64)",
        "(param i64 i64) (result i64 i64)",
        "(param i32 i32 i32 i32) (result i32)",  # the cbor convention's shape
    ],
)
def test_a_wrong_signature_is_refused_at_admission(app: Host, signature: str) -> None:
    package = native_guest(f'(import "myapp_v1" "add" (func $add {signature}))')
    with pytest.raises(AdmissionError) as info:
        app.admit(package, grants=["myapp.math"])
    assert any(
        p.startswith("import myapp_v1.add: signature") and "(i64, i64) -> (i64)" in p
        for p in info.value.problems
    ), info.value.problems


def test_a_newer_native_function_is_refused_to_an_older_guest(app: Host) -> None:
    app.add_function(
        "myapp.double",
        lambda ctx, a: 2 * a,
        capability="myapp.math",
        since="1.1",
        convention="native",
        params=("i32",),
        results=("i32",),
        fuel_base=100,
    )
    package = native_guest('(import "myapp_v1" "double" (func $d (param i32) (result i32)))')
    with pytest.raises(AdmissionError) as info:
        app.admit(package, grants=["myapp.math"])
    assert any("myapp_v1.double" in p and "1.1" in p for p in info.value.problems)


def test_i32_arguments_are_signed_and_results_take_either_sign(app: Host) -> None:
    got: list[int] = []

    @app.function(
        "myapp.neg",
        capability="myapp.math",
        convention="native",
        params=("i32",),
        results=("i32",),
        fuel_base=100,
    )
    def neg(ctx: CallContext, a: int) -> int:
        got.append(a)
        if a == -1:
            return 0xFFFF_FFFF  # the same bits as -1
        return -1 if a == -2 else -a

    # The command passes minus its input (a one-byte CBOR uint) and answers the i32 result as
    # a CBOR uint32 (0x1a, then big-endian: the little-endian store is byte-swapped first).
    body = """
    (i32.store (i32.const 8192) (i32.const 0))
    (i32.store8 (i32.const 8196) (i32.const 0x1a))
    (i32.store (i32.const 8197)
      (call $swap (call $neg (i32.sub (i32.const 0)
        (i32.load8_u (i32.add (local.get $ptr) (local.get $cmd_len)))))))
    (call $packed (i32.const 8192) (i32.const 9))"""
    swap = """
  (func $swap (param $x i32) (result i32)
    (i32.or (i32.or (i32.shl (local.get $x) (i32.const 24))
                    (i32.shl (i32.and (local.get $x) (i32.const 0xff00)) (i32.const 8)))
            (i32.or (i32.and (i32.shr_u (local.get $x) (i32.const 8)) (i32.const 0xff00))
                    (i32.shr_u (local.get $x) (i32.const 24)))))"""
    wasm = build(
        guest_wat(
            body,
            imports='(@custom "wasihost_abi.myapp" "1.0")'
            '(import "myapp_v1" "neg" (func $neg (param i32) (result i32)))',
            extra=swap,
        )
    )
    ext = app.admit(bare(wasm), grants=["myapp.math"])
    assert ext.call("run", 5) == 5
    assert ext.call("run", 1) == 0xFFFF_FFFF
    assert ext.call("run", 2) == 0xFFFF_FFFF
    assert got == [-5, -1, -2]


def test_failures_end_the_call_as_documented_and_leak_nothing(
    app: Host, caplog: pytest.LogCaptureFixture
) -> None:
    ext = app.load(NATIVEFNS)
    with caplog.at_level(logging.ERROR, logger="wasihost"), pytest.raises(CallError) as info:
        ext.call("add", [666, 0])
    assert info.value.failure is FailureClass.HOST_ERROR
    assert "/srv" not in str(info.value) and "corrupt" not in str(info.value)
    assert any("corrupt" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)
    # No status slot: a raised status ends the call, naming it.
    with pytest.raises(CallError) as info:
        ext.call("add", [777, 0])
    assert info.value.failure is FailureClass.HOST_ERROR and "NOT_FOUND" in str(info.value)
    # A result the entry's type cannot carry is the function's bug, never masked.
    for bad in (888, 999):
        with pytest.raises(CallError) as info:
            ext.call("add", [bad, 0])
        assert info.value.failure is FailureClass.HOST_ERROR
    assert ext.call("add", [1, 1]) == 2  # a fresh instance serves the next call


def test_a_commit_after_a_revocation_mid_call_is_refused(app: Host) -> None:
    ext = app.load(NATIVEFNS)
    assert ext.call("tally", 3) == 3
    before = ext._instances()
    with pytest.raises(CallError) as info:
        ext.call("tally", 99)  # the function revokes myapp.write, then commits
    assert info.value.failure is FailureClass.DENIED
    assert app.tallies == {ext.id: 3}  # type: ignore[attr-defined]
    # The trap left the guest mid-way: its instance is not reused.
    assert not set(before) & set(ext._instances())
    # The grant was downgraded in place: the gate refuses tally, add still runs.
    with pytest.raises(CallError) as info:
        ext.call("tally", 1)
    assert info.value.failure is FailureClass.DENIED
    assert app.tallies == {ext.id: 3}  # type: ignore[attr-defined]
    assert ext.call("add", [20, 22]) == 42


def test_revoking_the_extension_during_a_native_call_stops_it(app: Host) -> None:
    entered, release = threading.Event(), threading.Event()

    @app.function(
        "myapp.wait",
        capability="myapp.math",
        convention="native",
        params=(),
        results=(),
        fuel_base=100,
    )
    def wait(ctx: CallContext) -> None:
        entered.set()
        release.wait(10)
        ctx.commit(lambda: None)  # refused: the extension was revoked meanwhile

    package = native_guest(
        '(import "myapp_v1" "wait" (func $wait))', "(call $wait) (call $ok_null)"
    )
    ext = app.admit(package, grants=["myapp.math"])
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            ext.call("run", None)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert entered.wait(10)
    app.revoke(ext.id, reason="test")
    release.set()
    caller.join(10)
    assert isinstance(outcome[0], ExtensionRevoked), outcome


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"params": ("f64",), "results": ()}, "integers only"),
        ({"params": ("i64",) * 9, "results": ()}, "at most 8"),
        ({"params": (), "results": ("i64", "i64")}, "at most 1"),
        ({"params": "i64", "results": ()}, "must be a tuple"),
        ({"params": (), "results": (), "max_request_bytes": 10}, "max_request_bytes"),
        ({"params": (), "results": (), "fuel_per_byte": 1}, "fuel_per_byte"),
        ({"params": (), "results": (), "commits": True}, "commits"),
        ({"params": (), "results": (), "fuel_base": 1}, "fuel_base"),
        ({"results": ()}, "must be a tuple"),
    ],
)
def test_a_malformed_native_registration_is_refused(
    app: Host, options: dict[str, Any], message: str
) -> None:
    options = {"fuel_base": 100, **options}
    with pytest.raises(ConfigError, match=message):
        app.add_function(
            "myapp.bad", lambda ctx: None, capability="myapp.math", convention="native", **options
        )


def test_cbor_only_and_native_only_options_do_not_mix(app: Host) -> None:
    with pytest.raises(ConfigError, match="params and results are for convention='native'"):
        app.add_function(
            "myapp.bad",
            lambda ctx, r: None,
            capability="myapp.math",
            params=("i64",),
            max_request_bytes=1,
            max_response_bytes=1,
            fuel_base=100,
            fuel_per_byte=1,
        )
    with pytest.raises(ConfigError, match="needs max_request_bytes"):
        app.add_function("myapp.bad", lambda ctx, r: None, capability="myapp.math", fuel_base=100)
    with pytest.raises(ConfigError, match="convention="):
        app.add_function(
            "myapp.bad", lambda ctx: None, capability="myapp.math", convention="raw", fuel_base=1
        )


def test_native_functions_are_listed_by_abi_and_inspect(app: Host) -> None:
    listing = abi_listing(app.registry)
    [entry] = [f for f in listing["functions"] if f["name"] == "add"]
    assert entry["module"] == "myapp_v1" and entry["convention"] == "native"
    assert entry["params"] == ["i64", "i64"] and entry["results"] == ["i64"]
    assert entry["signed_args"] and entry["fuel_base"] == ADD_FUEL
    assert entry["doc"] == "Add two numbers."
    text = render_abi_text(listing)
    assert (
        f"myapp_v1.add (i64, i64) -> (i64)  capability=myapp.math since=1.0 native "
        f"fuel={ADD_FUEL}/call" in text
    )
    report = inspect_package(
        load_package(NATIVEFNS, app.registry.capabilities()),
        app.registry,
        app.policy,
        ["myapp.math", "myapp.write"],
    )
    [row] = [r for r in report["imports"] if r["name"] == "add"]
    assert row["entry"]["convention"] == "native" and row["entry"]["fuel_base"] == ADD_FUEL
    assert report["admission"]["admitted"]
