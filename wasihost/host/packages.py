"""Packaging as a Python API: make a key, pack, sign and verify a ``.whpkg``, and install,
update, roll back or remove an extension in a state directory. Public as
:mod:`wasihost.packages`; each function is the code the matching ``wasihost`` command runs
(cli/packages.py prints what it returns), so a release script gets the same checks and the same
errors, without a subprocess or a parser.

Arguments are paths or the objects they would be read into (a :class:`TrustStore`, for
instance); every refusal is a :class:`~wasihost.core.errors.WasihostError` that says what is
wrong, and nothing is written when one is raised. See docs/packages.md, "From Python".
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ..core.errors import ConfigError, UnsignedPackageError
from ..core.registry import OpenCapabilities
from ..packaging.names import PACKAGE_SUFFIX
from ..packaging.package import Package, archive_parts, identity, load_package, open_archive
from .defaults import default_registry
from .policy import Policy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ..core.manifest import Manifest
    from ..core.serving import Broker
    from ..packaging.allowed_signers import AllowedSigners
    from ..packaging.revocation import Revocations
    from ..packaging.trust import TrustStore
    from ..store.state import InstalledPackage
    from .runtime import Host


def known_capabilities() -> OpenCapabilities:
    """What these functions read a manifest against: the built-in registry's capabilities and
    every namespaced application capability, taken on trust (none of them runs the guest)."""
    return OpenCapabilities(default_registry().capabilities())


def not_checked_here(manifest: Manifest | None) -> tuple[str, ...]:
    """The capabilities ``manifest`` requests that were taken on trust: an application's own."""
    if manifest is None:
        return ()
    return tuple(known_capabilities().unchecked(manifest.required | manifest.optional))


@attrs.frozen
class Packed:
    """What :func:`pack` wrote."""

    id: str
    version: str
    path: Path
    files: int
    package_sha256: str
    not_checked_here: tuple[str, ...]


@attrs.frozen
class Signed:
    """What :func:`sign` signed, and as whom."""

    id: str
    version: str
    path: Path
    publisher: str
    package_sha256: str
    not_checked_here: tuple[str, ...]


@attrs.frozen
class Verified:
    """A package whose signature :func:`verify` checked."""

    package: Package
    publisher: str
    package_sha256: str
    not_checked_here: tuple[str, ...]

    @property
    def id(self) -> str:
        assert self.package.manifest is not None
        return self.package.manifest.id

    @property
    def version(self) -> str:
        assert self.package.manifest is not None
        return self.package.manifest.version


def _archive_path(path: str | os.PathLike[str], what: str) -> Path:
    out = Path(path)
    if out.suffix != PACKAGE_SUFFIX:
        raise ConfigError(f"{what}: {out} must end in {PACKAGE_SUFFIX}")
    return out


def trust_store(trust: TrustStore | str | os.PathLike[str] | None) -> TrustStore | None:
    """``trust`` as a trust store: read from the file it names, or as given."""
    if trust is None or not isinstance(trust, str | os.PathLike):
        return trust
    from ..packaging.trust import TrustStore

    return TrustStore.from_file(Path(trust))


def keygen(publisher: str, prefix: str | os.PathLike[str]) -> tuple[Path, Path]:
    """A new Ed25519 signing key for ``publisher``: ``PREFIX.key`` (private, mode 0600) and
    ``PREFIX.pub`` (its trust-file line); returns both paths. Neither file may exist."""
    from ..packaging.files import write_key_pair
    from ..packaging.trust import SigningKey

    text = os.fspath(prefix)
    if not text:
        raise ConfigError("the key prefix is empty: give a file prefix, such as acme")
    if text.endswith("/") or Path(text).is_dir():
        # PREFIX names the files (PREFIX.key, PREFIX.pub): a directory would give .key and
        # .pub, hidden files named for nothing.
        raise ConfigError(
            f"the key prefix {text} is a directory: give a file prefix, such as "
            f"{text.rstrip('/')}/acme"
        )
    key = SigningKey.generate(publisher)
    return write_key_pair(text, key)


