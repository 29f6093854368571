"""Red-team review of the guest ABI's call path and the core host calls: hostile guests that
follow the ABI, run through the real engine. Each test here failed on the code before the fix
it names, or guards a protection that was seen to fail its test when removed (see the report
of the review in the branch's history)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from tests.brokers.test_http import Server, dumping_guest, ok, resolve, wat_guest
from tests.support.common import bare
from tests.support.guests import HEAP_START, build, escape, guest_wat, host_import
from wasihost.brokers.files import FilesBroker
from wasihost.brokers.http import MAX_RESPONSE_BODY_BYTES, MAX_RESPONSE_HEADER_BYTES, HttpBroker
from wasihost.brokers.jobs import MIN_RESCHEDULE_MS, JobsBroker, ManualClock
from wasihost.brokers.secrets import SecretsBroker
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.manifest import parse_manifest
from wasihost.core.scrub import MIN_FORM_BYTES
from wasihost.core.status import HostStatus, Status
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package
from wasihost.store.secrets import MemorySecretStore

WAIT_S = 10.0
REQUEST_AT = 60000  # where a guest below keeps its canned host-call request


def package(manifest: str, wasm: bytes, source: str = "redteam") -> Package:
    """A package made in memory: ``manifest`` (TOML) and the module ``wasm``."""
    parsed = parse_manifest(manifest, default_registry().capabilities())
    return Package(source, parsed, wasm, hashlib.sha256(wasm).hexdigest())


def hello(ext_id: str, abi: str = "1.1") -> dict[str, Any]:
    return {"id": ext_id, "version": "0.1.0", "abi": abi, "features": []}


# -- jobs: a run that schedules its own successor ---------------------------------------------

RESCHEDULE_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.reschedule"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["jobs"]

[commands]
again = {}

[jobs]
commands = ["again"]
max_jobs = 32
"""


def rescheduling_guest(request: dict[str, Any]) -> bytes:
    """Every command (the job's too) calls ``jobs_schedule`` with ``request``: each run of the
    job schedules the next one."""
    raw = cbor2.dumps(request)
    body = f"""(drop (call $jobs_schedule (i32.const {REQUEST_AT}) (i32.const {len(raw)})
                (i32.const 12288) (i32.const 16)))
        (call $ok_null)"""
    return build(
        guest_wat(
            body,
            marker="1.1",
            hello=hello("org.test.reschedule"),
            imports=host_import("jobs_schedule"),
            extra=f'(data (i32.const {REQUEST_AT}) "{escape(raw)}")',
        )
    )


@pytest.fixture
def job_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def jobs_host(job_clock: ManualClock) -> Iterator[Host]:
    with Host(Policy(allow={"jobs"}), cache_dir=None, brokers=[JobsBroker(clock=job_clock)]) as h:
        yield h


def _tick(host: Host) -> int:
    broker = host.broker("jobs")
    assert isinstance(broker, JobsBroker)
    queued = broker.tick()
    assert broker.drain(WAIT_S)
    return queued


@pytest.mark.parametrize(
    "request_value",
    [
        {"command": "again", "delay_ms": 0},
        {"command": "again", "every_ms": 1000, "delay_ms": 0},
    ],
    ids=["one-shot", "periodic-first-run"],
)
def test_a_job_that_schedules_its_successor_waits_the_minimum_period(
    jobs_host: Host, job_clock: ManualClock, request_value: dict[str, Any]
) -> None:
    # Break: a one-shot job with delay 0 scheduled by each run of itself ran back to back (12,726
    # runs in 2 s of a one-job extension on the system clock): a periodic job with no period.
    ext = jobs_host.admit(package(RESCHEDULE_MANIFEST, rescheduling_guest(request_value)))
    ext.call("again")  # an ordinary call keeps its delay of 0: due now
    assert _tick(jobs_host) == 1
    # The run scheduled a successor; with no time passed, nothing is due.
    assert _tick(jobs_host) == 0
    job_clock.advance(MIN_RESCHEDULE_MS / 1000 - 0.001)
    assert _tick(jobs_host) == 0
    job_clock.advance(0.001)
    assert _tick(jobs_host) >= 1


