"""Publisher keys: the trusted-publishers file, public-key lines and private-key files.

A trust file holds one key per line, ``ID ed25519 BASE64KEY``, where ID is a publisher id and
BASE64KEY the 32-byte raw Ed25519 public key; blank lines and lines starting with ``#`` are
comments. A line ending in the role word ``revocations`` (``ID ed25519 BASE64KEY
revocations``) holds a key that may sign revocation lists and nothing else: it verifies no
package, and a publisher key signs no revocation list (separate roles, as in TUF). A
publisher may have several keys (rotation): any one of them verifies. A key may end with an
expiry, ``expires=2027-06-30T00:00:00Z`` (UTC): from then on it verifies nothing, packages
installed under it included, so a lost or retired key stops being trusted on a date rather
than whenever someone remembers to delete its line. A key may also carry an endorsement,
``endorsed-by=OLDKEY:SIGNATURE``: the publisher's key of an earlier line signed this one as its
next key (``SigningKey.endorse``, ``wasihost endorse``), so an operator can accept a rotation
the publisher ships without checking the new key by other means; revoking the old key revokes
what it endorsed, and an endorsement counts only while its endorsing key is unexpired (a key
every line of which is endorsed expires with the last of its endorsers). A ``.pub``
file written by ``wasihost keygen`` is one such line. The trust file is the operator's own
configuration, so its errors are :class:`~wasihost.core.errors.ConfigError`.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

from ..core.errors import ConfigError
from .regular_files import read_regular

# The cryptography package is imported where a key is made or used: reading a trust file needs
# none of it, and a host run with no signing key should not pay its import at start-up.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# Publisher ids are typed in files and command lines and compared byte for byte: a short
# token of the same characters as reverse-DNS ids, e-mail addresses and user names.
PUBLISHER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
ALGORITHM: Final = "ed25519"
# The role word that marks a revocation-list signing key in a trust file.
REVOCATIONS_ROLE: Final = "revocations"
PRIVATE_ALGORITHM: Final = "ed25519-private"
# Ed25519 (RFC 8032): 32-byte public keys and 32-byte private seeds.
KEY_BYTES: Final = 32
# A trust file of thousands of keys is a few hundred KiB; 1 MiB bounds a mistaken path.
MAX_TRUST_FILE_BYTES: Final = 1024 * 1024
# More keys than any operator trusts; bounds what a wrong file makes us hold.
MAX_TRUSTED_KEYS: Final = 4096
# A private-key file is two short lines.
MAX_KEY_FILE_BYTES: Final = 4096


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64_exact(text: str, size: int) -> bytes:
    """``text`` as strict base64 of exactly ``size`` bytes; a ValueError saying what is wrong
    (``is not base64``, ``is N bytes, not SIZE``) otherwise, for the caller to name the field."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64") from None
    if len(raw) != size:
        raise ValueError(f"is {len(raw)} bytes, not {size}")
    return raw


def _b64_exact(text: str, size: int, where: str, what: str) -> bytes:
    try:
        return b64_exact(text, size)
    except ValueError as exc:
        raise ConfigError(f"{where}: the {what} {exc}") from None


def _key_bytes(text: str, where: str) -> bytes:
    return _b64_exact(text, KEY_BYTES, where, "key")


# Ed25519 public keys for which a signature proves nothing: the encodings of the eight points of
# small order (the y coordinates 0, 1, -1 and the two of order 8; the sign bit cleared), plus
# any y of p or more (non-canonical; p and p+1 are again small-order points). With such a key,
# (R, S) = (a small-order point, 0) verifies for about every fourth message: anyone can forge.
_P = 2**255 - 19
_SMALL_ORDER_Y = frozenset(
    {
        0,
        1,
        _P - 1,
        int.from_bytes(
            bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
            "little",
        ),
        int.from_bytes(
            bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),
            "little",
        ),
    }
)


def weak_public_key(raw: bytes) -> bool:
    """Whether the 32-byte Ed25519 public key ``raw`` is one for which anyone can make a
    signature verify (see ``_SMALL_ORDER_Y``): refused wherever a key is trusted."""
    y = int.from_bytes(raw, "little") & ((1 << 255) - 1)
    return y >= _P or y in _SMALL_ORDER_Y


def _public_key(text: str, where: str) -> bytes:
    raw = _key_bytes(text, where)
    if weak_public_key(raw):
        raise ConfigError(
            f"{where}: the key {text[:12]}... is a point of small order: any signature made "
            "for it would prove nothing, so it is refused"
        )
    return raw


