"""Publisher keys: the trusted-publishers file, public-key lines and private-key files.

A trust file holds one key per line, ``ID ed25519 BASE64KEY``, where ID is a publisher id and
BASE64KEY the 32-byte raw Ed25519 public key; blank lines and lines starting with ``#`` are
comments. A line ending in the role word ``revocations`` (``ID ed25519 BASE64KEY
revocations``) holds a key that may sign revocation lists and nothing else: it verifies no
package, and a publisher key signs no revocation list (separate roles, as in TUF). A
publisher may have several keys (rotation): any one of them verifies. A ``.pub``
file written by ``wasihost keygen`` is one such line. The trust file is the operator's own
configuration, so its errors are :class:`~wasihost.errors.ConfigError`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import attrs
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import ConfigError

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


def _key_bytes(text: str, where: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: the key is not base64") from None
    if len(raw) != KEY_BYTES:
        raise ConfigError(f"{where}: the key is {len(raw)} bytes, an Ed25519 key is {KEY_BYTES}")
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


@attrs.frozen
class TrustStore:
    """The publishers the host trusts, each with its raw Ed25519 public keys."""

    keys: frozenset[tuple[str, bytes]]
    # Keys that may sign revocation lists (and nothing else), by the name of their holder.
    revokers: frozenset[tuple[str, bytes]] = frozenset()

    @classmethod
    def parse(cls, text: str, origin: str = "trust file") -> TrustStore:
        keys: set[tuple[str, bytes]] = set()
        revokers: set[tuple[str, bytes]] = set()
        for number, fields in _lines(text):
            where = f"{origin} line {number}"
            role = fields.pop() if len(fields) == 4 and fields[3] == REVOCATIONS_ROLE else None
            if len(fields) != 3:
                raise ConfigError(
                    f"{where}: expected 'ID {ALGORITHM} BASE64KEY', or the same followed by "
                    f"{REVOCATIONS_ROLE!r} for a revocation-list key"
                )
            publisher, algorithm, key = fields
            check_publisher(publisher, where)
            if algorithm != ALGORITHM:
                raise ConfigError(f"{where}: unknown key type {algorithm[:40]!r}")
            (revokers if role else keys).add((publisher, _key_bytes(key, where)))
            if len(keys) + len(revokers) > MAX_TRUSTED_KEYS:
                raise ConfigError(f"{origin}: more than {MAX_TRUSTED_KEYS} keys")
        return cls(frozenset(keys), frozenset(revokers))

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
        check_publisher(publisher, "--publisher")
        return cls(publisher, Ed25519PrivateKey.generate())

    @property
    def public_bytes(self) -> bytes:
        return self.private.public_key().public_bytes_raw()

    def public_line(self) -> str:
        """The ``.pub`` file: one trust-file line."""
        return f"{self.publisher} {ALGORITHM} {b64(self.public_bytes)}\n"

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
        return cls(publisher, Ed25519PrivateKey.from_private_bytes(_key_bytes(seed, where)))


def _read_text(path: Path, limit: int, what: str) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
