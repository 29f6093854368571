"""Installs, verified updates and rollbacks of packages in a host's state directory.

An installed ``.whpkg`` is kept as the signed archive itself, in a read-only tree, and verified
again at every start: its signature against the host's trust, its digest and signer against
the install record. An update is one transaction:

    verify -> preflight (ABI, grants, revocation) -> pause old -> checkpoint state
    -> start new (handshake) -> migrate -> health -> revocation re-check -> switch -> retire old

Anything failing before the switch closes the new version, restores the checkpoint and resumes
the old one: the old version keeps running and stays installed. The replaced version and the
checkpoint are kept, so :func:`rollback` can return to it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ..core.errors import (
    AdmissionError,
    ConfigError,
    ManifestError,
    PackageError,
    SignatureError,
    WasihostError,
)

# Moved to core.errors and store.presence (state-directory locks); exported from here too
# (``as``: an explicit re-export, for mypy).
from ..core.errors import UpdateError as UpdateError  # noqa: PLC0414
from ..core.lifecycle import State, clip_reason
from ..core.manifest import (
    Manifest,
    check_extension_id,
    declared_publisher,
    parse_manifest,
    version_order,
)
from ..core.registry import OpenCapabilities
from ..packaging import contents, signing, sshsig
from ..packaging.allowed_signers import SshSigned, read_ssh_signature
from ..packaging.archive import read_archive
from ..packaging.files import read_package_file
from ..packaging.package import MANIFEST_NAME, Package, is_archive, load_package, manifest_text
from ..packaging.revocation import Claims, RevocationList
from ..packaging.trust import TrustStore
from ..store.presence import LOCKS_DIR_NAME as LOCKS_DIR_NAME  # noqa: PLC0414
from ..store.presence import PRESENCE_NAME as PRESENCE_NAME  # noqa: PLC0414
from ..store.presence import Presence as Presence  # noqa: PLC0414
from ..store.presence import lock_file
from ..store.state import (
    CHECKPOINTS_DIR_NAME,
    PACKAGES_DIR_NAME,
    InstalledPackage,
    fsync_path,
    record_path,
    relative_name,
    remove_tree,
    sync_tree,
)

if TYPE_CHECKING:
    from ..core.registry import Registry
    from ..core.serving import HostView
    from ..store.state import StateStore
    from .extension import Extension
    from .functions import HostFunctions
    from .policy import Policy

ARCHIVE_NAME = "package.whpkg"
SSH_SIGNATURE_NAME = "package.whpkg.sig"


# For the type checker only: HostView is (core/serving.py).
if TYPE_CHECKING:

    class UpdateHost(HostView, Protocol):
        """What installs, updates and rollbacks use of their host (``wasihost.host.runtime.Host``,
        which calls them): typed by this, this module need not import the runtime that imports it.
        A :class:`~wasihost.core.serving.HostView` (its journal, and what the checkpointing brokers
        it is handed to read), and the members below besides; the policy whole (its trust)."""

        policy: Policy
        registry: Registry
        functions: HostFunctions
        presence: Presence | None

        def require_state(self) -> StateStore: ...

        def load_package(
            self,
            source: str | Path,
            *,
            trust: TrustStore | None,
            ssh: SshSigned | None,
            applications: bool = False,
        ) -> Package: ...

        def plan(self, package: Package) -> object: ...

        def extension(self, extension: str) -> Extension | None: ...

        def build_unregistered(self, package: Package) -> Extension: ...

        def switch(self, old: Extension | None, new: Extension, reason: str) -> None: ...

        def disable(self, extension: str, reason: str) -> int: ...


class Checkpointing(Protocol):
    """A broker whose per-extension state an update checkpoints (storage rows, ...)."""

    def checkpoint(self, host: UpdateHost, extension: str, directory: Path) -> None: ...

    def restore(self, host: UpdateHost, extension: str, directory: Path) -> None: ...


def _same_publisher(package: Package, current: InstalledPackage | None) -> None:
    if current is not None and current.signer is not None and package.signer != current.signer:
        raise AdmissionError(
            [
                f"{current.id} is installed as published by {current.signer!r}; a replacement "
                f"must be verified as {current.signer!r}'s too"
                + ("" if package.signer is None else f" (this one is {package.signer!r}'s)")
            ]
        )


def _known(host: UpdateHost) -> OpenCapabilities:
    """The capabilities an installed package's manifest is read against when checking it is
    what was installed (not when admitting it): an application capability this host does not
    serve is taken on trust, as at its install."""
    return OpenCapabilities(host.registry.capabilities())


def content_digest(manifest: bytes, module: str, wasm: bytes) -> str:
    """What an unsigned install records of its content: the SHA-256 of the content record
    (``packaging/contents``, as an archive's package digest) of its manifest and module."""
    return hashlib.sha256(contents.render({MANIFEST_NAME: manifest, module: wasm})).hexdigest()


def _unsigned_content(host: UpdateHost, root: Path, package: Package) -> str:
    """The content digest of the package directory ``root``, whose module ``package`` holds:
    its manifest read again must say what ``package``'s says (else it changed meanwhile)."""
    assert package.manifest is not None
    text = manifest_text(root)
    try:
        again: Manifest | None = parse_manifest(text.decode("utf-8"), _known(host))
    except (UnicodeDecodeError, ManifestError):
        again = None
    if again != package.manifest:
        raise PackageError(f"{root}: its {MANIFEST_NAME} changed while it was read")
    return content_digest(text, package.manifest.module, package.wasm)


def _installed_content(host: UpdateHost, installed: InstalledPackage) -> str | None:
    """An install's content digest: recorded, or (a record from before unsigned installs
    recorded one) of its tree as it is; None if the tree cannot be read."""
    if installed.content_digest is not None:
        return installed.content_digest
    try:
        package = load_package(installed.path, _known(host))
        return _unsigned_content(host, installed.path, package)
    except WasihostError:
        return None


def _check_version(
    host: UpdateHost,
    source: str | Path,
    package: Package,
    current: InstalledPackage | None,
    allow_downgrade: bool,
) -> None:
    assert package.manifest is not None
    if current is None:
        return
    new, old = package.manifest.version, current.version
    if not allow_downgrade and version_order(new) < version_order(old):
        raise PackageError(
            f"{current.id} {old} is installed; installing {new} would downgrade it "
            "(allow_downgrade=True, or --allow-downgrade)"
        )
    if version_order(new) != version_order(old):
        return
    # One content per release: a signed package's digest, or an unsigned one's manifest and
    # module (with the module alone, another manifest with an extra command or a longer
    # timeout replaced the installed one as "the same" version).
    if package.signer is not None:
        ours: str | None = package.package_digest
    else:
        ours = _unsigned_content(host, Path(source), package)
    theirs = current.package_digest or _installed_content(host, current)
    if ours == theirs:
        return
    if new == old:
        # Two different releases under one version number: a mix-and-match or a replay.
        raise PackageError(
            f"{current.id} {old} is installed with other content; a new release needs a new version"
        )
    if not allow_downgrade:
        # Build metadata (SemVer's "+...") orders nothing: 1.0.0+build.1 and 1.0.0+build.2 are
        # the same release to the version order, so an older build of it replayed over a newer
        # one was neither a downgrade nor "the same version" (compared as strings).
        raise PackageError(
            f"{current.id} {old} is installed; {new} is the same release to the version order "
            "(build metadata after '+' does not order) with other content: refused as a "
            "conflict (allow_downgrade=True, or --allow-downgrade, to install it anyway)"
        )


def candidate(
    host: UpdateHost,
    source: str | Path,
    *,
    trust: TrustStore | None,
    ssh: SshSigned | None,
    allow_downgrade: bool,
    adopt_data: bool = False,
) -> tuple[Package, InstalledPackage | None]:
    """The package at ``source``, verified for installing over what is installed, or over
    what a removal kept (``adopt_data`` hands that to another publisher)."""
    store = host.require_state()
    trust_given = trust is not None or ssh is not None
    package = host.load_package(source, trust=trust, ssh=ssh, applications=True)
    manifest = package.manifest
    if manifest is None:
        raise PackageError("only packages with an extension.toml can be installed")
    if is_archive(source) and package.signer is None:
        raise AdmissionError(
            [
                f"{source} is a .whpkg that no trusted key verified: an archive installs only "
                "verified (trusted publishers, or an OpenSSH signature)"
                + (" and this one is not signed by any of them" if trust_given else "")
            ]
        )
    current = store.package(manifest.id)
    _same_publisher(package, current)
    if current is None:
        store.check_heir(manifest.id, package.signer, adopt_data=adopt_data)
    _check_version(host, source, package, current, allow_downgrade)
    return package, current


def write_install(
    host: UpdateHost, source: str | Path, package: Package, ssh: SshSigned | None
) -> InstalledPackage:
    """Write the package's read-only tree and its (not yet active) install record."""
    store = host.require_state()
    manifest = package.manifest
    assert manifest is not None
    unsigned = None  # a package directory's content digest: what its record vouches for
    if is_archive(source):
        files = {ARCHIVE_NAME: read_package_file(Path(source))}
        if ssh is not None:
            files[SSH_SIGNATURE_NAME] = ssh.signature
    else:
        # The manifest is read from the source again here: it must still say what was checked
        # (the module is the checked bytes already). A source changed in between (an install
        # that verified one manifest and wrote another, with other capabilities or commands)
        # is refused; nothing of a directory is signed, so equal content is all we can ask.
        text = manifest_text(Path(source))
        try:
            again: Manifest | None = parse_manifest(text.decode("utf-8"), _known(host))
        except (UnicodeDecodeError, ManifestError):
            again = None
        if again != manifest:
            raise PackageError(
                f"{source}: its {MANIFEST_NAME} changed while it was installed; nothing was "
                "installed"
            )
        files = {MANIFEST_NAME: text, manifest.module: package.wasm}
        unsigned = content_digest(text, manifest.module, package.wasm)
    digest = package.package_digest or unsigned or package.sha256
    tree = store.write_tree(manifest.id, manifest.version, digest, files)
    return InstalledPackage(
        manifest.id,
        manifest.version,
        package.sha256,
        tree,
        time.time_ns(),
        package_digest=package.package_digest if package.signer is not None else None,
        signer=package.signer,
        verified_by=package.verified_by,
        content_digest=unsigned,
    )


def installed_requests(host: UpdateHost, installed: InstalledPackage) -> frozenset[str]:
    """The capabilities an installed package's manifest requests, read without verifying its
    signature (the host's own read-only tree; what runs is verified at every start): for an
    operator's grant of an application capability, the manifest is all that is asked."""
    from ..packaging.package import open_archive

    if installed.package_digest is None:
        manifest = load_package(installed.path, _known(host)).manifest
    else:
        manifest = open_archive(installed.path / ARCHIVE_NAME, _known(host))[1]
    return frozenset() if manifest is None else manifest.required | manifest.optional


def verify_installed(host: UpdateHost, installed: InstalledPackage) -> Package:
    """Load an installed package again and check it is what was installed: the same module
    bytes and, for a signed archive, a signature that still verifies against the host's trust,
    by the same publisher, over the same package digest; for an unsigned install, the same
    manifest and module (its content digest)."""
    caps = _known(host)
    if installed.package_digest is None:
        if installed.content_digest is None:
            raise PackageError(
                f"{installed.id} {installed.version} was installed unsigned before install "
                "records covered the manifest: install it again (wasihost install DIR; remove "
                "it first if its tree was changed) so that its manifest is checked at each start"
            )
        package = load_package(installed.path, caps)
        if package.manifest is None:
            raise PackageError(f"{installed.id} {installed.version}: its manifest is gone")
        found = _unsigned_content(host, installed.path, package)
        if found != installed.content_digest:
            raise PackageError(
                f"{installed.id} {installed.version}: installed manifest or module changed on "
                f"disk (content sha256 {found[:16]}, recorded {installed.content_digest[:16]})"
            )
    else:
        ssh = None
        signature = installed.path / SSH_SIGNATURE_NAME
        if signature.exists():
            allowed = host.policy.allowed_signers
            if allowed is None:
                raise PackageError(
                    f"{installed.id} was installed verified by an OpenSSH signature: give the "
                    "host the allowed_signers to verify it again (Policy(allowed_signers=...), "
                    "--allowed-signers)"
                )
            ssh = SshSigned(allowed, read_ssh_signature(signature))
        try:
            package = load_package(
                installed.path / ARCHIVE_NAME, caps, host.policy.trusted_publishers, ssh
            )
        except SignatureError as exc:
            raise PackageError(
                f"{installed.id} {installed.version} no longer verifies as installed: {exc}"
            ) from None
        if package.signer != installed.signer or package.package_digest != installed.package_digest:
            raise PackageError(
                f"{installed.id} {installed.version} no longer verifies as installed (signed by "
                f"{installed.signer!r}, package digest {installed.package_digest[:16]}): "
                + (
                    "give the host the trust file that verified it"
                    if package.signer is None
                    else "its signature or content changed"
                )
            )
    if package.sha256 != installed.sha256:
        raise PackageError(
            f"{installed.id}: installed module changed on disk (sha256 {package.sha256[:16]}, "
            f"recorded {installed.sha256[:16]})"
        )
    manifest = package.manifest
    if manifest is None or (manifest.id, manifest.version) != (installed.id, installed.version):
        # The record is what install checked (version order, publisher, grants): a tree whose
        # manifest names another id would be admitted under that id's grants.
        claims = f"{manifest.id} {manifest.version}" if manifest is not None else "no manifest"
        raise PackageError(
            f"{installed.id} {installed.version}: the installed manifest says {claims}"
        )
    return package


@attrs.frozen
class InstalledRevocations:
    """What :func:`revoke_installed` did: the installed extensions it disabled, each with why
    (``disabled``), and those it could not match against the list, each with why
    (``unchecked``: the list may revoke them): their stored package cannot be read, or the
    list revokes keys and, without the host's trust, the keys that endorsed theirs are
    unknown."""

    disabled: dict[str, str]
    unchecked: dict[str, str]


def revoke_installed(host: UpdateHost, revocations: RevocationList) -> InstalledRevocations:
    """Mark every installed extension that ``revocations`` revokes as revoked in the durable
    grant table (as ``Host.disable`` does), so no later start admits it.

    Each is matched on what its install record holds (id, version, module and package
    digests, the verified publisher) and what its stored tree claims (the signing key and the
    keys that endorsed it, an unsigned manifest's publisher); nothing is admitted or verified,
    so a package that requests an application's capability is matched like any other. One whose
    tree cannot be read is still disabled if its record alone is revoked, and is reported in
    ``unchecked`` otherwise; either way the others are all matched (the first unreadable one
    stopped the whole pass, leaving later revoked extensions enabled)."""
    store = host.require_state()
    disabled: dict[str, str] = {}
    unchecked: dict[str, str] = {}
    for extension, version, sha256 in store.package_rows():
        try:
            installed = store.package(extension)
        except ConfigError as exc:
            # A damaged install record stopped the whole pass (store.packages() raised),
            # leaving every revoked extension after it enabled: it is matched on its row.
            claims = Claims(
                module_digest=sha256 if isinstance(sha256, str) else "",
                extension=extension,
                version=version if isinstance(version, str) else None,
            )
            why = revocations.revocation_of_claims(claims)
            if why is not None:
                host.disable(extension, clip_reason(f"{why} by the revocation list"))
                disabled[extension] = why
            else:
                unchecked[extension] = f"its install record cannot be read: {exc}"
            continue
        if installed is None:
            continue  # removed meanwhile
        record = Claims(
            module_digest=installed.sha256,
            extension=installed.id,
            version=installed.version,
            publishers=(installed.signer,) if installed.signer is not None else (),
            package_digest=installed.package_digest,
        )
        problem: str | None = None
        try:
            claims = _tree_claims(host, installed, record)
        except (WasihostError, OSError, ValueError) as exc:
            claims, problem = record, str(exc) or type(exc).__name__
            problem = f"its stored package cannot be read: {problem}"
        why = revocations.revocation_of_claims(claims)
        if why is not None:
            host.disable(installed.id, clip_reason(f"{why} by the revocation list"))
            disabled[installed.id] = why
        elif problem is not None:
            unchecked[installed.id] = problem
        elif revocations.keys and _endorsers_unknown(host, installed):
            # Its signing key may be one a revoked key endorsed (a rotation): only the trust
            # file says so, and without it such a package was left enabled, reported nowhere.
            unchecked[installed.id] = (
                "the list revokes keys, and the keys that endorsed its signing key are known "
                "only from the host's trust file (give it with --trust)"
            )
    return InstalledRevocations(disabled, unchecked)


def _endorsers_unknown(host: UpdateHost, installed: InstalledPackage) -> bool:
    """Whether ``installed`` was verified by a trust-file key whose endorsers the host cannot
    know: it has no trust store (an OpenSSH-signed or unsigned package has no endorsers)."""
    return (
        installed.package_digest is not None
        and host.policy.trusted_publishers is None
        and not (installed.path / SSH_SIGNATURE_NAME).exists()
    )


def _tree_claims(host: UpdateHost, installed: InstalledPackage, record: Claims) -> Claims:
    """``record`` with what the installed tree claims: a signed archive's signing key (and,
    with the host's trust, the keys that endorsed it), an unsigned manifest's publisher."""
    if installed.package_digest is not None:
        key = _claimed_signing_key(installed.path, installed.path / ARCHIVE_NAME)
        if key is None:
            raise PackageError(f"{installed.path / ARCHIVE_NAME} holds no signature record")
        # The keys that endorsed the signing key (a rotation) are revoked with it, as at
        # admission: without them a revoked old key left what it endorsed installed and
        # enabled here.
        trust = host.policy.trusted_publishers
        endorsed = trust.lineage(key)[1:] if trust is not None else ()
        return attrs.evolve(record, signing_key=key, endorsed_by=endorsed)
    text = manifest_text(installed.path).decode("utf-8")
    claimed = declared_publisher(text)
    return attrs.evolve(record, publishers=(claimed,) if claimed is not None else ())


def _claimed_signing_key(tree: Path, archive_path: Path) -> bytes | None:
    """The key an installed archive says it was signed with: its OpenSSH signature's key when
    it was installed by one (the key admission checks), else its signature record's."""
    ssh_signature = tree / SSH_SIGNATURE_NAME
    if ssh_signature.exists():
        return sshsig.parse(read_ssh_signature(ssh_signature)).key
    record = read_archive(read_package_file(archive_path)).signature
    return signing.SignatureRecord.parse(record).key if record is not None else None


# -- checkpoints ------------------------------------------------------------------------------


def take_checkpoint(host: UpdateHost, extension: str, version: str) -> Path:
    """Copy the extension's durable state (its data directory and what each checkpointing
    broker keeps for it) into a new checkpoint directory."""
    store = host.require_state()
    name = f"{version}-{time.time_ns()}"
    if not isinstance(version, str) or "/" in name or name.startswith("."):
        # A name in checkpoints/<id>/, never a path: a version read from a record is checked
        # as SemVer (InstalledPackage.from_record), this is the same rule for every caller.
        raise ConfigError(f"a checkpoint is named after a version, not {version!r}")
    target = store.checkpoint_dir(extension) / name
    target.mkdir(parents=True, mode=0o700)
    data = store.data_dir(extension)
    if data.exists():
        shutil.copytree(data, target / "data", symlinks=True)
    for broker in _checkpointing(host):
        broker.checkpoint(host, extension, target / "brokers" / broker.name)
    sync_tree(target)  # whole on disk before the marker that points to it (_mark_pending)
    return target


# The marker of an update or rollback under way, in ``checkpoints/<id>/``: written once its
# checkpoint is complete, removed once the transaction committed (the install record switched)
# or was undone. Found at a later start, it means the host died in between.
PENDING_NAME = "pending.json"
# Two paths and their JSON: far below this.
MAX_PENDING_BYTES = 64 * 1024


# One install, update or rollback of an extension at a time. Each reads what is installed and
# then writes on it: two at once (threads of one host, or two hosts on one state directory)
# would both checkpoint, migrate and activate, the second over the first. A lock file per
# extension, under the state directory's locks/, held (flock, not waited for) for the whole
# transaction; it is never removed, since a locked file removed lets the next opener lock a
# new one beside it.
@contextmanager
def exclusive(host: UpdateHost, extension: str, *, alone: bool = False) -> Iterator[None]:
    """Hold ``extension``'s transaction lock for the ``with`` block, or raise
    :class:`UpdateError` at once if another install, update or rollback of it holds it (in
    this host, another thread, or another host on the same state directory). With ``alone``
    (a transaction that changes the extension's state: update, rollback, removal), also
    refuse if another host on the state directory has it admitted (:class:`Presence`), and
    keep any from admitting it until the block ends."""
    fd = lock_file(host.require_state().directory, f"{check_extension_id(extension)}.lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UpdateError(
                f"{extension}: another install, update or rollback of it is under way; "
                "try again when it has ended"
            ) from None
        if alone and host.presence is not None:
            with host.presence.alone(extension):
                yield
        else:
            yield
    finally:
        os.close(fd)  # the lock goes with its descriptor


def still_current(host: UpdateHost, extension: str, seen: InstalledPackage | None) -> None:
    """Under :func:`exclusive`: what is installed is still ``seen``, the record a transaction
    was prepared against before it took the lock; else :class:`UpdateError`."""
    if host.require_state().package(extension) != seen:
        raise UpdateError(
            f"{extension}: another install, update or rollback changed it while this one was "
            "prepared; try again"
        )


def _pending(host: UpdateHost, extension: str) -> Path:
    return host.require_state().checkpoint_dir(extension) / PENDING_NAME


def _mark_pending(host: UpdateHost, extension: str, checkpoint: Path, running: Path) -> int:
    """Record durably that ``extension``'s state may change from here until the transaction
    ends: ``checkpoint`` holds it as it was, while ``running`` was the installed tree. The
    marker stays locked (``flock``) by the returned descriptor until :func:`_clear_pending`:
    another host on the same state directory sees an update under way, not a dead one (the
    lock goes with the process that held it)."""
    marker = _pending(host, extension)
    tmp = marker.with_name(f".{PENDING_NAME}.{os.getpid()}.tmp")
    directory = host.require_state().directory
    names = {"checkpoint": checkpoint, "running": running}
    doc = json.dumps({k: relative_name(directory, v) for k, v in names.items()}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, doc)
        os.fsync(fd)
        os.replace(tmp, marker)
        fsync_path(marker.parent)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd


def _clear_pending(host: UpdateHost, extension: str, fd: int) -> None:
    """The transaction committed or was undone: the marker goes, then its lock."""
    _pending(host, extension).unlink(missing_ok=True)
    os.close(fd)


def interrupted(host: UpdateHost, extension: str) -> bool:
    """Whether a host died during an update or rollback of ``extension`` and nothing has
    undone it yet (its marker is there; ``wasihost status`` says so)."""
    return _pending(host, extension).exists()


def recover_interrupted(host: UpdateHost, extension: str) -> str | None:
    """Finish what a host that died during an update or rollback of ``extension`` left: if
    the install record still names the version that ran before it, the transaction never
    committed, and the state its migration (or restore) may have half changed is put back
    from the checkpoint; if the record names the new version, it committed and only the
    marker goes. Returns what was done, for the journal; None if nothing was pending."""
    marker = _pending(host, extension)
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link in its place (an internal error, exit 70, before)
        raise _unreadable_marker(extension, marker, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UpdateError(
                f"{extension}: an update or rollback is under way in another host"
            ) from None
        return _recover(host, extension, marker, fd)
    finally:
        os.close(fd)


def _recover(host: UpdateHost, extension: str, marker: Path, fd: int) -> str:
    store = host.require_state()
    try:
        doc = json.loads(os.read(fd, MAX_PENDING_BYTES))
        checkpoint = record_path(
            store.directory, extension, CHECKPOINTS_DIR_NAME, doc["checkpoint"]
        )
        running = record_path(store.directory, extension, PACKAGES_DIR_NAME, doc["running"])
    except (OSError, ValueError, KeyError, TypeError, ConfigError, RecursionError) as exc:
        raise _unreadable_marker(extension, marker, exc) from None
    active = store.package(extension)
    if active is not None and active.path == running:
        restore_checkpoint(host, extension, checkpoint)
        done = f"the host stopped during an update or rollback; state restored from {checkpoint}"
    else:
        done = "the host stopped after an update or rollback committed; nothing to undo"
    marker.unlink()
    if active is None or active.checkpoint != checkpoint:
        remove_tree(checkpoint)
    host.journal(extension, "interrupted update", done)
    return done


def _unreadable_marker(extension: str, marker: Path, exc: BaseException) -> PackageError:
    return PackageError(
        f"{extension}: an interrupted update left {marker}, which cannot be read ({exc}); "
        "restore its state by hand from the checkpoints directory, then remove the file"
    )


def restore_checkpoint(host: UpdateHost, extension: str, checkpoint: Path) -> None:
    store = host.require_state()
    # Into the directory data/<id> leads to, where it is a link (data on another disk): the
    # link was replaced by a local copy, leaving the data it led to for no purge to find.
    data = store.clear_data(extension, keep_link=True)
    if (checkpoint / "data").exists():
        shutil.copytree(checkpoint / "data", data, symlinks=True, dirs_exist_ok=True)
    for broker in _checkpointing(host):
        broker.restore(host, extension, checkpoint / "brokers" / broker.name)


def remove(host: UpdateHost, extension: str, *, purge: bool) -> None:
    """Uninstall ``extension`` (``wasihost remove``); with ``purge`` forget it with everything
    kept for it (``--purge``): its package, records and data directory, and what each
    checkpointing broker keeps for it, which is not under the data directory (storage rows
    live in the state directory's one storage database).

    An id the state knows nothing of is refused before anything is locked or asked. Then it
    runs under the extension's transaction lock, so never beside an install, update or
    rollback of it (in this host or another): one would activate a tree this deleted. The
    brokers' part goes first and the state's records last, so a host killed on the way leaves
    the id known and the same command can be run again to completion (with the records gone
    first, a second purge refused the id and the brokers' rows stayed, for the next install of
    that id to find)."""
    check_extension_id(extension)
    store = host.require_state()
    store.check_removable(extension, purge=purge)
    with exclusive(host, extension, alone=True):
        if purge:
            with tempfile.TemporaryDirectory() as empty:
                for broker in _checkpointing(host):
                    # Restoring a checkpoint in which it held nothing drops all it holds.
                    broker.restore(host, extension, Path(empty) / broker.name)
        else:
            # The data directory stays: not as a dead update's migration half left it.
            recover_interrupted(host, extension)
        store.remove(extension, purge=purge)


def purge(host: UpdateHost, extension: str) -> None:
    """``remove(host, extension, purge=True)``."""
    remove(host, extension, purge=True)


def _checkpointing(host: UpdateHost) -> list[Any]:
    return [
        b
        for b in host.functions.brokers()
        if callable(getattr(b, "checkpoint", None)) and callable(getattr(b, "restore", None))
    ]


# -- update and rollback ----------------------------------------------------------------------


def _start_checked(
    host: UpdateHost, package: Package, steps: list[tuple[str, dict[str, Any] | None]]
) -> Extension:
    """An extension of ``package``, not registered with the host, started and put through
    ``steps`` (command, input); closed again if any fails."""
    ext = host.build_unregistered(package)
    try:
        ext.start()
        for command, value in steps:
            ext.call(command, value)
    except BaseException:
        ext.close("update check failed")
        raise
    return ext


# How long past its own call deadline an update waits for the running version's calls to end:
# a call ends at its deadline's next epoch tick, or when a synchronous host function returns.
DRAIN_MARGIN_S = 1.0


def _pause(ext: Extension | None, reason: str) -> bool:
    """Pause the running version and wait until none of its calls is in flight: a call that
    started before the pause may still write (storage, host functions), and a checkpoint taken
    or restored under it would lose that acknowledged write or mix it into the other
    version's data. True if it was paused here; an :class:`UpdateError` (the extension
    resumed) if its calls outlast their deadline."""
    paused = False
    if ext is not None and ext.lifecycle.state is State.RUNNING:
        ext.pause(reason)
        paused = True
    if ext is not None:
        bound = ext.resources.timeout_ms / 1000 + DRAIN_MARGIN_S
        if not ext.wait_idle(bound):
            if paused:
                ext.resume()
            raise UpdateError(
                f"{ext.id}: a call was still running {bound:.1f} s after the pause; "
                "nothing was changed"
            )
    return paused


def update(
    host: UpdateHost,
    source: str | Path,
    *,
    trust: TrustStore | None,
    ssh: SshSigned | None,
    allow_downgrade: bool,
) -> InstalledPackage:
    """Replace the installed version of a package's extension by ``source``, as one
    transaction (see the module docstring); returns the new install record."""
    package, current = candidate(
        host, source, trust=trust, ssh=ssh, allow_downgrade=allow_downgrade
    )
    assert package.manifest is not None
    with exclusive(host, package.manifest.id, alone=True):
        still_current(host, package.manifest.id, current)
        return _update(host, source, ssh, package, current)


def _update(
    host: UpdateHost,
    source: str | Path,
    ssh: SshSigned | None,
    package: Package,
    current: InstalledPackage | None,
) -> InstalledPackage:
    store = host.require_state()
    manifest = package.manifest
    assert manifest is not None
    if current is None:
        raise PackageError(f"{manifest.id} is not installed: install it first")
    if recover_interrupted(host, manifest.id) is not None:
        current = store.package(manifest.id)
        assert current is not None
    if manifest.version == current.version:
        raise UpdateError(f"{manifest.id} {current.version} is already installed")
    host.plan(package)  # ABI, required grants held, revocation: before anything changes
    running = host.extension(manifest.id)
    paused = _pause(running, f"updating to {manifest.version}")
    try:
        record = write_install(host, source, package, ssh)
    except BaseException:
        if paused and running is not None:
            running.resume()
        raise
    try:
        checkpoint = take_checkpoint(host, manifest.id, current.version)
        pending = _mark_pending(host, manifest.id, checkpoint, current.path)
    except BaseException:
        if paused and running is not None:
            running.resume()
        raise
    spec = manifest.update
    steps: list[tuple[str, dict[str, Any] | None]] = []
    if spec.migrate is not None:
        direction = {"from": current.version, "to": manifest.version, "direction": "up"}
        steps.append((spec.migrate, direction))
    if spec.health is not None:
        steps.append((spec.health, None))
    try:
        installed_package = verify_installed(host, record)
        new = _start_checked(host, installed_package, steps)
        try:
            host.plan(installed_package)  # a revocation published meanwhile stops it here
        except BaseException:
            new.close("update check failed")
            raise
    except BaseException as exc:
        restore_checkpoint(host, manifest.id, checkpoint)
        _clear_pending(host, manifest.id, pending)
        remove_tree(checkpoint)
        if record.path != current.path:
            remove_tree(record.path)
        if paused and running is not None:
            running.resume()
        host.journal(manifest.id, "update failed", f"{manifest.version}: {exc}")
        if isinstance(exc, WasihostError):
            raise UpdateError(
                f"update of {manifest.id} to {manifest.version} failed, {current.version} "
                f"kept: {exc}"
            ) from exc
        raise
    record = attrs.evolve(
        record,
        checkpoint=checkpoint,
        migrated=spec.migrate is not None,
        previous=attrs.evolve(current, previous=None),
    )
    store.activate(record)
    _clear_pending(host, manifest.id, pending)
    prune(host, record)
    host.switch(running, new, f"replaced by {manifest.version}")
    return record


def rollback(host: UpdateHost, extension: str) -> InstalledPackage:
    """Return ``extension`` to the version its last update replaced: the current version's
    reversible migration runs down, or else the checkpoint taken before that update is
    restored; the earlier version is verified again and started before the switch."""
    check_extension_id(extension)  # before its lock file is named after it
    with exclusive(host, extension, alone=True):
        return _rollback(host, extension)


def _rollback(host: UpdateHost, extension: str) -> InstalledPackage:
    store = host.require_state()
    recover_interrupted(host, extension)
    current = store.package(extension)
    if current is None:
        raise PackageError(f"{extension} is not installed")
    previous = current.previous
    if previous is None:
        raise UpdateError(f"{extension} keeps no earlier version: nothing to roll back to")
    earlier = verify_installed(host, previous)
    host.plan(earlier)  # a revoked earlier version is not rolled back to
    running = host.extension(extension)
    paused = _pause(running, f"rolling back to {previous.version}")
    # The current version's state as it is now: if the rollback fails after its data step
    # (the down-migration ran, or the old checkpoint was restored) and before the switch, the
    # current version resumes on this, not on data it did not write or no longer has.
    try:
        now_state = take_checkpoint(host, extension, f"{current.version}-before-rollback")
        pending = _mark_pending(host, extension, now_state, current.path)
    except BaseException:
        if paused and running is not None:
            running.resume()
        raise
    try:
        now = verify_installed(host, current)
        assert now.manifest is not None
        spec = now.manifest.update
        if current.migrated and spec.reversible and spec.migrate is not None:
            down = {"from": current.version, "to": previous.version, "direction": "down"}
            _start_checked(host, now, [(spec.migrate, down)]).close("migrated down")
        elif current.checkpoint is not None:
            restore_checkpoint(host, extension, current.checkpoint)
        new = _start_checked(host, earlier, [])
    except BaseException as exc:
        restore_checkpoint(host, extension, now_state)
        _clear_pending(host, extension, pending)
        remove_tree(now_state)
        if paused and running is not None:
            running.resume()
        host.journal(extension, "rollback failed", f"{previous.version}: {exc}")
        if isinstance(exc, WasihostError):
            raise UpdateError(
                f"rollback of {extension} to {previous.version} failed, {current.version} "
                f"kept: {exc}"
            ) from exc
        raise
    record = attrs.evolve(previous, previous=None, installed_at=time.time_ns())
    store.activate(record)
    _clear_pending(host, extension, pending)
    remove_tree(now_state)
    prune(host, record)
    host.switch(running, new, f"rolled back to {previous.version}")
    host.journal(extension, "rolled back", f"{current.version} -> {previous.version}")
    return record


def prune(host: UpdateHost, record: InstalledPackage) -> None:
    """After ``record`` was activated, under the extension's transaction lock: keep the active
    tree, the one a rollback returns to and its checkpoint; drop the rest, half-written trees
    a killed host left (``.*.installing``) included, since no other write runs meanwhile."""
    store = host.require_state()
    keep_trees = {record.path} | ({record.previous.path} if record.previous else set())
    for tree in store.package_dir(record.id).iterdir():
        if tree not in keep_trees:
            remove_tree(tree)
    checkpoints = store.checkpoint_dir(record.id)
    if checkpoints.exists():
        for checkpoint in checkpoints.iterdir():
            if checkpoint != record.checkpoint:
                remove_tree(checkpoint)
