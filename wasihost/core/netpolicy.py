"""The http broker's destination policy: origins, URLs and addresses, with no I/O.

Pure, like :mod:`wasihost.core.codec`: every function takes text or an address and answers a value
or raises :class:`NetPolicyError`, never anything else. The broker (``brokers/http.py``) does
the resolving and the connecting; what may be reached is decided here:

- an **origin** is ``scheme://host[:port]`` (http or https, no path, no user info), compared
  exactly after normalisation (lowercase, the scheme's default port made explicit);
- a **pattern** is an origin or ``scheme://*.suffix[:port]`` (one or more labels in front of
  the suffix), for the operator's grant scope;
- a request **URL** is parsed strictly (visible ASCII, no user info, no fragment, no
  backslash), so the host and the server cannot read two different destinations in it;
- an **address** is classified: loopback, private, link-local, CGNAT, multicast, unspecified,
  reserved and documentation ranges are *local* (reachable only with ``allow_local_network``),
  IPv4 embedded in IPv6 (mapped, compatible, NAT64, 6to4) is judged by its IPv4 address, and
  the cloud metadata endpoints are refused always (also where a translator on the local
  network could find them: local-use NAT64, SIIT-translated and Teredo addresses).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final

import attrs

# The schemes an origin may name: the broker speaks HTTP/1.1, in clear or over TLS.
SCHEMES: Final = frozenset({"http", "https"})
DEFAULT_PORTS: Final = {"http": 80, "https": 443}

# 4 KiB of URL: browsers and servers accept more (Apache's request line is 8190 bytes), but an
# API call that needs more should send a body; the bound also caps the matcher's work.
MAX_URL_CHARS: Final = 4096
# RFC 1035: a name is at most 253 characters in text, a label at most 63.
MAX_HOST_CHARS: Final = 253
MAX_LABEL_CHARS: Final = 63
# An origin is short: scheme, a name of at most 253 characters and a port.
MAX_ORIGIN_CHARS: Final = 8 + 2 + MAX_HOST_CHARS + 6

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
# A last label of digits (or 0x...) reads as an IPv4 number to resolvers (``127.1``,
# ``0x7f.1``): such a host must be a canonical dotted quad or is refused.
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
# What a request URL may hold: visible ASCII. Spaces, controls, non-ASCII and backslash (which
# WHATWG parsers read as '/') are refused rather than normalised.
_URL_CHARS = re.compile(r"[!-\[\]-~]*")


class NetPolicyError(ValueError):
    """An origin, pattern or URL that does not parse; the message says what is wrong."""


@attrs.frozen
class Origin:
    """A normalised origin: lowercase scheme and host, the port always explicit. ``host`` is a
    DNS name, a dotted-quad IPv4 address or an IPv6 address (compressed, without brackets)."""

    scheme: str
    host: str
    port: int

    @property
    def is_ip_literal(self) -> bool:
        return _ip_literal(self.host) is not None

    def host_header(self) -> str:
        """The ``Host`` header for this origin: the port only when it is not the default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@attrs.frozen
