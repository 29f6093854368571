"""Red-team review of confidentiality and isolation between extensions through the secrets,
events, storage and log brokers, as a hostile guest that follows the ABI sees them (and as a
second extension beside a victim in the same host). Each test here failed on the code before
the fix it names, or pins a promise that held (said so in its comment). Servers are started
here, on 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cbor2
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.support.common import FIXTURES
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.brokers.http import HttpBroker, parse_request
from wasihost.brokers.jobs import JobsBroker, ManualClock
from wasihost.brokers.secrets import SecretsBroker
from wasihost.core.errors import CallError, ConfigError
from wasihost.core.extlog import Level, LogRecord, to_logging
from wasihost.core.manifest import parse_manifest
from wasihost.core.scrub import Unscrubbable, scrub, secret_forms
from wasihost.core.status import HostStatus, Status
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package
from wasihost.store.kvstore import KVStore
from wasihost.store.kvtypes import Namespace, Quota
from wasihost.store.secrets import FileSecretStore, MemorySecretStore

REQ_AT = 20000  # a fixed request, laid out by a data segment
RESP_AT = 8000
# Generous: only a broken host waits this long.
WAIT_S = 30.0


# -- secrets: the scrubber ---------------------------------------------------------------------


class EchoHandler(BaseHTTPRequestHandler):
    """Reflects the request's Authorization header the ways common echo endpoints do: as JSON
    (httpbin's /headers: Python's json.dumps), as PHP writes JSON, as JSON written in UTF-8,
    as a form."""

    def do_GET(self) -> None:
        value = self.headers.get("Authorization", "")  # decoded as latin-1, as sent
        if self.path == "/json":
            body = json.dumps({"authorization": value}).encode()
        elif self.path == "/php":  # PHP's json_encode writes every '/' as '\\/'
            body = json.dumps({"authorization": value}).replace("/", "\\/").encode()
        elif self.path == "/json-utf8":
            body = json.dumps({"authorization": value}, ensure_ascii=False).encode()
        else:
            body = urllib.parse.urlencode({"authorization": value}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


def loopback(name: str, port: int) -> list[str]:
    return ["127.0.0.1"]


def httpget(tmp_path: Path, origin: str) -> Path:
    """fixtures/httpget, its manifest allowing ``origin``."""
    target = tmp_path / "httpget"
    shutil.copytree(
        FIXTURES / "httpget", target, ignore=shutil.ignore_patterns("src", "Cargo.toml")
    )
    manifest = (target / "extension.toml").read_text()
    manifest = manifest.replace('["http://api.test:8080"]', f'["{origin}"]')
    (target / "extension.toml").write_text(manifest)
    return target


# Break (red-team 2026-12-01): a secret holding a '"' or a '\' (a password, not a hex token)
# reflected by a JSON echo (httpbin's /headers, any json.dumps of the request) came back with a
# backslash in front of that character: the scrubber decoded JSON's '\/' and '\u00XX' but not
# '\"', '\\' or '\t', so the guest read the secret whole, one backslash to drop. The same for a
# secret with a space reflected form-encoded ('+'), and for one with a byte over 0x7f sent as
# latin-1 and reflected as UTF-8 (a server decodes the header and writes text), raw or
# percent-encoded. Now those escapes are decoded too and the UTF-8 spelling is a form.
@pytest.mark.parametrize(
    ("secret", "path"),
    [
        ('pa"ss-word-2026', "/json"),
        ("pa\\ss-word-2026", "/json"),
        ("pa\tss-word-2026", "/json"),
        ("pass word 2026", "/form"),
        ("caf\u00e9-token-2026", "/json-utf8"),
        ("caf\u00e9-token-2026", "/form"),
    ],
)
def test_a_secret_reflected_by_a_json_or_form_echo_is_scrubbed(
    tmp_path: Path, cache: Path, echo_server: int, secret: str, path: str
) -> None:
    origin = f"http://api.test:{echo_server}"
    secrets = SecretsBroker(MemorySecretStore({"api-token": secret.encode("latin-1")}))
    brokers = [HttpBroker(resolver=loopback), secrets]
    with Host(Policy(allow={"http", "secrets"}), cache_dir=cache, brokers=brokers) as host:
        ext = host.load(httpget(tmp_path, origin))
        host.grant(ext.id, "http", {"allow_local_network": True, "origins": [origin]})
        host.grant(ext.id, "secrets", {"headers": {"api-token": [origin]}})
        auth = ["Authorization", {"secret": "api-token", "prefix": "Bearer "}]
        got = ext.call("fetch", {"url": origin + path, "headers": [auth]})
    assert got["status"] == 200
    if path == "/form":
        assert got["body"] == b"authorization=Bearer+[redacted]"
    else:
        assert got["body"] == b'{"authorization": "Bearer [redacted]"}'


# Break (red-team 2026-12-01): the guest writes a secret header's prefix, and a prefix of '%'
# made '%a1' of a secret starting 'a1': the scrubber's decoded view read it as the byte 0xa1,
# so a token holding a '/' (echoed as '\\/' by PHP, found only in that view) was found in
# neither view and handed back whole. Now a prefix ending in what could open an escape ('%',
# '\\', '&' and letters, digits or '#' after it) is INVALID_ARGUMENT, before anything is sent.
def test_a_prefix_cannot_open_an_escape_that_hides_the_secret(
    tmp_path: Path, cache: Path, echo_server: int
) -> None:
    origin = f"http://api.test:{echo_server}"
    secret = b"a1/Z9xK2mPq+sEcReT"
    secrets = SecretsBroker(MemorySecretStore({"api-token": secret}))
    brokers = [HttpBroker(resolver=loopback), secrets]
    with Host(Policy(allow={"http", "secrets"}), cache_dir=cache, brokers=brokers) as host:
        ext = host.load(httpget(tmp_path, origin))
        host.grant(ext.id, "http", {"allow_local_network": True, "origins": [origin]})
        host.grant(ext.id, "secrets", {"headers": {"api-token": [origin]}})
        plain = ["Authorization", {"secret": "api-token", "prefix": "Bearer "}]
        got = ext.call("fetch", {"url": origin + "/php", "headers": [plain]})
        assert got["body"] == b'{"authorization": "Bearer [redacted]"}'
        for prefix in ("%", "x%a", "\\", "\\u00", "&", "&#x", "&amp"):
            opening = ["Authorization", {"secret": "api-token", "prefix": prefix}]
            with pytest.raises(CallError) as info:
                ext.call("fetch", {"url": origin + "/php", "headers": [opening]})
            assert info.value.guest_class == "invalid_argument", prefix


def test_the_new_escapes_decode_one_layer_and_leave_other_text_alone() -> None:
    """The escapes added above mean what JSON means by them: ``\\\\u0041`` is a backslash and
    the text ``u0041``, not ``A``; a ``+`` is never decoded (a form encoder's space is a
    spelling of the secret instead), so a secret holding a real ``+`` is found as written and
    percent-escaped, and other text is left alone."""
    forms = secret_forms(b"a+b-secret")
    assert scrub(b"x a+b-secret y", forms) == b"x [redacted] y"
    assert scrub(b"x a%2Bb-secret y", forms) == b"x [redacted] y"
    backslash_u = secret_forms(b"\\u0041-secret")
    assert scrub(b'"\\\\u0041-secret"', backslash_u) == b'"[redacted]"'
    assert scrub(b'"A-secret"', backslash_u) == b'"A-secret"'
    assert scrub(b"plain text, 100% + more", secret_forms(b"unrelated")) == (
        b"plain text, 100% + more"
    )


# A header value's characters: latin-1, no controls but tab (the http broker refuses others).
HEADER_CHARS = st.characters(
    min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"
) | st.just("\t")


# Break (red-team 2026-12-01), the property behind the test above: whatever a header secret
# holds, the value json.dumps (either ensure_ascii) or urlencode (UTF-8 or latin-1) makes of a
# header carrying it after any prefix the broker takes, scrubbed, decodes to text without the
# secret. (Found by it: a JSON string's escaped backslash before a '/' read as an escaped '/',
# so a secret holding backslash-slash was missed; and the prefix break below.)
@given(st.text(HEADER_CHARS, min_size=4, max_size=40), st.text(HEADER_CHARS, max_size=10))
def test_any_header_secret_echoed_as_json_or_a_form_is_scrubbed(secret: str, prefix: str) -> None:
    header = ["A", {"secret": "s", "prefix": prefix}]
    try:
        parse_request({"method": "GET", "url": "http://a.test/", "headers": [header]})
    except HostStatus:
        assume(False)  # a prefix the broker refuses never reaches a server
    # A secret holding its own percent-escape or HTML reference ('%00', '&lt;') is read as
    # that escape in the decoded view; where only that view finds it (JSON's \u0080 beside
    # it) it is missed, like a doubly escaped one (scrub.py's known gaps; left as it is).
    assume("%" not in secret and "&" not in secret)
    forms = secret_forms(secret.encode("latin-1"))
    value = prefix + secret
    for ascii_only in (True, False):
        try:
            cleaned = scrub(json.dumps({"a": value}, ensure_ascii=ascii_only).encode(), forms)
        except Unscrubbable:
            continue  # refused whole: nothing reaches the guest
        try:
            assert secret not in json.loads(cleaned.decode())["a"]
        except ValueError:
            # A form matched across an escape or a character's UTF-8 bytes (the secret 0000 in
            # \u00c00000): no JSON, or no UTF-8, is left; nor is any spelling of the secret.
            for spelling in (secret.encode("latin-1"), secret.encode()):
                escaped = spelling.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
                assert spelling not in cleaned and escaped.replace(b"\t", b"\\t") not in cleaned
    for encoding in ("utf-8", "latin-1"):
        try:
            cleaned = scrub(urllib.parse.urlencode({"a": value}, encoding=encoding).encode(), forms)
        except Unscrubbable:
            continue
        # (A redaction may take the '=' too, when the secret starts with one: the whole text.)
        echoed = urllib.parse.unquote_plus(cleaned.decode(), encoding=encoding)
        assert secret not in echoed


# -- secrets: binding, names, enumeration (held) ----------------------------------------------


def stub_extension(scope: dict[str, Any]) -> Any:
    """What SecretsBroker.use reads of an extension: its grant and its scopes."""
    grant = SimpleNamespace(allows=lambda capability: capability == "secrets")
    return SimpleNamespace(id="org.test.stub", grant=grant, grant_scopes=lambda: {"secrets": scope})


# Held (red-team 2026-12-01), pinned: a secret bound to https://api.test is lent for no other
# spelling of an origin a guest can write (the scheme, another port, a trailing dot, upper
# case, an IDNA form, user info): parse_url refuses some, the rest normalise to a different
# origin and are DENIED. A name that is not [a-z0-9_-] (a path, a NUL, upper case) is
# INVALID_ARGUMENT before any store is read; a name not granted is DENIED whether the store
# holds it or not (no enumeration of other extensions' secrets); the prefix cannot start a
# second header.
def test_a_secret_is_lent_only_to_its_origin_and_names_cannot_probe_the_store(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    (directory / "api-token").write_text("tok-1234567890\n")
    (directory / "api-token").chmod(0o600)
    (directory / "other-token").write_text("other-0987654321\n")
    (directory / "other-token").chmod(0o600)
    (tmp_path / "outside").write_text("outside-secret\n")
    broker = SecretsBroker(FileSecretStore(directory))
    ext = stub_extension({"headers": {"api-token": ["https://api.test"]}})
    assert broker.use(ext, "api-token", "https://api.test:443") == b"tok-1234567890"

    def status(name: object, origin: str | None) -> Status:
        with pytest.raises(HostStatus) as info:
            broker.use(ext, name, origin)
        return info.value.status

    for url in (
        "http://api.test/",
        "https://api.test:8443/",
        "https://API.TEST:443/",  # the same origin: allowed below
        "https://xn--api-9oa.test/",
        "https://api.test.evil.test/",
    ):
        try:
            origin = str(parse_request({"method": "GET", "url": url}).target.origin)
        except HostStatus:
            continue
        if origin == "https://api.test:443":
            continue
        assert status("api-token", origin) is Status.DENIED, url
    for url in ("https://api.test./", "https://user@api.test/", "https://api.test\\@x.test/"):
        with pytest.raises(HostStatus):
            parse_request({"method": "GET", "url": url})
    for name in ("../outside", "/etc/passwd", "api-token\x00", "API-TOKEN", "", "a" * 65, 7):
        assert status(name, "https://api.test:443") is Status.INVALID_ARGUMENT, name
    # Held by the name grammar, whatever the store: a FileSecretStore never opens a path.
    with pytest.raises(ConfigError):
        FileSecretStore(directory).read("../outside")
    assert status("other-token", "https://api.test:443") is Status.DENIED
    assert status("no-such-token", "https://api.test:443") is Status.DENIED
    assert status("api-token", None) is Status.DENIED  # bound to headers, not for signing
    for prefix in ("Bearer \r\nX-Evil: 1", "Bearer \n", "\x00", "\u0100"):
        header = ["Authorization", {"secret": "api-token", "prefix": prefix}]
        with pytest.raises(HostStatus) as info:
            parse_request({"method": "GET", "url": "https://api.test/", "headers": [header]})
        assert info.value.status is Status.INVALID_ARGUMENT


# -- log: what the operator reads ----------------------------------------------------------------


# Break (red-team 2026-12-01): to_logging, the sink that puts extension logs into Python's
# logging, handed a guest's message to it as the guest wrote it: with any line-based handler (a
# file, stderr) a newline in a record wrote a second line of the guest's choosing, a forged
# record of another extension ("org.victim ERROR ...") or of the host, and an escape sequence
# reached the terminal. Now the message is logged with control characters, line separators and
# bidi overrides escaped (terminal.printable), the exact text in the ``wasihost_message`` extra.
def test_a_guest_log_record_cannot_forge_another_record_through_to_logging() -> None:
    forged = "ok\norg.victim ERROR payment failed, call +1 555\r\x1b[2K\u2028\u202e"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("org.evil")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    captured: list[logging.LogRecord] = []
    capture = logging.Handler()
    capture.emit = captured.append  # type: ignore[method-assign]
    logger.addHandler(capture)
    try:
        to_logging("org.evil", LogRecord(Level.INFO, forged, 1))
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(capture)
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.startswith("org.evil INFO ok\\x0aorg.victim"), text
    assert not any(c in text for c in "\r\x1b\u2028\u202e")
    (record,) = captured
    assert record.wasihost_message == forged  # type: ignore[attr-defined]
    assert record.wasihost_source == "guest"  # type: ignore[attr-defined]


PANIC = "boom\nWARNING wasihost: extension org.victim revoked by the operator\x1b[2K"

EVENTS_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.wat"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["events"]

[commands]
go = {}
fail = {}

[events]
classes = ["t.*"]
command = "fail"
"""

