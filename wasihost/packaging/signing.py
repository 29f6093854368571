"""Ed25519 signatures over a package: its digest and its manifest identity.

The signed message is a domain-separated text (so a signature cannot be replayed as anything
but a wasihost package signature) naming the extension id, version, publisher, ABI, the
module's SHA-256 and the package digest (the SHA-256 of the content record, which lists every
file's SHA-256). The signature record (``.whpkg/signature`` in the archive) names the publisher
and the public key, so that the verifier picks that one key from its trust store.

:func:`verify` returns None or raises a :class:`~wasihost.core.errors.SignatureError` subclass;
there is no boolean to forget to check.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Final

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..core.errors import (
    ExpiredKeyError,
    InvalidSignatureError,
    PublisherMismatchError,
    SignatureError,
    UnsignedPackageError,
    UntrustedKeyError,
)
from .trust import (
    ALGORITHM,
    KEY_BYTES,
    PUBLISHER_ID,
    SigningKey,
    TrustStore,
    b64,
    format_time,
)

# The domain of the signed message; a new message layout gets a new name.
MESSAGE_SCHEMA: Final = "wasihost-package-signature/1"
# The one signature record format this reader understands.
RECORD_SCHEMA: Final = "wasihost-signature/1"
# Ed25519 signatures are 64 bytes (RFC 8032).
SIGNATURE_BYTES: Final = 64
_RECORD_KEYS: Final = ("publisher", "algorithm", "key", "signature")


@attrs.frozen
class Identity:
    """What a signature vouches for besides the bytes: the manifest's identity fields."""

    id: str
    version: str
    publisher: str | None
    abi: str
    module_sha256: str


def message(identity: Identity, package_digest: str) -> bytes:
    """The exact bytes signed: one ``key value`` line per field, in this order."""
    lines = [
        MESSAGE_SCHEMA,
        f"id {identity.id}",
        f"version {identity.version}",
        f"publisher {identity.publisher or ''}",
        f"abi {identity.abi}",
        f"module-sha256 {identity.module_sha256}",
        f"package-sha256 {package_digest}",
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


@attrs.frozen
class SignatureRecord:
    publisher: str
    key: bytes
    signature: bytes

    def render(self) -> bytes:
        return (
            f"{RECORD_SCHEMA}\npublisher {self.publisher}\nalgorithm {ALGORITHM}\n"
            f"key {b64(self.key)}\nsignature {b64(self.signature)}\n"
        ).encode("ascii")

    @classmethod
    def parse(cls, data: bytes) -> SignatureRecord:
        """The canonical record only; anything else is an invalid signature."""
        try:
            lines = data.decode("ascii").split("\n")
        except UnicodeDecodeError:
            raise InvalidSignatureError("the signature record is not ASCII") from None
        if lines[0] != RECORD_SCHEMA or lines[-1] != "" or len(lines) != len(_RECORD_KEYS) + 2:
            raise InvalidSignatureError(f"the signature record is not a {RECORD_SCHEMA} record")
        values: dict[str, str] = {}
        for key, line in zip(_RECORD_KEYS, lines[1:-1], strict=True):
            name, _, value = line.partition(" ")
            if name != key or not value:
                raise InvalidSignatureError(f"the signature record has no {key!r} line in place")
            values[key] = value
        if values["algorithm"] != ALGORITHM:
            raise InvalidSignatureError(f"signature algorithm {values['algorithm'][:20]!r}")
        if not PUBLISHER_ID.fullmatch(values["publisher"]):
            raise InvalidSignatureError("the signature record's publisher is not a publisher id")
        try:
            public = base64.b64decode(values["key"], validate=True)
            signature = base64.b64decode(values["signature"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidSignatureError(
                "the signature record's key or signature is not base64"
            ) from None
        if len(public) != KEY_BYTES or len(signature) != SIGNATURE_BYTES:
            raise InvalidSignatureError("the signature record's key or signature has a bad size")
        return cls(values["publisher"], public, signature)


def sign(identity: Identity, package_digest: str, key: SigningKey) -> bytes:
    """The signature record of a package by ``key``; the manifest must name its publisher."""
    if identity.publisher is None:
        raise PublisherMismatchError(
            f"extension.toml has no [extension] publisher; add publisher = "
            f"{json.dumps(key.publisher)} to sign it with this key"
        )
    if identity.publisher != key.publisher:
        raise PublisherMismatchError(
            f"extension.toml's [extension] publisher is {json.dumps(identity.publisher)}, and "
            f"this key is {json.dumps(key.publisher)}'s: sign with {identity.publisher}'s key, "
            "or change the publisher"
        )
    signature = key.private.sign(message(identity, package_digest))
    return SignatureRecord(key.publisher, key.public_bytes, signature).render()


def verify(
    record: bytes | None, identity: Identity, package_digest: str, trust: TrustStore
) -> None:
    """Return if ``record`` is a trusted publisher's valid signature over this package and
    identity; raise the specific :class:`SignatureError` otherwise."""
    if record is None:
        raise UnsignedPackageError("the package is not signed")
    parsed = SignatureRecord.parse(record)
    keys = trust.keys_for(parsed.publisher)
    if not keys:
        raise UntrustedKeyError(f"publisher {parsed.publisher!r} is not in the trust store")
    if parsed.key not in keys:
        raise UntrustedKeyError(
            f"key {b64(parsed.key)[:16]}... is not one of publisher {parsed.publisher!r}'s "
            "trusted keys"
        )
    expired = trust.expired(parsed.key, parsed.publisher)
    if expired is not None:
        reason = trust.expiry_reason(parsed.key, parsed.publisher)
        raise ExpiredKeyError(
            f"key {b64(parsed.key)[:16]}... of publisher {parsed.publisher!r} expired at "
            f"{format_time(expired)} ({reason}): the publisher signs "
            "with a newer key (a new trust-file line), or the operator extends the expiry"
        )
    try:
        Ed25519PublicKey.from_public_bytes(parsed.key).verify(
            parsed.signature, message(identity, package_digest)
        )
    except InvalidSignature:
        raise InvalidSignatureError(
            f"the signature by {parsed.publisher!r} does not match this package's contents "
            "and identity (tampered, or a signature of another package)"
        ) from None
    # Checked after the cryptography: the signature is genuine, and the claim it makes about
    # who published this package must agree with what the manifest says.
    if identity.publisher != parsed.publisher:
        raise PublisherMismatchError(
            f"the manifest names publisher {identity.publisher!r}, the package is signed by "
            f"{parsed.publisher!r}"
        )


__all__ = ["Identity", "SignatureError", "SignatureRecord", "message", "sign", "verify"]
