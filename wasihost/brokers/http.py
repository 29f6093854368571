"""The http broker: one outbound HTTP/1.1 request per ``http_request`` call, to an allowed
origin, over a connection pinned to an address the host resolved and checked itself.

What may be reached is decided by :mod:`wasihost.core.netpolicy` (pure); this module does the I/O:
it resolves the name (an injectable resolver), refuses the request if any answer is a refused
address, connects to the checked address itself (urllib3's connection; for https, TLS over
memory BIOs with the name as server name and certificate host, so that its bytes are counted
too), sends the request with the host's own framing headers, and reads a bounded response.
Redirects are answered, not followed: the guest's next request is checked like any other.

The exchange runs on a worker thread while the guest's thread waits, so the call returns at
its deadline or at the instance's interrupt (disable, revocation, close) within a few
milliseconds, whatever the server does; the worker's socket is shut then, and its own timeouts
end it in any case.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..core.budgets import Resource
from ..core.errors import ConfigError
from ..core.extlog import Level
from ..core.manifest import DEFAULT_HTTP_BYTES_PER_HOUR
from ..core.netpolicy import (
    NetPolicyError,
    Origin,
    OriginPattern,
    Target,
    address_refusal,
    origin_allowed,
    parse_pattern,
    parse_url,
)
from ..core.scrub import MIN_FORM_BYTES, Unscrubbable, scrub, scrub_text, secret_forms
from ..core.serving import ASYNC_WAKE_CHECK_S
from ..core.status import GuestDeadline, GuestInterrupted, HostStatus, Status
from ..store.secrets import MAX_SECRET_BYTES
from . import run_allowance
from .run_allowance import NetworkAllowance
from .secrets import use_secret

if TYPE_CHECKING:
    import ssl

    import urllib3
    from urllib3.connection import HTTPConnection

    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

LOG = logging.getLogger("wasihost")

Resolver = Callable[[str, int], Sequence[str]]
"""``resolver(name, port) -> addresses`` (text); raises ``OSError`` when the name has none."""

# The methods of an API client. CONNECT would open a tunnel and TRACE reflects the request
# (headers and all) back, so neither is offered.
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# The registry's request shape: body "at most 32768" bytes.
MAX_REQUEST_BODY_BYTES: Final = 32768
# The registry's response shape: body "at most 49152" bytes; one byte more is read to tell a
# body of exactly the limit from a longer one.
MAX_RESPONSE_BODY_BYTES: Final = 49152
# 64 request headers of at most 8 KiB each, 16 KiB in all: what common servers accept
# (nginx's large_client_header_buffers is 4 x 8 KiB) and far more than an API call sends.
MAX_REQUEST_HEADERS: Final = 64
MAX_HEADER_NAME_CHARS: Final = 256
MAX_HEADER_VALUE_CHARS: Final = 8192
MAX_REQUEST_HEADER_BYTES: Final = 16384
# Response headers that reach the guest: 64 of them, 8 KiB of names and values in all, so the
# encoded response (body limit + headers + framing) stays under the entry's 61440 bytes.
MAX_RESPONSE_HEADERS: Final = 64
MAX_RESPONSE_HEADER_BYTES: Final = 8192
# One request takes at most 30 s, whatever the call's deadline: a server that trickles bytes
# cannot hold a worker thread longer than that.
MAX_REQUEST_SECONDS: Final = 30.0
# RFC 9110 section 15: a status code is in 100..599; one outside it is a malformed response.
MIN_STATUS: Final = 100
MAX_STATUS: Final = 599
# A resolver answer longer than this is not an ordinary name's; it is refused (UNAVAILABLE).
MAX_RESOLVED_ADDRESSES: Final = 32
# A name's addresses tried in turn when one does not answer: enough for an IPv6 and an IPv4
# address and a spare, few enough that a dead name fails fast.
MAX_CONNECT_ATTEMPTS: Final = 3
# Requests still running per extension (the current one plus any the guest abandoned at its
# deadline, each ending within MAX_REQUEST_SECONDS): more is UNAVAILABLE, so a guest cannot
# pile up worker threads.
MAX_INFLIGHT_PER_EXTENSION: Final = 4
# Reading the response in pieces lets each read take the time left.
READ_CHUNK_BYTES: Final = 16384
# The TLS layer reads the socket in pieces of a record's size (16 KiB of plaintext and its
# framing), each counted and capped before it is read.
TLS_READ_BYTES: Final = 16384 + 256
# What one response may take on the wire (status line, headers, body and its chunk framing),
# counted as it is read from the socket: the header and body limits are checked on what the
# HTTP parser returns, which may have read up to 100 header lines of 64 KiB each first (6.5 MB,
# and none of it was counted when the headers were refused). Room for the limits above with
# chunk framing as wasteful as 1-byte chunks (6 bytes on the wire per byte of body).
MAX_RESPONSE_WIRE_BYTES: Final = 512 * 1024
# What a header line costs on the wire besides its name and value (": " and CRLF), and the
# request line's fixed part (the space after the method, " HTTP/1.1\r\n" and the blank line),
# for the traffic account: with every header the host sends listed (Request.wire_headers), it
# counts the request's bytes exactly (tests/brokers/test_redteam_jobs.py).
HEADER_LINE_OVERHEAD: Final = 4
REQUEST_LINE_OVERHEAD: Final = 14
# The User-Agent of a request whose guest set none. The host sends it itself, and Content-Length
# too, so that the HTTP client adds no header the traffic account has not counted (urllib3's
# own were 60 bytes a request, uncounted: a run with a small max_network_bytes sent twice it).
USER_AGENT: Final = "wasihost"
# The methods whose request has a Content-Length even without a body (as urllib3 sends them).
METHODS_WITH_BODY: Final = frozenset({"POST", "PUT", "PATCH"})
# The traffic account keeps one bucket per minute of the sliding hour.
QUOTA_WINDOW_S: Final = 3600.0
QUOTA_BUCKETS: Final = 60

# Headers the host owns: framing, connection management and proxies (a guest-set one could
# smuggle a second request or change where the bytes go), and the encoding, so the body the
# guest gets is the bytes the server sent.
HOST_OWNED_HEADERS: Final = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "http2-settings",
        "accept-encoding",
    }
)
# RFC 9110 token characters.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A field value may hold visible characters, spaces and tabs, never CR, LF, NUL or other
# controls (a CR or LF would start a header of the guest's choosing). It is sent as latin-1,
# one byte per character, so characters above U+00FF have no bytes to be.
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|[^\x00-\xff]")

# The secrets broker's bounds: a name is at most 64 characters, a value at most 4 KiB (the
# header budget reserves that much for each secret header).
MAX_SECRET_NAME_CHARS: Final = 64
# A secret header's prefix may not end in what could begin an escape ('%', '\\', '&', then only
# letters, digits or '#'): the scrubber reads an echoed response with escapes decoded, and a
# prefix of '%' made '%a1' of a secret starting a1, so a token that needed that decoded view
# (its '/' echoed as '\\/' by PHP's json_encode) was found in neither view and handed back
# whole (red-team 2026-12-01). The secret's own bytes are the operator's; the prefix is the
# guest's.
_ESCAPE_OPENING = re.compile(r"[%\\&][0-9A-Za-z#]*\Z")

_SCOPE_KEYS: Final = frozenset({"origins", "allow_local_network"})
# An operator's scope names a handful of services, like a manifest.
MAX_SCOPE_ORIGINS: Final = 64


def system_resolver(name: str, port: int) -> list[str]:
    """The system's resolver: every TCP address of ``name``."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]) for info in infos]


