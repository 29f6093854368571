"""The storage broker (issue 11, section 2 "Storage" and section 3 "Bad input"), through the
real engine: the Rust fixture `storage` on the SDK's `storage` module for every operation,
and hand-written WAT guests for requests the SDK would never send."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.common import FIXTURES, ROOT, bare, run_in_thread
from tests.support.guests import build, escape, guest_wat
from wasihost.brokers.storage import ExtensionStorage, StorageBroker
from wasihost.cli import main
from wasihost.core.errors import AdmissionError, CallError, ConfigError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked, State
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.store.kvstore import DB_NAME, KVStore, Namespace, Quota, QuotaExceeded, Usage

FIXTURE = FIXTURES / "storage"
FIXTURE_ID = "org.wasihost.fixtures.storage"
WASM = (FIXTURE / "storage.wasm").read_bytes()
CAPS = frozenset({"storage", "log"})

RESP_AT = 8192
RESP_CAP = 40_000  # more than storage_get's 32,771-byte response
RAW_AT = 50_000  # a fixed request, below the bump heap at 64 KiB


def new_host(cache: Path, policy: Policy | None = None, **kw: Any) -> Host:
    return Host(policy or Policy(allow=CAPS), cache_dir=cache, **kw)


@pytest.fixture
def host(cache: Path) -> Iterator[Host]:
    with new_host(cache) as h:
        yield h


def load(host: Host, name: str | None = None, scope: dict[str, Any] | None = None) -> Extension:
    """The Rust fixture as a bare module (so one host may admit it under several ids)."""
    package = bare(WASM, name)
    if scope is not None:
        host.grant(package.name, "storage", scope)
    # The fixture's own budget (a page of writes at storage_put's price), not the default.
    return host.admit(package, grants=["storage"], fuel=100_000_000)


def store_of(host: Host) -> KVStore:
    store = host.broker("storage").store  # type: ignore[attr-defined]
    assert isinstance(store, KVStore)
    return store


def guest_error(ext: Extension, command: str, value: Any) -> str:
    """The class of the guest error ``command`` ends with (the host status it got)."""
    with pytest.raises(CallError) as info:
        ext.call(command, value)
    assert info.value.failure is FailureClass.GUEST_ERROR, info.value
    assert info.value.guest_class is not None
    return info.value.guest_class


def put(ext: Extension, key: str, value: bytes) -> None:
    assert ext.call("put", {"key": key, "value": value}) is None


def all_keys(ext: Extension, prefix: str = "", limit: int = 100) -> list[str]:
    keys: list[str] = []
    after = None
    while True:
        page = ext.call("list", {"prefix": prefix, "after": after, "limit": limit})
        assert len(page["keys"]) <= limit
        keys += page["keys"]
        after = page["next"]
        if after is None:
            return keys
        assert after == page["keys"][-1]


# -- every operation from the Rust guest ---------------------------------------------------


def test_every_operation_from_the_rust_guest(host: Host) -> None:
    ext = load(host)
    assert ext.call("get", {"key": "a"}) is None
    put(ext, "a", b"1")
    put(ext, "b", b"")
    assert ext.call("get", {"key": "a"}) == b"1"
    assert ext.call("get", {"key": "b"}) == b""
    put(ext, "a", b"one")
    assert ext.call("get", {"key": "a"}) == b"one"
    # The largest value goes through the SDK's retry with the entry's whole response limit.
    big = bytes(range(256)) * 128
    put(ext, "big", big)
    assert ext.call("get", {"key": "big"}) == big
    assert ext.call("list", {"prefix": "", "after": None, "limit": 10}) == {
        "keys": ["a", "b", "big"],
        "next": None,
    }
    assert ext.call("list", {"prefix": "b", "after": None, "limit": 1}) == {
        "keys": ["b"],
        "next": "b",
    }
    assert ext.call("list", {"prefix": "b", "after": "b", "limit": 1}) == {
        "keys": ["big"],
        "next": None,
    }
    # cas: expected null means "absent"; new null deletes; a mismatch changes nothing.
    assert ext.call("cas", {"key": "c", "expected": None, "new": b"x"}) is True
    assert ext.call("cas", {"key": "c", "expected": None, "new": b"y"}) is False
    assert ext.call("cas", {"key": "c", "expected": b"z", "new": b"y"}) is False
    assert ext.call("get", {"key": "c"}) == b"x"
    assert ext.call("cas", {"key": "c", "expected": b"x", "new": b"y"}) is True
    assert ext.call("get", {"key": "c"}) == b"y"
    assert ext.call("cas", {"key": "c", "expected": b"y", "new": None}) is True
    assert ext.call("get", {"key": "c"}) is None
    assert ext.call("delete", {"key": "a"}) is True
    assert ext.call("delete", {"key": "a"}) is False
    assert all_keys(ext) == ["b", "big"]
    ns = Namespace(ext.id)
    assert store_of(host).usage(ns) == Usage(1 + 3 + len(big), 2)
    assert store_of(host).check() == []


def test_the_fixture_package_declares_abi_1_1_and_storage(host: Host) -> None:
    ext = host.load(FIXTURE)
    assert ext.plan.version.minor == 1
    put(ext, "k", b"v")
    assert store_of(host).get(Namespace(FIXTURE_ID), b"k") == b"v"


def test_a_1_0_guest_importing_storage_is_refused_naming_the_import(host: Host) -> None:
    wasm = build(guest_wat(imports=_import("storage_get"), marker="1.0"))
    with pytest.raises(AdmissionError) as info:
        host.admit(bare(wasm), grants=["storage"])
    assert list(info.value.problems) == [
        "import wasihost_v1.storage_get: added in ABI 1.1, but the module declares 1.0"
    ]


def test_without_the_grant_the_storage_guest_is_refused(host: Host) -> None:
    with pytest.raises(AdmissionError, match="storage_put: needs capability 'storage'"):
        host.admit(bare(WASM), grants=[])


# -- quotas -----------------------------------------------------------------------------


def test_max_bytes_edge_exactly_at_succeeds_one_over_refuses_unchanged(host: Host) -> None:
    ext = load(host, scope={"max_bytes": 100})
    store, ns = store_of_after(host, ext)
    put(ext, "k", b"v" * 99)  # 1 + 99 = 100: exactly the quota
    assert store.usage(ns) == Usage(100, 1)
    assert guest_error(ext, "put", {"key": "j", "value": b""}) == "quota_exceeded"
    # A replacement counts the difference: one byte more is refused, the old value stays.
    assert guest_error(ext, "put", {"key": "k", "value": b"w" * 100}) == "quota_exceeded"
    assert guest_error(ext, "cas", {"key": "k", "expected": b"v" * 99, "new": b"w" * 100}) == (
        "quota_exceeded"
    )
    assert ext.call("get", {"key": "k"}) == b"v" * 99
    assert ext.call("get", {"key": "j"}) is None
    assert store.usage(ns) == Usage(100, 1)
    # The same size, or less, still goes in.
    put(ext, "k", b"w" * 99)
    assert ext.call("cas", {"key": "k", "expected": b"w" * 99, "new": b"u" * 49}) is True
    assert store.usage(ns) == Usage(50, 1)
    put(ext, "j", b"x" * 49)
    assert store.usage(ns) == Usage(100, 2)
    assert store.check() == []


def store_of_after(host: Host, ext: Extension) -> tuple[KVStore, Namespace]:
    ext.call("get", {"key": "warm-up"})  # the broker opens the store on first use
    return store_of(host), Namespace(ext.id)


def test_max_objects_edge(host: Host) -> None:
    ext = load(host, scope={"max_objects": 3})
    store, ns = store_of_after(host, ext)
    for key in ("a", "b", "c"):
        put(ext, key, b"1")
    assert guest_error(ext, "put", {"key": "d", "value": b"1"}) == "quota_exceeded"
    assert guest_error(ext, "cas", {"key": "d", "expected": None, "new": b"1"}) == "quota_exceeded"
    assert all_keys(ext) == ["a", "b", "c"]
    put(ext, "a", b"replaced")  # not a new object
    assert ext.call("delete", {"key": "b"}) is True
    put(ext, "d", b"1")
    assert store.usage(ns) == Usage(1 + 8 + 1 + 1 + 1 + 1, 3)
    assert ext.call("fill", {"prefix": "f", "size": 1}) == {
        "written": 0,
        "class": "quota_exceeded",
    }


def test_fill_writes_exactly_up_to_the_quota(host: Host) -> None:
    ext = load(host, scope={"max_bytes": 10 * 1024})
    out = ext.call("fill", {"prefix": "f", "size": 100})
    assert out["class"] == "quota_exceeded"
    sizes = [len(f"f{i}") + 100 for i in range(out["written"] + 1)]
    assert sum(sizes[:-1]) <= 10 * 1024 < sum(sizes)
    assert store_of(host).usage(Namespace(ext.id)) == Usage(sum(sizes[:-1]), out["written"])


def test_quotas_come_from_the_manifest_capped_by_policy_and_scope(
    tmp_path: Path, cache: Path
) -> None:
    package = tmp_path / "storage"
    shutil.copytree(FIXTURE, package, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    manifest = package / "extension.toml"
    manifest.write_text(
        manifest.read_text().replace(
            "timeout_ms = 5000", "timeout_ms = 5000\nstorage_max_objects = 7"
        )
    )
    fill = {"prefix": "f", "size": 1}
    with new_host(cache) as h:
        ext = h.load(package)
        assert ext.resources.storage_max_objects == 7
        assert ext.call("fill", fill)["written"] == 7
    with new_host(cache, Policy(allow=CAPS, ceilings={"storage_max_objects": 4})) as h:
        assert h.load(package).call("fill", fill)["written"] == 4
    with new_host(cache) as h:
        h.grant(FIXTURE_ID, "storage", {"max_objects": 2})
        assert h.load(package).call("fill", fill)["written"] == 2
    with new_host(cache) as h:
        h.grant(FIXTURE_ID, "storage", {"max_objects": 100})  # a scope lowers, never raises
        assert h.load(package).call("fill", fill)["written"] == 7


def test_the_default_quota_is_one_mib_and_ten_thousand_keys(host: Host) -> None:
    ext = host.load(FIXTURE)  # its manifest's fuel pays for 32 KiB values
    assert (ext.resources.storage_max_bytes, ext.resources.storage_max_objects) == (
        1024 * 1024,
        10_000,
    )
    out = ext.call("fill", {"prefix": "", "size": 32 * 1024})
    assert out == {"written": 31, "class": "quota_exceeded"}  # 32 values of 32 KiB + keys > 1 MiB


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ({"tenant": "Acme"}, "tenant must be"),
        ({"tenant": "a/b"}, "tenant must be"),
        ({"tenant": "a:b"}, "tenant must be"),
        ({"tenant": ""}, "tenant must be"),
        ({"tenant": ".hidden"}, "tenant must be"),
        ({"tenant": "a\u0000"}, "tenant must be"),
        ({"tenant": "x" * 65}, "tenant must be"),
        ({"tenant": 7}, "tenant must be"),
        ({"max_bytes": -1}, "max_bytes must be"),
        ({"max_bytes": True}, "max_bytes must be"),
        ({"max_objects": 10**7}, "max_objects must be"),
        ({"quota": 1}, "unknown keys"),
    ],
)
def test_malformed_storage_scopes_are_refused_at_grant(
    host: Host, scope: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        host.grant("org.example.x", "storage", scope)


# -- namespaces ---------------------------------------------------------------------------

ODD_KEYS = [
    "/",
    "a/b",
    "../a",
    "a:b",
    "::",
    "\\x00",
    "%00",
    " ",
    "é",
    "e\u0301",
    "日本語",
    "\U0001f600" * 64,  # 256 bytes of UTF-8: the longest key
    "\u202eevil",
    "x" * 256,
]


def test_keys_with_separators_and_unicode_are_stored_verbatim(host: Host) -> None:
    ext = load(host)
    for i, key in enumerate(ODD_KEYS):
        put(ext, key, str(i).encode())
    for i, key in enumerate(ODD_KEYS):
        assert ext.call("get", {"key": key}) == str(i).encode()
    assert all_keys(ext, limit=5) == sorted(ODD_KEYS, key=lambda k: k.encode())
    assert all_keys(ext, prefix="a") == ["a/b", "a:b"]
    assert all_keys(ext, prefix="e") == ["e\u0301"]
    assert all_keys(ext, prefix="é") == ["é"]


@pytest.mark.parametrize(
    "key",
    ["", "a\x00b", "\x00", "a\nb", "\x1b[31m", "tab\t", "\x7f", "\x85", "x" * 257, "é" * 129],
)
def test_malformed_keys_are_invalid_arguments(host: Host, key: str) -> None:
    ext = load(host)
    assert guest_error(ext, "put", {"key": key, "value": b"v"}) == "invalid_argument"
    assert guest_error(ext, "get", {"key": key}) == "invalid_argument"
    assert guest_error(ext, "delete", {"key": key}) == "invalid_argument"
    assert guest_error(ext, "cas", {"key": key, "expected": None, "new": b"v"}) == (
        "invalid_argument"
    )
    assert store_of(host).usage(Namespace(ext.id)) == Usage()


def test_two_extensions_with_the_same_keys_never_meet(host: Host) -> None:
    one, two = load(host, "s1"), load(host, "s1t")
    put(one, "shared", b"one")
    put(two, "shared", b"two")
    assert one.call("get", {"key": "shared"}) == b"one"
    assert two.call("get", {"key": "shared"}) == b"two"
    assert one.call("delete", {"key": "shared"}) is True
    assert two.call("get", {"key": "shared"}) == b"two"
    assert all_keys(one) == []
    assert all_keys(two) == ["shared"]


def test_tenants_with_colliding_looking_names_are_separate(host: Host) -> None:
    # Extension "s1" under tenant "t" and extension "s1t" without one would be one string if
    # joined; so would tenants "a" + key "b.c" and "a.b" + key "c". They are columns.
    one = load(host, "s1", scope={"tenant": "t"})
    two = load(host, "s1t")
    put(one, "k", b"s1 in t")
    put(two, "k", b"s1t")
    store = store_of(host)
    assert store.get(Namespace("s1", "t"), b"k") == b"s1 in t"
    assert store.get(Namespace("s1t"), b"k") == b"s1t"
    assert store.get(Namespace("s1"), b"k") is None
    three = load(host, "s3", scope={"tenant": "a"})
    put(three, "b.c", b"in a")
    host.grant("s3", "storage", {"tenant": "a.b"})  # re-scoped: the next call sees tenant a.b
    assert three.call("get", {"key": "b.c"}) is None
    assert three.call("get", {"key": "c"}) is None
    put(three, "c", b"in a.b")
    host.grant("s3", "storage", {"tenant": "a."})
    assert all_keys(three) == []
    host.grant("s3", "storage", {})  # no tenant: the extension's default namespace
    assert all_keys(three) == []
    host.grant("s3", "storage", {"tenant": "a"})
    assert all_keys(three) == ["b.c"]
    assert store.get(Namespace("s3", "a.b"), b"c") == b"in a.b"
    assert store.check() == []


# -- malformed requests from WAT guests ------------------------------------------------------


def _import(op: str) -> str:
    return f'(import "wasihost_v1" "{op}" (func $fn (param i32 i32 i32 i32) (result i32)))'


def raw_guest(op: str, request: bytes | None = None) -> bytes:
    """A 1.1 guest whose commands pass ``request`` (or else their own CBOR input, unchanged)
    to ``wasihost_v1.<op>`` and answer its response, or its negative status as an integer."""
    if request is None:
        args = "(i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)"
        extra = ""
    else:
        args = f"(i32.const {RAW_AT}) (i32.const {len(request)})"
        extra = f'(data (i32.const {RAW_AT}) "{escape(request)}")'
    body = f"""
    (global.set $r (call $fn {args} (i32.const {RESP_AT + 4}) (i32.const {RESP_CAP})))
    (i32.store (i32.const {RESP_AT}) (i32.const 0))
    (if (i32.lt_s (global.get $r) (i32.const 0))
      (then
        (i32.store8 (i32.const {RESP_AT + 4}) (i32.sub (i32.const 0x1f) (global.get $r)))
        (return (call $packed (i32.const {RESP_AT}) (i32.const 5)))))
    (call $packed (i32.const {RESP_AT}) (i32.add (global.get $r) (i32.const 4)))"""
    return build(
        guest_wat(
            body,
            imports=_import(op),
            marker="1.1",
            extra="(global $r (mut i32) (i32.const 0))" + extra,
        )
    )


class CountingStore(KVStore):
    """An in-memory store that counts every operation reaching it."""

    def __init__(self) -> None:
        super().__init__(None)
        self.operations = 0

    def get(self, ns: Namespace, key: bytes) -> bytes | None:
        self.operations += 1
        return super().get(ns, key)

    def put(self, ns: Namespace, key: bytes, value: bytes, quota: Quota) -> None:
        self.operations += 1
        super().put(ns, key, value, quota)

    def delete(self, ns: Namespace, key: bytes) -> bool:
        self.operations += 1
        return super().delete(ns, key)

    def cas(
        self, ns: Namespace, key: bytes, expected: bytes | None, new: bytes | None, quota: Quota
    ) -> bool:
        self.operations += 1
        return super().cas(ns, key, expected, new, quota)

    def list(
        self, ns: Namespace, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[bytes], bytes | None]:
        self.operations += 1
        return super().list(ns, prefix, after, limit)


INVALID = -2
TOO_LARGE = -3

MALFORMED: list[tuple[str, Any]] = [
    ("storage_get", 7),
    ("storage_get", b"key"),
    ("storage_get", None),
    ("storage_get", ["k"]),
    ("storage_get", ""),
    ("storage_get", "a\x00b"),
    ("storage_get", "x" * 257),
    ("storage_put", "k"),
    ("storage_put", ["k"]),
    ("storage_put", ["k", "text value"]),
    ("storage_put", ["k", None]),
    ("storage_put", ["k", b"v", b"extra"]),
    ("storage_put", [1, b"v"]),
    ("storage_put", [b"k", b"v"]),
    ("storage_put", ["\x1f", b"v"]),
    ("storage_put", ["k", b"x" * 32769]),
    ("storage_put", {"key": "k", "value": b"v"}),
    ("storage_delete", 1),
    ("storage_delete", ""),
    ("storage_delete", "\n"),
    ("storage_list", ["", None, 0]),
    ("storage_list", ["", None, 101]),
    ("storage_list", ["", None, -1]),
    ("storage_list", ["", None, True]),
    ("storage_list", ["", None, 1.5]),
    ("storage_list", ["", None, 2**64 - 1]),
    ("storage_list", ["", 5, 10]),
    ("storage_list", ["", b"cursor", 10]),
    ("storage_list", ["", "", 10]),
    ("storage_list", ["", "a\x00", 10]),
    ("storage_list", [None, None, 10]),
    ("storage_list", ["p\x00", None, 10]),
    ("storage_list", ["x" * 257, None, 10]),
    ("storage_list", ["", None]),
    ("storage_list", ["", None, 10, 0]),
    ("storage_cas", ["k"]),
    ("storage_cas", ["k", "text", None]),
    ("storage_cas", ["k", None, 5]),
    ("storage_cas", ["k", None, b"x" * 32769]),
    ("storage_cas", ["", None, b"v"]),
]


@pytest.mark.parametrize(("op", "request_value"), MALFORMED)
def test_malformed_requests_are_invalid_before_any_database_work(
    op: str, request_value: Any, cache: Path
) -> None:
    store = CountingStore()
    with new_host(cache, brokers=[StorageBroker(store=store)]) as h:
        ext = h.admit(bare(raw_guest(op)), grants=["storage"])
        assert ext.call("run", request_value) == INVALID
        assert store.operations == 0
    store.close()


@pytest.mark.parametrize(
    ("op", "raw"),
    [
        ("storage_get", b"\x62\xff\xfe"),  # text that is not UTF-8
        ("storage_get", b"\x7f\x61\x62"),  # indefinite-length text: not the ABI's profile
        ("storage_put", b"\x82\x61k\x5a\xff\xff\xff\xff"),  # a 4 GiB byte string, 0 present
        ("storage_list", b"\x83\x60\xf6\x18\x65"),  # limit 101
        ("storage_list", b"\x83\x60\xf6\x00"),  # limit 0
        ("storage_get", b""),
        ("storage_get", b"\x61"),  # truncated
    ],
)
def test_raw_malformed_bytes_are_refused_without_touching_the_store(
    op: str, raw: bytes, cache: Path
) -> None:
    store = CountingStore()
    with new_host(cache, brokers=[StorageBroker(store=store)]) as h:
        ext = h.admit(bare(raw_guest(op, raw)), grants=["storage"])
        assert ext.call("run") == INVALID
        assert store.operations == 0
    store.close()


def test_requests_over_the_entry_limit_are_refused_unread(host: Host) -> None:
    ext = host.admit(bare(raw_guest("storage_get")), grants=["storage"])
    assert ext.call("run", "k" * 400) == TOO_LARGE  # storage_get takes at most 300 bytes
    put_ext = host.admit(bare(raw_guest("storage_put")), grants=["storage"])
    assert put_ext.call("run", ["k", b"x" * 33_100]) == TOO_LARGE
    store = host.broker("storage").store  # type: ignore[attr-defined]
    assert store is None or store.usage(Namespace(put_ext.id)) == Usage()


def test_a_raw_guest_gets_not_found_and_same_tenant_names_stay_apart(host: Host) -> None:
    get = host.admit(bare(raw_guest("storage_get"), "raw"), grants=["storage"])
    assert get.call("run", "missing") == -8  # NOT_FOUND
    put_ext = host.admit(bare(raw_guest("storage_put"), "raw2"), grants=["storage"])
    host.grant("raw", "storage", {"tenant": "t"})
    host.grant("raw2", "storage", {"tenant": "t"})
    assert put_ext.call("run", ["k", b"v" * 32768]) is None
    # Another extension, same tenant name: its own namespace still.
    assert get.call("run", "k") == -8
    store = store_of(host)
    assert store.get(Namespace("raw2", "t"), b"k") == b"v" * 32768


# -- paging --------------------------------------------------------------------------------


def test_paging_through_more_than_a_hundred_keys(host: Host) -> None:
    ext = load(host, scope={"max_objects": 250})
    assert ext.call("fill", {"prefix": "k", "size": 1}) == {
        "written": 250,
        "class": "quota_exceeded",
    }
    expected = sorted((f"k{i}" for i in range(250)), key=str.encode)
    pages = []
    after = None
    while True:
        page = ext.call("list", {"prefix": "k", "after": after, "limit": 100})
        pages.append(page["keys"])
        after = page["next"]
        if after is None:
            break
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [k for p in pages for k in p] == expected
    assert all_keys(ext, prefix="k19") == ["k19", "k190", *[f"k19{i}" for i in range(1, 10)]]
    assert all_keys(ext, prefix="k2", limit=7) == sorted(
        (k for k in expected if k.startswith("k2")), key=str.encode
    )
    assert all_keys(ext, prefix="x") == []


def test_a_full_page_of_the_longest_keys_fits_the_response(host: Host) -> None:
    ext = load(host)
    keys = [f"{i:03d}" + "\U0001f600" * 63 + "z" for i in range(101)]  # 3 + 252 + 1 bytes
    assert all(len(k.encode()) == 256 for k in keys)
    for key in keys:
        put(ext, key, b"")
    page = ext.call("list", {"prefix": "", "after": None, "limit": 100})
    assert page == {"keys": keys[:100], "next": keys[99]}
    assert ext.call("list", {"prefix": "", "after": keys[99], "limit": 100}) == {
        "keys": keys[100:],
        "next": None,
    }


# -- commits through the grant table --------------------------------------------------------


class PausingStorage(ExtensionStorage):
    """Pauses the ``pause_at``-th request after the gate and the namespace look-up, before
    its write commits: where a revocation that must win would land."""

    def __init__(self, ext: Extension, store: KVStore, broker: PausingBroker) -> None:
        super().__init__(ext, store)
        self.requests = 0
        self.pause_at = broker.pause_at
        self.paused = broker.paused
        self.resume = broker.resume

    def where(self) -> tuple[Namespace, Quota]:
        found = super().where()
        self.requests += 1
        if self.requests == self.pause_at:
            self.paused.set()
            assert self.resume.wait(30)
        return found


class PausingBroker(StorageBroker):
    def __init__(self, pause_at: int) -> None:
        super().__init__()
        self.pause_at = pause_at
        self.paused = threading.Event()
        self.resume = threading.Event()

    def open(self, ext: Extension) -> PausingStorage:
        return PausingStorage(ext, super().open(ext).store, self)


@pytest.mark.parametrize("whole", [False, True])
def test_no_write_lands_after_revoke_returns(whole: bool, cache: Path) -> None:
    """A put authorised before the revocation (it passed the gate) but not yet committed
    when revoke() returns is refused at commit; and no later one lands."""
    broker = PausingBroker(pause_at=25)
    with new_host(cache, brokers=[broker]) as h:
        ext = load(h)
        result: list[Any] = []
        worker, errors = run_in_thread(
            lambda: result.append(ext.call("fill", {"prefix": "r", "size": 8}))
        )
        assert broker.paused.wait(30)
        if whole:
            h.revoke(ext.id, None, "test")
        else:
            h.revoke(ext.id, "storage")
        store = store_of(h)
        landed = store.usage(Namespace(ext.id)).objects
        broker.resume.set()
        worker.join(30)
        assert landed == 24  # the 25th put was paused before its commit
        assert store.usage(Namespace(ext.id)).objects == landed
        assert store.get(Namespace(ext.id), b"r24") is None
        # The paused put's commit answers DENIED; after a whole revocation the interrupt may
        # end the call instead.
        if errors:
            assert whole and isinstance(errors[0], ExtensionRevoked)
        else:
            assert result == [{"written": landed, "class": "denied"}]


# -- durability ------------------------------------------------------------------------------


def test_state_dir_storage_survives_a_host_restart_and_is_private(
    tmp_path: Path, cache: Path
) -> None:
    state = tmp_path / "state"
    for _ in range(2):
        with new_host(cache, state_dir=state) as h:
            h.grant(FIXTURE_ID, "storage")
            ext = h.load(FIXTURE)
            before = ext.call("get", {"key": "n"})
            put(ext, "n", (before or b"") + b"+")
    store = KVStore(state / DB_NAME)
    assert store.get(Namespace(FIXTURE_ID), b"n") == b"++"
    store.close()
    assert stat.S_IMODE((state / DB_NAME).stat().st_mode) == 0o600


def test_an_explicit_path_is_used_and_memory_is_lost_at_close(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "kv.sqlite3"
    with new_host(cache, brokers=[StorageBroker(path)]) as h:
        put(load(h, "p"), "k", b"kept")
    with new_host(cache, brokers=[StorageBroker(path)]) as h:
        assert load(h, "p").call("get", {"key": "k"}) == b"kept"
    with new_host(cache) as h:
        ext = load(h, "m")
        put(ext, "k", b"gone")
        ext.close()
        assert load(h, "m").call("get", {"key": "k"}) == b"gone"  # the host still holds it
    with new_host(cache) as h:
        assert load(h, "m").call("get", {"key": "k"}) is None


def test_a_failing_database_is_unavailable_to_the_guest_and_logged_for_the_host(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = KVStore(None)
    with new_host(cache, brokers=[StorageBroker(store=store)]) as h:
        ext = load(h)
        put(ext, "k", b"v")
        store.close()  # the database goes away under the broker
        with caplog.at_level(logging.ERROR, logger="wasihost"):
            assert guest_error(ext, "get", {"key": "k"}) == "unavailable"
            assert guest_error(ext, "put", {"key": "k", "value": b"w"}) == "unavailable"
        assert "storage database failed" in caplog.text
        assert ext.lifecycle.state is State.RUNNING  # a status, not a crash


def test_a_full_disk_refuses_the_write_whole_and_the_store_carries_on(cache: Path) -> None:
    store = KVStore(None)
    with new_host(cache, brokers=[StorageBroker(store=store)]) as h:
        ext = load(h)
        put(ext, "small", b"s")
        # SQLite's own limit on the file's size: the next big value does not fit.
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 2}")
        assert guest_error(ext, "put", {"key": "big", "value": b"b" * 32768}) == "unavailable"
        assert ext.call("get", {"key": "big"}) is None
        put(ext, "small", b"t")  # the failed transaction left nothing open
        assert store.usage(Namespace(ext.id)) == Usage(6, 1)
        assert store.check() == []
    store.close()


def test_concurrent_extensions_write_consistently(host: Host) -> None:
    exts = [load(host, f"c{i}", scope={"max_objects": 300}) for i in range(3)]
    threads = [run_in_thread(lambda e=e: e.call("fill", {"prefix": "", "size": 100})) for e in exts]
    for worker, errors in threads:
        worker.join(60)
        assert errors == []
    store = store_of(host)
    assert store.check() == []
    for ext in exts:
        assert store.usage(Namespace(ext.id)).objects == len(all_keys(ext)) == 300


CHILD = """
import os, signal, sys
from pathlib import Path
import wasihost.store.kvstore
from wasihost import Host, Policy

