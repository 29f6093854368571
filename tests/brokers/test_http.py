"""The http broker (brokers/http.py) and its destination policy (netpolicy.py): a Rust guest
(fixtures/httpget) and hostile WAT guests against a server this module starts on 127.0.0.1.

The resolver is injected: ``api.test`` and friends resolve to the test server's 127.0.0.1 (or
to the address a refusal test needs), so the refusals are tested through real names."""

from __future__ import annotations

import base64
import gzip
import html
import http.server
import ipaddress
import logging
import re
import shutil
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.common import FIXTURES, FakeClock, bare, run_in_thread
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers.http import (
    MAX_REQUEST_BODY_BYTES,
    MAX_RESPONSE_BODY_BYTES,
    HourlyQuota,
    HttpBroker,
)
from wasihost.brokers.secrets import SecretsBroker
from wasihost.core.errors import AdmissionError, CallError, ConfigError, FailureClass, ManifestError
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.core.manifest import DEFAULT_HTTP_BYTES_PER_HOUR, parse_manifest
from wasihost.core.netpolicy import (
    NetPolicyError,
    Origin,
    address_class,
    address_refusal,
    origin_allowed,
    parse_origin,
    parse_pattern,
    parse_url,
)
from wasihost.core.scrub import MIN_FORM_BYTES, Unscrubbable, scrub, scrub_text, secret_forms
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.store.secrets import MemorySecretStore
from wasihost.supervisor.governor import Governor

HTTPGET = FIXTURES / "httpget"
# How long the slow handler holds a request at most, so a failing test still ends.
SLOW_HOLD_S = 5.0


