"""The secrets broker and stores: guests use secrets by name and never see them."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import cbor2
import pytest

from tests.support.common import FIXTURES, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers.secrets import SecretsBroker, normalize_origin, use_secret
from wasihost.core.errors import AdmissionError, CallError, ConfigError
from wasihost.core.status import HostStatus, Status
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.store.secrets import (
    MAX_SECRET_BYTES,
    EnvSecretStore,
    FileSecretStore,
    MemorySecretStore,
    SecretUnavailable,
)

SECRET = b"s3cr3t-token-that-must-never-leak-0123456789"
FIXTURE = FIXTURES / "secrets"


def mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


@pytest.fixture
def store() -> MemorySecretStore:
    return MemorySecretStore({"signing": SECRET, "other": b"another secret"})


@pytest.fixture
def broker(store: MemorySecretStore) -> SecretsBroker:
    return SecretsBroker(store)


@pytest.fixture
def host(broker: SecretsBroker) -> Iterator[Host]:
    with Host(Policy(allow={"secrets", "log"}), cache_dir=None, brokers=[broker]) as h:
        yield h


@pytest.fixture
def signer(host: Host) -> Extension:
    ext = host.load(FIXTURE)
    host.grant(ext.id, "secrets", {"names": ["signing"]})
    return ext


def sign(ext: Extension, name: str, data: bytes = b"order 42") -> bytes:
    out = ext.call("sign", {"name": name, "data": data})
    assert isinstance(out, bytes)
    return out


def guest_class(ext: Extension, name: str) -> str | None:
    with pytest.raises(CallError) as info:
        sign(ext, name)
    return info.value.guest_class


# -- through the engine, with the Rust fixture --------------------------------------------------


def test_a_guest_signs_with_a_granted_secret(signer: Extension) -> None:
    assert sign(signer, "signing", b"order 42") == mac(SECRET, b"order 42")
    assert sign(signer, "signing", b"") == mac(SECRET, b"")


def test_a_name_not_granted_is_denied_and_a_missing_one_not_found(
    host: Host, signer: Extension
) -> None:
    assert guest_class(signer, "other") == "denied"  # in the store, not in the scope
    host.grant(signer.id, "secrets", {"names": ["signing", "absent"]})
    assert guest_class(signer, "absent") == "not_found"
    assert guest_class(signer, "Bad/Name") == "invalid_argument"


def test_revoking_a_secret_takes_effect_at_once_and_rotation_too(
    host: Host, broker: SecretsBroker, store: MemorySecretStore, signer: Extension
) -> None:
    assert sign(signer, "signing") == mac(SECRET, b"order 42")
    store.set("signing", b"rotated")
    assert sign(signer, "signing") == mac(b"rotated", b"order 42")
    broker.revoke("signing")
    assert guest_class(signer, "signing") == "denied"
    broker.reinstate("signing")
    assert sign(signer, "signing") == mac(b"rotated", b"order 42")
    host.revoke(signer.id, "secrets")
    with pytest.raises(CallError):
        sign(signer, "signing")


def test_a_scope_only_for_headers_does_not_allow_signing(host: Host, signer: Extension) -> None:
    host.grant(signer.id, "secrets", {"headers": {"signing": ["https://api.example.com"]}})
    assert guest_class(signer, "signing") == "denied"
    # The http broker's way in: only for the origin the operator bound the secret to.
    assert use_secret(signer, "signing", "https://api.example.com:443") == SECRET
    for origin in ("https://evil.example.com:443", "http://api.example.com:80", None):
        with pytest.raises(HostStatus) as info:
            use_secret(signer, "signing", origin)
        assert info.value.status == Status.DENIED


def test_malformed_scopes_are_refused_before_they_are_stored(host: Host, signer: Extension) -> None:
    for scope, message in [
        ({"nmes": ["a"]}, "unknown keys nmes"),
        ({"names": "signing"}, "must be a list"),
        ({"names": ["../etc/passwd"]}, "not 1..64"),
        ({"headers": {"signing": []}}, "1..16 origins"),
        ({"headers": {"signing": ["ftp://x"]}}, "http or https"),
        ({"headers": {"signing": ["https://x/path"]}}, "nothing more"),
    ]:
        with pytest.raises(ConfigError, match=message):
            host.grant(signer.id, "secrets", scope)


def test_a_guest_built_for_1_0_cannot_import_secret_hmac(host: Host) -> None:
    wasm = build(guest_wat(imports=host_import("secret_hmac"), marker="1.0"))
    with pytest.raises(AdmissionError, match="secret_hmac"):
        host.admit(bare(wasm), grants=["secrets"])


# -- exfiltration: the plaintext reaches no guest-visible place ---------------------------------

REQ_AT, RESP_AT, RET_AT = 8192, 6144, 5120
PAGE = 65536


def dumping_guest(request: object) -> bytes:
    """Calls secret_hmac with ``request`` and answers its whole first page of memory (as one
    CBOR byte string after the output's status word at address 0), where any leaked byte
    would be; the call's return value is at ``RET_AT``."""
    blob = cbor2.dumps(request)
    header = b"\0\0\0\0\x5a" + (PAGE - 9).to_bytes(4, "big")
    body = f"""
    (i32.store (i32.const {RET_AT})
      (call $secret_hmac (i32.const {REQ_AT}) (i32.const {len(blob)})
                         (i32.const {RESP_AT}) (i32.const 64)))
    (call $packed (i32.const 0) (i32.const {PAGE}))"""
    extra = f"""
  (data (i32.const 0) "{escape(header)}")
  (data (i32.const {REQ_AT}) "{escape(blob)}")"""
    return build(guest_wat(body, imports=host_import("secret_hmac"), marker="1.1", extra=extra))


def test_the_plaintext_never_enters_guest_memory_logs_or_errors(
    host: Host, broker: SecretsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="wasihost")
    ext = host.admit(bare(dumping_guest(["signing", b"data"])), grants=["secrets", "log"])
    host.grant(ext.id, "secrets", {"names": ["signing"]})
    memory = ext.call("run")
    assert isinstance(memory, bytes) and len(memory) == PAGE - 9
    assert returned(memory) == 34
    assert memory[RESP_AT - 9 : RESP_AT - 9 + 34] == b"\x58\x20" + mac(SECRET, b"data")
    broker.revoke("signing")  # a denied use, an error path, leaks nothing either
    denied = ext.call("run")
    assert returned(denied) == -Status.DENIED and SECRET not in denied
    assert SECRET not in memory
    assert SECRET.decode() not in caplog.text
    assert all(SECRET.decode() not in r.message for r in ext.log.records)
    assert SECRET.decode() not in repr(broker.store)


def test_an_unsafe_file_secret_is_refused_and_the_log_names_it_without_its_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    (directory / "signing").write_bytes(SECRET + b"\n")
    os.chmod(directory / "signing", 0o644)
    with Host(
        Policy(allow={"secrets"}),
        cache_dir=None,
        brokers=[SecretsBroker(FileSecretStore(directory))],
    ) as host:
        ext = host.load(FIXTURE)
        host.grant(ext.id, "secrets", {"names": ["signing"]})
        assert guest_class(ext, "signing") == "unavailable"
        assert "mode 0644" in caplog.text and SECRET.decode() not in caplog.text
        os.chmod(directory / "signing", 0o600)
        assert sign(ext, "signing") == mac(SECRET, b"order 42")  # the newline is not the key


def returned(memory: bytes) -> int:
    at = RET_AT - 9
    return int.from_bytes(memory[at : at + 4], "little", signed=True)


def test_hostile_requests_are_invalid_before_any_secret_is_read() -> None:
    class Counting(MemorySecretStore):
        reads = 0

        def read(self, name: str) -> bytes | None:
            Counting.reads += 1
            return super().read(name)

    broker = SecretsBroker(Counting({"signing": SECRET}))
    host = Host(Policy(allow={"secrets"}), cache_dir=None, brokers=[broker])

    for request in [
        "signing",
        ["signing"],
        ["signing", "text, not bytes"],
        [b"signing", b"x"],
        ["signing", b"x", b"extra"],
        ["signing", b"x" * (16 * 1024 + 1)],
        [None, b"x"],
    ]:
        ext = host.admit(bare(dumping_guest(request)), grants=["secrets"])
        host.grant(ext.id, "secrets", {"names": ["signing"]})
        assert returned(ext.call("run")) == -Status.INVALID_ARGUMENT, request
    assert Counting.reads == 0
    ext = host.admit(bare(dumping_guest(["signing", b"x"])), grants=["secrets"])
    host.grant(ext.id, "secrets", {"names": ["signing"]})
    assert returned(ext.call("run")) == 34 and Counting.reads == 1
    host.close()


# -- the stores ----------------------------------------------------------------------------------


def test_file_store_checks_the_directory_and_each_file_on_its_handle(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(ConfigError, match="mode 0700"):
        FileSecretStore(loose)
    (tmp_path / "link").symlink_to(loose)
    with pytest.raises(ConfigError, match="not a link"):
        FileSecretStore(tmp_path / "link")
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    store = FileSecretStore(good)
    assert store.read("absent") is None
    (good / "plain").write_bytes(b"value")
    os.chmod(good / "plain", 0o600)
    assert store.read("plain") == b"value"
    (tmp_path / "outside").write_bytes(b"outside")
    os.chmod(tmp_path / "outside", 0o600)
    (good / "linked").symlink_to(tmp_path / "outside")
    with pytest.raises(SecretUnavailable, match="link"):
        store.read("linked")
    (good / "big").write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    os.chmod(good / "big", 0o600)
    with pytest.raises(SecretUnavailable, match="over"):
        store.read("big")
    (good / "dir").mkdir(mode=0o700)
    with pytest.raises(SecretUnavailable, match="regular file"):
        store.read("dir")
    with pytest.raises(ConfigError):
        store.read("../outside")
    os.chmod(good, 0o750)  # loosened after construction: refused at the next use
    with pytest.raises(SecretUnavailable, match="mode 0700"):
        store.read("plain")


def test_env_store_maps_names_to_prefixed_variables() -> None:
    store = EnvSecretStore(environ={"WASIHOST_SECRET_API_TOKEN": "tok", "WASIHOST_SECRET_E": ""})
    assert store.read("api_token") == b"tok"
    assert store.read("api-token") is None  # would be ambiguous with api_token
    assert store.read("absent") is None
    with pytest.raises(SecretUnavailable):
        store.read("e")
    with pytest.raises(ConfigError):
        EnvSecretStore(prefix="lower_")


def test_origins_normalise_to_scheme_host_and_explicit_port() -> None:
    assert normalize_origin("HTTPS://API.Example.com") == "https://api.example.com:443"
    assert normalize_origin("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert normalize_origin("http://[::1]:80") == "http://[::1]:80"
    for bad in ["https://u:p@x", "https://x/a", "https://x?q", "file:///etc", "https://x:99999", 7]:
        with pytest.raises(ValueError, match="origin"):
            normalize_origin(bad)


def test_the_command_line_serves_a_secrets_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wasihost.cli import main

    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    (directory / "signing").write_bytes(SECRET)
    os.chmod(directory / "signing", 0o600)
    data = {"name": "signing", "data": {"$bytes": b"order".hex()}}
    argv = ["run", str(FIXTURE), "sign", "--input", json.dumps(data), "--no-cache"]
    assert main([*argv, "--secrets-dir", str(directory), "--secret", "signing"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"$bytes": mac(SECRET, b"order").hex()}
    # Granted the directory but not the name: the guest is denied, the secret stays put.
    assert main([*argv, "--secrets-dir", str(directory), "--secret", "other"]) == 1
    err = capsys.readouterr().err
    assert "denied" in err and SECRET.decode() not in err
    assert main([*argv, "--secret", "signing"]) == 2
    assert "--secret NAME needs --secrets-dir" in capsys.readouterr().err