# -- http: secrets the scrubber cannot handle ------------------------------------------------


class ReflectingServer:
    """A server on 127.0.0.1 that hands back the token of the request's Authorization header:
    once (``/once``), filling the body (``/fill``) or a header (``/fill-header``)."""

    def __init__(self) -> None:
        self.tokens: list[bytes] = []
        seen = self.tokens

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 5.0

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                value = self.headers.get("authorization", "")
                token = value.split(" ", 1)[-1].encode("latin-1")
                seen.append(token)
                body, echo = b"got:" + token, token
                if self.path.startswith("/fat-headers/"):
                    # many header lines of 60,000 bytes: far over the header limit
                    count = int(self.path.rsplit("/", 1)[1])
                    self.send_response(200)
                    for i in range(count):
                        self.send_header(f"X-Fat{i}", "f" * 60_000)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                    return
                if self.path == "/close":
                    # the body after a Connection: close: the client closes its connection
                    # object before it reads the body, which must still arrive whole
                    body = b"c" * 40_000
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    self.close_connection = True
                    return
                if self.path == "/fill":
                    body = token * (MAX_RESPONSE_BODY_BYTES // len(token))
                elif self.path == "/fill-header":
                    echo = token * ((MAX_RESPONSE_HEADER_BYTES - 256) // len(token))
                self.send_response(200)
                self.send_header("X-Echo", echo.decode("latin-1"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(WAIT_S)


@pytest.fixture(scope="module")
def reflecting() -> Iterator[ReflectingServer]:
    server = ReflectingServer()
    yield server
    server.close()


def fetch_with_secret(server: ReflectingServer, secret: bytes, path: str) -> tuple[int, bytes]:
    """A WAT guest sends a request to ``path`` with ``secret`` as its bearer token; what its
    http_request returned, and its response buffer (where any byte the host wrote would be)."""
    origin = f"http://api.test:{server.port}"
    secrets = SecretsBroker(MemorySecretStore({"tok": secret}))
    with Host(
        Policy(allow={"http", "secrets"}),
        cache_dir=None,
        brokers=[HttpBroker(resolver=resolve), secrets],
    ) as host:
        request = ok(
            url=origin + path, headers=[["Authorization", {"secret": "tok", "prefix": "Bearer "}]]
        )
        ext = host.admit(bare(dumping_guest(cbor2.dumps(request))), grants=["http", "secrets"])
        host.grant(ext.id, "http", {"allow_local_network": True, "origins": [origin]})
        host.grant(ext.id, "secrets", {"headers": {"tok": [origin]}})
        memory = ext.call("run")
    assert isinstance(memory, bytes)
    return int.from_bytes(memory[:4], "little", signed=True), memory


@pytest.mark.parametrize("secret", [b"Q", b"Zq9"])
def test_a_secret_too_short_to_scrub_is_never_sent_as_a_header(
    reflecting: ReflectingServer, secret: bytes
) -> None:
    # Break: forms under MIN_FORM_BYTES are not scrubbed, so a 3-byte secret sent as a header
    # came back from a reflecting server into guest memory as it was.
    assert len(secret) < MIN_FORM_BYTES
    reflecting.tokens.clear()
    returned, memory = fetch_with_secret(reflecting, secret, "/once")
    assert returned == -Status.UNAVAILABLE
    assert reflecting.tokens == []  # not sent
    assert b"got:" + secret not in memory


@pytest.mark.parametrize("path", ["/fill", "/fill-header"])
def test_redactions_that_grow_a_response_past_its_limit_are_payload_too_large(
    reflecting: ReflectingServer, path: str
) -> None:
    # Break: "[redacted]" is longer than a 4-byte secret, so a response filled with it grew
    # past the entry's limit after scrubbing, and the call ended host_error (a CodecError
    # traceback in the host's log) instead of the guest getting a status.
    secret = b"Zq9x"
    returned, memory = fetch_with_secret(reflecting, secret, path)
    assert returned == -Status.PAYLOAD_TOO_LARGE
    assert secret not in memory


# -- random: a seeded host ----------------------------------------------------------------------


def random_guest() -> bytes:
    """``run`` answers 32 bytes of ``random_bytes`` (a CBOR byte string)."""
    body = """
        (drop (call $random_bytes (i32.const 9000) (i32.const 2) (i32.const 12292) (i32.const 64)))
        (i32.store (i32.const 12288) (i32.const 0))
        (call $packed (i32.const 12288) (i32.const 38))"""
    # status 0, then the host's answer (a CBOR byte string of 32: 34 bytes) as the body.
    return build(
        guest_wat(
            body, imports=host_import("random_bytes"), extra='(data (i32.const 9000) "\\18\\20")'
        )
    )


def test_two_extensions_of_a_seeded_host_draw_different_streams() -> None:
    # Break: every extension's stream was keyed by the policy's seed alone, so one extension
    # reading its own random bytes knew the bytes another extension had drawn (its nonces,
    # its tokens): SeededRandom's "not guessable without the seed" held for no extension.
    seed = b"r" * 16
    runs = []
    for _ in range(2):
        with Host(Policy(allow={"random"}, random_seed=seed), cache_dir=None) as host:
            wasm = random_guest()
            one = host.admit(bare(wasm, "one.wasm"), grants=["random"]).call("run")
            two = host.admit(bare(wasm, "two.wasm"), grants=["random"]).call("run")
            assert isinstance(one, bytes) and len(one) == 32
            assert one != two
            runs.append((one, two))
    assert runs[0] == runs[1]  # still reproducible


# -- the call path: a lying wasihost_alloc and a lying packed result ------------------------

PAGE = 65536
MEMORY_PAGES = 2


def lying_alloc_guest(lie: str) -> bytes:
    """``wasihost_alloc`` answers honestly for the handshake (its first two calls) and then
    ``lie``, an expression over ``$n`` (the size asked for) and ``$end`` (the memory's size
    in bytes when alloc was entered)."""
    alloc = f"""
  (global $allocs (mut i32) (i32.const 0))
  (func (export "wasihost_alloc") (param $n i32) (result i32)
    (local $end i32)
    (local.set $end (i32.mul (memory.size) (i32.const {PAGE})))
    (global.set $allocs (i32.add (global.get $allocs) (i32.const 1)))
    (if (result i32) (i32.le_u (global.get $allocs) (i32.const 2))
      (then (i32.const {HEAP_START}))
      (else {lie})))"""
    return build(guest_wat(alloc=alloc, memory=f'(memory (export "memory") {MEMORY_PAGES})'))


@pytest.mark.parametrize(
    ("lie", "fits"),
    [
        ("(i32.sub (local.get $end) (local.get $n))", True),  # the block ends with memory
        ("(i32.add (i32.sub (local.get $end) (local.get $n)) (i32.const 1))", False),
        ("(i32.sub (local.get $end) (i32.const 1))", False),
        ("(local.get $end)", False),
        ("(i32.const -1)", False),  # 0xFFFF_FFFF: ptr + total wraps a u32
        ("(i32.const 0x80000000)", False),  # 2^31: negative as an i32
        ("(i32.sub (i32.const 0) (local.get $n))", False),  # 2^32 - n: ends exactly at 2^32
        # grows the memory first, then hands out the new page: inside memory now
        ("(drop (memory.grow (i32.const 1))) (local.get $end)", True),
        # grows the memory and hands out a block one byte past the new end
        (
            "(drop (memory.grow (i32.const 1))) "
            f"(i32.add (i32.sub (i32.add (local.get $end) (i32.const {PAGE})) (local.get $n)) "
            "(i32.const 1))",
            False,
        ),
    ],
    ids=[
        "at-end",
        "one-past-end",
        "last-byte",
        "at-size",
        "u32-max",
        "i32-min",
        "wraps-to-2^32",
        "new-page",
        "one-past-grown-end",
    ],
)
def test_a_lying_alloc_is_a_protocol_failure_unless_its_block_lies_in_memory(
    host: Host, lie: str, fits: bool
) -> None:
    # Held: the block [ptr, ptr + total) is checked against the memory's size re-read after
    # alloc (size_for), with exact integers, before the host writes into it.
    ext = host.admit(bare(lying_alloc_guest(lie)))
    payload = b"p" * 1000
    if fits:
        assert ext.call("run", payload) is None
        return
    with pytest.raises(CallError) as info:
        ext.call("run", payload)
    assert info.value.failure is FailureClass.PROTOCOL
    assert "wasihost_alloc" in info.value.message


def lying_result_guest(packed: str, grow: bool = False) -> bytes:
    """The command writes an OK ``null`` answer in the last 5 bytes of memory (after growing
    it by a page if ``grow``) and returns ``packed``, an i64 expression over ``$end`` (the
    memory's size in bytes then)."""
    body = f"""
    {"(drop (memory.grow (i32.const 1)))" if grow else ""}
    (global.set $end (i32.mul (memory.size) (i32.const {PAGE})))
    (i32.store (i32.sub (global.get $end) (i32.const 5)) (i32.const 0))
    (i32.store8 (i32.sub (global.get $end) (i32.const 1)) (i32.const 0xf6))
    {packed}"""
    return build(
        guest_wat(
            body,
            memory=f'(memory (export "memory") {MEMORY_PAGES})',
            extra="(global $end (mut i32) (i32.const 0))",
        )
    )


END_MINUS = "(call $packed (i32.sub (global.get $end) (i32.const {back})) (i32.const {length}))"


@pytest.mark.parametrize(
    ("packed", "grow", "fragment"),
    [
        (END_MINUS.format(back=5, length=5), False, None),  # ends with memory
        (END_MINUS.format(back=5, length=5), True, None),  # in a page grown during the call
        (END_MINUS.format(back=4, length=5), False, "outside memory"),
        (END_MINUS.format(back=5, length=4), False, "empty payload"),
        (END_MINUS.format(back=5, length=3), False, "no status"),
        ("(i64.const -1)", False, "outside memory"),  # ptr and len both 2^32 - 1
        ("(i64.const 0x00000001ffffffff)", False, "outside memory"),  # len 2^32 - 1
        ("(i64.const 0x8000000000000005)", False, "outside memory"),  # ptr 2^31
        # ptr + len is exactly 2^32: only exact integers see it is outside
        ("(i64.const 0xfffffffb00000005)", False, "outside memory"),
    ],
    ids=[
        "at-end",
        "grown-page",
        "one-past-end",
        "body-cut",
        "short",
        "all-ones",
        "len-max",
        "ptr-2^31",
        "sum-2^32",
    ],
)
def test_a_lying_packed_result_is_a_protocol_failure_unless_it_lies_in_memory(
    host: Host, packed: str, grow: bool, fragment: str | None
) -> None:
    ext = host.admit(bare(lying_result_guest(packed, grow)))
    if fragment is None:
        assert ext.call("run") is None
        return
    with pytest.raises(CallError) as info:
        ext.call("run")
    assert info.value.failure is FailureClass.PROTOCOL
    assert fragment in info.value.message


# -- embedder functions: a HostStatus that is not a failure status --------------------------


def embedder_guest() -> bytes:
    """``run`` passes its CBOR input to ``myapp_v1.lookup`` and answers what the import
    returned, as a CBOR integer (the response bytes are not looked at)."""
    body = """
    (global.set $r (call $fn (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)
                             (i32.const 12292) (i32.const 1024)))
    (i32.store (i32.const 8000) (i32.const 0))
    (i32.store8 (i32.const 8004) (i32.const 0x3a))  ;; a negative int, 4-byte argument
    (i32.store8 (i32.const 8005) (i32.shr_u (i32.sub (i32.const -1) (global.get $r)) (i32.const 24)))
    (i32.store8 (i32.const 8006) (i32.shr_u (i32.sub (i32.const -1) (global.get $r)) (i32.const 16)))
    (i32.store8 (i32.const 8007) (i32.shr_u (i32.sub (i32.const -1) (global.get $r)) (i32.const 8)))
    (i32.store8 (i32.const 8008) (i32.sub (i32.const -1) (global.get $r)))
    (if (i32.ge_s (global.get $r) (i32.const 0))
      (then (i32.store8 (i32.const 8004) (i32.const 0x1a))
            (i32.store (i32.const 8005) (i32.const 0))
            (i32.store8 (i32.const 8008) (global.get $r))))
    (call $packed (i32.const 8000) (i32.const 9))"""
    return build(
        guest_wat(
            body,
            imports='(import "myapp_v1" "lookup" (func $fn (param i32 i32 i32 i32) (result i32)))'
            '(@custom "wasihost_abi.myapp" "1.0")',
            extra="(global $r (mut i32) (i32.const 0))",
        )
    )


@pytest.mark.parametrize(
    "raised",
    [Status.OK, -5, 42, True, "NOT_FOUND"],
    ids=["ok", "negative", "unknown-code", "bool", "text"],
)
def test_a_host_status_that_is_not_a_failure_status_is_a_host_error(raised: Any) -> None:
    # Break: HostStatus(Status.OK) answered the guest 0 (a success with 0 bytes written) and
    # HostStatus(-5) answered 5 (a success with 5 bytes the host never wrote): an embedder's
    # bug was handed to the guest as a success. HostStatus takes a Status other than OK.
    with Host(Policy(allow={"myapp.read"}), cache_dir=None) as host:

        @host.function(
            "myapp.lookup",
            capability="myapp.read",
            max_request_bytes=64,
            max_response_bytes=64,
            fuel_base=500,
            fuel_per_byte=2,
        )
        def lookup(ctx: Any, request: Any) -> Any:
            if request == "fine":
                raise HostStatus(Status.NOT_FOUND)
            if request == "plain":
                raise HostStatus(3)  # type: ignore[arg-type]  # a plain int of a status: kept
            raise HostStatus(raised)

        ext = host.admit(bare(embedder_guest()), grants=["myapp.read"])
        assert ext.call("run", "fine") == -Status.NOT_FOUND
        assert ext.call("run", "plain") == -Status.PAYLOAD_TOO_LARGE
        with pytest.raises(CallError) as info:
            ext.call("run", "bad")
        assert info.value.failure is FailureClass.HOST_ERROR
        assert "not a failure status" in info.value.message


HTTP_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.wat"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["http"]

[http]
allowed_origins = ["{origin}"]
bytes_per_hour = 1_048_576

[commands]
run = {{}}
"""


@pytest.mark.parametrize("count", [90, 120], ids=["over-the-header-limit", "over-100-lines"])
def test_refused_response_headers_are_counted_and_capped_on_the_wire(
    reflecting: ReflectingServer, count: int
) -> None:
    # Break: the header limits were checked on what the HTTP parser returned, after it had read
    # up to 100 lines of 64 KiB, and those bytes were never counted: a server at an allowed
    # origin sent 5.4 MB of headers per request, each answered PAYLOAD_TOO_LARGE (or
    # UNAVAILABLE past 100 lines), while the extension's 1 MiB per hour stayed unspent.
    origin = f"http://api.test:{reflecting.port}"
    wasm = wat_guest(cbor2.dumps(ok(url=f"{origin}/fat-headers/{count}")))
    manifest = HTTP_MANIFEST.format(origin=origin)  # the id is wat_guest's hello's
    with Host(Policy(allow={"http"}), cache_dir=None, brokers=[HttpBroker(resolver=resolve)]) as h:
        ext = h.admit(package(manifest, wasm))
        h.grant(ext.id, "http", {"allow_local_network": True})
        answers = [ext.call("run") for _ in range(4)]
    # Each response is cut at MAX_RESPONSE_WIRE_BYTES and counted: two spend the hour's MiB,
    # and the next request is refused before it is sent.
    assert answers[0] == -Status.PAYLOAD_TOO_LARGE
    assert -Status.QUOTA_EXCEEDED in answers[1:]
    assert answers[-1] == -Status.QUOTA_EXCEEDED


def posting_guest(request: bytes, resp_cap: int) -> bytes:
    """``run`` sends ``request`` to http_request with ``resp_cap`` bytes of response buffer
    and answers what the import returned (negative statuses as a CBOR negative integer)."""
    body = f"""
    (global.set $r (call $http_request (i32.const 9000) (i32.const {len(request)})
                                       (i32.const 20000) (i32.const {resp_cap})))
    (i32.store8 (i32.const 8004)
      (select (i32.sub (i32.const 0x1f) (global.get $r)) (i32.const 0)
              (i32.lt_s (global.get $r) (i32.const 0))))
    (call $packed (i32.const 8000) (i32.const 5))"""
    return build(
        guest_wat(
            body,
            imports=host_import("http_request"),
            memory='(memory (export "memory") 3)',
            marker="1.1",
            extra=f'(global $r (mut i32) (i32.const 0)) (data (i32.const 9000) "{escape(request)}")',
        )
    )


def test_a_request_with_too_small_a_response_buffer_is_refused_before_it_is_sent() -> None:
    # Break: http_request was not marked `commits`, so with a response buffer under 61440 bytes
    # the request was sent (a POST's effect done, its bytes counted), then the guest got
    # BUFFER_TOO_SMALL and no response: the retry the ABI invites sent the POST again.
    server = Server()
    try:
        origin = f"http://api.test:{server.port}"
        post = cbor2.dumps(ok(method="POST", url=origin + "/pay", body=b"amount=100"))
        with Host(Policy(allow={"http"}), cache_dir=None, brokers=[HttpBroker(resolver=resolve)]) as h:
            for cap, answer in ((16, -Status.BUFFER_TOO_SMALL), (61440, 0)):
                ext = h.admit(bare(posting_guest(post, cap)), grants=["http"])
                h.grant(ext.id, "http", {"allow_local_network": True, "origins": [origin]})
                assert ext.call("run") == answer
        # The small buffer sent nothing; the retry with room sent the POST once.
        assert [(m, p, b) for m, p, _, b in server.requests] == [("POST", "/pay", b"amount=100")]
    finally:
        server.close()


# -- files: a read whose answer does not fit ----------------------------------------------------


def reading_guest() -> bytes:
    """``open`` opens data/a.txt for reading; ``small`` reads 10 bytes at the handle's position
    with a 10-byte response buffer (one short of the CBOR head), ``big`` the same with 64.
    Each answers the response the host wrote, or the negative status as a CBOR integer."""
    requests = {
        "open": cbor2.dumps(["data", "a.txt", "r"]),
        "small": cbor2.dumps([1, None, 10]),
        "big": cbor2.dumps([1, None, 10]),
    }
    at = {"open": 9000, "small": 9100, "big": 9200}
    data = "".join(f'(data (i32.const {at[k]}) "{escape(v)}")' for k, v in requests.items())
    body = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 4))
      (then (global.set $r (call $file_open (i32.const 9000) (i32.const {len(requests["open"])})
                                            (i32.const 20004) (i32.const 64)))))
    (if (i32.eq (local.get $cmd_len) (i32.const 5))
      (then (global.set $r (call $file_read (i32.const 9100) (i32.const {len(requests["small"])})
                                            (i32.const 20004) (i32.const 10)))))
    (if (i32.eq (local.get $cmd_len) (i32.const 3))
      (then (global.set $r (call $file_read (i32.const 9200) (i32.const {len(requests["big"])})
                                            (i32.const 20004) (i32.const 64)))))
    (i32.store (i32.const 20000) (i32.const 0))
    (if (i32.lt_s (global.get $r) (i32.const 0))
      (then
        (i32.store8 (i32.const 20004) (i32.sub (i32.const 0x1f) (global.get $r)))
        (return (call $packed (i32.const 20000) (i32.const 5)))))
    (call $packed (i32.const 20000) (i32.add (global.get $r) (i32.const 4)))"""
    return build(
        guest_wat(
            body,
            marker="1.1",
            imports=host_import("file_open") + host_import("file_read"),
            extra="(global $r (mut i32) (i32.const 0))" + data,
        )
    )


def test_a_read_refused_for_its_buffer_does_not_move_the_files_position(
    tmp_path: Path,
) -> None:
    # Break: file_read advanced the handle's position before the engine found that the answer
    # did not fit the response buffer: the guest got BUFFER_TOO_SMALL, and the retry with a
    # bigger buffer (which ABI section 7 invites) read the next 10 bytes, the first 10 lost.
    mount = tmp_path / "data"
    mount.mkdir()
    (mount / "a.txt").write_bytes(b"0123456789abcdefghij")
    broker = FilesBroker(temp_dir=tmp_path)
    with Host(Policy(allow={"files"}), cache_dir=None, brokers=[broker]) as host:
        ext = host.admit(bare(reading_guest()), grants=["files"])
        host.grant(ext.id, "files", {"mounts": {"data": {"host": str(mount), "mode": "r"}}})
        assert ext.call("open") == 1
        assert ext.call("small") == -Status.BUFFER_TOO_SMALL
        assert ext.call("big") == b"0123456789"
        assert ext.call("big") == b"abcdefghij"


def closing_guest() -> bytes:
    """``t`` makes a temporary file; ``cs`` closes handle 1 with no response room, ``cbig``
    with room. Each answers the import's return value as a CBOR integer (a negative status,
    or the bytes written)."""
    close = cbor2.dumps(1)
    body = f"""
    (if (i32.eq (local.get $cmd_len) (i32.const 1))
      (then (global.set $r (call $file_temp (i32.const 9000) (i32.const 1)
                                            (i32.const 20004) (i32.const 64)))))
    (if (i32.eq (local.get $cmd_len) (i32.const 2))
      (then (global.set $r (call $file_close (i32.const 9100) (i32.const {len(close)})
                                             (i32.const 20004) (i32.const 0)))))
    (if (i32.eq (local.get $cmd_len) (i32.const 4))
      (then (global.set $r (call $file_close (i32.const 9100) (i32.const {len(close)})
                                             (i32.const 20004) (i32.const 64)))))
    (i32.store (i32.const 20000) (i32.const 0))
    (i32.store8 (i32.const 20004)
      (select (i32.sub (i32.const 0x1f) (global.get $r)) (global.get $r)
              (i32.lt_s (global.get $r) (i32.const 0))))
    (call $packed (i32.const 20000) (i32.const 5))"""
    return build(
        guest_wat(
            body,
            marker="1.1",
            imports=host_import("file_temp") + host_import("file_close"),
            extra='(global $r (mut i32) (i32.const 0)) (data (i32.const 9000) "\\f6")'
            f'(data (i32.const 9100) "{escape(close)}")',
        )
    )


def test_a_close_refused_for_its_buffer_closes_nothing(tmp_path: Path) -> None:
    # Break: file_close closed the handle, then found its null answer did not fit a response
    # buffer of 0 bytes: BUFFER_TOO_SMALL for a close that had happened, and the retry the ABI
    # invites answered NOT_FOUND. file_close is now marked commits: the buffer is checked first.
    with Host(
        Policy(allow={"files"}), cache_dir=None, brokers=[FilesBroker(temp_dir=tmp_path)]
    ) as host:
        ext = host.admit(bare(closing_guest()), grants=["files"])
        assert ext.call("t") == 1  # one byte: the handle, 1
        assert ext.call("cs") == -Status.BUFFER_TOO_SMALL
        assert ext.call("cbig") == 1  # one byte written: null, the handle closed now
        assert ext.call("cbig") == -Status.NOT_FOUND


def test_a_connection_close_response_is_read_whole_through_the_meter(
    reflecting: ReflectingServer,
) -> None:
    # Kept while fixing the meter above: reading through a plain wrapper of the socket lost
    # the body of every Connection: close (and HTTP/1.0) response, since http.client closes
    # the connection before the body is read and only makefile's reference keeps it open.
    origin = f"http://api.test:{reflecting.port}"
    wasm = dumping_guest(cbor2.dumps(ok(url=origin + "/close")))
    with Host(Policy(allow={"http"}), cache_dir=None, brokers=[HttpBroker(resolver=resolve)]) as h:
        ext = h.admit(bare(wasm), grants=["http"])
        h.grant(ext.id, "http", {"allow_local_network": True, "origins": [origin]})
        memory = ext.call("run")
    assert isinstance(memory, bytes)
    returned = int.from_bytes(memory[:4], "little", signed=True)
    assert returned > 0
    response = cbor2.loads(memory[4 : 4 + returned])
    assert response["status"] == 200 and response["body"] == b"c" * 40_000
