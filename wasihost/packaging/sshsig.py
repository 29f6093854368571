"""OpenSSH signatures (``ssh-keygen -Y sign``) over a package file: a bounded SSHSIG reader.

The format is OpenSSH's ``PROTOCOL.sshsig``: an armored base64 blob holding the magic
``SSHSIG``, a version, the signer's public key, the namespace, a reserved string, the hash
algorithm and the signature; the signature is over ``SSHSIG``, the namespace, the reserved
string, the hash algorithm and the hash of the signed file, so a signature made for another
namespace (``git``, ``file``) never verifies as a ``wasihost`` one.

The signature file comes from whoever handed us the package, so :func:`parse` reads it like
:mod:`wasihost.core.codec` reads guest bytes: every length is checked against the bytes actually
left (and a bound) before anything is sliced, nothing may trail, and the only error that
leaves it is :class:`~wasihost.core.errors.InvalidSignatureError`. Only Ed25519 keys are accepted;
other key types (RSA, ECDSA, certificates) are refused by name. Whether the key is allowed to
sign as a publisher is :mod:`.allowed_signers`' answer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from typing import Final

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..core.errors import InvalidSignatureError
from .trust import KEY_BYTES, weak_public_key

MAGIC: Final = b"SSHSIG"
# The one SSHSIG version OpenSSH writes and this reader understands.
VERSION: Final = 1
# The namespace (ssh-keygen -n) a wasihost package signature is made for.
NAMESPACE: Final = "wasihost"
ED25519: Final = "ssh-ed25519"
# Ed25519 signatures are 64 bytes (RFC 8032).
SIGNATURE_BYTES: Final = 64
_ARMOR_BEGIN: Final = "-----BEGIN SSH SIGNATURE-----"
_ARMOR_END: Final = "-----END SSH SIGNATURE-----"
# An armored RSA-16384 signature (the largest key ssh-keygen makes) is under 6 KiB; 16 KiB
# bounds what a hostile .sig file makes us decode.
MAX_SIGNATURE_FILE_BYTES: Final = 16 * 1024
# No field of an SSHSIG blob is longer than an RSA-16384 key or signature (2 KiB); a length
# above this is garbage, refused before it is used.
MAX_FIELD_BYTES: Final = 4096
# Namespaces and algorithm names are short words; messages quote at most this much of one.
_QUOTE_CHARS: Final = 40
# The hashes PROTOCOL.sshsig allows, by name (ssh-keygen signs with sha512).
_HASHES: Final = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}
_U32: Final = struct.Struct(">I")


def _quote(raw: bytes) -> str:
    return ascii(raw[:_QUOTE_CHARS].decode("ascii", "replace"))


class _Reader:
    """SSH wire format (RFC 4251 section 5): uint32 and length-prefixed strings, bounded."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def fail(self, why: str) -> InvalidSignatureError:
        return InvalidSignatureError(f"{self.what}: {why}")

    def raw(self, size: int) -> bytes:
        if size > len(self.data) - self.pos:
            raise self.fail("truncated")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def u32(self) -> int:
        value: int = _U32.unpack(self.raw(_U32.size))[0]
        return value

    def string(self) -> bytes:
        size = self.u32()
        if size > MAX_FIELD_BYTES:
            raise self.fail(f"a field of {size} bytes (at most {MAX_FIELD_BYTES})")
        return self.raw(size)

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes after the last field")


def _string(value: bytes) -> bytes:
    return _U32.pack(len(value)) + value


def ed25519_key(blob: bytes, what: str) -> bytes:
    """The raw 32-byte key of an ``ssh-ed25519`` public-key blob; anything else is refused."""
    reader = _Reader(blob, what)
    kind = reader.string()
    if kind != ED25519.encode():
        raise reader.fail(
            f"a {_quote(kind)} key: only {ED25519} keys are supported "
            "(make one with ssh-keygen -t ed25519)"
        )
    key = reader.string()
    reader.end()
    if len(key) != KEY_BYTES:
        raise reader.fail(f"an {ED25519} key of {len(key)} bytes")
    if weak_public_key(key):
        raise reader.fail(f"an {ED25519} key of small order, for which anyone can sign")
    return key