def check_publisher(publisher: str, where: str) -> None:
    if not PUBLISHER_ID.fullmatch(publisher):
        raise ConfigError(
            f"{where}: publisher id {publisher[:40]!r} is not 1 to 128 of letters, digits "
            "and ._@+- starting with a letter or digit"
        )


def _lines(text: str) -> Iterable[tuple[int, list[str]]]:
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield number, stripped.split()


EXPIRES_OPTION: Final = "expires="
ENDORSED_OPTION: Final = "endorsed-by="
LINE_FORM: Final = (
    f"expected 'ID {ALGORITHM} BASE64KEY', then optionally {REVOCATIONS_ROLE!r} (a "
    "revocation-list key), 'expires=YYYY-MM-DD', 'endorsed-by=OLDKEY:SIGNATURE' (a rotation)"
)
# The domain of a rotation's endorsement: the old key signs only this, so an endorsement can be
# replayed as nothing else and nothing else as an endorsement.
ROTATION_DOMAIN: Final = b"wasihost-key-rotation/1\n"


def rotation_message(publisher: str, new_key: bytes) -> bytes:
    return ROTATION_DOMAIN + f"publisher {publisher}\nkey {b64(new_key)}\n".encode()


def _options(
    tokens: list[str], where: str
) -> tuple[str | None, float | None, tuple[bytes, bytes] | None]:
    """A trust line's role word, expiry and endorsement, each at most once, in any order."""
    role: str | None = None
    expires: float | None = None
    endorsement: tuple[bytes, bytes] | None = None
    seen: set[str] = set()
    for token in tokens:
        name = token.split("=", 1)[0]
        if name in seen:
            raise ConfigError(f"{where}: {name} is given twice")
        seen.add(name)
        if token == REVOCATIONS_ROLE:
            role = token
        elif token.startswith(EXPIRES_OPTION):
            expires = parse_expiry(token[len(EXPIRES_OPTION) :], where)
        elif token.startswith(ENDORSED_OPTION):
            old, _, signature = token[len(ENDORSED_OPTION) :].partition(":")
            raw_signature = _b64_exact(signature, 64, where, "endorsement signature")
            endorsement = (_public_key(old, where), raw_signature)
        else:
            raise ConfigError(f"{where}: {LINE_FORM}; not {token[:40]!r}")
    return role, expires, endorsement