class OriginPattern:
    """An origin, or with ``wildcard`` every name of one or more labels under ``host``."""

    scheme: str
    host: str
    port: int
    wildcard: bool = False

    def matches(self, origin: Origin) -> bool:
        if origin.scheme != self.scheme or origin.port != self.port:
            return False
        if not self.wildcard:
            return origin.host == self.host
        return not origin.is_ip_literal and origin.host.endswith("." + self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{'*.' if self.wildcard else ''}{host}:{self.port}"


@attrs.frozen
class Target:
    """A parsed request URL: where to connect, and the request target to send."""

    origin: Origin
    path: str  # the origin-form request target: '/' path ['?' query]


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def parse_host(text: str) -> str:
    """A URL's host part, normalised: a DNS name (lowercased), a canonical dotted quad, or a
    bracketed IPv6 literal (returned without brackets, compressed, no zone)."""
    if text.startswith("["):
        if not text.endswith("]"):
            raise NetPolicyError("an IPv6 literal must be closed with ']'")
        inner = text[1:-1]
        if "%" in inner:
            raise NetPolicyError("an IPv6 zone is not allowed")
        try:
            return ipaddress.IPv6Address(inner).compressed
        except ValueError:
            raise NetPolicyError("not an IPv6 address") from None
    host = text.lower()
    if not host:
        raise NetPolicyError("the host is empty")
    if len(host) > MAX_HOST_CHARS:
        raise NetPolicyError(f"the host has more than {MAX_HOST_CHARS} characters")
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            raise NetPolicyError("a numeric host must be a dotted-quad IPv4 address") from None
        if str(address) != host:
            raise NetPolicyError("a numeric host must be a dotted-quad IPv4 address")
        return host
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise NetPolicyError(
                "each label of a name is 1 to 63 of a-z, 0-9 and '-' (not at either end)"
            )
    return host


def _split_authority(authority: str, scheme: str) -> tuple[str, int]:
    if "@" in authority:
        raise NetPolicyError("user info ('@') is not allowed")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise NetPolicyError("an IPv6 literal must be closed with ']'")
        host_text, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise NetPolicyError("only ':port' may follow an IPv6 literal")
        port_text = rest[1:] if rest else None
    else:
        host_text, colon, port_text_raw = authority.partition(":")
        port_text = port_text_raw if colon else None
    if port_text is None:
        port = DEFAULT_PORTS[scheme]
    else:
        if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            raise NetPolicyError("the port must be a decimal number in 1..65535")
        port = int(port_text)
    return host_text, port


def _split_scheme(text: str) -> tuple[str, str]:
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise NetPolicyError("expected scheme://host")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise NetPolicyError("the scheme must be http or https")
    return scheme, rest


def parse_origin(text: str) -> Origin:
    """``scheme://host[:port]``, nothing after it (a single trailing '/' aside)."""
    if len(text) > MAX_ORIGIN_CHARS or not _URL_CHARS.fullmatch(text):
        raise NetPolicyError("an origin is scheme://host[:port] in visible ASCII")
    scheme, rest = _split_scheme(text)
    if rest.endswith("/"):
        rest = rest[:-1]
    if any(c in rest for c in "/?#"):
        raise NetPolicyError("an origin has no path, query or fragment")
    host_text, port = _split_authority(rest, scheme)
    return Origin(scheme, parse_host(host_text), port)


def parse_pattern(text: str) -> OriginPattern:
    """An origin, or ``scheme://*.suffix[:port]`` matching every name under ``suffix``."""
    wildcard = "://*." in text
    origin = parse_origin(text.replace("://*.", "://", 1) if wildcard else text)
    if wildcard:
        if origin.is_ip_literal:
            raise NetPolicyError("a wildcard applies to names, not addresses")
        if "." not in origin.host:
            raise NetPolicyError("a wildcard needs a suffix of at least two labels")
    return OriginPattern(origin.scheme, origin.host, origin.port, wildcard)


def parse_url(text: str) -> Target:
    """A request URL: ``scheme://host[:port][/path][?query]``, at most
    :data:`MAX_URL_CHARS` visible ASCII characters, no user info, no fragment."""
    if len(text) > MAX_URL_CHARS:
        raise NetPolicyError(f"the URL has more than {MAX_URL_CHARS} characters")
    if not _URL_CHARS.fullmatch(text):
        raise NetPolicyError("the URL must be visible ASCII without '\\'")
    if "#" in text:
        raise NetPolicyError("a fragment is not sent; leave it out")
    scheme, rest = _split_scheme(text)
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if path.startswith("?") or not path:
        path = "/" + path
    host_text, port = _split_authority(authority, scheme)
    return Target(Origin(scheme, parse_host(host_text), port), path)


def origin_allowed(
    origin: Origin,
    manifest_origins: Iterable[Origin] | None,
    scope_patterns: Iterable[OriginPattern] | None,
) -> bool:
    """Whether ``origin`` may be asked at all: it must be one of the manifest's origins (when
    the extension has a manifest) and match one of the scope's patterns (when the operator's
    grant gives some). With neither, nothing is allowed: a bare module reaches only what the
    operator names."""
    if manifest_origins is None and scope_patterns is None:
        return False
    if manifest_origins is not None and origin not in set(manifest_origins):
        return False
    return scope_patterns is None or any(p.matches(origin) for p in scope_patterns)


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

@attrs.frozen
class MetadataEndpoint:
    """An address where a cloud serves an instance's (or a pod's, a task's) metadata and
    credentials, with who serves it and the public document that says so."""

    address: str
    service: str
    source: str


# Cloud metadata and credential endpoints: no grant reaches them, allow_local_network
# included. Data, one row per address with its source, so that adding one is a row (and
# tests/brokers/test_issue28_brokers.py checks every row is refused and cites a source). Red-team
# 2026-12-01 (issue 28 item 13): EKS Pod Identity's, Tencent's and GCE's IPv6 endpoint were
# missing, so a grant with allow_local_network reached them; and then OpenStack's IPv6 one.
METADATA_ENDPOINTS: Final = (
    MetadataEndpoint(
        "169.254.169.254",
        "AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, Huawei, ... instance metadata",
        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html",
    ),
    MetadataEndpoint(
        "fd00:ec2::254",
        "AWS EC2 instance metadata over IPv6",
        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html",
    ),
    MetadataEndpoint(
        "169.254.170.2",
        "AWS ECS task metadata and task-role credentials",
        "https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-iam-roles.html",
    ),
    MetadataEndpoint(
        "169.254.170.23",
        "AWS EKS Pod Identity agent (pod credentials)",
        "https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html",
    ),
    MetadataEndpoint(
        "fd00:ec2::23",
        "AWS EKS Pod Identity agent over IPv6",
        "https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html",
    ),
    MetadataEndpoint(
        "169.254.169.123",
        "AWS time sync (the same link-local service network)",
        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/set-time.html",
    ),
    MetadataEndpoint(
        "fd00:ec2::123",
        "AWS time sync over IPv6",
        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/set-time.html",
    ),
    MetadataEndpoint(
        "fe80::a9fe:a9fe",
        "OpenStack instance metadata over IPv6 (link-local, on the instance's own link)",
        "https://docs.openstack.org/nova/latest/admin/metadata-service.html",
    ),
    MetadataEndpoint(
        "fd20:ce::254",
        "Google Compute Engine metadata server over IPv6",
        "https://cloud.google.com/compute/docs/metadata/querying-metadata",
    ),
    MetadataEndpoint(
        "100.100.100.200",
        "Alibaba Cloud ECS instance metadata",
        "https://www.alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata",
    ),
    MetadataEndpoint(
        "169.254.0.23",
        "Tencent Cloud CVM instance metadata (metadata.tencentyun.com)",
        "https://www.tencentcloud.com/document/product/213/4934",
    ),
    MetadataEndpoint(
        "192.0.0.192",
        "Oracle Cloud Infrastructure Classic instance metadata",
        "Oracle Cloud Infrastructure Classic documentation, 'Retrieving Instance Metadata'",
    ),
    MetadataEndpoint(
        "168.63.129.16",
        "Azure wire server (a public address with a host-only meaning)",
        "https://learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16",
    ),
)
METADATA_ADDRESSES: Final = frozenset(ipaddress.ip_address(e.address) for e in METADATA_ENDPOINTS)

# IPv4 ranges that are not the public internet (IANA special-purpose registry), with why.
_LOCAL_V4: Final = tuple(
    (ipaddress.IPv4Network(net), reason)
    for net, reason in (
        ("0.0.0.0/8", "unspecified"),  # "this network": 0.0.0.0 reaches the host itself
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "cgnat"),  # carrier-grade NAT, shared address space
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),  # IETF protocol assignments
        ("192.0.2.0/24", "reserved"),  # documentation
        ("192.88.99.0/24", "reserved"),  # deprecated 6to4 relay anycast
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved"),  # benchmarking
        ("198.51.100.0/24", "reserved"),  # documentation
        ("203.0.113.0/24", "reserved"),  # documentation
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # future use, and 255.255.255.255 broadcast
    )
)