class HourlyQuota:
    """Bytes moved in the last hour, in one-minute buckets: bounded memory whatever the
    traffic, and a limit that slides rather than resetting on the hour."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, int] = {}

    def _current(self) -> int:
        minute = int(self._clock() * QUOTA_BUCKETS / QUOTA_WINDOW_S)
        for key in [k for k in self._buckets if k <= minute - QUOTA_BUCKETS]:
            del self._buckets[key]
        return minute

    def used(self) -> int:
        with self._lock:
            self._current()
            return sum(self._buckets.values())

    def reserve(self, n: int) -> bool:
        """Count ``n`` bytes if they fit in what is left; otherwise count nothing."""
        with self._lock:
            minute = self._current()
            if sum(self._buckets.values()) + n > self.limit:
                return False
            self._buckets[minute] = self._buckets.get(minute, 0) + n
            return True

    def take(self, n: int) -> tuple[int, int]:
        """Count up to ``n`` bytes about to be read, as many as are left (0 when none): one
        step under the lock, so concurrent responses share what is left instead of each
        reading up to what was left when it started (four at once read 3-4x the budget,
        red-team 2026-12-01). Returns the bytes counted and the bucket they went to, for
        :meth:`refund`."""
        with self._lock:
            minute = self._current()
            granted = max(0, min(n, self.limit - sum(self._buckets.values())))
            if granted:
                self._buckets[minute] = self._buckets.get(minute, 0) + granted
            return granted, minute

    def refund(self, n: int, minute: int) -> None:
        """Give back ``n`` bytes of a :meth:`take` into ``minute``'s bucket that were not read
        (nothing if that bucket has left the hour already)."""
        with self._lock:
            if minute in self._buckets:
                self._buckets[minute] -= n

    def left(self) -> int:
        return max(0, self.limit - self.used())


class HttpState:
    """One extension's http state: its traffic account and its requests in flight."""

    def __init__(self, ext: ExtensionView, quota: HourlyQuota) -> None:
        self.ext = ext
        self.quota = quota
        self.host_budget = HostNetworkBudget(ext)
        self.inflight = threading.BoundedSemaphore(MAX_INFLIGHT_PER_EXTENSION)


class SecretRef:
    """A header value the host fills in: ``prefix`` followed by the secret ``name``."""

    __slots__ = ("name", "prefix")

    def __init__(self, name: str, prefix: str) -> None:
        self.name = name
        self.prefix = prefix


