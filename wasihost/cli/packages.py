"""The package commands: ``keygen``, ``pack``, ``sign``, ``verify``, ``revoke``, ``endorse``,
and those that change what a state directory holds: ``install``, ``update``, ``rollback``,
``remove``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.terminal import printable
from ..host import packages
from ..packaging.names import PACKAGE_SUFFIX
from ..packaging.package import is_archive
from .common import MAX_REVOCATION_DAYS, UsageError
from .options import _revocations, _ssh, _state_flag, _state_host, _trust

if TYPE_CHECKING:
    from ..host.runtime import Host
    from ..store.state import InstalledPackage


def _say_unchecked(names: tuple[str, ...] | list[str]) -> None:
    """The line that says which requested capabilities were not checked here: an
    application's own (host/packages.py, not_checked_here)."""
    if names:
        print(
            f"note: {', '.join(names)}: application capabilit{'ies' if len(names) > 1 else 'y'}, "
            "not checked here: the application that embeds wasihost serves "
            f"{'them' if len(names) > 1 else 'it'} and checks the extension when it loads it"
        )


def _installed_unchecked(host: Host, installed: InstalledPackage) -> tuple[str, ...]:
    """What the package just installed requests that was not checked here, read from its
    installed copy (host/updates.py, installed_requests), for the note above only; nothing
    when it cannot be read again."""
    from ..core.errors import WasihostError
    from ..host.updates import installed_requests

    try:
        return tuple(packages.known_capabilities().unchecked(installed_requests(host, installed)))
    except WasihostError:
        return ()


def _ssh_pair(args: argparse.Namespace) -> dict[str, Any]:
    """``install``/``update`` keyword arguments for an OpenSSH-signed source, if asked for."""
    ssh = _ssh(args, args.source)
    if ssh is None:
        return {}
    return {"allowed_signers": ssh.allowed, "ssh_signature": ssh.signature}


def _signed_by(pkg: InstalledPackage) -> str:
    return f", signed by {pkg.signer}" if pkg.signer is not None else ", unsigned"


def _cmd_update(args: argparse.Namespace) -> int:
    with _state_host(args) as host:
        pkg = host.update_installed(
            args.source, allow_downgrade=args.allow_downgrade, **_ssh_pair(args)
        )
        before = pkg.previous.version if pkg.previous is not None else "?"
        print(f"updated {pkg.id} {before} -> {pkg.version}{_signed_by(pkg)}")
        _say_unchecked(_installed_unchecked(host, pkg))
        print(f"roll back with: wasihost rollback {pkg.id}{_state_flag(args)}")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from ..core.manifest import check_extension_id

    check_extension_id(args.extension)  # before the state directory is opened or made
    with _state_host(args) as host:
        before = host.require_state().package(args.extension)
        pkg = host.rollback(args.extension)
        was = before.version if before is not None else "?"
        print(f"rolled back {pkg.id} {was} -> {pkg.version}{_signed_by(pkg)}")
    return 0


def _cmd_install(args: argparse.Namespace) -> int:
    with _state_host(args) as host:
        pkg = host.install(
            args.source,
            allow_downgrade=args.allow_downgrade,
            adopt_data=args.adopt_data,
            **_ssh_pair(args),
        )
        print(
            f"installed {pkg.id} {pkg.version} (sha256 {pkg.sha256[:16]}{_signed_by(pkg)}) "
            f"into {pkg.path}"
        )
        _say_unchecked(_installed_unchecked(host, pkg))
        held = sorted(host.grants.state(pkg.id).entries)
        if held:
            print(f"it holds the grants it had: {', '.join(held)}")
        else:
            print(f"it holds no grants yet: wasihost grants grant {pkg.id} CAP{_state_flag(args)}")
    return 0


def _cmd_endorse(args: argparse.Namespace) -> int:
    from ..packaging.files import read_signing_key
    from ..packaging.trust import TrustStore

    old = read_signing_key(args.key)
    new = TrustStore.from_file(args.new)
    if new.revokers or len(new.keys) != 1:
        raise UsageError(f"{args.new} must hold one publisher key line (a .pub file)")
    ((publisher, key),) = new.keys
    if publisher != old.publisher:
        raise UsageError(
            f"{args.new} is {publisher!r}'s key and {args.key} is {old.publisher!r}'s: a key "
            "endorses only its own publisher's next key"
        )
    if key == old.public_bytes:
        # A key endorsing itself proves nothing a rotation needs, and the line it printed
        # looked like one.
        raise UsageError(f"{args.new} is the public key of {args.key} itself: endorse a new key")
    print(old.endorse(key), end="")
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    if not args.out:
        raise UsageError("--out is empty: give a file prefix, such as acme")
    if args.out.endswith("/") or Path(args.out).is_dir():
        example = f"{args.out.rstrip('/')}/acme"
        raise UsageError(f"--out {args.out} is a directory: give a file prefix, such as {example}")
    private, public = packages.keygen(args.publisher, args.out)
    print(f"wrote {private} (private, mode 600) and {public} (a trust-file line)")
    return 0


def _whpkg(path: Path, flag: str) -> Path:
    if not is_archive(path):
        raise UsageError(f"{flag}: {path} must end in {PACKAGE_SUFFIX}")
    return path


