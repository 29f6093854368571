"""Loading a package from disk: a signed ``.whpkg`` archive, a directory with
``extension.toml`` and its module, or a bare ``.wasm`` file. Every file is read with a size
bound and every path stays inside the package; an archive is verified whole (see
:mod:`wasihost.packaging`) before anything of it is used.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ..core.errors import ArchiveError, ConfigError, ManifestError, PackageError
from ..core.manifest import Manifest, parse_manifest
from ..core.wasmbin import MAX_MODULE_BYTES
from .names import PACKAGE_SUFFIX
from .regular_files import read_regular

# The archive, signature and key modules (and the cryptography package under them) are
# imported by the functions that read an archive: a directory or a bare module never needs
# them, and they were a large part of every `wasihost run`'s start-up.
if TYPE_CHECKING:
    from . import signing
    from .allowed_signers import SshSigned
    from .archive import Archive
    from .trust import TrustStore

MANIFEST_NAME = "extension.toml"
# Real manifests are a few hundred bytes; 64 KiB bounds what a hostile one makes us parse.
MAX_MANIFEST_BYTES = 64 * 1024


@attrs.frozen
class Package:
    """A package's manifest (absent for a bare module), its module bytes and their digest.

    ``signer`` is the publisher whose trusted key verified the package (a ``.whpkg`` checked
    against a trust store), None when nothing was verified; ``package_digest`` is an
    archive's package digest (the SHA-256 of its content record)."""

    source: str
    manifest: Manifest | None
    wasm: bytes = attrs.field(repr=False)
    sha256: str
    signer: str | None = None
    package_digest: str | None = None
    # How the signer was verified, for inspect: None for the trust file's Ed25519 keys.
    verified_by: str | None = None
    # The raw Ed25519 public key that verified the package (for key revocation).
    signing_key: bytes | None = attrs.field(default=None, repr=False)
    # The older keys of its publisher that endorsed the signing key (a rotation), newest first:
    # revoking one of them revokes what it endorsed.
    endorsed_by: tuple[bytes, ...] = attrs.field(default=(), repr=False)

    @property
    def name(self) -> str:
        return self.manifest.id if self.manifest is not None else Path(self.source).stem


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        raise PackageError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise PackageError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise PackageError(f"{what} {path} is larger than {limit} bytes")
    return data


def manifest_text(root: Path) -> bytes:
    """The raw bytes of a package's manifest, bounded as when loading."""
    return _read_bounded(root / MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest")


def parse_manifest_bytes(text: bytes, known_capabilities: frozenset[str]) -> Manifest:
    """A manifest file's bytes, parsed: ManifestError for text that is not UTF-8 too."""
    try:
        return parse_manifest(text.decode("utf-8"), known_capabilities)
    except UnicodeDecodeError:
        raise ManifestError("", "manifest is not UTF-8") from None



def _check_module_digest(manifest: Manifest, digest: str) -> None:
    if manifest.sha256 is not None and manifest.sha256 != digest:
        raise PackageError(
            f"module {manifest.module} has SHA-256 {digest}, the manifest says {manifest.sha256}"
        )


def is_archive(source: str | os.PathLike[str]) -> bool:
    return Path(source).suffix == PACKAGE_SUFFIX


def identity(manifest: Manifest, module_sha256: str) -> signing.Identity:
    """The identity a signature vouches for, from a manifest."""
    from . import signing

    return signing.Identity(
        manifest.id, manifest.version, manifest.publisher, manifest.abi, module_sha256
    )


def open_archive(path: Path, known_capabilities: frozenset[str]) -> tuple[Archive, Manifest, bytes]:
    """A verified archive, its manifest and module; nothing is checked against a trust store."""
    from .archive import read_archive
    from .files import read_package_file

    archive = read_archive(read_package_file(path))
    manifest, wasm = archive_parts(archive, str(path), known_capabilities)
    return archive, manifest, wasm


def archive_parts(
    archive: Archive, origin: str, known_capabilities: frozenset[str]
) -> tuple[Manifest, bytes]:
    """An archive's parsed manifest and its module's bytes."""
    text = archive.files.get(MANIFEST_NAME)
    if text is None:
        raise ArchiveError(f"{origin} has no {MANIFEST_NAME}")
    if len(text) > MAX_MANIFEST_BYTES:
        raise PackageError(f"manifest in {origin} is larger than {MAX_MANIFEST_BYTES} bytes")
    manifest = parse_manifest_bytes(text, known_capabilities)
    wasm = archive.files.get(manifest.module)
    if wasm is None:
        raise ArchiveError(f"{origin} has no module {manifest.module!r}")
    if len(wasm) > MAX_MODULE_BYTES:
        raise PackageError(f"module in {origin} is larger than {MAX_MODULE_BYTES} bytes")
    return manifest, wasm


def _load_archive(
    path: Path,
    known_capabilities: frozenset[str],
    trust: TrustStore | None,
    ssh: SshSigned | None,
) -> Package:
    from . import signing
    from .archive import read_archive
    from .files import read_package_file

    data = read_package_file(path)
    archive = read_archive(data)
    manifest, wasm = archive_parts(archive, str(path), known_capabilities)
    digest = hashlib.sha256(wasm).hexdigest()
    _check_module_digest(manifest, digest)
    if ssh is not None:
        # The SSH signature covers the archive file byte for byte, hence every file in it.
        line = ssh.verify(data, manifest.publisher)
        how = f"an OpenSSH ed25519 key of {ssh.allowed.origin} line {line.line}"
        return Package(
            str(path), manifest, wasm, digest, manifest.publisher, archive.digest, how, line.key
        )
    if trust is not None and archive.signature is not None:
        signing.verify(archive.signature, identity(manifest, digest), archive.digest, trust)
        key = signing.SignatureRecord.parse(archive.signature).key
        return Package(
            str(path),
            manifest,
            wasm,
            digest,
            manifest.publisher,
            archive.digest,
            None,
            key,
            trust.lineage(key)[1:],
        )
    return Package(str(path), manifest, wasm, digest, None, archive.digest)


def _source_text(source: object) -> str:
    """What a package's path may be: a non-empty str or os.PathLike of str, without NUL.
    Anything else is the embedder's mistake, named as such (it was a raw TypeError from
    pathlib, or a ValueError from the first stat)."""
    if isinstance(source, bool) or not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"a package source is a path (str or os.PathLike), not {type(source).__name__}"
        )
    text = os.fspath(source)
    if not isinstance(text, str):
        raise ConfigError("a package source is a path of text, not bytes")
    if not text or "\x00" in text:
        raise ConfigError(f"{text!r} is not a package path")
    return text