class Request:
    """A guest request that passed every shape check. Until :meth:`attach_secrets`, a header
    may still be a :class:`SecretRef`; ``forms`` are then what to scrub from the response."""

    __slots__ = ("body", "forms", "headers", "method", "target")

    def __init__(
        self,
        method: str,
        target: Target,
        headers: list[tuple[str, str | SecretRef]],
        body: bytes | None,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.forms: list[bytes] = []

    @property
    def has_secrets(self) -> bool:
        return any(isinstance(value, SecretRef) for _, value in self.headers)

    def attach_secrets(self, use: Callable[[str], bytes]) -> None:
        """Replace each secret reference by its value (``use(name)`` raises the guest's
        status) and note the secret's forms for :func:`~wasihost.core.scrub.scrub`."""
        attached: list[tuple[str, str | SecretRef]] = []
        for name, value in self.headers:
            if isinstance(value, SecretRef):
                secret = use(value.name)
                text = secret.decode("latin-1")
                if _BAD_VALUE.search(text):
                    # The operator stored something no header can carry; never its bytes in
                    # the log, only that it cannot be used.
                    LOG.warning("secret %s cannot be sent as a header value", value.name)
                    raise HostStatus(Status.UNAVAILABLE)
                if len(secret) < MIN_FORM_BYTES:
                    # The scrubber leaves forms this short alone (they would match ordinary
                    # text), so a server reflecting the header would hand it to the guest.
                    LOG.warning(
                        "secret %s is under %d bytes: too short to be scrubbed from a "
                        "response, so it is never sent as a header",
                        value.name,
                        MIN_FORM_BYTES,
                    )
                    raise HostStatus(Status.UNAVAILABLE)
                self.forms.extend(secret_forms(secret))
                attached.append((name, value.prefix + text))
            else:
                attached.append((name, value))
        self.headers = attached
        self.forms.sort(key=len, reverse=True)

    def wire_headers(self) -> list[tuple[str, str]]:
        """Every header line the host sends, in order (after :meth:`attach_secrets`): the HTTP
        client is given all of them and adds none of its own."""
        headers: list[tuple[str, str]] = [
            ("Host", self.target.origin.host_header()),
            ("Accept-Encoding", "identity"),
        ]
        for name, value in self.headers:
            assert isinstance(value, str)  # secrets attached before
            headers.append((name, value))
        if not any(name.lower() == "user-agent" for name, _ in self.headers):
            headers.append(("User-Agent", USER_AGENT))
        if self.body is not None or self.method in METHODS_WITH_BODY:
            headers.append(("Content-Length", str(len(self.body or b""))))
        return headers

    def wire_bytes(self) -> int:
        """What the request costs on the wire, for the traffic account: exactly the bytes sent
        (after :meth:`attach_secrets`)."""
        size = len(self.method) + len(self.target.path) + REQUEST_LINE_OVERHEAD
        for name, value in self.wire_headers():
            size += len(name) + len(value) + HEADER_LINE_OVERHEAD
        return size + (len(self.body) if self.body is not None else 0)


def _invalid() -> HostStatus:
    return HostStatus(Status.INVALID_ARGUMENT)


def parse_request(request: Any) -> Request:
    """Check the guest's request shape and bounds; raise ``HostStatus(INVALID_ARGUMENT)`` for
    anything malformed. A secret header's name is checked by the secrets broker when used."""
    if not isinstance(request, dict) or not set(request) <= {"method", "url", "headers", "body"}:
        raise _invalid()
    method = request.get("method")
    url = request.get("url")
    headers = request.get("headers", [])
    body = request.get("body")
    if not isinstance(method, str) or method not in METHODS:
        raise _invalid()
    if not isinstance(url, str):
        raise _invalid()
    try:
        target = parse_url(url)
    except NetPolicyError:
        raise _invalid() from None
    if body is not None and (not isinstance(body, bytes) or len(body) > MAX_REQUEST_BODY_BYTES):
        raise _invalid()
    if not isinstance(headers, list) or len(headers) > MAX_REQUEST_HEADERS:
        raise _invalid()
    checked: list[tuple[str, str | SecretRef]] = []
    total = 0
    for pair in headers:
        if not isinstance(pair, list) or len(pair) != 2:
            raise _invalid()
        name, value = pair
        if (
            not isinstance(name, str)
            or len(name) > MAX_HEADER_NAME_CHARS
            or not _TOKEN.fullmatch(name)
            or name.lower() in HOST_OWNED_HEADERS
        ):
            raise _invalid()
        if isinstance(value, dict):
            if (
                set(value) != {"secret", "prefix"}
                or not isinstance(value["secret"], str)
                or len(value["secret"]) > MAX_SECRET_NAME_CHARS
                or not isinstance(value["prefix"], str)
                or len(value["prefix"]) > MAX_HEADER_VALUE_CHARS - MAX_SECRET_BYTES
                or _BAD_VALUE.search(value["prefix"])
                or _ESCAPE_OPENING.search(value["prefix"])
            ):
                raise _invalid()
            total += len(name) + len(value["prefix"]) + MAX_SECRET_BYTES
            if total > MAX_REQUEST_HEADER_BYTES:
                raise _invalid()
            checked.append((name, SecretRef(value["secret"], value["prefix"])))
            continue
        if (
            not isinstance(value, str)
            or len(value) > MAX_HEADER_VALUE_CHARS
            or _BAD_VALUE.search(value)
        ):
            raise _invalid()
        total += len(name) + len(value)
        if total > MAX_REQUEST_HEADER_BYTES:
            raise _invalid()
        checked.append((name, value))
    return Request(method, target, checked, body)


class Exchange:
    """One request on its worker thread: the result (a response or a status) and a way for
    the waiting guest thread to cut it short."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.status: Status | None = None
        self.cancelled = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def attach(self, sock: socket.socket | None) -> None:
        """The connection's socket, so that :meth:`cancel` can shut it."""
        with self._lock:
            self._sock = sock
            if self.cancelled:
                _shut(sock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            _shut(self._sock)


class ResponseTooLarge(OSError):
    """The response took more than :data:`MAX_RESPONSE_WIRE_BYTES` on the wire."""


class AllowanceSpent(OSError):
    """A response wanted more bytes than a job run's ``max_network_bytes`` or the extension's
    hourly quota had left."""


class _MeteredReader(io.RawIOBase):
    """What the HTTP parser reads a plain response through: the socket's own raw reader (which
    keeps the socket open while it is, as ``makefile`` promises: the client closes the
    connection of a ``Connection: close`` response before it reads the body), its bytes
    counted, and refused past the meter's cap or a job run's allowance."""

    def __init__(self, meter: MeteredSocket, raw: io.RawIOBase) -> None:
        self._meter = meter
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._meter.read_into(self._raw.readinto, memoryview(buffer).cast("B"))

    def close(self) -> None:
        self._raw.close()
        super().close()


class ReadBudget(Protocol):
    """What a response's bytes are taken from before each read (:class:`MeteredSocket`): a
    job run's allowance, the manifest's hourly quota, the host's network budget."""

    def take(self, n: int) -> tuple[int, int]:
        """Count up to ``n`` bytes about to be read, as many as are left (0: none); with a
        token for :meth:`refund`."""
        ...

    def refund(self, n: int, token: int) -> None:
        """Give back ``n`` bytes of a :meth:`take` (with its token) that were not read."""
        ...


class HostNetworkBudget:
    """The host's network budget (the governor's ``network_bytes_per_hour``) as a
    :class:`ReadBudget`: its bytes are taken before each read as the manifest's quota's are
    (it was charged after the read: four responses in flight read 3-4x it before one was
    charged over it). When it has none left, the crossing's action fires."""

    __slots__ = ("_ext",)

    def __init__(self, ext: ExtensionView) -> None:
        self._ext = ext

    def take(self, n: int) -> tuple[int, int]:
        return self._ext.host.governor.take_received(self._ext, n)

    def refund(self, n: int, token: int) -> None:
        self._ext.host.governor.refund_received(self._ext, n, token)


class MeteredSocket:
    """A connection's socket whose reads are counted (``received``) and capped at ``cap``
    bytes: through :meth:`makefile` for plain HTTP, through :meth:`read_into` for the TLS layer
    (:class:`TlsSocket`), which reads every byte of its records from the socket here;
    everything else is the socket's own."""

    def __init__(self, sock: socket.socket, cap: int, budgets: Sequence[ReadBudget] = ()) -> None:
        self.sock = sock
        self.cap = cap
        # Each read takes its bytes from every budget before it reads, and is given no more
        # room than the least of them leaves (the header block is read whole, up to the cap,
        # before anything could refuse it: with 4 KiB of the hour left, one response read
        # 512 KiB), so responses in flight at once together read no more than is left, and
        # the host never reads past a budget, even by a buffer. In order: a job run's
        # allowance, the manifest's hourly quota, the host's network budget (last, since
        # finding it spent fires its action).
        self.budgets = tuple(budgets)
        # A budget stopped the response: QUOTA_EXCEEDED.
        self.allowance_spent = False
        self.received = 0

    def read_into(self, read: Callable[[memoryview], int | None], view: memoryview) -> int:
        """``read(view)`` from the socket, given no more room than the cap and the budgets
        leave, its bytes counted."""
        if not len(view):
            return 0  # nothing asked: no budget is spent by it
        room = self.cap - self.received
        if room <= 0:
            raise ResponseTooLarge("response over the wire limit")
        room = min(room, len(view))
        taken: list[tuple[ReadBudget, int]] = []
        for budget in self.budgets:
            granted, token = budget.take(room)
            if granted < room:
                for earlier, earlier_token in taken:
                    earlier.refund(room - granted, earlier_token)
                room = granted
            if room <= 0:
                self.allowance_spent = True
                raise AllowanceSpent("response over what is left of a network budget")
            taken.append((budget, token))
        try:
            n = read(view[:room] if len(view) > room else view) or 0
        except BaseException:
            self._refund(taken, room)
            raise
        if n < room:
            self._refund(taken, room - n)
        self.received += n
        return n

    @staticmethod
    def _refund(taken: Sequence[tuple[ReadBudget, int]], n: int) -> None:
        """Give back what a read took and did not read."""
        for budget, token in taken:
            budget.refund(n, token)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"a metered socket is read as 'rb', not {mode!r}")
        raw = self.sock.makefile("rb", buffering=0)
        return io.BufferedReader(_MeteredReader(self, raw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _TlsReader(io.RawIOBase):
    """The decrypted response, for the HTTP parser (counted already, as records)."""

    def __init__(self, tls: TlsSocket) -> None:
        self._tls = tls

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._tls.recv_into(memoryview(buffer).cast("B"))


class TlsSocket:
    """TLS to the checked address through OpenSSL's memory BIOs, over a :class:`MeteredSocket`:
    every byte read from the socket (handshake, session tickets, record framing and padding,
    alerts) passes the meter, is counted and stops at its cap. An ``ssl.SSLSocket`` reads
    the socket inside OpenSSL, so only the decrypted bytes could be counted: a server sending
    20,000 TLS 1.3 session tickets moved 5 MB to the host as a 129-byte exchange, and padded
    records could move any amount within the request's time for 512 KiB of HTTP.

    The HTTP client uses it as its connection's socket: ``sendall``, ``makefile("rb")``,
    ``settimeout``, ``close``. Reads and writes block on the socket, with its timeout; the
    socket's shutdown (a cancelled exchange) ends them."""

    def __init__(self, meter: MeteredSocket, context: ssl.SSLContext, hostname: str) -> None:
        import ssl

        self._meter = meter
        self._sock = meter.sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=False, server_hostname=hostname
        )
        self._chunk = bytearray(TLS_READ_BYTES)

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self._sock.sendall(data)

    def _fill(self) -> None:
        view = memoryview(self._chunk)
        n = self._meter.read_into(self._sock.recv_into, view)
        if n:
            self._incoming.write(view[:n])
        else:
            self._incoming.write_eof()

    def _run(self, op: Callable[[], Any]) -> Any:
        import ssl

        while True:
            try:
                result = op()
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
                continue
            self._flush()
            return result

    def handshake(self, context: ssl.SSLContext, hostname: str) -> None:
        """The TLS handshake, then the name check urllib3 made (the context may leave it)."""
        import ssl

        from urllib3.connection import _match_hostname

        self._run(self._tls.do_handshake)
        if not context.check_hostname and context.verify_mode != ssl.CERT_NONE:
            _match_hostname(
                self._tls.getpeercert(),  # type: ignore[arg-type]  # the same dict
                hostname,
                getattr(context, "hostname_checks_common_name", False) or False,
            )

    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view:
            written: int = self._run(functools.partial(self._tls.write, view))
            view = view[written:]

    def recv_into(self, view: memoryview) -> int:
        import ssl

        if not view:
            return 0
        try:
            n: int = self._run(lambda: self._tls.read(len(view), view))
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            # close_notify, or the server closed without it: the end of the response, as
            # SSLSocket's suppress_ragged_eofs reads it; a body short of its Content-Length
            # is the HTTP client's IncompleteRead.
            return 0
        return n

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"a TLS connection is read as 'rb', not {mode!r}")
        return io.BufferedReader(_TlsReader(self))

    def settimeout(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)

    def shutdown(self, how: int) -> None:
        socket.socket.shutdown(self._sock, how)

    def close(self) -> None:
        # The HTTP client closes its connection of a ``Connection: close`` response before it
        # reads the body; the socket itself is closed by the exchange when it is over.
        pass


def _shut(sock: socket.socket | None) -> None:
    # shutdown (unlike close) wakes a thread blocked reading the socket. The base class's
    # method is called so an SSL socket's TLS object is left to its reader.
    if sock is None:
        return
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class HttpBroker:
    """Serves ``http_request`` (capability ``http``).

    ``resolver`` answers a name's addresses (default: the system's ``getaddrinfo``);
    ``ssl_context`` verifies servers (default: the system's trust store, hostname checked by
    urllib3 against the origin's name); ``clock`` drives the hourly traffic account."""

    name = "http"
    functions = ("wasihost_v1.http_request",)
    capabilities = frozenset({"http"})

    def __init__(
        self,
        *,
        resolver: Resolver = system_resolver,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_request_seconds: float = MAX_REQUEST_SECONDS,
    ) -> None:
        if not 0 < max_request_seconds <= MAX_REQUEST_SECONDS:
            raise ConfigError(f"max_request_seconds must be in (0, {MAX_REQUEST_SECONDS}]")
        self.resolver = resolver
        # Loading the trust store costs milliseconds: done on the first https request, not for
        # every host that never makes one.
        self._ssl_context = ssl_context
        self.clock = clock
        self.max_request_seconds = max_request_seconds

    def ssl_context(self) -> ssl.SSLContext:
        import ssl

        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        # Servers are always verified (urllib3, which made the handshake before, set this on
        # the context too); the name is checked by the context or by TlsSocket.handshake.
        if self._ssl_context.verify_mode != ssl.CERT_REQUIRED:
            self._ssl_context.verify_mode = ssl.CERT_REQUIRED
        return self._ssl_context

    # -- grant scope ----------------------------------------------------------------------

    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        unknown = set(scope) - _SCOPE_KEYS
        if unknown:
            raise ConfigError(f"http scope: unknown key {sorted(unknown)[0]!r}")
        if "allow_local_network" in scope and not isinstance(scope["allow_local_network"], bool):
            raise ConfigError("http scope: allow_local_network must be true or false")
        if "origins" in scope:
            scope_patterns(scope)

    # -- broker protocol ------------------------------------------------------------------

    def open(self, ext: ExtensionView) -> HttpState:
        manifest = ext.manifest
        budget = manifest.http.bytes_per_hour if manifest is not None else None
        limit = DEFAULT_HTTP_BYTES_PER_HOUR if budget is None else budget
        return HttpState(ext, HourlyQuota(limit, self.clock))

    def close(self, state: HttpState) -> None:
        pass

    def handler(self, entry: HostFunction, state: HttpState) -> Callable[[Any, Any], Any]:
        capability = entry.capability

        def handle(call: Any, request: Any) -> dict[str, Any]:
            return self.serve(state, capability, call, request)

        return handle

    # -- one request ----------------------------------------------------------------------

    def serve(self, state: HttpState, capability: str, call: Any, request: Any) -> dict[str, Any]:
        parsed = parse_request(request)
        ext = state.ext
        scope = ext.grant_scopes().get(capability, {})
        manifest = ext.manifest
        manifest_origins = manifest.http.allowed_origins if manifest is not None else None
        origin = parsed.target.origin
        try:
            patterns = scope_patterns(scope)
        except ConfigError:
            # A scope stored before this broker checked it (an older host's durable grants):
            # what it means is unknown, so it allows nothing.
            raise refused(
                ext, Status.DENIED, origin, "its http grant's scope cannot be read: grant it again"
            ) from None
        if not origin_allowed(origin, manifest_origins, patterns):
            raise refused(ext, Status.DENIED, origin, _not_allowed(manifest_origins, patterns))
        allow_local = scope.get("allow_local_network") is True
        if parsed.has_secrets:
            where = str(origin)
            parsed.attach_secrets(lambda name: use_secret(ext, name, where))

        sent = parsed.wire_bytes()
        # A job run's own network bytes ([jobs] max_network_bytes): taken whole before anything
        # is counted anywhere (one step, so nothing else of the run spends them meanwhile),
        # given back if the request is refused after all. The response's bytes are taken from
        # it as they are read (MeteredSocket).
        allowance = run_allowance.current(ext.id)
        if allowance is not None and not allowance.reserve(sent):
            spent = "the job run's [jobs] max_network_bytes is spent"
            raise refused(ext, Status.QUOTA_EXCEEDED, origin, spent)
        if not state.inflight.acquire(blocking=False):
            if allowance is not None:
                allowance.refund(sent)
            raise HostStatus(Status.UNAVAILABLE)
        governor = ext.host.governor
        try:
            # budgets: the host's budget first; its action may refuse the request.
            governor.charge_request(ext, sent)
        except BaseException as exc:
            state.inflight.release()
            if allowance is not None:
                allowance.refund(sent)
            if isinstance(exc, HostStatus):
                spent = (
                    "its network budget (network_bytes_per_hour, from the manifest's [http] "
                    "bytes_per_hour or the host's policy) is spent for now"
                )
                raise refused(ext, exc.status, origin, spent) from None
            raise
        try:
            # The request's bytes are counted before it is sent, through the grant table: none
            # is counted under a grant that a returned revocation withdrew.
            authorised, fits = ext.commit(capability, lambda: state.quota.reserve(sent))
            if not authorised:
                raise refused(ext, Status.DENIED, origin, "its http grant was revoked")
            if not fits:
                raise refused(
                    ext,
                    Status.QUOTA_EXCEEDED,
                    origin,
                    "the extension's hourly http bytes ([http] bytes_per_hour) are spent",
                )
        except BaseException:
            governor.refund(ext, Resource.NETWORK_BYTES_PER_HOUR, sent)
            state.inflight.release()
            if allowance is not None:
                allowance.refund(sent)
            raise
        cap = time.monotonic() + self.max_request_seconds
        deadline = min(call.deadline, cap)
        exchange = Exchange()

        def work() -> None:
            try:
                exchange.result = self._exchange(
                    parsed, allow_local, deadline, state, exchange, allowance
                )
            except HostStatus as exc:
                exchange.status = exc.status
            except Exception:
                # A bug of ours, not the guest's: the details go to the host's log only.
                LOG.exception("http request of extension %s failed", ext.id)
                exchange.status = Status.INTERNAL
            finally:
                state.inflight.release()
                exchange.done.set()

        threading.Thread(target=work, name="wasihost-http", daemon=True).start()
        wakeup: threading.Event = call.wakeup
        # The guest's thread waits for the worker, but never past the call's deadline, the
        # per-request cap or the instance's interrupt, whatever the server or resolver does.
        while not exchange.done.is_set():
            if wakeup.is_set():
                exchange.cancel()
                raise GuestInterrupted
            now = time.monotonic()
            if now >= call.deadline:
                exchange.cancel()
                raise GuestDeadline
            if now >= cap:
                exchange.cancel()
                raise HostStatus(Status.UNAVAILABLE)
            exchange.done.wait(min(deadline - now, ASYNC_WAKE_CHECK_S))
        if exchange.status is not None:
            raise HostStatus(exchange.status)
        assert exchange.result is not None
        return exchange.result

    def _addresses(
        self, origin: Origin, allow_local: bool, ext: ExtensionView
    ) -> Sequence[str]:
        """The checked addresses to connect to: every address the name has must pass."""
        if origin.is_ip_literal:
            addresses: Sequence[str] = [origin.host]
        else:
            try:
                addresses = list(self.resolver(origin.host, origin.port))
            except (OSError, UnicodeError):
                raise HostStatus(Status.UNAVAILABLE) from None
        if not addresses or len(addresses) > MAX_RESOLVED_ADDRESSES:
            raise HostStatus(Status.UNAVAILABLE)
        for address in addresses:
            why = address_refusal(address, allow_local) if isinstance(address, str) else None
            if not isinstance(address, str) or why is not None:
                raise refused(ext, Status.DENIED, origin, _address_reason(address, why))
        return addresses

    def _exchange(
        self,
        request: Request,
        allow_local: bool,
        deadline: float,
        state: HttpState,
        exchange: Exchange,
        allowance: NetworkAllowance | None,
    ) -> dict[str, Any]:
        # The HTTP client loads with the first request: a host that never makes one (most
        # command-line runs) does not pay for urllib3, http.client and ssl.
        import http.client

        import urllib3
        from urllib3 import HTTPHeaderDict

        origin = request.target.origin
        addresses = self._addresses(origin, allow_local, state.ext)
        # Every header the host counted, so the client adds none (see USER_AGENT).
        headers = HTTPHeaderDict()
        for name, value in request.wire_headers():
            headers.add(name, value)
        conn = self._connect(origin, addresses, deadline, exchange)
        sock = conn.sock
        assert sock is not None  # connected
        budgets: list[ReadBudget] = [] if allowance is None else [allowance]
        meter = MeteredSocket(
            sock, MAX_RESPONSE_WIRE_BYTES, [*budgets, state.quota, state.host_budget]
        )
        try:
            if origin.scheme == "https":
                # TLS above the meter, so its own bytes are counted too (TlsSocket).
                context = self.ssl_context()
                tls = TlsSocket(meter, context, origin.host)
                tls.handshake(context, origin.host)
                conn.sock = tls
            else:
                conn.sock = meter  # the parser reads the response through the meter
            conn.request(
                request.method,
                request.target.path,
                body=request.body,
                headers=headers,
                preload_content=False,
                decode_content=False,
            )
            _set_timeout(conn, deadline)
            response = conn.getresponse()
            return self._read_response(response, request, conn, deadline)
        except HostStatus:
            raise
        except (
            OSError,
            http.client.HTTPException,
            urllib3.exceptions.HTTPError,
            ValueError,
        ):
            # AllowanceSpent and ResponseTooLarge, however the client wrapped them.
            if meter.allowance_spent:
                raise HostStatus(Status.QUOTA_EXCEEDED) from None
            if meter.received >= meter.cap:
                raise HostStatus(Status.PAYLOAD_TOO_LARGE) from None
            # Refused, reset, timed out, a bad certificate, a malformed response: the guest
            # learns only that the server could not be used.
            raise HostStatus(Status.UNAVAILABLE) from None
        finally:
            conn.close()
            sock.close()  # a TLS connection's (its close leaves the socket to the exchange)

    def _connect(
        self, origin: Origin, addresses: Sequence[str], deadline: float, exchange: Exchange
    ) -> HTTPConnection:
        """A TCP connection to the first of the checked ``addresses`` that answers (the name's
        others are tried in turn, as a browser would), never to anything resolved again."""
        import urllib3
        from urllib3.connection import HTTPConnection

        for address in addresses[:MAX_CONNECT_ATTEMPTS]:
            left = deadline - time.monotonic()
            if left <= 0 or exchange.cancelled:
                break
            # A plain TCP connection for https too: the exchange puts TLS over it (TlsSocket).
            conn = HTTPConnection(address, origin.port, timeout=left)
            try:
                conn.connect()
            except (OSError, urllib3.exceptions.HTTPError, ValueError):
                conn.close()
                continue
            exchange.attach(conn.sock)
            return conn
        raise HostStatus(Status.UNAVAILABLE)

    def _read_response(
        self,
        response: urllib3.HTTPResponse,
        request: Request,
        conn: HTTPConnection,
        deadline: float,
    ) -> dict[str, Any]:
        if not MIN_STATUS <= response.status <= MAX_STATUS:
            # http.client takes any three digits (999 reached the guest as a status).
            raise HostStatus(Status.UNAVAILABLE)
        forms = request.forms
        headers: list[list[str]] = []
        header_bytes = 0  # as received
        scrubbed_bytes = 0  # as handed to the guest: a redaction may be longer than its form
        for name, value in response.headers.items():
            header_bytes += len(name.encode()) + len(value.encode())
            try:
                pair = [scrub_text(name, forms), scrub_text(value, forms)]
            except Unscrubbable:
                raise HostStatus(Status.UNAVAILABLE) from None
            scrubbed_bytes += len(pair[0].encode()) + len(pair[1].encode())
            headers.append(pair)
        if len(headers) > MAX_RESPONSE_HEADERS or max(
            header_bytes, scrubbed_bytes
        ) > MAX_RESPONSE_HEADER_BYTES:
            raise HostStatus(Status.PAYLOAD_TOO_LARGE)
        transfer = response.headers.get("Transfer-Encoding")
        if transfer is not None and [c.strip().lower() for c in transfer.split(",")] != [
            "chunked"
        ]:
            # The host sends no TE, so chunked is the one transfer coding a server may use
            # (RFC 9112 section 6.1); any other left the body coded (a secret reflected under
            # "gzip, chunked" reached the guest compressed, where the scrubber cannot see it).
            raise HostStatus(Status.UNAVAILABLE)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if forms and encoding != "identity":
            # The host asked for identity; a compressed body could carry the secret in a form
            # the scrubber cannot see, so it is not handed over.
            raise HostStatus(Status.UNAVAILABLE)
        body = bytearray()
        if request.method != "HEAD":
            while len(body) <= MAX_RESPONSE_BODY_BYTES:
                _set_timeout(conn, deadline)
                want = min(READ_CHUNK_BYTES, MAX_RESPONSE_BODY_BYTES + 1 - len(body))
                chunk = response.read(want, decode_content=False)
                if not chunk:
                    break
                body += chunk
            if len(body) > MAX_RESPONSE_BODY_BYTES:
                raise HostStatus(Status.PAYLOAD_TOO_LARGE)
        try:
            data = scrub(bytes(body), forms) if forms else bytes(body)
        except Unscrubbable:
            # A response the secret cannot be removed from is not handed to the guest at all.
            raise HostStatus(Status.UNAVAILABLE) from None
        if len(data) > MAX_RESPONSE_BODY_BYTES:
            # Redactions longer than the forms they replaced (a short secret, reflected many
            # times) grew the body past what the entry's response can carry.
            raise HostStatus(Status.PAYLOAD_TOO_LARGE)
        return {"status": response.status, "headers": headers, "body": data}


def _set_timeout(conn: HTTPConnection, deadline: float) -> None:
    """Give the socket's next operation only the time left to the request's deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise HostStatus(Status.UNAVAILABLE)
    if conn.sock is not None:
        conn.sock.settimeout(left)


def scope_patterns(scope: Mapping[str, Any]) -> list[OriginPattern] | None:
    """The patterns of an http grant scope, or None when it names none (a ``ConfigError`` for
    a malformed one: the operator's mistake)."""
    origins = scope.get("origins")
    if origins is None:
        return None
    if not isinstance(origins, list) or len(origins) > MAX_SCOPE_ORIGINS:
        raise ConfigError(f"http scope: origins must be a list of at most {MAX_SCOPE_ORIGINS}")
    patterns = []
    for text in origins:
        if not isinstance(text, str):
            raise ConfigError("http scope: each origin must be a string")
        try:
            patterns.append(parse_pattern(text))
        except NetPolicyError as exc:
            raise ConfigError(f"http scope: origin {text[:80]!r}: {exc}") from None
    return patterns


def refused(ext: ExtensionView, status: Status, origin: object, reason: str) -> HostStatus:
    """The status a refused request answers, with a line in the extension's log (source
    ``host``) naming the origin and why: the guest sees only DENIED or QUOTA_EXCEEDED, and its
    own error says no more, so the embedder (and ``wasihost run``, which prints the log) reads
    the cause there."""
    ext.log.append(Level.WARN, f"http: refused a request to {origin}: {reason}", source="host")
    return HostStatus(status)


def _not_allowed(manifest_origins: object, patterns: object) -> str:
    if not manifest_origins:
        return "the manifest lists no [http] allowed_origins, so no origin is allowed"
    if patterns:
        return (
            "the origin is not one of the manifest's [http] allowed_origins that the grant's "
            "scope (origins) also allows"
        )
    return "the origin is not one of the manifest's [http] allowed_origins"


def _address_reason(address: object, why: str | None) -> str:
    if why is None or why == "not an address":
        return f"the resolver answered {str(address)[:64]!r}, which is not an address"
    if why == "metadata":
        return f"it resolves to {address}, a cloud metadata address, never reached"
    return (
        f"it resolves to {address}, a {why} address, reached only with the grant's scope "
        "allow_local_network = true"
    )