class Server:
    """A small HTTP/1.1 server on 127.0.0.1 that records what reached it."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.slow_entered = threading.Event()
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = SLOW_HOLD_S

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append((self.command, self.path, headers, body))
                if self.path == "/slow":
                    server.slow_entered.set()
                    server.release.wait(SLOW_HOLD_S)
                    return self._answer(200, b"late")
                if self.path.startswith("/redirect"):
                    return self._answer(302, b"", [("Location", server.url("evil.test", "/hello"))])
                if self.path == "/big":
                    return self._answer(200, b"x" * (MAX_RESPONSE_BODY_BYTES + 1))
                if self.path == "/exact":
                    return self._answer(200, b"y" * MAX_RESPONSE_BODY_BYTES)
                if self.path == "/reflect-escaped":
                    return self._reflect_escaped(headers)
                if self.path.startswith("/reflect"):
                    return self._reflect(headers, gzipped=self.path == "/reflect-gzip")
                if self.path == "/many-headers":
                    return self._answer(200, b"", [(f"X-H{i}", "v" * 200) for i in range(60)])
                extra = [
                    ("X-Got-Host", headers.get("host", "")),
                    ("X-Got-Method", self.command),
                    ("X-Got-Framing", headers.get("transfer-encoding", "none")),
                ]
                return self._answer(200, body if self.command != "GET" else b"hello", extra)

            def _reflect(self, headers: dict[str, str], gzipped: bool) -> None:
                # What careless servers do with a request's credentials: echo them as headers,
                # and in the body raw, in base64 inside Basic credentials, in hex, quoted.
                value = headers.get("authorization", "").encode("latin-1")
                token = value.split(b" ", 1)[-1]
                body = b"\n".join(
                    [
                        value,
                        b"Basic " + base64.b64encode(b"user:" + token),
                        b"Basic " + base64.b64encode(b"us:" + token),
                        base64.urlsafe_b64encode(b"x" + token),
                        token.hex().encode(),
                        token.hex().upper().encode(),
                        urllib.parse.quote_from_bytes(token, safe="").encode(),
                    ]
                )
                extra = [("X-Echo-Authorization", value.decode("latin-1"))]
                if gzipped:
                    body = gzip.compress(body)
                    extra.append(("Content-Encoding", "gzip"))
                self._answer(200, body, extra)

            def _reflect_escaped(self, headers: dict[str, str]) -> None:
                # The token echoed as servers escape text: PHP's json_encode ('/' as '\\/'),
                # JSON's \\u00XX, Python's quote (which keeps '/'), lowercase percent-escapes,
                # HTML references, and hex in mixed case; a Basic credential JSON-escaped too.
                token = headers.get("authorization", "").split(" ", 1)[-1].encode("latin-1")
                php = token.replace(b"/", b"\\/")
                lower_hex = urllib.parse.quote_from_bytes(token, safe="").encode()
                lower_hex = re.sub(rb"%[0-9A-F]{2}", lambda m: m.group().lower(), lower_hex)
                body = b"\n".join(
                    [
                        b'{"authorization": "Bearer ' + php + b'"}',
                        b"".join(b"\\u%04x" % b if b in b"/+=?" else bytes([b]) for b in token),
                        urllib.parse.quote(token).encode(),
                        lower_hex,
                        b"".join(b"&#%d;" % b if b in b"/+=?" else bytes([b]) for b in token),
                        b"".join(b"&#x%X;" % b if b in b"/+=?" else bytes([b]) for b in token),
                        token.hex()[:9].encode() + token.hex()[9:].upper().encode(),
                        b"Basic " + base64.b64encode(b"user:" + token).replace(b"/", b"\\/"),
                    ]
                )
                echoed = urllib.parse.quote(token.decode("latin-1"))
                self._answer(200, body, [("X-Echo-Quoted", echoed)])

            def _answer(
                self, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()
            ) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up (the host cancelling) is expected here

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str, path: str = "/hello", scheme: str = "http") -> str:
        return f"{scheme}://{name}:{self.port}{path}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(SLOW_HOLD_S)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _clear_requests(server: Server) -> None:
    server.requests.clear()
    server.release.clear()
    server.slow_entered.clear()


# What each test name resolves to. ``mixed.test`` has a public address and a loopback one: a
# name is refused if any of its answers is.
ADDRESSES: dict[str, list[str]] = {
    "api.test": ["127.0.0.1"],
    "evil.test": ["127.0.0.1"],
    "meta.test": ["169.254.169.254"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "ten.test": ["10.20.30.40"],
    "nat64.test": ["64:ff9b::7f00:1"],
    "mixed.test": ["93.184.216.34", "127.0.0.1"],
    "one.svc.test": ["127.0.0.1"],
    "fallback.test": ["::1", "127.0.0.1"],  # the server listens on the second only
    "two.svc.test": ["127.0.0.1"],
}


def resolve(name: str, port: int) -> list[str]:
    if name not in ADDRESSES:
        raise socket.gaierror(socket.EAI_NONAME, "unknown name")
    return ADDRESSES[name]


def http_host(cache: Path, clock: FakeClock | None = None) -> Host:
    broker = HttpBroker(resolver=resolve, clock=clock or time.monotonic)
    # The host's network budget (governor.py) counts the same bytes on its own clock.
    governor = Governor(clock=clock or time.monotonic)
    return Host(Policy(allow={"http", "log"}), cache_dir=cache, brokers=[broker], governor=governor)


@pytest.fixture
def host(cache: Path) -> Iterator[Host]:
    with http_host(cache) as h:
        yield h


def package(tmp_path: Path, origins: Sequence[str], bytes_per_hour: int = 1_048_576) -> Path:
    """fixtures/httpget with its manifest naming ``origins`` (the server's port varies)."""
    target = tmp_path / "httpget"
    shutil.copytree(HTTPGET, target, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    manifest = (target / "extension.toml").read_text()
    listed = ", ".join(f'"{o}"' for o in origins)
    manifest = manifest.replace(
        'allowed_origins = ["http://api.test:8080"]', f"allowed_origins = [{listed}]"
    ).replace("bytes_per_hour = 1_048_576", f"bytes_per_hour = {bytes_per_hour}")
    (target / "extension.toml").write_text(manifest)
    return target


def load(
    host: Host,
    tmp_path: Path,
    server: Server,
    *,
    local: bool = True,
    names: Sequence[str] = (),
    bytes_per_hour: int = 1_048_576,
) -> Extension:
    origins = [f"http://{n}:{server.port}" for n in dict.fromkeys(("api.test", *names))]
    ext = host.load(package(tmp_path, origins, bytes_per_hour))
    host.grant(ext.id, "http", {"allow_local_network": True} if local else {})
    return ext


def guest_class(ext: Extension, command: str, value: Any, **kw: Any) -> str | None:
    with pytest.raises(CallError) as info:
        ext.call(command, value, **kw)
    assert info.value.failure is FailureClass.GUEST_ERROR, info.value
    return info.value.guest_class


# -- the Rust guest through the real engine ----------------------------------------------------


def test_a_rust_guest_gets_and_posts_through_an_allowed_origin(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server)
    got = ext.call("fetch", {"url": server.url("api.test")})
    assert got["status"] == 200 and got["body"] == b"hello"
    headers = dict(got["headers"])
    # Pinned to 127.0.0.1, yet the server saw the name the guest asked for.
    assert headers["X-Got-Host"] == f"api.test:{server.port}"
    posted = ext.call(
        "fetch",
        {
            "method": "POST",
            "url": server.url("api.test", "/echo?x=1"),
            "headers": [["Content-Type", "application/octet-stream"], ["X-Mine", "1"]],
            "body": b"\x00payload",
        },
    )
    assert posted["status"] == 200 and posted["body"] == b"\x00payload"
    method, path, seen, body = server.requests[-1]
    assert (method, path, body) == ("POST", "/echo?x=1", b"\x00payload")
    assert seen["x-mine"] == "1" and seen["content-length"] == "8"
    head = ext.call("fetch", {"method": "HEAD", "url": server.url("api.test")})
    assert head["status"] == 200 and head["body"] == b""


@pytest.mark.parametrize(
    "url",
    [
        "http://evil.test:{port}/hello",  # not in the manifest
        "http://api.test:{other}/hello",  # another port
        "https://api.test:{port}/hello",  # another scheme
        "http://127.0.0.1:{port}/hello",  # the address itself is another origin
        "http://api.test/hello",  # the default port is a port like any other
    ],
)
def test_an_origin_the_manifest_does_not_list_is_denied_unsent(
    host: Host, tmp_path: Path, server: Server, url: str
) -> None:
    ext = load(host, tmp_path, server)
    url = url.format(port=server.port, other=server.port + 1)
    ext.log.drain()
    assert guest_class(ext, "fetch", {"url": url}) == "denied"
    assert server.requests == []
    # The guest sees DENIED; the extension's log says which origin and why (issue 35 item 4).
    (said,) = [r for r in ext.log.drain() if r.source == "host"]
    assert said.message.startswith("http: refused a request to ")
    assert said.message.endswith(": the origin is not one of the manifest's [http] allowed_origins")


@pytest.mark.parametrize(
    "name", ["api.test", "meta.test", "mapped.test", "ten.test", "nat64.test", "mixed.test"]
)
def test_an_allowed_name_resolving_to_a_local_address_is_denied(
    host: Host, tmp_path: Path, server: Server, name: str
) -> None:
    ext = load(host, tmp_path, server, local=False, names=[name])
    ext.log.drain()
    assert guest_class(ext, "fetch", {"url": server.url(name)}) == "denied"
    assert server.requests == []
    (said,) = [r.message for r in ext.log.drain() if r.source == "host"]
    assert said.startswith(
        f"http: refused a request to http://{name}:{server.port}: it resolves to "
    )
    assert "metadata address, never reached" in said or "allow_local_network = true" in said


def test_a_names_checked_addresses_are_tried_in_turn(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server, names=["fallback.test"])
    got = ext.call("fetch", {"url": server.url("fallback.test")})
    assert got["status"] == 200
    assert server.requests[-1][2]["host"] == f"fallback.test:{server.port}"


def test_the_metadata_address_is_denied_even_with_the_local_network(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server, local=True, names=["meta.test"])
    assert guest_class(ext, "fetch", {"url": server.url("meta.test")}) == "denied"


def test_a_redirect_is_returned_and_following_it_is_checked_again(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server)
    got = ext.call("fetch", {"url": server.url("api.test", "/redirect")})
    assert got["status"] == 302
    assert dict(got["headers"])["Location"] == server.url("evil.test", "/hello")
    assert [r[1] for r in server.requests] == ["/redirect"]  # the host did not follow it
    # The guest follows it itself: a new request, to an origin the manifest does not list.
    assert guest_class(ext, "follow", {"url": server.url("api.test", "/redirect")}) == "denied"
    assert [r[1] for r in server.requests] == ["/redirect", "/redirect"]


def test_a_response_over_the_body_limit_is_payload_too_large(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server)
    exact = ext.call("fetch", {"url": server.url("api.test", "/exact")})
    assert len(exact["body"]) == MAX_RESPONSE_BODY_BYTES
    assert guest_class(ext, "fetch", {"url": server.url("api.test", "/big")}) == (
        "payload_too_large"
    )
    assert guest_class(ext, "fetch", {"url": server.url("api.test", "/many-headers")}) == (
        "payload_too_large"
    )


def test_a_slow_server_ends_the_call_at_its_deadline(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server)
    ext.start()
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("fetch", {"url": server.url("api.test", "/slow")}, timeout_ms=300)
    elapsed = time.monotonic() - started
    assert info.value.failure is FailureClass.DEADLINE
    assert elapsed < 1.0, elapsed
    server.release.set()


def test_the_per_request_cap_ends_a_slow_request_as_unavailable(
    tmp_path: Path, server: Server, cache: Path
) -> None:
    broker = HttpBroker(resolver=resolve, max_request_seconds=0.2)
    with Host(Policy(allow={"http"}), cache_dir=cache, brokers=[broker]) as host:
        ext = load(host, tmp_path, server)
        ext.start()
        started = time.monotonic()
        assert guest_class(ext, "fetch", {"url": server.url("api.test", "/slow")}) == (
            "unavailable"
        )
        assert time.monotonic() - started < 1.0  # the call's own deadline is 2 s
        server.release.set()


def test_a_budget_of_zero_bytes_forbids_traffic(host: Host, tmp_path: Path, server: Server) -> None:
    ext = load(host, tmp_path, server, bytes_per_hour=0)
    assert guest_class(ext, "fetch", {"url": server.url("api.test")}) == "quota_exceeded"
    assert server.requests == []


def test_a_disable_interrupts_a_request_in_flight(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = load(host, tmp_path, server)
    ext.start()
    worker, outcome = run_in_thread(
        lambda: ext.call("fetch", {"url": server.url("api.test", "/slow")})
    )
    assert server.slow_entered.wait(5)
    stopped = time.monotonic()
    host.disable(ext.id)
    worker.join(2)
    assert not worker.is_alive()
    assert time.monotonic() - stopped < 1.0
    assert len(outcome) == 1 and isinstance(outcome[0], (CallError, ExtensionRevoked))
    server.release.set()


def test_the_bytes_per_hour_quota_refuses_then_recovers(
    tmp_path: Path, server: Server, cache: Path
) -> None:
    clock = FakeClock()
    with http_host(cache, clock) as host:
        ext = load(host, tmp_path, server, bytes_per_hour=1000)
        ext.call("fetch", {"url": server.url("api.test")})  # a few hundred bytes each way
        statuses = []
        for _ in range(6):
            try:
                ext.call("fetch", {"url": server.url("api.test")})
                statuses.append("ok")
            except CallError as exc:
                statuses.append(str(exc.guest_class))
        assert "quota_exceeded" in statuses
        sent = len(server.requests)
        ext.log.drain()
        assert guest_class(ext, "fetch", {"url": server.url("api.test")}) == "quota_exceeded"
        assert len(server.requests) == sent  # refused before sending
        said = [r.message for r in ext.log.drain() if r.source == "host"]
        # The manifest's bytes_per_hour is also the extension's network budget (budgets.md),
        # which is charged first.
        assert said == [
            f"http: refused a request to http://api.test:{server.port}: its network budget "
            "(network_bytes_per_hour, from the manifest's [http] bytes_per_hour or the host's "
            "policy) is spent for now"
        ]
        clock.now += 3600  # an hour later the account is empty again
        assert ext.call("fetch", {"url": server.url("api.test")})["status"] == 200


def test_a_manifest_without_http_origins_reaches_nothing(
    host: Host, tmp_path: Path, server: Server
) -> None:
    ext = host.load(package(tmp_path, []))
    host.grant(ext.id, "http", {"allow_local_network": True, "origins": ["http://*.svc.test:1"]})
    ext.log.drain()
    assert guest_class(ext, "fetch", {"url": server.url("api.test")}) == "denied"
    assert [r.message for r in ext.log.drain() if r.source == "host"] == [
        f"http: refused a request to http://api.test:{server.port}: the manifest lists no "
        "[http] allowed_origins, so no origin is allowed"
    ]


def test_the_grant_scope_narrows_the_manifest(host: Host, tmp_path: Path, server: Server) -> None:
    ext = load(host, tmp_path, server, names=["evil.test"])
    host.grant(
        ext.id,
        "http",
        {"allow_local_network": True, "origins": [f"http://api.test:{server.port}"]},
    )
    assert ext.call("fetch", {"url": server.url("api.test")})["status"] == 200
    ext.log.drain()
    assert guest_class(ext, "fetch", {"url": server.url("evil.test")}) == "denied"
    (said,) = [r.message for r in ext.log.drain() if r.source == "host"]
    assert said.endswith("that the grant's scope (origins) also allows")


# -- hostile requests from a WAT guest ------------------------------------------------------

RESPONSE_AT = 70000


def wat_guest(request: bytes, marker: str = "1.1") -> bytes:
    """A guest whose command sends ``request`` (raw bytes) to http_request and answers the
    status (0 for a response, -status otherwise) as a CBOR integer."""
    body = f"""
    (global.set $r (call $http_request (i32.const 9000) (i32.const {len(request)})
                                       (i32.const {RESPONSE_AT}) (i32.const 61440)))
    (i32.store8 (i32.const 8004)
      (select (i32.sub (i32.const 0x1f) (global.get $r)) (i32.const 0)
              (i32.lt_s (global.get $r) (i32.const 0))))
    (call $packed (i32.const 8000) (i32.const 5))"""
    extra = "(global $r (mut i32) (i32.const 0))" + (
        f'(data (i32.const 9000) "{escape(request)}")' if request else ""
    )
    return build(
        guest_wat(
            body,
            imports=host_import("http_request"),
            memory='(memory (export "memory") 3)',
            marker=marker,
            extra=extra,
        )
    )


def wat_call(host: Host, request: object, scope: dict[str, Any]) -> int:
    raw = request if isinstance(request, bytes) else cbor2.dumps(request)
    ext = host.admit(bare(wat_guest(raw)), grants=["http"])
    host.grant(ext.id, "http", scope)
    try:
        return int(ext.call("run"))
    finally:
        ext.close()


def ok(**over: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "method": "GET",
        "url": "http://api.test:1/",
        "headers": [],
        "body": None,
    }
    request.update(over)
    return request


MALFORMED: list[object] = [
    b"\xff",  # not CBOR
    "GET http://api.test/",
    ok(extra=1),
    ok(method="CONNECT"),
    ok(method="TRACE"),
    ok(method="get"),
    ok(method=1),
    ok(url=b"http://api.test:1/"),
    ok(url="http://user@api.test:1/"),
    ok(url="http://api.test:1/#frag"),
    ok(url="ftp://api.test:1/"),
    ok(url="http://api.test:1\\@evil.test/"),
    ok(url="http://api.test:99999/"),
    ok(url="http://127.1:1/"),
    ok(url="http://api.test:1/" + "a" * 5000),
    ok(url="http://api.test:1/ space"),
    ok(headers=[["X-A", "one\r\nHost: evil.test"]]),
    ok(headers=[["X-A", "nul\x00"]]),
    ok(headers=[["X A", "v"]]),
    ok(headers=[["X-A\n", "v"]]),
    ok(headers=[["Host", "evil.test"]]),
    ok(headers=[["content-length", "5"]]),
    ok(headers=[["Transfer-Encoding", "chunked"]]),
    ok(headers=[["Connection", "close"]]),
    ok(headers=[["X-A", "v"]] * 65),
    ok(headers=[["X-A", "v" * 8193]]),
    ok(headers=[["X-A"]]),
    ok(headers=[["X-A", 1]]),
    ok(headers=[["X-A", {"secret": "k"}]]),
    ok(headers={"X-A": "v"}),
    ok(body="text"),
    ok(body=b"b" * (MAX_REQUEST_BODY_BYTES + 1)),
]


@pytest.mark.parametrize("request_value", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_request_is_invalid_argument_unsent(
    host: Host, server: Server, request_value: object
) -> None:
    scope = {"allow_local_network": True, "origins": ["http://api.test:1"]}
    assert wat_call(host, request_value, scope) == -2  # INVALID_ARGUMENT
    assert server.requests == []


def test_a_request_over_the_entry_limit_is_payload_too_large(host: Host) -> None:
    huge = ok(body=b"b" * 41000)
    assert wat_call(host, huge, {"allow_local_network": True}) == -3  # PAYLOAD_TOO_LARGE


def test_a_bare_module_reaches_only_what_the_scope_names(host: Host, server: Server) -> None:
    url = server.url("one.svc.test")
    assert wat_call(host, ok(url=url), {"allow_local_network": True}) == -1  # DENIED
    wildcard = {"allow_local_network": True, "origins": [f"http://*.svc.test:{server.port}"]}
    assert wat_call(host, ok(url=url), wildcard) == 0
    assert wat_call(host, ok(url=server.url("two.svc.test")), wildcard) == 0
    assert wat_call(host, ok(url=server.url("api.test")), wildcard) == -1
    assert len(server.requests) == 2
    closed = {"allow_local_network": True, "origins": ["http://api.test:1"]}
    assert wat_call(host, ok(url="http://api.test:1/"), closed) == -6  # UNAVAILABLE
    assert (
        wat_call(
            host,
            ok(url="http://nowhere.test:1/"),
            {"allow_local_network": True, "origins": ["http://nowhere.test:1"]},
        )
        == -6
    )


def test_a_1_0_guest_importing_http_request_is_refused_at_admission(host: Host) -> None:
    with pytest.raises(AdmissionError) as info:
        host.admit(bare(wat_guest(cbor2.dumps(ok()), marker="1.0")), grants=["http"])
    assert any("http_request" in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    "scope",
    [
        {"origins": "https://api.example.com"},
        {"origins": ["https://api.example.com/path"]},
        {"origins": ["https://*.com.*"]},
        {"origins": ["ftp://example.com"]},
        {"origins": [1]},
        {"allow_local_network": "yes"},
        {"hosts": []},
    ],
)
def test_a_malformed_grant_scope_is_refused(host: Host, scope: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        host.grant("org.example.any", "http", scope)


# -- the manifest's [http] table ------------------------------------------------------------

BASE = """
[extension]
schema = "wasihost-manifest/1"
id = "org.example.web"
version = "1.0.0"
abi = "1.1"
module = "web.wasm"
[capabilities]
required = ["http"]
[commands]
run = {}
"""


def manifest(http: str) -> Any:
    # A top-level key must come before the first table header.
    text = http + BASE if not http.startswith("[") else BASE + http
    return parse_manifest(text, frozenset({"http"}))


def test_the_http_table_parses_origins_and_budget() -> None:
    m = manifest(
        '[http]\nallowed_origins = ["https://API.example.com", "http://127.0.0.1:8080/"]\n'
        "bytes_per_hour = 1000\n"
    )
    assert m.http.allowed_origins == (
        Origin("https", "api.example.com", 443),
        Origin("http", "127.0.0.1", 8080),
    )
    assert m.http.bytes_per_hour == 1000
    assert manifest("").http.allowed_origins == ()
    assert manifest("").http.bytes_per_hour == DEFAULT_HTTP_BYTES_PER_HOUR


@pytest.mark.parametrize(
    ("http", "key"),
    [
        ("[http]\nallowed = []", "http.allowed"),
        ('[http]\nallowed_origins = "https://a.example"', "http.allowed_origins"),
        ('[http]\nallowed_origins = ["https://a.example/x"]', "http.allowed_origins[0]"),
        ('[http]\nallowed_origins = ["https://*.example.com"]', "http.allowed_origins[0]"),
        (
            '[http]\nallowed_origins = ["https://a.example", "https://a.example:443"]',
            "http.allowed_origins[1]",
        ),
        (
            "[http]\nallowed_origins = ["
            + ", ".join(f'"https://h{i}.example"' for i in range(65))
            + "]",
            "http.allowed_origins",
        ),
        ("[http]\nbytes_per_hour = -1", "http.bytes_per_hour"),
        ("[http]\nbytes_per_hour = true", "http.bytes_per_hour"),
        ("[http]\nbytes_per_hour = 1073741825", "http.bytes_per_hour"),
        ("http = 1", "http"),
    ],
)
def test_a_malformed_http_table_names_its_key(http: str, key: str) -> None:
    with pytest.raises(ManifestError) as info:
        manifest(http)
    assert info.value.key == key


# -- netpolicy, pure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin", "path"),
    [
        ("http://api.test", ("http", "api.test", 80), "/"),
        ("HTTPS://API.Test:8443/a/b?c=d", ("https", "api.test", 8443), "/a/b?c=d"),
        ("http://api.test?q", ("http", "api.test", 80), "/?q"),
        ("http://[::1]:8080/x", ("http", "::1", 8080), "/x"),
        ("http://[0:0::1]/", ("http", "::1", 80), "/"),
        ("https://10.0.0.1/", ("https", "10.0.0.1", 443), "/"),
    ],
)
def test_urls_parse_to_a_normalised_origin(
    url: str, origin: tuple[str, str, int], path: str
) -> None:
    target = parse_url(url)
    assert target.origin == Origin(*origin)
    assert target.path == path


@pytest.mark.parametrize(
    "url",
    [
        "api.test/x",
        "file:///etc/passwd",
        "gopher://api.test/",
        "http://",
        "http:///x",
        "http://user:pw@api.test/",
        "http://api.test:0/",
        "http://api.test:065535/",
        "http://api.test:1x/",
        "http://api.test:/",
        "http://api.test/#x",
        "http://api.test\\.evil/",
        "http://api.test/\x00",
        "http://ap i.test/",
        "http://xn--bcher-kva.test\u00e9/",
        "http://-api.test/",
        "http://api-.test/",
        "http://api..test/",
        "http://a_b.test/",
        "http://127.1/",
        "http://0x7f.0.0.1/",
        "http://2130706433/",
        "http://127.000.0.1/",
        "http://[::1/",
        "http://[::1]x/",
        "http://[fe80::1%25eth0]/",
        "http://" + "a" * 64 + ".test/",
        "http://" + ".".join(["abcdefghij"] * 24) + "/",
    ],
)
def test_urls_that_could_be_read_two_ways_are_refused(url: str) -> None:
    with pytest.raises(NetPolicyError):
        parse_url(url)


@given(st.text(max_size=300))
def test_url_parsing_answers_a_target_or_a_netpolicy_error(text: str) -> None:
    try:
        target = parse_url(text)
    except NetPolicyError:
        return
    assert target.origin.scheme in ("http", "https")
    assert target.path.startswith("/")
    assert parse_url(str(target.origin) + target.path) == target


@pytest.mark.parametrize(
    ("pattern", "url", "matches"),
    [
        ("https://api.example.com", "https://api.example.com/x", True),
        ("https://api.example.com", "https://api.example.com:443/x", True),
        ("https://api.example.com", "http://api.example.com/x", False),
        ("https://api.example.com", "https://api.example.com:8443/x", False),
        ("https://api.example.com", "https://sub.api.example.com/x", False),
        ("https://*.example.com", "https://a.example.com/", True),
        ("https://*.example.com", "https://a.b.example.com/", True),
        ("https://*.example.com", "https://example.com/", False),
        ("https://*.example.com", "https://evilexample.com/", False),
        ("https://*.example.com", "https://example.com.evil.test/", False),
        ("https://*.example.com:8443", "https://a.example.com:8443/", True),
        ("https://*.example.com:8443", "https://a.example.com/", False),
        ("http://10.0.0.1:8080", "http://10.0.0.1:8080/", True),
    ],
)
def test_patterns_match_scheme_host_and_port_exactly(pattern: str, url: str, matches: bool) -> None:
    assert parse_pattern(pattern).matches(parse_url(url).origin) is matches


@pytest.mark.parametrize(
    "pattern", ["https://*.com", "https://*.10.0.0.1", "https://a.*.com", "https://*", "*://a.b"]
)
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(NetPolicyError):
        parse_pattern(pattern)


def test_origin_allowed_needs_the_manifest_and_the_scope_to_agree() -> None:
    origin = parse_origin("https://api.example.com")
    other = parse_origin("https://other.example.com")
    star = [parse_pattern("https://*.example.com")]
    assert origin_allowed(origin, [origin], None)
    assert origin_allowed(origin, [origin], star)
    assert not origin_allowed(origin, [other], star)
    assert not origin_allowed(origin, [origin], [parse_pattern("https://other.example.com")])
    assert origin_allowed(origin, None, star)  # a bare module: what the scope names
    assert not origin_allowed(origin, None, None)
    assert not origin_allowed(origin, [], star)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("8.8.8.8", "public"),
        ("93.184.216.34", "public"),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("172.32.0.1", "public"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "cgnat"),
        ("100.127.255.255", "cgnat"),
        ("169.254.1.1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("169.254.170.2", "metadata"),
        ("100.100.100.200", "metadata"),
        ("192.0.0.192", "metadata"),
        ("168.63.129.16", "metadata"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "reserved"),
        ("198.18.0.1", "reserved"),
        ("2606:4700:4700::1111", "public"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:8.8.8.8", "public"),
        ("::127.0.0.1", "loopback"),
        ("64:ff9b::127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "metadata"),
        ("64:ff9b:1::1", "private"),
        ("2002:7f00:1::1", "loopback"),
        ("2002:a00:1::1", "private"),
        ("2002:808:808::1", "public"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("fd00:ec2::254", "metadata"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("fec0::1", "private"),
        ("ff02::1", "multicast"),
        ("2001::1", "reserved"),  # Teredo
        ("2001:db8::1", "reserved"),
        ("100::1", "reserved"),  # discard-only, outside 2000::/3
        ("4000::1", "reserved"),
    ],
)
def test_addresses_are_classified(address: str, kind: str) -> None:
    assert address_class(ipaddress.ip_address(address)) == kind


def test_only_public_addresses_pass_unless_the_local_network_is_granted() -> None:
    assert address_refusal("8.8.8.8", allow_local_network=False) is None
    assert address_refusal("127.0.0.1", allow_local_network=False) == "loopback"
    assert address_refusal("127.0.0.1", allow_local_network=True) is None
    assert address_refusal("169.254.169.254", allow_local_network=True) == "metadata"
    assert address_refusal("not-an-address", allow_local_network=True) == "not an address"


@given(st.ip_addresses())
def test_every_address_has_a_class_and_public_ones_are_global(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    kind = address_class(address)
    if kind == "public" and not (
        isinstance(address, ipaddress.IPv6Address)
        and (address.ipv4_mapped is not None or address.sixtofour is not None)
    ):
        assert address.is_global, address


def test_the_hourly_quota_slides() -> None:
    clock = FakeClock()
    quota = HourlyQuota(100, clock)
    assert quota.reserve(60)
    assert not quota.reserve(41)  # would pass the limit: nothing counted
    assert quota.reserve(40)
    clock.now += 1800
    assert quota.take(1)[0] == 0  # still within the hour: nothing left to take
    clock.now += 1801
    granted, minute = quota.take(30)
    assert granted == 30 and quota.used() == 30
    quota.refund(20, minute)  # a read that took 30 and read 10
    assert quota.used() == 10 and quota.left() == 90


# -- secret headers ------------------------------------------------------------------------------

SECRET = b"s3cr3t-T0ken/with+odd=chars?"
SECRET_FORMS = [
    SECRET,
    SECRET.hex().encode(),
    base64.b64encode(SECRET),
    base64.urlsafe_b64encode(SECRET),
    urllib.parse.quote_from_bytes(SECRET, safe="").encode(),
]


def leaks(data: bytes) -> list[bytes]:
    """The forms of the secret found in ``data`` (base64 at any alignment included)."""
    found = [f for f in SECRET_FORMS if f in data]
    for shift in range(3):
        for prefix in (b"user:", b"us:", b"x"):
            blob = base64.b64encode(prefix[:shift] + SECRET)
            if blob[8:-8] in data:
                found.append(blob)
    return found


@pytest.fixture
def secret_host(cache: Path) -> Iterator[tuple[Host, SecretsBroker]]:
    secrets = SecretsBroker(MemorySecretStore({"api-token": SECRET}))
    broker = HttpBroker(resolver=resolve)
    policy = Policy(allow={"http", "secrets", "log"})
    with Host(policy, cache_dir=cache, brokers=[broker, secrets]) as host:
        yield host, secrets


def grant_secret(host: Host, ext: Extension, server: Server) -> None:
    origins = [f"http://api.test:{server.port}", f"http://evil.test:{server.port}"]
    host.grant(ext.id, "http", {"allow_local_network": True, "origins": origins})
    bound = {"api-token": [f"http://api.test:{server.port}"]}
    host.grant(ext.id, "secrets", {"headers": bound})


AUTH = ["Authorization", {"secret": "api-token", "prefix": "Bearer "}]


def test_a_secret_header_is_sent_and_scrubbed_from_what_a_reflecting_server_returns(
    secret_host: tuple[Host, SecretsBroker],
    tmp_path: Path,
    server: Server,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="wasihost")
    host, _ = secret_host
    ext = host.load(package(tmp_path, [f"http://api.test:{server.port}"]))
    grant_secret(host, ext, server)
    got = ext.call("fetch", {"url": server.url("api.test", "/reflect"), "headers": [AUTH]})
    # The server got the secret, and reflected it six ways; the guest got none of them.
    assert server.requests[-1][2]["authorization"] == "Bearer " + SECRET.decode()
    assert got["status"] == 200
    assert leaks(got["body"]) == [] and got["body"].count(b"[redacted]") >= 6
    echoed = dict(got["headers"])["X-Echo-Authorization"]
    assert echoed == "Bearer [redacted]"
    assert leaks(repr(got).encode()) == []
    assert SECRET.decode() not in caplog.text
    assert all(SECRET.decode() not in r.message for r in ext.log.records)


def test_a_secret_reflected_with_escapes_is_scrubbed_too(
    secret_host: tuple[Host, SecretsBroker], tmp_path: Path, server: Server
) -> None:
    """Red team, 2026-12-01: a JSON echo (PHP writes '/' as '\\/'), Python's quote (which
    keeps '/'), lowercase percent-escapes and HTML references handed the token back whole."""
    host, _ = secret_host
    ext = host.load(package(tmp_path, [f"http://api.test:{server.port}"]))
    grant_secret(host, ext, server)
    got = ext.call("fetch", {"url": server.url("api.test", "/reflect-escaped"), "headers": [AUTH]})
    assert got["status"] == 200
    lines = got["body"].split(b"\n")
    assert len(lines) == 8
    assert lines[0] == b'{"authorization": "Bearer [redacted]"}'
    assert lines[1:7] == [b"[redacted]"] * 6
    # In base64 only the characters that depend on the secret's bits alone are replaced.
    assert lines[7].startswith(b"Basic dXNlcjp") and lines[7].endswith(b"[redacted]")
    assert dict(got["headers"])["X-Echo-Quoted"] == "[redacted]"
    for line in lines:
        unescaped = urllib.parse.unquote_to_bytes(html.unescape(line.decode()).encode())
        assert leaks(unescaped.replace(b"\\/", b"/")) == []


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/reflect", 0),  # scrubbed, then handed over
        ("/reflect-gzip", -6),  # compressed: not scrubbable, so UNAVAILABLE
    ],
)
def test_the_secret_never_enters_guest_memory(
    secret_host: tuple[Host, SecretsBroker], server: Server, path: str, status: int
) -> None:
    host, _ = secret_host
    request = ok(url=server.url("api.test", path), headers=[AUTH])
    ext = host.admit(bare(dumping_guest(cbor2.dumps(request))), grants=["http", "secrets"])
    grant_secret(host, ext, server)
    memory = ext.call("run")
    assert isinstance(memory, bytes) and len(memory) == DUMP_BYTES
    returned = int.from_bytes(memory[:4], "little", signed=True)
    assert (returned > 0) if status == 0 else (returned == status)
    assert server.requests[-1][2]["authorization"] == "Bearer " + SECRET.decode()
    assert leaks(memory) == []
    if status == 0:
        response = cbor2.loads(memory[4 : 4 + returned])
        assert response["status"] == 200 and b"[redacted]" in response["body"]


def test_a_secret_goes_only_to_the_origin_it_is_bound_to(
    secret_host: tuple[Host, SecretsBroker], tmp_path: Path, server: Server
) -> None:
    host, secrets = secret_host
    origins = [f"http://api.test:{server.port}", f"http://evil.test:{server.port}"]
    ext = host.load(package(tmp_path, origins))
    grant_secret(host, ext, server)
    # evil.test is an allowed origin, but the operator bound the token to api.test only.
    evil = {"url": server.url("evil.test", "/reflect"), "headers": [AUTH]}
    assert guest_class(ext, "fetch", evil) == "denied"
    missing = ["Authorization", {"secret": "other-token", "prefix": ""}]
    assert guest_class(ext, "fetch", {"url": server.url("api.test"), "headers": [missing]}) == (
        "denied"
    )
    secrets.revoke("api-token")
    fetch = {"url": server.url("api.test", "/reflect"), "headers": [AUTH]}
    assert guest_class(ext, "fetch", fetch) == "denied"
    assert server.requests == []


def test_a_failing_request_with_a_secret_leaks_it_in_no_error(
    secret_host: tuple[Host, SecretsBroker],
    tmp_path: Path,
    server: Server,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="wasihost")
    host, _ = secret_host
    ext = host.load(package(tmp_path, [f"http://api.test:{server.port}"]))
    grant_secret(host, ext, server)
    with pytest.raises(CallError) as info:
        ext.call(
            "fetch", {"url": server.url("api.test", "/slow"), "headers": [AUTH]}, timeout_ms=200
        )
    server.release.set()
    assert leaks(str(info.value).encode()) == [] and SECRET.decode() not in caplog.text


DUMP_AT = 69632  # the response buffer: the guest's second page, after its input
DUMP_BYTES = 4 + 61440


def dumping_guest(request: bytes) -> bytes:
    """Calls http_request with ``request`` and answers the call's return value (4 bytes) and
    the whole response buffer, where any byte the host wrote would be."""
    header = b"\0\0\0\0\x5a" + DUMP_BYTES.to_bytes(4, "big")
    body = f"""
    (i32.store (i32.const {DUMP_AT - 4})
      (call $http_request (i32.const 9000) (i32.const {len(request)})
                          (i32.const {DUMP_AT}) (i32.const 61440)))
    (call $packed (i32.const {DUMP_AT - 13}) (i32.const {DUMP_BYTES + 9}))"""
    extra = f"""
  (data (i32.const {DUMP_AT - 13}) "{escape(header)}")
  (data (i32.const 9000) "{escape(request)}")"""
    return build(guest_wat(body, imports=host_import("http_request"), marker="1.1", extra=extra))


# -- https: the connection is pinned to the checked address, the name is verified -----------


def certificates(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A test CA and a server certificate for ``api.test`` signed by it: (cert, key, CA PEM)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wasihost test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("api.test")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "server.pem", tmp_path / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path, ca.public_bytes(serialization.Encoding.PEM)


def test_https_is_pinned_to_the_checked_address_and_verifies_the_name(
    tmp_path: Path, cache: Path
) -> None:
    cert, key, ca = certificates(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    names: list[str | None] = []

    def record_sni(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
        names.append(name)

    server_tls.sni_callback = record_sni  # type: ignore[assignment]
    tls_server = Server(server_tls)
    broker = HttpBroker(
        resolver=resolve, ssl_context=ssl.create_default_context(cadata=ca.decode())
    )
    try:
        with Host(Policy(allow={"http"}), cache_dir=cache, brokers=[broker]) as host:
            origins = [tls_server.url(n, "", "https") for n in ("api.test", "evil.test")]
            scope = {"allow_local_network": True, "origins": origins}
            assert wat_call(host, ok(url=tls_server.url("api.test", "/hello", "https")), scope) == 0
            assert names == ["api.test"]  # SNI carried the name, not 127.0.0.1
            assert tls_server.requests[-1][2]["host"] == f"api.test:{tls_server.port}"
            # evil.test resolves to the same address, but the certificate is not for it.
            evil = ok(url=tls_server.url("evil.test", "/hello", "https"))
            assert wat_call(host, evil, scope) == -6  # UNAVAILABLE
            assert len(tls_server.requests) == 1
    finally:
        tls_server.close()


# -- scrub, pure -------------------------------------------------------------------------------


@given(
    st.binary(min_size=8, max_size=64),
    st.binary(max_size=16),
    st.binary(max_size=16),
)
def test_every_listed_form_of_a_secret_is_scrubbed_wherever_it_sits(
    secret: bytes, before: bytes, after: bytes
) -> None:
    forms = secret_forms(secret)
    blob = before + secret + after
    texts = [
        blob,
        blob.hex().encode(),
        blob.hex().upper().encode(),
        urllib.parse.quote_from_bytes(blob, safe="").encode(),
        base64.b64encode(blob),
        base64.urlsafe_b64encode(blob),
    ]
    for text in texts:
        try:
            cleaned = scrub(text, forms)
        except Unscrubbable:
            continue  # refused whole: the broker answers UNAVAILABLE, nothing reaches the guest
        assert secret not in cleaned
        # What is left of a base64 text no longer holds the secret's own characters.
        for core in forms:
            assert core not in cleaned


@given(
    st.binary(min_size=8, max_size=64),
    st.binary(max_size=16),
    st.binary(max_size=16),
)
def test_a_secret_percent_or_json_escaped_is_scrubbed_wherever_it_sits(
    secret: bytes, before: bytes, after: bytes
) -> None:
    forms = secret_forms(secret)
    blob = before + secret + after
    texts = [
        urllib.parse.quote_from_bytes(blob).encode(),  # '/' kept
        urllib.parse.quote_from_bytes(blob, safe="").lower().encode(),
        blob.replace(b"/", b"\\/"),
        base64.b64encode(blob).replace(b"/", b"\\/"),
    ]
    for text in texts:
        try:
            cleaned = scrub(text, forms)
        except Unscrubbable:
            continue
        for plain in (urllib.parse.unquote_to_bytes(cleaned), cleaned.replace(b"\\/", b"/")):
            assert secret not in plain
        assert not any(core in cleaned.replace(b"\\/", b"/") for core in forms)


def test_a_secret_inside_the_redaction_marker_is_refused_not_left_in_place() -> None:
    """Found by the property above: replacing ``[redacte`` with ``[redacted]`` would leave it."""
    forms = secret_forms(b"[redacte")
    with pytest.raises(Unscrubbable):
        scrub(b"x[redacte]y", forms)
    # The marker and what follows it can spell the secret again: refused too.
    forms = secret_forms(b"ted]xx")
    with pytest.raises(Unscrubbable):
        scrub(b"ted]ted]xxxx", forms)


def test_scrubbing_leaves_other_text_alone_and_cleans_header_text() -> None:
    forms = secret_forms(b"token-1234")
    assert scrub(b"nothing here", forms) == b"nothing here"
    assert scrub_text("Bearer token-1234", forms) == "Bearer [redacted]"
    assert scrub_text("caf\u00e9", forms) == "caf\u00e9"
    assert all(len(f) >= MIN_FORM_BYTES for f in secret_forms(b"ab"))