# The errors pathlib's is_dir() and exists() answer False to.
_NO_SUCH_FILE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def load_package(
    source: str | os.PathLike[str],
    known_capabilities: frozenset[str],
    trust: TrustStore | None = None,
    ssh: SshSigned | None = None,
) -> Package:
    """Load a ``.whpkg``, a package directory or a bare module; raise a specific error for
    anything wrong. With ``trust``, a signed archive's signature must verify against it (an
    unsigned one loads unverified: whether that is allowed is the policy's answer). With
    ``ssh``, the archive must verify by that OpenSSH signature (and ``trust`` is unused)."""
    path = Path(_source_text(source))
    try:
        path.stat()
    except OSError as exc:
        # What pathlib's is_dir() and exists() take for "no such file" stays so; any other
        # failure (a name too long for the system) was an internal error at is_dir().
        if exc.errno not in _NO_SUCH_FILE:
            raise PackageError(f"{path}: {exc.strerror}") from None
    if is_archive(path) and not path.is_dir():
        return _load_archive(path, known_capabilities, trust, ssh)
    if ssh is not None:
        raise PackageError(f"{path} is not a .whpkg: an SSH signature verifies .whpkg files")
    if path.is_dir():
        text = _read_bounded(path / MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest")
        manifest = parse_manifest_bytes(text, known_capabilities)
        root = path.resolve()
        module_path = (root / manifest.module).resolve()
        if not module_path.is_relative_to(root):
            raise PackageError(f"module {manifest.module!r} resolves outside the package")
        wasm = _read_bounded(module_path, MAX_MODULE_BYTES, "module")
        digest = hashlib.sha256(wasm).hexdigest()
        _check_module_digest(manifest, digest)
        return Package(str(path), manifest, wasm, digest)
    if path.exists() and not path.is_file():
        raise PackageError(f"{path} is neither a package directory nor a module file")
    try:
        path.stem.encode("utf-8")
    except UnicodeEncodeError:
        # A bare module's id is its file's stem, and an id is text: a stem with a byte that is
        # not UTF-8 failed the first call's handshake (its token) with a raw UnicodeEncodeError.
        raise PackageError(
            f"{path.name!a}: a bare module's extension id is its file name, and this one "
            "is not valid UTF-8; rename the file"
        ) from None
    wasm = _read_bounded(path, MAX_MODULE_BYTES, "module")
    return Package(str(path), None, wasm, hashlib.sha256(wasm).hexdigest())
