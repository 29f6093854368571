"""ABI 2.0 beside ABI 1.x: one registry and one Host serve 1.0, 1.1 and 2.0 guests at once;
v2's one breaking change (``log`` takes typed arguments and raw UTF-8) is checked against
hostile guests; guests declaring a version or importing a function their view lacks are
refused at admission, naming what is missing; the handshake carries the view's feature flags."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import cbor2
import pytest

from tests.support.common import FIXTURES, ROOT, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers.log import LogBroker
from wasihost.core.errors import AdmissionError, CallError, FailureClass
from wasihost.core.registry import AbiVersion, HostFunction
from wasihost.core.status import Status
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package

CAPS = frozenset({"log", "clock", "random", "storage"})
V2_LOG = '(import "wasihost_v2" "log" (func $log (param i32 i32 i32) (result i32)))'
MESSAGE_AT = 12288
ANSWER_AT = 8192
# Answers a command with the i32 ``$r`` as CBOR (0, or -1..-24 as one byte): what log returned.
ANSWER_FN = f"""
  (func $answer (param $r i32) (result i64)
    (i32.store (i32.const {ANSWER_AT}) (i32.const 0))
    (i32.store8 (i32.const {ANSWER_AT + 4})
      (select (i32.const 0) (i32.sub (i32.const 0x1f) (local.get $r)) (i32.eqz (local.get $r))))
    (call $packed (i32.const {ANSWER_AT}) (i32.const 5)))"""


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    with Host(Policy(allow=CAPS), cache_dir=None) as h:
        yield h


def _fixture(host: Host, name: str, **kw: Any) -> Any:
    package = load_package(FIXTURES / name, host.registry.capabilities())
    previous = host.extension(package.name)
    if previous is not None:
        previous.close()
    return host.admit(package, **kw)


def _v2_log_guest(level: int, ptr: int, length: int, message: bytes = b"", **kw: Any) -> bytes:
    """A 2.0 guest whose every command calls ``log(level, ptr, length)`` and answers what it
    returned; ``message`` is placed at MESSAGE_AT."""
    body = f"(call $answer (call $log (i32.const {level}) (i32.const {ptr}) (i32.const {length})))"
    extra = ANSWER_FN + (f'(data (i32.const {MESSAGE_AT}) "{escape(message)}")' if message else "")
    return build(guest_wat(body, imports=V2_LOG, marker="2.0", extra=extra, **kw))


def _refusal(host: Host, wasm: bytes, grants: tuple[str, ...] = ("log",)) -> str:
    with pytest.raises(AdmissionError) as info:
        host.admit(bare(wasm), grants=list(grants))
    return "; ".join(info.value.problems)


# -- the registry ------------------------------------------------------------------------------


def test_v2_registry_ships_byte_identical_and_carries_v1_1_over_with_one_change() -> None:
    normative = ROOT / "abi" / "v2" / "registry.json"
    assert (ROOT / "wasihost" / "core" / "abi_data" / "v2.json").read_bytes() == normative.read_bytes()
    v1 = json.loads((ROOT / "abi" / "v1" / "registry.json").read_text())
    v2 = json.loads(normative.read_text())
    assert (v2["abi_major"], v2["latest_minor"], v2["import_module"]) == (2, 0, "wasihost_v2")
    # Status codes are never reused or renumbered: v2 keeps every v1 code as it was.
    assert v2["status_codes"] == v1["status_codes"]
    assert [f["name"] for f in v2["functions"]] == [f["name"] for f in v1["functions"]]
    changed = []
    for old, new in zip(v1["functions"], v2["functions"], strict=True):
        assert new["since"] == "2.0"
        if old | {"since": None} != new | {"since": None}:
            changed.append(new["name"])
    assert changed == ["log"]
    # The Python registry serves exactly that file.
    served = {f.name: f for f in default_registry().view(AbiVersion(2, 0)).entries.values()
              if f.module == "wasihost_v2"}  # fmt: skip
    for raw in v2["functions"]:
        assert served[raw["name"]].to_json() | {"module": None} == raw | {"module": None}


def test_one_registry_serves_three_views_with_their_feature_flags() -> None:
    registry = default_registry()
    assert [str(v) for v in registry.versions] == ["1.1", "2.0"]
    v10, v11, v20 = (registry.view(AbiVersion.parse(v)) for v in ("1.0", "1.1", "2.0"))
    assert v10.lookup("wasihost_v1", "storage_get") is None
    assert v11.lookup("wasihost_v1", "storage_get") is not None
    assert v20.lookup("wasihost_v1", "log") is None
    assert v20.lookup("wasihost_v2", "log").signature == "(i32, i32, i32) -> (i32)"  # type: ignore[union-attr]
    assert v10.features == ()
    assert v11.features == ("bytes-commands", "namespaces")
    assert v20.features == ("bytes-commands", "namespaces", "native-log")
    for version in ("2.5", "3.0", "1.2"):
        assert not registry.supports(AbiVersion.parse(version))


# -- one Host, every major -----------------------------------------------------------------------


def test_rust_v2_fixture_runs_beside_v1_0_and_v1_1_fixtures_in_one_host(host: Host) -> None:
    echo = _fixture(host, "echo")  # ABI 1.0
    rawecho = _fixture(host, "rawecho")  # ABI 1.1
    logger = _fixture(host, "logger-v2", grants=["log", "clock"])  # ABI 2.0
    assert (echo.plan.version, rawecho.plan.version, logger.plan.version) == (
        AbiVersion(1, 0), AbiVersion(1, 1), AbiVersion(2, 0),
    )  # fmt: skip
    assert [e.qualified_name for e in logger.plan.imports if e.name == "log"] == ["wasihost_v2.log"]
    assert all(e.module != "wasihost_v1" for e in logger.plan.imports)
    assert echo.call("echo", {"n": 1}) == {"n": 1}
    assert logger.call("run", {"lines": 3}) == {"logged": 3}
    records = logger.log.drain()
    assert [(int(r.level), r.message) for r in records] == [
        (2, "line 0"),
        (2, "line 1"),
        (2, "line 2"),
    ]
    # A carried-over entry (clock_now) answers as in v1.
    first = logger.call("now")["monotonic"]
    assert logger.call("now")["monotonic"] >= first > 0
    # The whole 4096-byte limit is message (v1 spent 5 of it on CBOR), multi-byte UTF-8 too.
    text = "é" * 2048
    assert logger.call("say", {"message": text, "level": 4}) == {"status": 0}
    (record,) = logger.log.drain()
    assert (int(record.level), record.message) == (4, text)
    # One byte over: the SDK refuses it before the host call, with the ABI's status.
    assert logger.call("say", {"message": "x" * 4097}) == {"status": int(Status.PAYLOAD_TOO_LARGE)}
    # The handshake offered the v2 view's feature flags; the v1.0 guest's view has none.
    assert logger.handshake.features == ("bytes-commands", "namespaces", "native-log")
    assert echo.handshake.features == ()
    assert rawecho.start().features == ("bytes-commands", "namespaces")


def test_v2_log_over_budget_answers_quota_exceeded(host: Host) -> None:
    logger = _fixture(host, "logger-v2", grants=["log", "clock"])
    out = logger.call("run", {"lines": 2000})
    assert out["dropped"] > 0 and out["logged"] + out["dropped"] == 2000


def test_v2_rust_panic_aborts_through_wasihost_v2() -> None:
    wasm = (FIXTURES / "logger-v2" / "logger-v2.wasm").read_bytes()
    # Nothing of a v2 guest imports wasihost_v1, not even the SDK's panic hook.
    assert b"wasihost_v1" not in wasm and b"wasihost_v2" in wasm


# -- admission refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("declared", ["2.5", "3.0", "1.2"])
def test_a_version_the_host_lacks_is_refused_naming_it(host: Host, declared: str) -> None:
    text = _refusal(host, build(guest_wat(marker=declared)))
    assert f"module declares ABI {declared}; this host serves 1.1, 2.0" in text


def test_a_v2_guest_importing_wasihost_v1_is_refused(host: Host) -> None:
    text = _refusal(host, build(guest_wat(imports=host_import("log"), marker="2.0")))
    assert "import wasihost_v1.log: unknown import module 'wasihost_v1'" in text
    assert "ABI 2.0 serves" in text and "wasihost_v2" in text


def test_a_v1_guest_importing_wasihost_v2_is_refused(host: Host) -> None:
    for marker in ("1.0", "1.1"):
        text = _refusal(host, build(guest_wat(imports=V2_LOG, marker=marker)))
        assert "import wasihost_v2.log: unknown import module 'wasihost_v2'" in text


def test_a_v2_guest_with_the_v1_log_signature_or_an_unknown_entry_is_refused(host: Host) -> None:
    old = '(import "wasihost_v2" "log" (func (param i32 i32 i32 i32) (result i32)))'
    text = _refusal(host, build(guest_wat(imports=old, marker="2.0")))
    assert "wasihost_v2.log: signature (i32, i32, i32, i32) -> (i32) differs from " in text
    unknown = '(import "wasihost_v2" "exec" (func (param i32 i32 i32 i32) (result i32)))'
    assert "wasihost_v2.exec: not an entry of ABI 2.0" in _refusal(
        host, build(guest_wat(imports=unknown, marker="2.0"))
    )


def test_an_ungranted_v2_log_import_is_refused(host: Host) -> None:
    text = _refusal(host, _v2_log_guest(2, MESSAGE_AT, 2, b"hi"), grants=())
    assert "wasihost_v2.log: needs capability 'log', which is not granted" in text


# -- v2 log against hostile guests -----------------------------------------------------------------


def _run(host: Host, wasm: bytes) -> tuple[Any, list[Any]]:
    ext = host.admit(bare(wasm), grants=["log"])
    try:
        return ext.call("x"), ext.log.drain()
    finally:
        ext.close()


def test_v2_log_appends_a_well_formed_record(host: Host) -> None:
    answer, records = _run(host, _v2_log_guest(3, MESSAGE_AT, 5, b"hello"))
    assert answer == 0
    assert [(int(r.level), r.message) for r in records] == [(3, "hello")]


@pytest.mark.parametrize("level", [5, 255, 0x7FFFFFFF, -1])
def test_v2_log_bad_level_is_invalid_argument(host: Host, level: int) -> None:
    answer, records = _run(host, _v2_log_guest(level, MESSAGE_AT, 5, b"hello"))
    assert answer == -int(Status.INVALID_ARGUMENT) and records == []


@pytest.mark.parametrize("blob", [b"\xff", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf"])
def test_v2_log_invalid_utf8_is_invalid_argument(host: Host, blob: bytes) -> None:
    answer, records = _run(host, _v2_log_guest(2, MESSAGE_AT, len(blob), blob))
    assert answer == -int(Status.INVALID_ARGUMENT) and records == []


def test_v2_log_oversize_len_is_payload_too_large_without_reading(host: Host) -> None:
    # 4097 bytes inside memory: refused by length; the bytes there are not UTF-8, so a host
    # that read them first would have answered INVALID_ARGUMENT instead.
    answer, records = _run(host, _v2_log_guest(2, MESSAGE_AT, 4097, b"\xff" * 8))
    assert answer == -int(Status.PAYLOAD_TOO_LARGE) and records == []
    answer, _ = _run(host, _v2_log_guest(2, MESSAGE_AT, 4096, b"a" * 4096))
    assert answer == 0


@pytest.mark.parametrize(
    ("ptr", "length"),
    [(2 * 65536 - 2, 5), (-1, 1), (0x7FFFFFFF, 0x7FFFFFFF), (MESSAGE_AT, -1), (2 * 65536, 1)],
)
def test_v2_log_range_outside_memory_traps_as_protocol(host: Host, ptr: int, length: int) -> None:
    ext = host.admit(bare(_v2_log_guest(2, ptr, length)), grants=["log"])
    try:
        with pytest.raises(CallError) as info:
            ext.call("x")
        assert info.value.failure is FailureClass.PROTOCOL
        assert "wasihost_v2.log" in str(info.value)
        assert [r for r in ext.log.drain() if r.source == "guest"] == []
    finally:
        ext.close()


def test_v2_log_empty_message_at_the_end_of_memory_is_appended(host: Host) -> None:
    answer, records = _run(host, _v2_log_guest(0, 2 * 65536, 0))
    assert answer == 0 and [r.message for r in records] == [""]


class _RevokingLog(LogBroker):
    """The built-in log broker, but the first log call revokes ``log`` before it commits."""

    def __init__(self) -> None:
        self.host: Host | None = None

    def handler(self, entry: HostFunction, state: Any) -> Any:
        inner = super().handler(entry, state)

        def handle(call: Any, *args: int) -> Any:
            assert self.host is not None
            if state.grant.allows("log"):
                self.host.revoke(state.id, "log", "test")
            return inner(call, *args)

        return handle


@pytest.mark.parametrize("calls", [1, 2])
def test_v2_log_after_revocation_answers_denied(calls: int) -> None:
    """Revoked during the call: the commit is refused (first call), and a later log call of the
    same guest call is refused by the gate (its ``revoked_result``); nothing is appended."""
    broker = _RevokingLog()
    with Host(Policy(allow=CAPS), cache_dir=None, brokers=[broker]) as host:
        broker.host = host
        log = f"(call $log (i32.const 2) (i32.const {MESSAGE_AT}) (i32.const 2))"
        body = f"(drop {log}) " * (calls - 1) + f"(call $answer {log})"
        extra = ANSWER_FN + f'(data (i32.const {MESSAGE_AT}) "hi")'
        wasm = build(guest_wat(body, imports=V2_LOG, marker="2.0", extra=extra))
        ext = host.admit(bare(wasm), grants=["log"])
        assert ext.call("x") == -int(Status.DENIED)
        assert [r for r in ext.log.drain() if r.source == "guest"] == []


def test_v2_log_is_charged_fuel_per_byte(host: Host) -> None:
    short = host.admit(bare(_v2_log_guest(2, MESSAGE_AT, 1, b"a")), grants=["log"])
    long = host.admit(bare(_v2_log_guest(2, MESSAGE_AT, 4000, b"a" * 4000)), grants=["log"])
    try:
        assert short.call("x") == 0
        assert long.call("x") == 0
        entry = default_registry().view(AbiVersion(2, 0)).lookup("wasihost_v2", "log")
        assert entry is not None
        assert long.last_fuel_used - short.last_fuel_used >= entry.fuel_per_byte * 3999
    finally:
        short.close()
        long.close()


def _hello_recorder(marker: str) -> bytes:
    """A guest that keeps the input of ``wasihost.hello`` and answers any later command with it
    (status 0 + the CBOR the host sent), to see what crossed."""
    hello = {"id": "org.test.hello", "version": "0.1.0", "abi": marker, "features": []}
    hello_blob = b"\0\0\0\0" + cbor2.dumps(hello)
    welcome_blob = b"\0\0\0\0" + cbor2.dumps({"status": "ready"})
    kept = 20000  # status word at kept-4, the hello input after it
    return build(f"""(module
  (@custom "wasihost_abi" "{marker}")
  (memory (export "memory") 2)
  (global $kept_len (mut i32) (i32.const 0))
  (data (i32.const 1024) "{escape(hello_blob)}")
  (data (i32.const 2048) "{escape(welcome_blob)}")
  (func $packed (param $ptr i32) (param $len i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $ptr)) (i64.const 32))
            (i64.extend_i32_u (local.get $len))))
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 40000))
  (func (export "wasihost_call") (param $ptr i32) (param $cmd_len i32) (param $in_len i32)
    (result i64)
    (if (i32.eq (local.get $cmd_len) (i32.const 14))
      (then
        (memory.copy (i32.const {kept}) (i32.add (local.get $ptr) (local.get $cmd_len))
                     (local.get $in_len))
        (global.set $kept_len (local.get $in_len))
        (return (call $packed (i32.const 1024) (i32.const {len(hello_blob)})))))
    (if (i32.eq (local.get $cmd_len) (i32.const 16))
      (then (return (call $packed (i32.const 2048) (i32.const {len(welcome_blob)})))))
    (i32.store (i32.const {kept - 4}) (i32.const 0))
    (call $packed (i32.const {kept - 4}) (i32.add (global.get $kept_len) (i32.const 4)))))""")


@pytest.mark.parametrize(
    ("marker", "features"),
    [
        ("1.0", []),
        ("1.1", ["bytes-commands", "namespaces"]),
        ("2.0", ["bytes-commands", "namespaces", "native-log"]),
    ],
)
def test_the_hello_input_carries_the_views_feature_flags(
    host: Host, marker: str, features: list[str]
) -> None:
    ext = host.admit(bare(_hello_recorder(marker)))
    try:
        sent = ext.call("what-did-hello-say")
        assert sent == {"host": "wasihost", "abi": ["1.1", "2.0"], "features": features}
        assert ext.handshake is not None and list(ext.handshake.features) == features
    finally:
        ext.close()


# -- feature flags a guest requires --------------------------------------------------------------


def _requiring(features: str, marker: str) -> bytes:
    return build(guest_wat(marker=marker, extra=f'(@custom "wasihost_features" "{features}")'))


def test_a_guest_requiring_a_feature_its_view_offers_is_admitted_and_runs(host: Host) -> None:
    ext = host.admit(bare(_requiring("native-log,bytes-commands", "2.0")), grants=["log"])
    try:
        assert ext.call("noop") is None
        assert ext.handshake is not None and "native-log" in ext.handshake.features
    finally:
        ext.close()
    ext = host.admit(bare(_requiring("bytes-commands", "1.1")), grants=["log"])
    ext.close()


@pytest.mark.parametrize(
    ("features", "marker", "missing", "label"),
    [
        ("native-log", "1.1", "native-log", "ABI 1.1"),
        ("bytes-commands", "1.0", "bytes-commands", "ABI 1.0"),
        ("native-log,teleport", "2.0", "teleport", "ABI 2.0"),
    ],
)
def test_a_guest_requiring_a_feature_its_view_lacks_is_refused_naming_it(
    host: Host, features: str, marker: str, missing: str, label: str
) -> None:
    text = _refusal(host, _requiring(features, marker))
    assert f"module requires feature {missing!r}, which {label} of this host does not offer" in text


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('(@custom "wasihost_features" "Native-Log")', "is not a feature name"),
        ('(@custom "wasihost_features" "native-log, bytes-commands")', "is not a feature name"),
        ('(@custom "wasihost_features" "")', "is not a feature name"),
        ('(@custom "wasihost_features" "\\ff")', "is not ASCII"),
        (f'(@custom "wasihost_features" "{"a," * 200}a")', "over 256"),
        (
            '(@custom "wasihost_features" "native-log") (@custom "wasihost_features" "x")',
            "2 'wasihost_features' sections; at most one",
        ),
    ],
)
def test_a_malformed_features_section_is_refused_before_any_code_runs(
    host: Host, extra: str, says: str
) -> None:
    assert says in _refusal(host, build(guest_wat(marker="2.0", extra=extra)))