def format_time(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def parse_expiry(text: str, where: str) -> float:
    """``2027-06-30T00:00:00Z`` (or a date alone, meaning its midnight UTC) as Unix time."""
    try:
        if len(text) == 10:
            moment = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
        else:
            moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise ConfigError(
            f"{where}: expiry {text[:40]!r} is not YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ (UTC)"
        ) from None
    return moment.timestamp()


def _endorsed_until(
    expiry: Mapping[bytes, float],
    endorsers: Mapping[tuple[str, bytes], frozenset[bytes]],
    vouched: set[tuple[str, bytes]],
) -> dict[tuple[str, bytes], float]:
    """For each (publisher, key) whose every line is an endorsement: until when one of its
    endorsements counts (none: no end). Each is its publisher's own: a key the operator
    vouches for as one publisher's, or another publisher's old key endorsed, is trusted as
    this publisher's only through this publisher's endorsements. An endorsement carries no
    date, so that its endorsing key was valid when it signed is known only as "it is unexpired
    now" (an expiry never moves back): an endorsement counts while its endorser is trusted, and
    an endorser trusted only through endorsements itself while one of those counts. A date in
    the endorsement would not do: the holder of the old key, whom its expiry is meant to stop,
    would choose it.

    A key's end is the latest over its endorsers (one endorsement that counts suffices),
    bounded by its own expiry; found by relaxing until nothing moves (a widest-path search:
    each round settles at least one more key, so at most a round per key)."""
    inf = float("inf")
    until = {held: -inf for held in endorsers if held not in vouched}

    def end(held: tuple[str, bytes]) -> float:
        return min(until.get(held, inf), expiry.get(held[1], inf))

    changed = True
    while changed:
        changed = False
        for (publisher, key), known in until.items():
            endorsed_by = endorsers[(publisher, key)]
            best = min(max(end((publisher, e)) for e in endorsed_by), expiry.get(key, inf))
            if best > known:
                until[(publisher, key)] = best
                changed = True
    # (-inf, a key no endorsement reaches, cannot be: a key's first line needs an endorser on
    # an earlier line; 0 would make it expired since 1970.)
    return {held: max(value, 0.0) for held, value in until.items() if value != inf}


@attrs.frozen
class TrustStore:
    """The publishers the host trusts, each with its raw Ed25519 public keys. ``expiry``
    maps a key to the Unix time from which it is no longer trusted, checked against
    ``clock`` (injectable, so tests and audits can ask "as of when")."""

    keys: frozenset[tuple[str, bytes]]
    # Keys that may sign revocation lists (and nothing else), by the name of their holder.
    revokers: frozenset[tuple[str, bytes]] = frozenset()
    expiry: Mapping[bytes, float] = attrs.field(factory=dict, eq=False, hash=False)
    clock: Callable[[], float] = attrs.field(default=time.time, eq=False, hash=False)
    # A rotated-to key -> every older key of its publisher that signed an endorsement of it (a
    # key may be endorsed on several lines: each endorser stays one its revocation reaches).
    endorsers: Mapping[bytes, frozenset[bytes]] = attrs.field(factory=dict, eq=False, hash=False)
    # A (publisher, key) every line of which is endorsed (none is the operator's own word for
    # that publisher) -> when the last of its endorsements stops counting: an endorsement counts
    # only while its endorsing key is trusted, so the key's trust as that publisher's ends there.
    endorsed_until: Mapping[tuple[str, bytes], float] = attrs.field(
        factory=dict, eq=False, hash=False
    )

    def _ends(self, key: bytes, publisher: str | None) -> float | None:
        """When ``key`` stops being trusted as ``publisher``'s (as anyone's, if None): its own
        expiry or, for a key trusted only through endorsements, the end of the last of them."""
        ends = [self.expiry[key]] if key in self.expiry else []
        ends += [
            until
            for (holder, endorsed), until in self.endorsed_until.items()
            if endorsed == key and publisher in (None, holder)
        ]
        return min(ends, default=None)

    def expired(self, key: bytes, publisher: str | None = None) -> float | None:
        """When ``key``'s trust as ``publisher``'s key ended, if it has, else None; without a
        publisher, the soonest end over every publisher it is listed for."""
        when = self._ends(key, publisher)
        return when if when is not None and when <= self.clock() else None

    def expiry_reason(self, key: bytes, publisher: str | None = None) -> str:
        """Why ``key`` expires when it does, for an error: its own line, or its endorsers."""
        ends = self._ends(key, publisher)
        if ends is None or ends == self.expiry.get(key):
            return "its expiry"
        return (
            "the expiry of the keys that endorsed it: an endorsement counts only while its "
            "endorsing key is unexpired; the operator vouches for the key by a line of its own, "
            "without endorsed-by, to keep it"
        )

    def lineage(self, key: bytes) -> tuple[bytes, ...]:
        """``key`` and every key that endorsed it, directly or through other endorsed keys,
        nearest first (a rotation's chain), each once. Every endorsement line counts: a later
        line endorsing the same key again (by itself, or by a key it endorsed, a loop) adds to
        its endorsers and never replaces them, so revoking the old key still reaches it."""
        chain = [key]
        seen = {key}
        for current in chain:  # grows while it is walked: a breadth-first walk of the graph
            for endorser in sorted(self.endorsers.get(current, ())):
                if endorser not in seen:
                    seen.add(endorser)
                    chain.append(endorser)
        return tuple(chain)

    @classmethod
    def parse(
        cls, text: str, origin: str = "trust file", clock: Callable[[], float] = time.time
    ) -> TrustStore:
        keys: set[tuple[str, bytes]] = set()
        revokers: set[tuple[str, bytes]] = set()
        expiry: dict[bytes, float] = {}
        endorsers: dict[bytes, frozenset[bytes]] = {}
        endorsed_by: dict[tuple[str, bytes], frozenset[bytes]] = {}
        # (publisher, key) with a line that is not an endorsement: the operator's own word
        vouched: set[tuple[str, bytes]] = set()
        for number, fields in _lines(text):
            where = f"{origin} line {number}"
            if len(fields) < 3:
                raise ConfigError(f"{where}: {LINE_FORM}")
            publisher, algorithm, key = fields[:3]
            check_publisher(publisher, where)
            if algorithm != ALGORITHM:
                raise ConfigError(f"{where}: unknown key type {algorithm[:40]!r}")
            raw = _public_key(key, where)
            role, expires, endorsement = _options(fields[3:], where)
            if endorsement is not None:
                if role is not None:
                    raise ConfigError(f"{where}: a revocation key is not endorsed, only listed")
                from cryptography.exceptions import InvalidSignature
                from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

                endorser, signature = endorsement
                if endorser == raw:
                    raise ConfigError(f"{where}: a key cannot endorse itself")
                if (publisher, endorser) not in keys:
                    raise ConfigError(
                        f"{where}: endorsed by key {b64(endorser)[:16]}..., which is not a key of "
                        f"publisher {publisher!r} on an earlier line"
                    )
                try:
                    Ed25519PublicKey.from_public_bytes(endorser).verify(
                        signature, rotation_message(publisher, raw)
                    )
                except InvalidSignature:
                    raise ConfigError(
                        f"{where}: the endorsement is not a signature of this key by that old "
                        f"key of publisher {publisher!r}"
                    ) from None
                endorsers[raw] = endorsers.get(raw, frozenset()) | {endorser}
                held = (publisher, raw)
                endorsed_by[held] = endorsed_by.get(held, frozenset()) | {endorser}
            else:
                vouched.add((publisher, raw))
            (revokers if role else keys).add((publisher, raw))
            if expires is not None:
                expiry[raw] = min(expires, expiry.get(raw, expires))
            if len(keys) + len(revokers) > MAX_TRUSTED_KEYS:
                raise ConfigError(f"{origin}: more than {MAX_TRUSTED_KEYS} keys")
        endorsed_until = _endorsed_until(expiry, endorsed_by, vouched)
        return cls(frozenset(keys), frozenset(revokers), expiry, clock, endorsers, endorsed_until)

    @classmethod
    def from_file(cls, path: str | Path) -> TrustStore:
        return cls.parse(_read_text(Path(path), MAX_TRUST_FILE_BYTES, "trust file"), str(path))

    def revocation_keys_for(self, signer: str) -> frozenset[bytes]:
        return frozenset(key for who, key in self.revokers if who == signer)

    def keys_for(self, publisher: str) -> frozenset[bytes]:
        return frozenset(key for who, key in self.keys if who == publisher)

    @property
    def publishers(self) -> frozenset[str]:
        return frozenset(who for who, _ in self.keys)


@attrs.frozen
class SigningKey:
    """A publisher's private key, as ``wasihost keygen`` writes it."""

    publisher: str
    private: Ed25519PrivateKey = attrs.field(repr=False, eq=False)

    @classmethod
    def generate(cls, publisher: str) -> SigningKey:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        check_publisher(publisher, "--publisher")
        return cls(publisher, Ed25519PrivateKey.generate())

    @property
    def public_bytes(self) -> bytes:
        return self.private.public_key().public_bytes_raw()

    def public_line(self) -> str:
        """The ``.pub`` file: one trust-file line."""
        return f"{self.publisher} {ALGORITHM} {b64(self.public_bytes)}\n"

    def endorse(self, new_key: bytes) -> str:
        """The trust-file line of ``new_key`` as this publisher's next key, signed by this
        (old) key: a host that trusts this key accepts the line by itself."""
        signature = self.private.sign(rotation_message(self.publisher, new_key))
        return (
            f"{self.publisher} {ALGORITHM} {b64(new_key)} "
            f"{ENDORSED_OPTION}{b64(self.public_bytes)}:{b64(signature)}\n"
        )

    def private_text(self) -> str:
        return (
            f"# wasihost signing key of {self.publisher}: keep it secret\n"
            f"{self.publisher} {PRIVATE_ALGORITHM} {b64(self.private.private_bytes_raw())}\n"
        )

    @classmethod
    def parse(cls, text: str, origin: str = "key file") -> SigningKey:
        found = list(_lines(text))
        if len(found) != 1 or len(found[0][1]) != 3 or found[0][1][1] != PRIVATE_ALGORITHM:
            raise ConfigError(f"{origin}: expected one line 'ID {PRIVATE_ALGORITHM} BASE64SEED'")
        number, (publisher, _, seed) = found[0]
        where = f"{origin} line {number}"
        check_publisher(publisher, where)
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(publisher, Ed25519PrivateKey.from_private_bytes(_key_bytes(seed, where)))


def _read_text(path: Path, limit: int, what: str) -> str:
    try:
        data = read_regular(path, limit, follow=True)
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