state, prefix, kill_inside = Path(sys.argv[1]), sys.argv[2], int(sys.argv[4])
if kill_inside:
    # Die inside the kill_inside-th write transaction, after its row is written and before
    # its usage counter is: the transaction must vanish whole.
    count, seen = wasihost.store.kvstore._count, []
    def dying(*args):
        seen.append(1)
        if len(seen) == kill_inside:
            os.kill(os.getpid(), signal.SIGKILL)
        count(*args)
    wasihost.store.kvstore._count = dying
with Host(Policy(allow={"storage"}), cache_dir=Path(sys.argv[3]), state_dir=state) as host:
    host.grant("org.wasihost.fixtures.storage", "storage")
    ext = host.load("fixtures/storage")
    i = 0
    while True:
        ext.call("churn", {"prefix": prefix, "from": i, "count": 10, "slots": 40, "size": 3000})
        i += 10
        print(i, flush=True)
"""
SLOTS, SIZE = 40, 3000


def churn_states(prefix: str, upto: int) -> Iterator[dict[bytes, int]]:
    """Every state the churn command passes through, one per committed operation, from the
    empty one: key -> the index i whose value it holds."""
    state: dict[bytes, int] = {}
    yield dict(state)
    for i in range(upto):
        state[f"{prefix}{i % SLOTS}".encode()] = i
        yield dict(state)
        if i % 5 == 0:
            state.pop(f"{prefix}{(i + SLOTS // 2) % SLOTS}".encode(), None)
            yield dict(state)


def read_churn(store: KVStore, prefix: str) -> dict[bytes, int]:
    """What the store holds under ``prefix``, each value checked whole."""
    ns = Namespace(FIXTURE_ID)
    found: dict[bytes, int] = {}
    after = None
    while True:
        keys, after = store.list(ns, prefix.encode(), after, 100)
        for key in keys:
            value = store.get(ns, key)
            assert value is not None
            i = int.from_bytes(value[:4], "little")
            assert len(value) == max(4, 1 + i * 7919 % SIZE), (key, i, len(value))
            assert value[4:] == bytes([i % 251]) * (len(value) - 4), (key, i)
            assert key == f"{prefix}{i % SLOTS}".encode()
            found[key] = i
        if after is None:
            return found


def test_a_host_killed_mid_write_leaves_every_value_whole(tmp_path: Path) -> None:
    """A child host (a fresh interpreter) churns through the Rust guest and is SIGKILLed
    while writing: by the parent between two reads of its progress, or by itself inside a
    write transaction. The store it leaves is sound, every value whole, the counters equal
    to the content, and everything it acknowledged is there."""
    state, cache = tmp_path / "state", tmp_path / "cache"
    acknowledged: dict[str, int] = {}
    for round_, kill_inside in enumerate((0, 37, 0)):
        prefix = f"r{round_}-"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(state), prefix, str(cache), str(kill_inside)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "RUST_BACKTRACE": "0", "PYTHONPATH": str(ROOT)},
        )
        assert child.stdout is not None
        done = 0
        try:
            # Kill it a varying number of calls in, while it is inside the next call's writes
            # (or let it kill itself).
            while done < 20 * (round_ + 1):
                line = child.stdout.readline()
                if not line and kill_inside:
                    break
                assert line, child.communicate()[1][-2000:]
                done = int(line)
        finally:
            child.send_signal(signal.SIGKILL)
            rest, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        # Calls it finished between our last read and the kill were acknowledged too.
        acknowledged[prefix] = int(rest.split()[-1]) if rest.split() else done
        store = KVStore(state / DB_NAME)
        try:
            assert store.check() == []
            for earlier, acked in acknowledged.items():
                found = read_churn(store, earlier)
                # The store is exactly the state after some whole number of operations, at or
                # past the last acknowledged call: no torn value, no lost acknowledged write.
                states = list(churn_states(earlier, acked + 10))
                first = len(list(churn_states(earlier, acked))) - 1
                assert found in states[first:], (earlier, acked)
        finally:
            store.close()


# -- operator surfaces -----------------------------------------------------------------------


def test_the_cli_keeps_storage_in_the_state_dir_under_the_granted_tenant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = ["--state-dir", str(tmp_path / "state")]

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, *state])
        out, err = capsys.readouterr()
        return code, out, err

    assert cli("install", str(FIXTURE))[0] == 0
    code, _, err = cli("grants", "grant", FIXTURE_ID, "storage", "--scope", '{"tenant":"A/B"}')
    assert code == 1 and "tenant must be" in err
    assert cli("grants", "grant", FIXTURE_ID, "storage", "--scope", '{"tenant":"acme"}')[0] == 0
    put_input = '{"key": "k", "value": {"$bytes": "6869"}}'
    assert cli("run", FIXTURE_ID, "put", "--input", put_input)[:2] == (0, "null\n")
    assert cli("run", FIXTURE_ID, "get", "--input", '{"key": "k"}')[:2] == (
        0,
        '{"$bytes": "6869"}\n',
    )
    store = KVStore(tmp_path / "state" / DB_NAME)
    assert store.get(Namespace(FIXTURE_ID, "acme"), b"k") == b"hi"
    store.close()
    assert main(["inspect", str(FIXTURE), "--grant", "storage", "--json"]) == 0
    out = capsys.readouterr().out
    assert (
        "storage: the extension's own namespace, at most 1048576 B in 10000 keys (a grant "
        "scope may lower both)"
    ) in json.loads(out)["enforced"]


# -- the store against a model ----------------------------------------------------------------

KEYS = st.sampled_from([b"a", b"ab", b"b", b"\xc3\xa9", b"a/b"])
VALUES = st.binary(max_size=12)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("delete"), KEYS),
        st.tuples(st.just("cas"), KEYS, st.none() | VALUES, st.none() | VALUES),
    ),
    max_size=40,
)


@given(ops=OPS, max_bytes=st.integers(0, 40), max_objects=st.integers(0, 4))
def test_the_store_matches_a_dictionary_under_quotas(
    ops: list[tuple[Any, ...]], max_bytes: int, max_objects: int
) -> None:
    """Any sequence of writes: the store answers as a dict with the same quota rule would,
    a refused write changes nothing, and the counters always equal the content."""
    store = KVStore(None)
    ns, other = Namespace("x"), Namespace("x", "t")
    quota = Quota(max_bytes, max_objects)
    model: dict[bytes, bytes] = {}

    def fits(key: bytes, value: bytes) -> bool:
        size = sum(len(k) + len(v) for k, v in model.items())
        old = len(key) + len(model[key]) if key in model else 0
        grows = len(key) + len(value) - old
        return (grows <= 0 or size + grows <= max_bytes) and (
            key in model or len(model) < max_objects
        )

    try:
        store.put(other, b"a", b"other tenant", Quota(100, 1))
        for op in ops:
            if op[0] == "delete":
                assert store.delete(ns, op[1]) == (model.pop(op[1], None) is not None)
                continue
            key = op[1]
            expected, new = (model.get(key), op[2]) if op[0] == "put" else (op[2], op[3])
            matches = model.get(key) == expected
            refused = matches and new is not None and not fits(key, new)
            try:
                if op[0] == "put":
                    store.put(ns, key, new, quota)
                else:
                    assert store.cas(ns, key, expected, new, quota) == matches
            except QuotaExceeded:
                assert refused
            else:
                assert not refused
                if matches and new is None:
                    model.pop(key, None)
                elif matches:
                    model[key] = new
            assert {k: store.get(ns, k) for k in model} == model
        keys, _ = store.list(ns, b"", None, 100)
        assert keys == sorted(model)
        assert store.usage(ns) == Usage(sum(len(k) + len(v) for k, v in model.items()), len(model))
        assert store.get(other, b"a") == b"other tenant"
        assert store.check() == []
    finally:
        store.close()


def test_an_update_checkpoint_restores_the_entries_of_every_tenant(
    cache: Path, tmp_path: Path
) -> None:
    """The storage broker takes part in an update's checkpoint (wasihost.host.updates): a restore
    brings back exactly what the extension stored at the checkpoint, in every tenant, and
    leaves other extensions' entries alone."""
    from wasihost.host.updates import restore_checkpoint, take_checkpoint

    with new_host(cache, state_dir=tmp_path / "state") as host:
        for name in ("upd", "other"):
            host.grant(name, "storage")  # with a state directory, the grant table decides
        ext = load(host, "upd.wasm")
        other = load(host, "other.wasm")
        put(ext, "a", b"1")
        put(ext, "b", b"2")
        put(other, "a", b"other")
        checkpoint = take_checkpoint(host, ext.id, "0.1.0")
        put(ext, "a", b"changed")
        assert ext.call("delete", {"key": "b"}) is True
        put(ext, "c", b"new")
        put(other, "z", b"after")
        restore_checkpoint(host, ext.id, checkpoint)
        assert all_keys(ext) == ["a", "b"]
        assert ext.call("get", {"key": "a"}) == b"1"
        assert all_keys(other) == ["a", "z"]  # another extension's entries are not touched
        assert store_of(host).check() == []