JOBS_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.wat"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["jobs"]

[commands]
go = {}
fail = {}

[jobs]
commands = ["fail"]
"""


def panicking_package(kind: str) -> Package:
    """``go`` subscribes to ``t.a`` (events) or schedules ``fail`` every second (jobs);
    ``fail`` aborts with :data:`PANIC`."""
    entry = "events_subscribe" if kind == "events" else "jobs_schedule"
    request = cbor2.dumps("t.a" if kind == "events" else {"command": "fail", "every_ms": 1000})
    message = cbor2.dumps(PANIC)
    msg_at = REQ_AT + 1000
    body = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 4))  ;; fail
      (then (drop (call $abort (i32.const {msg_at}) (i32.const {len(message)})
                               (i32.const {RESP_AT}) (i32.const 0)))))
    (drop (call ${entry} (i32.const {REQ_AT}) (i32.const {len(request)})
                         (i32.const {RESP_AT}) (i32.const 16)))
    (call $ok_null)"""
    extra = (
        f'(data (i32.const {REQ_AT}) "{escape(request)}") '
        f'(data (i32.const {msg_at}) "{escape(message)}")'
    )
    wasm = build(
        guest_wat(
            body,
            marker="1.1",
            imports=host_import("abort") + host_import(entry),
            extra=extra,
        )
    )
    text = EVENTS_MANIFEST if kind == "events" else JOBS_MANIFEST
    manifest = parse_manifest(text, default_registry().capabilities())
    return Package(kind, manifest, wasm, hashlib.sha256(wasm).hexdigest())


