"""The signed revocation list: which publishers, keys, package digests and extension versions
a host refuses, as TUF-style metadata (a version that only goes up, an expiry).

The list is a canonical ASCII text, one ``key value`` line each, LF-terminated::

    wasihost-revocations/1
    version 7
    expires 2026-12-31T00:00:00Z
    publisher evil.example
    key BASE64-ED25519-PUBLIC-KEY
    package-sha256 HEX
    module-sha256 HEX
    extension org.example.hello 0.1.0
    signature ops.example BASE64KEY BASE64SIG

The last line signs every byte before it (under a domain prefix of its own, so it is never a
package signature). The key must be one the trust file marks ``revocations``.

The list is checked at every admission and **fails closed**: a list that is missing,
malformed, signed by anything but a revocation key, expired (a freeze attack: an old list
served forever), or older than the highest version this host has seen (a rollback, also
across restarts when the host has a state directory) refuses every package. The list comes
from wherever the operator fetched it, so :func:`parse` is a bounded reader whose only error
is :class:`~wasihost.core.errors.RevocationListError`.
"""

from __future__ import annotations

import calendar
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import attrs

from ..core.errors import RevocationListError, RevokedError
from .regular_files import read_regular
from .trust import (
    KEY_BYTES,
    PUBLISHER_ID,
    SigningKey,
    TrustStore,
    b64,
    b64_exact,
    format_time,
)

if TYPE_CHECKING:
    from ..store.state import StateStore
    from .package import Package

SCHEMA: Final = "wasihost-revocations/1"
# What the signature covers is prefixed with this, so that no other wasihost signature (a
# package's) can be replayed as a revocation list's, nor the other way round.
SIGNATURE_DOMAIN: Final = b"wasihost-revocation-list-signature/1\n"
# A list of every revoked digest of a large registry fits in 1 MiB (about 12000 entries).
MAX_LIST_BYTES: Final = 1024 * 1024
# Bounds the Python objects a hostile list makes us create (1 MiB of the shortest lines).
MAX_ENTRIES: Final = 16384
# Versions are stored in SQLite's signed 64-bit integers.
MAX_VERSION: Final = (1 << 63) - 1
# Ed25519 signatures are 64 bytes (RFC 8032).
SIGNATURE_BYTES: Final = 64
# Extension ids and versions: the manifest's own bounds are tighter; this bounds a line.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[1-9][0-9]{0,18}")
_EXPIRES = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z")
# Messages quote at most this much of a line from the list.
_QUOTE_CHARS: Final = 60


@attrs.frozen
class Claims:
    """What a revocation list is matched against: a package's id and version, publishers
    (the verified signer, and the manifest's claim), signing key and the keys that endorsed it,
    package and module digests. Made from a loaded package (:meth:`of`), or from an install
    record without loading its package again (``wasihost.host.updates.revoke_installed``)."""

    module_digest: str
    extension: str | None = None
    version: str | None = None
    publishers: tuple[str, ...] = ()
    signing_key: bytes | None = None
    endorsed_by: tuple[bytes, ...] = ()
    package_digest: str | None = None

    @classmethod
    def of(cls, package: Package) -> Claims:
        manifest = package.manifest
        publishers = (package.signer, manifest.publisher if manifest else None)
        return cls(
            module_digest=package.sha256,
            extension=manifest.id if manifest else None,
            version=manifest.version if manifest else None,
            publishers=tuple(p for p in publishers if p is not None),
            signing_key=package.signing_key,
            endorsed_by=package.endorsed_by,
            package_digest=package.package_digest,
        )