# IPv6 ranges judged by the IPv4 address they carry (RFC 4291 mapped and compatible, RFC 6052
# NAT64 well-known prefix): a tunnel to 127.0.0.1 is 127.0.0.1.
_EMBEDDING_V6: Final = (
    ipaddress.IPv6Network("::ffff:0:0/96"),
    ipaddress.IPv6Network("::/96"),
    ipaddress.IPv6Network("64:ff9b::/96"),
)
_SIX_TO_FOUR: Final = ipaddress.IPv6Network("2002::/16")
# Only 2000::/3 is global unicast; inside it these are not the public internet.
_GLOBAL_V6: Final = ipaddress.IPv6Network("2000::/3")
_LOCAL_V6: Final = tuple(
    (ipaddress.IPv6Network(net), reason)
    for net, reason in (
        ("2001::/23", "reserved"),  # IETF protocol assignments, Teredo (2001::/32) among them
        ("2001:db8::/32", "reserved"),  # documentation
        ("3fff::/20", "reserved"),  # documentation (RFC 9637)
    )
)
_OUTSIDE_GLOBAL_V6: Final = tuple(
    (ipaddress.IPv6Network(net), reason)
    for net, reason in (
        ("::1/128", "loopback"),
        ("::/128", "unspecified"),
        ("64:ff9b:1::/48", "private"),  # local-use NAT64 (RFC 8215)
        ("fc00::/7", "private"),  # unique local
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),  # deprecated site-local
        ("ff00::/8", "multicast"),
    )
)