def pack(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> Packed:
    """Pack the package directory ``directory`` (its ``extension.toml`` and what it names)
    into the ``.whpkg`` archive ``out``, unsigned. What it writes, a run would accept: the
    manifest parses and names a packed module."""
    from ..packaging.archive import read_archive, write_archive
    from ..packaging.files import pack_directory, write_package_file

    output = _archive_path(out, "pack")
    files = pack_directory(Path(directory))
    data = write_archive(files)
    archive = read_archive(data)
    manifest, _ = archive_parts(archive, os.fspath(directory), known_capabilities())
    write_package_file(output, data)
    return Packed(
        manifest.id,
        manifest.version,
        output,
        len(files),
        archive.digest,
        not_checked_here(manifest),
    )


def sign(package: str | os.PathLike[str], key: str | os.PathLike[str]) -> Signed:
    """Sign the ``.whpkg`` ``package`` in place with the private key file ``key`` (a
    ``PREFIX.key`` of :func:`keygen`); the manifest's publisher must be the key's."""
    from ..packaging import signing
    from ..packaging.archive import write_archive
    from ..packaging.files import read_signing_key, write_package_file

    path = _archive_path(package, "sign")
    signing_key = read_signing_key(Path(key))
    archive, manifest, wasm = open_archive(path, known_capabilities())
    who = identity(manifest, hashlib.sha256(wasm).hexdigest())
    record = signing.sign(who, archive.digest, signing_key)
    write_package_file(path, write_archive(archive.files, record))
    return Signed(
        manifest.id,
        manifest.version,
        path,
        signing_key.publisher,
        archive.digest,
        not_checked_here(manifest),
    )


def verify(
    package: str | os.PathLike[str],
    *,
    trust: TrustStore | str | os.PathLike[str] | None = None,
    allowed_signers: AllowedSigners | None = None,
    ssh_signature: bytes | None = None,
    revocations: Revocations | None = None,
) -> Verified:
    """Check the ``.whpkg`` ``package``'s signature against ``trust`` (a trust file or
    store), or its OpenSSH signature (``ssh_signature``, the ``.sig`` file's bytes) against
    ``allowed_signers``; and, with ``revocations``, that nothing of it is revoked.
    UnsignedPackageError when it carries no signature these verify."""
    from ..packaging.allowed_signers import SshSigned
    from ..packaging.revocation import MemoryFloor

    path = _archive_path(package, "verify")
    ssh = None
    if allowed_signers is not None or ssh_signature is not None:
        if allowed_signers is None or ssh_signature is None:
            raise ConfigError("an OpenSSH signature needs both allowed_signers and ssh_signature")
        ssh = SshSigned(allowed_signers, ssh_signature)
    store = trust_store(trust)
    if ssh is None and store is None:
        raise ConfigError("verify needs a trust file, or allowed_signers with an ssh_signature")
    loaded = load_package(path, known_capabilities(), store, ssh)
    if revocations is not None:
        revocations.check(loaded, revocations.floor or MemoryFloor())
    if loaded.signer is None or loaded.manifest is None or loaded.package_digest is None:
        raise UnsignedPackageError(f"{path} is not signed")
    return Verified(
        loaded, loaded.signer, loaded.package_digest, not_checked_here(loaded.manifest)
    )


def state_host(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    trust: TrustStore | str | os.PathLike[str] | None = None,
    allowed_signers: AllowedSigners | None = None,
    require_signed: bool = False,
    revocations: Revocations | None = None,
    functions: Callable[[Host], object] | None = None,
    brokers: Iterable[Broker] = (),
) -> Host:
    """The host these functions change a state directory through (the default one when
    ``state_dir`` is None): its grant table decides what an extension holds, and its policy
    allows every capability it serves, so that it caps nothing an operator granted.
    ``functions(host)`` registers an application's functions first (an update starts the
    new version, which may need them). Close it when done (it is a context manager)."""
    from ..store.state import default_state_dir
    from .runtime import Host

    store = trust_store(trust)
    if require_signed and store is None:
        raise ConfigError("require_signed needs a trust file or store")
    policy = Policy(
        allow=default_registry().capabilities(),
        trusted_publishers=store,
        require_signed=require_signed,
        revocations=revocations,
        allowed_signers=allowed_signers,
    )
    directory = Path(state_dir) if state_dir is not None else default_state_dir()
    host = Host(policy, cache_dir=None, state_dir=directory, brokers=brokers)
    if functions is None:
        return host
    return register_functions(host, functions, widen_policy=True)


def register_functions(
    host: Host, functions: Callable[[Host], object], *, widen_policy: bool
) -> Host:
    """``host`` once ``functions(host)`` registered an application's functions on it; the
    host is closed if that fails. ``widen_policy``: a host whose policy allows what it serves
    (a state directory's, the CLI's for a WASI command) allows the new capabilities too."""
    try:
        before = host.registry.capabilities()
        functions(host)
        added = host.registry.capabilities() - before
        if widen_policy and added:
            # Nothing has run on this new host: widening what it allows changes no grant.
            host.policy = attrs.evolve(host.policy, allow=host.policy.allow | added)
    except BaseException:
        host.close()
        raise
    return host


def install(
    source: str | os.PathLike[str],
    *,
    state_dir: str | os.PathLike[str] | None = None,
    trust: TrustStore | str | os.PathLike[str] | None = None,
    allowed_signers: AllowedSigners | None = None,
    ssh_signature: bytes | None = None,
    allow_downgrade: bool = False,
    adopt_data: bool = False,
) -> InstalledPackage:
    """Install ``source`` (a package directory, or a ``.whpkg`` verified by ``trust`` or an
    OpenSSH signature) into the state directory: :meth:`Host.install`, through
    :func:`state_host`."""
    with state_host(state_dir, trust=trust, allowed_signers=allowed_signers) as host:
        return host.install(
            os.fspath(source),
            allow_downgrade=allow_downgrade,
            adopt_data=adopt_data,
            allowed_signers=allowed_signers,
            ssh_signature=ssh_signature,
        )


def update(
    source: str | os.PathLike[str],
    *,
    state_dir: str | os.PathLike[str] | None = None,
    trust: TrustStore | str | os.PathLike[str] | None = None,
    allowed_signers: AllowedSigners | None = None,
    ssh_signature: bytes | None = None,
    allow_downgrade: bool = False,
    functions: Callable[[Host], object] | None = None,
) -> InstalledPackage:
    """Update an installed extension to ``source`` as one checked transaction
    (:meth:`Host.update_installed`): the version that ran before keeps running if anything
    fails. ``functions`` registers an application's functions for the new version's start."""
    with state_host(
        state_dir, trust=trust, allowed_signers=allowed_signers, functions=functions
    ) as host:
        return host.update_installed(
            os.fspath(source),
            allow_downgrade=allow_downgrade,
            allowed_signers=allowed_signers,
            ssh_signature=ssh_signature,
        )


def rollback(
    extension: str,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    trust: TrustStore | str | os.PathLike[str] | None = None,
    allowed_signers: AllowedSigners | None = None,
) -> InstalledPackage:
    """Return ``extension`` to the version its last update replaced (:meth:`Host.rollback`)."""
    from ..core.manifest import check_extension_id

    check_extension_id(extension)  # before the state directory is opened or made
    with state_host(state_dir, trust=trust, allowed_signers=allowed_signers) as host:
        return host.rollback(extension)


def remove(
    extension: str, *, state_dir: str | os.PathLike[str] | None = None, purge: bool = False
) -> None:
    """Forget an installed extension; with ``purge``, its data, grant history and journal
    too (otherwise they are kept for a reinstall of the same publisher's package)."""
    from ..core.manifest import check_extension_id
    from . import updates

    check_extension_id(extension)  # before the state directory is opened or made
    if not isinstance(purge, bool):
        raise ConfigError(f"purge is True or False, not {type(purge).__name__}")
    with state_host(state_dir) as host:
        updates.remove(host, extension, purge=purge)


__all__ = [
    "Packed",
    "Signed",
    "Verified",
    "install",
    "keygen",
    "known_capabilities",
    "not_checked_here",
    "pack",
    "register_functions",
    "remove",
    "rollback",
    "sign",
    "state_host",
    "trust_store",
    "update",
    "verify",
]