@attrs.frozen
class RevocationList:
    version: int
    expires: float
    publishers: frozenset[str] = frozenset()
    keys: frozenset[bytes] = frozenset()
    package_digests: frozenset[str] = frozenset()
    module_digests: frozenset[str] = frozenset()
    extensions: frozenset[tuple[str, str]] = frozenset()

    def body(self) -> bytes:
        lines = [SCHEMA, f"version {self.version}", f"expires {format_time(self.expires)}"]
        lines += [f"publisher {p}" for p in sorted(self.publishers)]
        lines += [f"key {b64(k)}" for k in sorted(self.keys)]
        lines += [f"package-sha256 {d}" for d in sorted(self.package_digests)]
        lines += [f"module-sha256 {d}" for d in sorted(self.module_digests)]
        lines += [f"extension {i} {v}" for i, v in sorted(self.extensions)]
        return ("\n".join(lines) + "\n").encode("ascii")

    def sign(self, key: SigningKey) -> bytes:
        """The signed list file, signed by ``key`` (which the trust file must mark
        ``revocations`` for hosts to accept it)."""
        body = self.body()
        signature = key.private.sign(SIGNATURE_DOMAIN + body)
        line = f"signature {key.publisher} {b64(key.public_bytes)} {b64(signature)}\n"
        return body + line.encode("ascii")

    def merged(self, older: RevocationList) -> RevocationList:
        """This list's version and expiry, with ``older``'s entries kept as well."""
        return attrs.evolve(
            self,
            publishers=self.publishers | older.publishers,
            keys=self.keys | older.keys,
            package_digests=self.package_digests | older.package_digests,
            module_digests=self.module_digests | older.module_digests,
            extensions=self.extensions | older.extensions,
        )

    def revocation_of(self, package: Package) -> str | None:
        """Why ``package`` is revoked, or None."""
        return self.revocation_of_claims(Claims.of(package))

    def revocation_of_claims(self, claims: Claims) -> str | None:
        """Why a package of these ``claims`` is revoked, or None."""
        for publisher in claims.publishers:
            if publisher in self.publishers:
                return f"publisher {publisher!r} is revoked"
        if claims.signing_key is not None and claims.signing_key in self.keys:
            return f"its signing key {b64(claims.signing_key)[:16]}... is revoked"
        for endorser in claims.endorsed_by:
            if endorser in self.keys:
                return f"the key {b64(endorser)[:16]}... that endorsed its signing key is revoked"
        if claims.package_digest is not None and claims.package_digest in self.package_digests:
            return f"package digest {claims.package_digest} is revoked"
        if claims.module_digest in self.module_digests:
            return f"module digest {claims.module_digest} is revoked"
        if claims.version is not None:
            # An entry without build metadata names a release, and revokes every build of it
            # (1.0.0 revokes 1.0.0+build.1; SemVer orders them as one version); an entry with
            # build metadata revokes that build only.
            release = claims.version.split("+", 1)[0]
            for version in dict.fromkeys((claims.version, release)):
                if (claims.extension, version) in self.extensions:
                    builds = "" if version == claims.version else ", every build of it,"
                    return f"extension {claims.extension} {version}{builds} is revoked"
        return None


def _fail(why: str) -> RevocationListError:
    return RevocationListError(f"revocation list: {why} (every package is refused)")


def _expires(text: str) -> float:
    match = _EXPIRES.fullmatch(text)
    if match is None:
        raise _fail("expires is not YYYY-MM-DDTHH:MM:SSZ")
    try:
        fields = time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise _fail("expires is not a date") from None
    return float(calendar.timegm(fields))


def _b64(text: str, size: int, what: str) -> bytes:
    try:
        return b64_exact(text, size)
    except ValueError as exc:
        raise _fail(f"{what} {exc}") from None


def parse(data: bytes, trust: TrustStore) -> RevocationList:
    """A verified list; :class:`RevocationListError` for anything else."""
    if len(data) > MAX_LIST_BYTES:
        raise _fail(f"larger than {MAX_LIST_BYTES} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise _fail("not ASCII") from None
    lines = text.split("\n")
    if lines[-1] != "" or len(lines) < 5:
        raise _fail(f"not a {SCHEMA} list ending in a signature line and a newline")
    if len(lines) > MAX_ENTRIES + 5:
        raise _fail(f"more than {MAX_ENTRIES} entries")
    signature_line = lines[-2]
    body = text[: len(text) - len(signature_line) - 1].encode("ascii")
    signer_key = _verify(signature_line, body, trust)
    # Only signed bytes are read from here on.
    if lines[0] != SCHEMA:
        raise _fail(f"the first line is not {SCHEMA}")
    version_line, expires_line = lines[1].split(" "), lines[2].split(" ")
    if len(version_line) != 2 or version_line[0] != "version":
        raise _fail("the second line is not 'version N'")
    if not _VERSION.fullmatch(version_line[1]) or int(version_line[1]) > MAX_VERSION:
        raise _fail(f"version {version_line[1][:20]!r} is not a positive integer")
    if len(expires_line) != 2 or expires_line[0] != "expires":
        raise _fail("the third line is not 'expires TIME'")
    publishers: set[str] = set()
    keys: set[bytes] = set()
    digests: dict[str, set[str]] = {"package-sha256": set(), "module-sha256": set()}
    extensions: set[tuple[str, str]] = set()
    for number, line in enumerate(lines[3:-2], start=4):
        kind, _, value = line.partition(" ")
        fields = value.split(" ")
        where = f"line {number} ({line[:_QUOTE_CHARS]!r})"
        if kind == "publisher" and PUBLISHER_ID.fullmatch(value):
            publishers.add(value)
        elif kind == "key" and len(fields) == 1:
            keys.add(_b64(value, KEY_BYTES, where))
        elif kind in digests and _HEX64.fullmatch(value):
            digests[kind].add(value)
        elif kind == "extension" and len(fields) == 2 and all(map(_TOKEN.fullmatch, fields)):
            extensions.add((fields[0], fields[1]))
        else:
            raise _fail(f"{where} is not a revocation entry")
    if signer_key in keys:
        # A list that says its own key is revoked vouches for nothing, itself included: it was
        # taken, and its entries applied, while the key it names as stolen signed it. A list's
        # key entries never retire a revocation key (the trust file's line does), so this
        # contradiction is refused (fail closed) rather than read either way.
        raise _fail("it revokes the key that signed it")
    return RevocationList(
        int(version_line[1]),
        _expires(expires_line[1]),
        frozenset(publishers),
        frozenset(keys),
        frozenset(digests["package-sha256"]),
        frozenset(digests["module-sha256"]),
        frozenset(extensions),
    )


def _verify(line: str, body: bytes, trust: TrustStore) -> bytes:
    """The revocation key that signed ``body``; raises unless it is a valid signature by one."""
    fields = line.split(" ")
    if len(fields) != 4 or fields[0] != "signature" or not PUBLISHER_ID.fullmatch(fields[1]):
        raise _fail("the last line is not 'signature SIGNER KEY SIGNATURE'")
    signer = fields[1]
    key = _b64(fields[2], KEY_BYTES, "the signature's key")
    signature = _b64(fields[3], SIGNATURE_BYTES, "the signature")
    if key not in trust.revocation_keys_for(signer):
        raise _fail(
            f"signed by {signer!r} with key {fields[2][:16]}..., which the trust file does not "
            "mark as a revocation key ('ID ed25519 KEY revocations')"
        )
    expired = trust.expired(key)
    if expired is not None:
        raise _fail(f"signed by {signer!r} with a key that expired at {format_time(expired)}")
    # Imported here, not at the top: a host that never reads a list never loads cryptography.
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, SIGNATURE_DOMAIN + body)
    except InvalidSignature:
        raise _fail(f"the signature by {signer!r} does not match the list (tampered)") from None
    return key