# Ranges whose addresses may carry an IPv4 address for a translator on the local network,
# where it could sit: the local-use NAT64 prefix (RFC 8215, at any RFC 6052 prefix length
# from /48 to /96), SIIT's IPv4-translated addresses (RFC 2765 ::ffff:0:a.b.c.d) and Teredo's
# server address (RFC 4380). Their addresses are local (reachable only with
# allow_local_network), and metadata if any candidate is: with the local network granted,
# 64:ff9b:1::a9fe:a9fe reached 169.254.169.254 through a local-use NAT64 translator.
_LOCAL_NAT64: Final = ipaddress.IPv6Network("64:ff9b:1::/48")
_SIIT_TRANSLATED: Final = ipaddress.IPv6Network("::ffff:0:0:0/96")
_TEREDO: Final = ipaddress.IPv6Network("2001::/32")


def _translated_candidates(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    value = int(address)
    if address in _LOCAL_NAT64:
        # RFC 6052 section 2.2: the IPv4 bits skip bits 64..71 (the "u" octet).
        b = value.to_bytes(16, "big")
        spots = (b[6:8] + b[9:11], b[7:8] + b[9:12], b[9:13], b[12:16])  # /48 /56 /64 /96
        return [ipaddress.IPv4Address(spot) for spot in spots]
    if address in _SIIT_TRANSLATED:
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address in _TEREDO:
        server = (value >> 64) & 0xFFFFFFFF
        client = ~value & 0xFFFFFFFF  # stored with every bit inverted
        return [ipaddress.IPv4Address(server), ipaddress.IPv4Address(client)]
    return []


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF)
    for net in _EMBEDDING_V6:
        if address in net:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_class(address: IPAddress) -> str:
    """``"public"``, ``"metadata"``, or why the address is local: ``loopback``, ``private``,
    ``link-local``, ``cgnat``, ``multicast``, ``unspecified`` or ``reserved``."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        address = ipaddress.IPv6Address(address.compressed.split("%")[0])
    if address in METADATA_ADDRESSES:
        return "metadata"
    if isinstance(address, ipaddress.IPv6Address) and any(
        v4 in METADATA_ADDRESSES for v4 in _translated_candidates(address)
    ):
        return "metadata"
    if isinstance(address, ipaddress.IPv4Address):
        for net4, reason in _LOCAL_V4:
            if address in net4:
                return reason
        return "public"
    for net6, reason in _OUTSIDE_GLOBAL_V6:
        if address in net6:
            return reason
    embedded = _embedded_v4(address)
    if embedded is not None:
        return address_class(embedded)
    if address not in _GLOBAL_V6:
        return "reserved"
    for net6, reason in _LOCAL_V6:
        if address in net6:
            return reason
    return "public"


def address_refusal(address: str, allow_local_network: bool) -> str | None:
    """Why the resolver's answer ``address`` may not be connected to, or None if it may:
    metadata never, local ranges only with ``allow_local_network``, text that is not an
    address never."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return "not an address"
    kind = address_class(parsed)
    if kind == "public":
        return None
    if kind == "metadata":
        return kind
    return None if allow_local_network else kind