# Break (red-team 2026-12-01): a failed event delivery or job run is written to the host's
# ``wasihost`` logger with its failure text, which quotes the guest's panic message (and a
# trap's backtrace, which names the module's own functions): a guest panicking with "\n..."
# wrote a line of its choosing into the host's log, a forged warning about another extension,
# and escape sequences to whatever terminal shows it. Now that text is logged escaped
# (terminal.printable); SubscriptionStats/JobStats.last_failure keep it as it was.
@pytest.mark.parametrize("kind", ["events", "jobs"])
def test_a_panic_message_cannot_forge_a_line_of_the_host_log(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    brokers = [JobsBroker(clock=clock)] if kind == "jobs" else []
    with Host(Policy(allow={kind}), cache_dir=None, brokers=brokers) as host:
        ext = host.admit(panicking_package(kind), grants=[kind])
        assert ext.call("go") is None
        broker = host.broker(kind)
        with caplog.at_level(logging.WARNING, logger="wasihost"):
            if kind == "events":
                assert host.publish("t.a") == 1
            else:
                clock.advance(1.0)
                broker.tick()  # type: ignore[attr-defined]
            assert broker.drain(WAIT_S)  # type: ignore[attr-defined]
        (stats,) = broker.stats(ext.id).values()  # type: ignore[attr-defined]
    assert stats.failed == 1 and PANIC in (stats.last_failure or "")
    (line,) = [r.getMessage() for r in caplog.records if "org.test.wat" in r.getMessage()]
    assert "\n" not in line and "\x1b" not in line
    assert "boom\\x0aWARNING wasihost: extension org.victim" in line


# -- storage: namespaces (held) --------------------------------------------------------------


# Held (red-team 2026-12-01), pinned: a namespace is two columns compared exactly and a prefix
# listing is a byte range over BLOB keys, so no key or prefix spelling reaches another
# extension's or tenant's keys: SQL LIKE wildcards ('%', '_'), a NUL, a prefix of 0xff bytes
# (no upper bound), the empty prefix, keys that differ only by case or Unicode normalisation,
# extension ids and tenants that look alike.
def test_no_key_or_prefix_spelling_lists_another_namespace() -> None:
    store = KVStore(None)
    quota = Quota(max_bytes=1 << 20, max_objects=1000)
    spaces = [
        Namespace("org.a"),
        Namespace("org.a", "t1"),
        Namespace("org.a", "t_"),
        Namespace("org.b"),
        Namespace("org.a%"),
        Namespace("org_a"),
    ]
    keys = [b"%", b"_", b"\x00", b"\xff\xff", b"caf\xc3\xa9", b"cafe\xcc\x81", b"K", b"k"]
    try:
        for number, ns in enumerate(spaces):
            for key in keys:
                store.put(ns, key, f"{number}".encode(), quota)
            store.put(ns, f"own-{number}".encode(), b"x", quota)
        for number, ns in enumerate(spaces):
            own = sorted([*keys, f"own-{number}".encode()])
            for prefix in (b"", b"%", b"_", b"\x00", b"\xff", b"own-", b"o%", b"caf"):
                listed, cursor = store.list(ns, prefix, None, 100)
                assert cursor is None
                assert listed == [k for k in own if k.startswith(prefix)], (ns, prefix)
            assert all(store.get(ns, key) == f"{number}".encode() for key in keys)
            assert store.usage(ns).objects == len(keys) + 1
    finally:
        store.close()


# -- events: isolation between subscribers (held) ---------------------------------------------


def test_an_extension_cannot_subscribe_past_its_grant_with_a_wildcard(cache: Path) -> None:
    """Held (red-team 2026-12-01), pinned: with the manifest allowing ``orders.*`` and the
    operator's scope narrowing it to ``orders.created``, no selector spelling (the pattern
    itself, ``orders.created.*``, ``orders..*``, a wider ``o*``) subscribes to more; events of
    another class never reach it."""
    with Host(Policy(allow={"events", "log"}), cache_dir=cache) as host:
        ext = host.load(FIXTURES / "events")
        host.grant(ext.id, "events", {"classes": ["orders.created"]})
        for selector in ("orders.*", "orders.created.*", "orders..*", "audit.login", "o*", "*"):
            with pytest.raises(CallError) as info:
                ext.call("subscribe", {"class": selector})
            assert info.value.guest_class in ("denied", "invalid_argument"), selector
        assert ext.call("subscribe", {"class": "orders.created"}) is None
        assert host.publish("orders.cancelled", 1) == 0
        assert host.publish("orders.created.x", 2) == 0
        assert host.publish("orders.created", 3) == 1
        broker = host.broker("events")
        assert broker.drain(WAIT_S)  # type: ignore[attr-defined]
        got = ext.call("received")
    assert [e["payload"] for e in got] == [3]