def _cmd_pack(args: argparse.Namespace) -> int:
    packed = packages.pack(args.directory, _whpkg(args.output, "-o"))
    print(
        f"packed {packed.id} {packed.version}: {packed.files} files into {packed.path} "
        f"(package sha256 {packed.package_sha256})"
    )
    _say_unchecked(packed.not_checked_here)
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    signed = packages.sign(_whpkg(args.package, "sign"), args.key)
    print(
        f"signed {signed.id} {signed.version} as {signed.publisher} "
        f"(package sha256 {signed.package_sha256})"
    )
    _say_unchecked(signed.not_checked_here)
    return 0


def _check_revocation_entries(args: argparse.Namespace) -> None:
    """The operator's entries, refused as usage errors naming the flag: a malformed one would
    otherwise be refused by the list's own parser as if the list were corrupt, and an entry
    that no package can match (an extension version that is not SemVer) would revoke nothing
    while the command reported success."""
    from ..core.manifest import is_extension_id, is_version
    from ..packaging.trust import KEY_BYTES, PUBLISHER_ID, b64_exact

    for digest in args.module_sha256:
        if not (len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise UsageError(f"--module-sha256: {printable(digest[:80])!r} is not 64 lowercase hex")
    for ext_id, version in args.extension:
        if not is_extension_id(ext_id):
            raise UsageError(
                f"--extension: {printable(ext_id[:80])!r} is not an extension id "
                "(reverse-DNS: lowercase labels of a-z, 0-9 and '-', at least two)"
            )
        if not is_version(version):
            raise UsageError(
                f"--extension {ext_id}: {printable(version[:80])!r} is not a SemVer 2.0.0 version"
            )
    for publisher in args.publisher:
        if not PUBLISHER_ID.fullmatch(publisher):
            raise UsageError(
                f"--publisher: {printable(publisher[:80])!r} is not a publisher id (1 to 128 of "
                "letters, digits and ._@+- starting with a letter or digit)"
            )
    for text in args.signing_key:
        try:
            b64_exact(text, KEY_BYTES)
        except ValueError as exc:
            raise UsageError(f"--signing-key: {printable(text[:80])!r} {exc}") from None


def _cmd_revoke(args: argparse.Namespace) -> int:
    from ..packaging import revocation
    from ..packaging.archive import read_archive
    from ..packaging.files import read_package_file, read_signing_key, write_package_file
    from ..packaging.revocation import RevocationList
    from ..packaging.trust import TrustStore

    if not 1 <= args.expires_days <= MAX_REVOCATION_DAYS:
        raise UsageError(f"--expires-days must be in 1..{MAX_REVOCATION_DAYS}")
    _check_revocation_entries(args)
    key = read_signing_key(args.key)
    own = TrustStore(frozenset(), frozenset({(key.publisher, key.public_bytes)}))
    previous = None
    if args.list.exists():
        # Extending a list this key did not sign would launder someone else's entries.
        previous = revocation.parse(revocation.read_list(args.list), own)
    additions = RevocationList(
        previous.version + 1 if previous is not None else 1,
        time.time() + args.expires_days * 86400,
        frozenset(args.publisher),
        frozenset(revocation.key_bytes(k) for k in args.signing_key),
        frozenset(read_archive(read_package_file(p)).digest for p in args.package),
        frozenset(args.module_sha256),
        frozenset((i, v) for i, v in args.extension),
    )
    merged = additions.merged(previous) if previous is not None else additions
    # Re-read through the parser, so that a bad entry fails here and not on every host.
    data = merged.sign(key)
    revocation.parse(data, own)
    write_package_file(args.list, data)
    print(
        f"wrote {args.list}: version {merged.version}, expires "
        f"{revocation.format_time(merged.expires)}, signed by {key.publisher}"
    )
    if args.state_dir is not None:
        from ..host.updates import revoke_installed

        with _state_host(args) as host:
            done = revoke_installed(host, merged)
        for extension, why in sorted(done.disabled.items()):
            print(f"disabled installed {printable(extension)}: {printable(why)}")
        for extension, why in sorted(done.unchecked.items()):
            print(
                f"error: installed {printable(extension)} was not checked against the list "
                f"({printable(why)}): it may be revoked; disable "
                f"it with: wasihost grants revoke {printable(extension)}{_state_flag(args)}",
                file=sys.stderr,
            )
        if done.unchecked:
            return 1
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    path = _whpkg(args.package, "verify")
    ssh = _ssh(args, path)
    if ssh is None and args.trust is None:
        raise UsageError("give --trust TRUSTFILE, or --allowed-signers FILE (and --ssh-sig)")
    verified = packages.verify(
        path,
        trust=_trust(args),
        allowed_signers=ssh.allowed if ssh is not None else None,
        ssh_signature=ssh.signature if ssh is not None else None,
        revocations=_revocations(args),
    )
    print(
        f"verified: {verified.id} {verified.version} published by "
        f"{verified.publisher} (package sha256 {verified.package_sha256})"
    )
    _say_unchecked(verified.not_checked_here)
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    from ..core.manifest import check_extension_id

    check_extension_id(args.extension)  # before the state directory is opened or made
    with _state_host(args) as host:
        from ..host.updates import remove

        remove(host, args.extension, purge=args.purge)
        print(f"removed {args.extension}" + (" and its data" if args.purge else ""))
    return 0