@attrs.frozen
class SshSignature:
    """A parsed SSHSIG: who signed (raw Ed25519 key), for which namespace, and how."""

    key: bytes
    namespace: str
    reserved: bytes
    hash_algorithm: str
    signature: bytes

    def signed_data(self, message: bytes) -> bytes:
        digest = _HASHES[self.hash_algorithm](message).digest()
        return (
            MAGIC
            + _string(self.namespace.encode("ascii"))
            + _string(self.reserved)
            + _string(self.hash_algorithm.encode("ascii"))
            + _string(digest)
        )

    def verify(self, message: bytes, namespace: str = NAMESPACE) -> None:
        """Return if this is a valid signature of ``message`` for ``namespace`` by ``key``."""
        if self.namespace != namespace:
            raise InvalidSignatureError(
                f"the SSH signature was made for namespace {self.namespace[:_QUOTE_CHARS]!r}, "
                f"not {namespace!r} (sign with ssh-keygen -Y sign -n {namespace})"
            )
        try:
            Ed25519PublicKey.from_public_bytes(self.key).verify(
                self.signature, self.signed_data(message)
            )
        except InvalidSignature:
            raise InvalidSignatureError(
                "the SSH signature does not match this file (tampered, or a signature of "
                "another file)"
            ) from None


def dearmor(text: bytes) -> bytes:
    """The blob inside ``-----BEGIN SSH SIGNATURE-----`` armor."""
    if len(text) > MAX_SIGNATURE_FILE_BYTES:
        raise InvalidSignatureError(
            f"the SSH signature file is larger than {MAX_SIGNATURE_FILE_BYTES} bytes"
        )
    try:
        lines = text.decode("ascii").strip().splitlines()
    except UnicodeDecodeError:
        raise InvalidSignatureError("the SSH signature file is not ASCII") from None
    if len(lines) < 3 or lines[0].strip() != _ARMOR_BEGIN or lines[-1].strip() != _ARMOR_END:
        raise InvalidSignatureError(
            f"the SSH signature file is not {_ARMOR_BEGIN} ... {_ARMOR_END} armor"
        )
    try:
        return base64.b64decode("".join(line.strip() for line in lines[1:-1]), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSignatureError("the SSH signature file's body is not base64") from None


def parse(text: bytes) -> SshSignature:
    """Read an armored SSHSIG; raise :class:`InvalidSignatureError` for anything malformed."""
    reader = _Reader(dearmor(text), "SSH signature")
    if reader.raw(len(MAGIC)) != MAGIC:
        raise reader.fail("no SSHSIG magic")
    version = reader.u32()
    if version != VERSION:
        raise reader.fail(f"SSHSIG version {version} (this host reads version {VERSION})")
    key_blob = reader.string()
    namespace = reader.string()
    reserved = reader.string()
    hash_algorithm = reader.string()
    wrapped = reader.string()
    reader.end()
    key = ed25519_key(key_blob, "SSH signature's public key")
    if not namespace or not all(0x20 < b < 0x7F for b in namespace):
        raise reader.fail("the namespace is empty or not printable ASCII")
    # OpenSSH writes this empty; a non-empty one means a format this reader does not know.
    if reserved:
        raise reader.fail("the reserved field is not empty")
    algorithm = hash_algorithm.decode("ascii", "replace")
    if algorithm not in _HASHES:
        raise reader.fail(f"hash algorithm {_quote(hash_algorithm)} (sha256 or sha512)")
    inner = _Reader(wrapped, "SSH signature's signature")
    kind = inner.string()
    if kind != ED25519.encode():
        raise inner.fail(f"a {_quote(kind)} signature: only {ED25519} is supported")
    signature = inner.string()
    inner.end()
    if len(signature) != SIGNATURE_BYTES:
        raise inner.fail(f"an {ED25519} signature of {len(signature)} bytes")
    return SshSignature(key, namespace.decode("ascii"), reserved, algorithm, signature)


__all__ = ["NAMESPACE", "SshSignature", "dearmor", "ed25519_key", "parse"]