class VersionFloor(Protocol):
    """The highest list version seen, durable when the host has a state directory."""

    def highest(self) -> int: ...

    def raise_to(self, version: int) -> None: ...


class MemoryFloor:
    """The highest version seen by this process only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._highest = 0

    def highest(self) -> int:
        return self._highest

    def raise_to(self, version: int) -> None:
        with self._lock:
            self._highest = max(self._highest, version)


class StateFloor:
    """The highest version seen, kept in the state database: a rollback of the list across
    restarts is refused too."""

    KEY: Final = "revocation-list-version"

    def __init__(self, state: StateStore) -> None:
        self._state = state

    def highest(self) -> int:
        return self._state.high_water(self.KEY)

    def raise_to(self, version: int) -> None:
        self._state.raise_high_water(self.KEY, version)


class StateDirFloor:
    """The highest version seen, in the state database of ``directory``, opened for each
    read or write (for front ends, like the CLI, that have no host holding it open)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def highest(self) -> int:
        from ..store.state import StateStore

        store = StateStore(self.directory)
        try:
            return StateFloor(store).highest()
        finally:
            store.close()

    def raise_to(self, version: int) -> None:
        from ..store.state import StateStore

        store = StateStore(self.directory)
        try:
            StateFloor(store).raise_to(version)
        finally:
            store.close()


def key_bytes(text: str) -> bytes:
    """A base64 Ed25519 public key, as a list entry takes it."""
    return _b64(text, KEY_BYTES, f"key {text[:_QUOTE_CHARS]!r}")


def read_list(path: Path) -> bytes:
    try:
        return read_regular(path, MAX_LIST_BYTES, follow=True)
    except OSError as exc:
        raise _fail(f"{path} cannot be read: {exc.strerror}") from None


@attrs.frozen
class Revocations:
    """Where the host's revocation list is and how it is trusted: the file (re-read at every
    check, so a refreshed list takes effect at the next admission), the trust store whose
    ``revocations`` keys sign it, and the clock its expiry is checked against. ``floor``
    keeps the highest version seen; without one, a host keeps it itself (in its state
    database when it has a state directory)."""

    path: Path = attrs.field(converter=Path)
    trust: TrustStore
    clock: Callable[[], float] = attrs.field(default=time.time, eq=False)
    floor: VersionFloor | None = attrs.field(default=None, eq=False)

    def current(self, floor: VersionFloor) -> RevocationList:
        """The list, verified, fresh and not older than ``floor``; raises otherwise. A newer
        list raises the floor, so a later rollback is refused."""
        found = parse(read_list(self.path), self.trust)
        now = self.clock()
        if found.expires <= now:
            raise _fail(
                f"version {found.version} expired at {format_time(found.expires)} (it is "
                f"{format_time(now)}): fetch a fresh list"
            )
        highest = floor.highest()
        if found.version < highest:
            raise _fail(
                f"version {found.version} is older than version {highest} already seen (a rollback)"
            )
        floor.raise_to(found.version)
        return found

    def check(self, package: Package, floor: VersionFloor) -> None:
        """Return if ``package`` may be admitted under the current list; raise otherwise."""
        why = self.current(floor).revocation_of(package)
        if why is not None:
            raise RevokedError(f"{package.name} is refused: {why} by the revocation list")


__all__ = [
    "Claims",
    "MemoryFloor",
    "RevocationList",
    "Revocations",
    "StateDirFloor",
    "StateFloor",
    "VersionFloor",
    "format_time",
    "key_bytes",
    "parse",
    "read_list",
]
