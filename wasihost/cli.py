"""The ``wasihost`` command line: run, inspect, abi, state, and packages (keygen, pack, sign,
verify).

Every failure ends as one line ``error: <class>: <message>`` on stderr and a non-zero exit
status; a traceback is a bug.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import cbor_json, limits
from .errors import (
    AdmissionError,
    CallError,
    CodecError,
    ConfigError,
    FailureClass,
    PackageError,
    UnsignedPackageError,
    UntrustedKeyError,
    WasihostError,
)
from .input_files import read_file_or_stdin
from .package import (
    Package,
    archive_parts,
    identity,
    is_archive,
    load_package,
    open_archive,
)
from .packaging.names import PACKAGE_SUFFIX
from .policy import Policy
from .registry import AbiVersion, default_registry
from .terminal import printable

# Each command imports what only it needs (the package archive, signature and key code, the
# runtime): `wasihost run` of a directory or module loads none of the packaging modules, and
# `wasihost pack` none of the engine. Start-up is most of a short command's time.
if TYPE_CHECKING:
    from .packaging.allowed_signers import SshSigned
    from .packaging.revocation import Revocations
    from .packaging.trust import TrustStore
    from .runtime import Host
    from .state import InstalledPackage

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE: a bug in wasihost, not in the guest or the input
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a Unix tool killed by a closed pipe reports
# --input-file/--input-bytes: the largest max_input_bytes a manifest may ask for; reading more
# could only be refused later, so it is refused before it is read.
MAX_CLI_INPUT_BYTES = 16 * 1024 * 1024
# `wasihost revoke`'s default lifetime of a list: a week, so that a host cut off from fresh
# lists stops admitting within days (TUF gives its frequently re-signed roles short expiries).
DEFAULT_REVOCATION_DAYS = 7
# A list valid for more than a year would let a frozen copy be served for that long.
MAX_REVOCATION_DAYS = 366


class UsageError(Exception):
    """Bad command-line arguments."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


COMMANDS = frozenset(
    {
        "run",
        "inspect",
        "keygen",
        "pack",
        "sign",
        "verify",
        "revoke",
        "abi",
        "install",
        "endorse",
        "update",
        "rollback",
        "remove",
        "grants",
        "status",
        "wasi",
        "bench",
    }
)
"""Every subcommand (tests check the parser defines exactly these)."""


class _Skipped:
    """The stand-in for the parser of a subcommand this invocation does not use: every
    ``add_*`` call is accepted and dropped. argparse builds each parser eagerly, about a
    millisecond per subcommand, most of it translation look-ups on the file system: a short
    command builds only its own parser (see :func:`_command_of`)."""

    def __getattr__(self, name: str) -> Any:
        return self._ignore

    def _ignore(self, *args: Any, **kwargs: Any) -> _Skipped:
        return self


class _OnlySubparsers:
    """``add_subparsers()``'s action, building only the parser of ``only``."""

    def __init__(self, sub: Any, only: str) -> None:
        self._sub = sub
        self._only = only

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name != self._only:
            return _Skipped()
        return self._sub.add_parser(name, **kwargs)


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The subcommand ``argv`` names, if its first word is one; None (build every parser: a
    help listing, a usage error naming the choices) otherwise."""
    words = sys.argv[1:] if argv is None else argv
    return words[0] if words and words[0] in COMMANDS else None


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with ``only``, one whose subcommands other than ``only`` are not
    defined (parsing an argv whose first word is ``only`` gives the same result)."""
    p = _Parser(prog="wasihost", description="Run untrusted WebAssembly extensions safely.")
    sub: Any = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    if only is not None:
        sub = _OnlySubparsers(sub, only)

    run = sub.add_parser("run", help="run one command of a package or module")
    run.add_argument("source", help=".whpkg, package directory or .wasm module")
    run.add_argument("command", help="command name")
    given = run.add_mutually_exclusive_group()
    given.add_argument(
        "--input", default=None, help="command input as JSON (default: null; see docs/cli.md)"
    )
    given.add_argument(
        "--input-file", metavar="FILE", help="command input as JSON, read from FILE ('-': stdin)"
    )
    given.add_argument(
        "--input-bytes",
        metavar="FILE",
        help="FILE's raw bytes ('-': stdin) as the input, a CBOR byte string",
    )
    run.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="CAP",
        help="grant an optional capability (repeatable)",
    )
    run.add_argument("--fuel", type=int, help="fuel budget per call")
    run.add_argument("--timeout-ms", type=int, help="wall-clock deadline per call")
    run.add_argument(
        "--json",
        action="store_true",
        help="print {output, fuel_used, logs} instead of the output alone",
    )
    run.add_argument(
        "--secrets-dir",
        type=Path,
        metavar="DIR",
        help="serve secrets from DIR (one file per secret, mode 0600, DIR mode 0700)",
    )
    run.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME",
        help="let the extension sign with secret NAME (repeatable; grants 'secrets')",
    )
    run.add_argument("--cache-dir", type=Path, help="compiled-module cache directory")
    run.add_argument("--no-cache", action="store_true", help="do not use the on-disk cache")

    inspect = sub.add_parser("inspect", help="show imports, exports and the admission verdict")
    inspect.add_argument("source", help=".whpkg, package directory or .wasm module")
    inspect.add_argument("--grant", action="append", default=[], metavar="CAP")
    inspect.add_argument("--json", action="store_true")
    verify = sub.add_parser("verify", help="verify a .whpkg against trusted publishers")
    verify.add_argument("package", type=Path, metavar="FILE.whpkg")
    verify.add_argument("--trust", type=Path, metavar="TRUSTFILE")
    for parser in (run, inspect):
        _trust_flags(parser)
    for parser in (run, inspect, verify):
        _ssh_flags(parser)
        _revocations_flag(parser)

    keygen = sub.add_parser("keygen", help="create a publisher's Ed25519 signing key pair")
    keygen.add_argument("--publisher", required=True, metavar="ID", help="publisher id")
    keygen.add_argument(
        "--out", required=True, metavar="PREFIX", help="writes PREFIX.key and PREFIX.pub"
    )
    endorse = sub.add_parser(
        "endorse", help="print a trust-file line endorsing a publisher's new key with its old one"
    )
    endorse.add_argument("new", type=Path, metavar="NEW.pub", help="the new key's .pub file")
    endorse.add_argument("--key", required=True, type=Path, metavar="OLD.key")
    pack = sub.add_parser("pack", help="pack a package directory into a .whpkg archive")
    pack.add_argument("directory", type=Path)
    pack.add_argument("-o", "--output", required=True, type=Path, metavar="FILE.whpkg")
    sign = sub.add_parser("sign", help="sign a .whpkg (replacing any signature it has)")
    sign.add_argument("package", type=Path, metavar="FILE.whpkg")
    sign.add_argument("--key", required=True, type=Path, metavar="PREFIX.key")

    revoke = sub.add_parser(
        "revoke", help="add entries to a signed revocation list (a new version, re-signed)"
    )
    revoke.add_argument("list", type=Path, metavar="LIST", help="created if it does not exist")
    revoke.add_argument("--key", required=True, type=Path, metavar="PREFIX.key")
    revoke.add_argument(
        "--expires-days",
        type=int,
        default=DEFAULT_REVOCATION_DAYS,
        metavar="N",
        help=f"the new list expires N days from now (default {DEFAULT_REVOCATION_DAYS})",
    )
    revoke.add_argument("--publisher", action="append", default=[], metavar="ID")
    revoke.add_argument(
        "--signing-key", action="append", default=[], metavar="BASE64", help="an Ed25519 key"
    )
    revoke.add_argument("--package", action="append", default=[], type=Path, metavar="FILE.whpkg")
    revoke.add_argument("--module-sha256", action="append", default=[], metavar="HEX")
    revoke.add_argument(
        "--extension", action="append", default=[], nargs=2, metavar=("ID", "VERSION")
    )
    revoke.add_argument(
        "--state-dir",
        type=Path,
        help="also disable, durably, the installed extensions of this state that the list revokes",
    )
    revoke.add_argument(
        "--trust",
        type=Path,
        metavar="TRUSTFILE",
        help="with --state-dir: the trust file whose rotations (endorsed-by) are followed, so "
        "that a revoked key also disables what is signed by a key it endorsed",
    )

    def state_opt(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--state-dir", type=Path, help="durable state directory (default: per-user data dir)"
        )

    state_opt(run)
    state_opt(verify)
    state_opt(inspect)
    install = sub.add_parser("install", help="copy a package into the state directory")
    install.add_argument("source", help=".whpkg (verified) or package directory")
    update = sub.add_parser(
        "update",
        help="update an installed extension: verify, checkpoint, start, health, switch",
    )
    update.add_argument("source", help=".whpkg (verified) or package directory")
    for parser in (install, update):
        parser.add_argument(
            "--allow-downgrade",
            action="store_true",
            help="install even if a higher version is installed",
        )
    rollback = sub.add_parser(
        "rollback", help="return an installed extension to the version its last update replaced"
    )
    rollback.add_argument("extension")
    for parser in (install, update, rollback):
        state_opt(parser)
        _trust_flags(parser)
        _ssh_flags(parser)
        _revocations_flag(parser)
    remove = sub.add_parser("remove", help="forget an installed package")
    remove.add_argument("extension")
    remove.add_argument(
        "--purge", action="store_true", help="also delete its data, grants history and journal"
    )
    state_opt(remove)
    grants = sub.add_parser("grants", help="list, grant or revoke capabilities")
    gsub = grants.add_subparsers(dest="grants_cmd", required=True, parser_class=_Parser)
    glist = gsub.add_parser("list", help="active grants and the grant epoch")
    glist.add_argument("extension")
    glist.add_argument("--json", action="store_true")
    state_opt(glist)
    ggrant = gsub.add_parser("grant", help="grant a capability (bumps the epoch)")
    ggrant.add_argument("extension")
    ggrant.add_argument("capability")
    ggrant.add_argument("--scope", default=None, help="scope as a JSON object")
    state_opt(ggrant)
    grevoke = gsub.add_parser("revoke", help="revoke a capability, or everything")
    grevoke.add_argument("extension")
    grevoke.add_argument("capability", nargs="?", help="omit to revoke everything (disable)")
    grevoke.add_argument("--reason", default="", help="why (shown by status)")
    state_opt(grevoke)
    greinstate = gsub.add_parser("reinstate", help="lift a whole-extension revocation")
    greinstate.add_argument("extension")
    state_opt(greinstate)
    status = sub.add_parser("status", help="state, grants and remaining data of extensions")
    status.add_argument("extension", nargs="?")
    status.add_argument("--json", action="store_true")
    state_opt(status)

    if only in (None, "wasi"):
        from .wasi import cli as wasi_cli  # its options' types, for its command only

        wasi_cli.add_parser(sub)
    if only in (None, "bench"):
        from .benchmark import cli as bench_cli  # the benchmark's code, for its command only

        bench_cli.add_parser(sub)

    abi = sub.add_parser("abi", help="list the host-function registry")
    abi.add_argument("--version", help="an ABI version such as 1.0 (default: every version)")
    abi.add_argument("--json", action="store_true")
    return p


def _cli_policy(
    package: Package, grants: Sequence[str], args: argparse.Namespace | None = None
) -> Policy:
    """The CLI grants what the manifest requires, plus each ``--grant``; nothing else. A
    ``.whpkg`` is run only verified; ``--require-signed`` extends that to every source."""
    required = package.manifest.required if package.manifest is not None else frozenset()
    trust = _trust(args) if args is not None else None
    require = args is not None and (args.require_signed or (is_archive(args.source) and trust))
    return Policy(
        allow=frozenset(required) | frozenset(grants),
        trusted_publishers=trust,
        require_signed=bool(require),
        revocations=_revocations(args) if args is not None else None,
    )


def _revocations(args: argparse.Namespace) -> Revocations | None:
    """The ``--revocations`` list, checked against the ``--trust`` file's revocation keys."""
    path = getattr(args, "revocations", None)
    if path is None:
        return None
    from .packaging.revocation import Revocations, StateDirFloor
    from .packaging.trust import TrustStore

    if getattr(args, "trust", None) is None:
        raise UsageError(
            "--revocations needs --trust TRUSTFILE (the file marks the keys that sign the list)"
        )
    trust = TrustStore.from_file(args.trust)
    # With an explicit --state-dir, the highest version seen outlives this command.
    state_dir = getattr(args, "state_dir", None)
    floor = StateDirFloor(state_dir) if state_dir is not None else None
    return Revocations(path, trust, floor=floor)


def _trust_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust",
        type=Path,
        metavar="TRUSTFILE",
        help="trusted publishers ('ID ed25519 BASE64KEY' lines) to verify a .whpkg with "
        "(and installed ones again at each start)",
    )
    parser.add_argument(
        "--require-signed",
        action="store_true",
        help="refuse anything no trusted publisher signed (needs --trust)",
    )


def _revocations_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--revocations",
        type=Path,
        metavar="FILE",
        help="signed revocation list; needs --trust (its 'revocations' keys sign it)",
    )


def _ssh_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="verify a .whpkg by OpenSSH signature against this allowed_signers file",
    )
    parser.add_argument(
        "--ssh-sig",
        type=Path,
        metavar="FILE.whpkg.sig",
        help="the ssh-keygen -Y sign -n wasihost signature (default: the package path + .sig)",
    )


def _ssh(args: argparse.Namespace, source: str | Path) -> SshSigned | None:
    """The ``--allowed-signers`` / ``--ssh-sig`` verification asked for, if any."""
    if getattr(args, "allowed_signers", None) is None:
        if getattr(args, "ssh_sig", None) is not None:
            raise UsageError("--ssh-sig needs --allowed-signers FILE")
        return None
    from .packaging.allowed_signers import AllowedSigners, SshSigned, read_ssh_signature

    if not is_archive(source):
        raise UsageError(f"{source} is not a .whpkg: an SSH signature verifies .whpkg files")
    signature = args.ssh_sig if args.ssh_sig is not None else Path(f"{source}.sig")
    return SshSigned(
        AllowedSigners.from_file(args.allowed_signers), read_ssh_signature(signature)
    )


def _trust(args: argparse.Namespace) -> TrustStore | None:
    """The ``--trust`` file, read once per command."""
    cached: TrustStore | None = getattr(args, "_trust_store", None)
    if cached is None and getattr(args, "trust", None) is not None:
        from .packaging.trust import TrustStore

        cached = TrustStore.from_file(args.trust)
        args._trust_store = cached
    if getattr(args, "require_signed", False) and cached is None:
        raise UsageError("--require-signed needs --trust TRUSTFILE")
    return cached


def _brokers(args: argparse.Namespace) -> list[Any]:
    """The brokers the command line configures (``--secrets-dir``)."""
    directory = getattr(args, "secrets_dir", None)
    if directory is None:
        if getattr(args, "secret", None):
            raise UsageError("--secret NAME needs --secrets-dir DIR (where the secret is)")
        return []
    from .brokers.secrets import SecretsBroker
    from .secrets import FileSecretStore

    return [SecretsBroker(FileSecretStore(directory))]


def _host(policy: Policy, args: argparse.Namespace) -> Host:
    from .runtime import Host, default_cache_dir

    if getattr(args, "no_cache", False):
        cache: Path | None = None
    else:
        cache = getattr(args, "cache_dir", None) or default_cache_dir()
    return Host(policy, cache_dir=cache, brokers=_brokers(args))


def _state_dir(args: argparse.Namespace) -> Path:
    from .state import default_state_dir

    return args.state_dir if args.state_dir is not None else default_state_dir()


def _state_dir_to_read(args: argparse.Namespace) -> None:
    """A command that only reads the state (status, grants list) does not create an explicit
    --state-dir that does not exist: a mistyped path would otherwise become a new, empty state
    directory (parents included) reported as holding no extensions."""
    if args.state_dir is not None and not args.state_dir.exists():
        raise ConfigError(
            f"state directory {args.state_dir} does not exist (install creates one; "
            "check the path)"
        )


def _state_host(args: argparse.Namespace) -> Host:
    """A host on the durable state: the grant table decides; the policy allows every
    capability the registry knows, so that it caps nothing the operator granted."""
    from .packaging.allowed_signers import AllowedSigners
    from .runtime import Host

    registry = default_registry()
    trust = _trust(args)
    allowed = getattr(args, "allowed_signers", None)
    policy = Policy(
        allow=registry.capabilities(),
        trusted_publishers=trust,
        require_signed=bool(getattr(args, "require_signed", False)),
        revocations=_revocations(args),
        allowed_signers=AllowedSigners.from_file(allowed) if allowed is not None else None,
    )
    return Host(policy, cache_dir=None, state_dir=_state_dir(args), brokers=_brokers(args))


def _read_input_file(name: str, flag: str) -> bytes:
    """At most MAX_CLI_INPUT_BYTES of FILE ('-': stdin); more is a usage error, not a
    truncation."""
    try:
        data = read_file_or_stdin(name, MAX_CLI_INPUT_BYTES)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {name}: {exc.strerror}") from None
    if data is None:
        raise UsageError(f"{flag}: {name} is over {MAX_CLI_INPUT_BYTES} bytes")
    return data


def _input_value(args: argparse.Namespace) -> Any:
    if args.input_bytes is not None:
        return _read_input_file(args.input_bytes, "--input-bytes")
    if args.input_file is not None:
        flag = "--input-file"
        raw = _read_input_file(args.input_file, flag)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{flag}: {args.input_file} is not UTF-8 text") from None
    else:
        flag, text = "--input", args.input if args.input is not None else "null"
    try:
        return cbor_json.from_json(cbor_json.loads(text))
    except cbor_json.JsonFormError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def check_budget_flags(args: argparse.Namespace) -> None:
    """``--fuel`` and ``--timeout-ms`` are refused in their own words, not the manifest's."""
    for flag, value, (low, high) in (
        ("--fuel", args.fuel, (limits.MIN_FUEL_PER_CALL, limits.MAX_FUEL_PER_CALL)),
        ("--timeout-ms", args.timeout_ms, (limits.MIN_TIMEOUT_MS, limits.MAX_TIMEOUT_MS)),
    ):
        if value is not None and not low <= value <= high:
            raise UsageError(f"{flag} must be in {low}..{high}, got {value}")


def _not_shadowing(args: argparse.Namespace) -> None:
    """``run NAME --state-dir D`` where NAME is both a path here and an extension installed in
    D: running the path would run whatever a file or directory of that name in the current
    directory holds, under the CLI's grants, instead of the installed, verified extension."""
    from .state import StateStore

    store = StateStore(args.state_dir)
    try:
        shadowed = store.package(args.source) is not None
    finally:
        store.close()
    if shadowed:
        raise UsageError(
            f"{args.source} is an extension installed in {args.state_dir} and also a path "
            f"here: give ./{args.source} to run the path"
        )


def _cmd_run(args: argparse.Namespace) -> int:
    value = _input_value(args)
    check_budget_flags(args)
    # An installed extension's id never holds a '/' nor ends like a file: such a source is a
    # path, and one that does not exist is reported as a missing file, not a missing install.
    installed = (
        not is_archive(args.source)
        and "/" not in args.source
        and not args.source.endswith(".wasm")
        and not Path(args.source).exists()
        and (args.state_dir is not None or _state_dir(args).exists())
    )
    if not installed and args.state_dir is not None and "/" not in args.source:
        _not_shadowing(args)
    package = None
    if installed:
        if args.grant:
            raise UsageError("--grant does not apply to installed extensions: use wasihost grants")
        if args.secret:
            raise UsageError(
                "--secret does not apply to installed extensions: use wasihost grants grant "
                f"{args.source} secrets --scope '{{\"names\": [...]}}'"
            )
        host = _state_host(args)
    else:
        if args.secret and "secrets" not in args.grant:
            args.grant.append("secrets")
        ssh = _ssh(args, args.source)
        if is_archive(args.source) and args.trust is None and ssh is None:
            raise UsageError(
                f"{args.source} is a .whpkg, which runs only verified: give --trust TRUSTFILE "
                "(or --allowed-signers FILE with its --ssh-sig)"
            )
        package = load_package(
            args.source, default_registry().capabilities(), _trust(args), ssh
        )
        host = _host(_cli_policy(package, args.grant, args), args)
    try:
        if package is None:
            ext = host.load_installed(args.source, fuel=args.fuel, timeout_ms=args.timeout_ms)
        else:
            ext = host.admit(package, grants=args.grant, fuel=args.fuel, timeout_ms=args.timeout_ms)
        if args.secret and package is not None:
            host.grant(ext.id, "secrets", {"names": sorted(set(args.secret))})
        if ext.plan.is_command:
            raise UsageError(
                f"{args.source} is a plain WASI command with no commands to call: "
                f"run it with `wasihost wasi {args.source}`"
            )
        try:
            output = ext.call(args.command, value)
        except CallError as exc:
            if exc.failure is FailureClass.OUT_OF_FUEL:
                exc.hint = (
                    f"raise the budget with --fuel N (this run had {ext.resources.fuel_per_call})"
                )
            elif exc.failure is FailureClass.DEADLINE:
                exc.hint = f"raise --timeout-ms (this run had {ext.resources.timeout_ms} ms)"
            raise
        except CodecError as exc:
            if "exceeds" in exc.message:
                exc.hint = (
                    f"the input may be at most {ext.resources.max_input_bytes} bytes of CBOR: "
                    "raise [resources] max_input_bytes in the package's extension.toml"
                )
            raise
        finally:
            records = ext.log.drain()
            if not args.json:
                for r in records:
                    print(
                        f"[{ext.id}] {r.level.name.lower()}: {printable(r.message)}",
                        file=sys.stderr,
                    )
        if args.json:
            doc = {
                "output": cbor_json.to_json(output),
                "fuel_used": ext.last_fuel_used,
                "logs": [r.to_json() for r in records],
            }
            print(cbor_json.dumps(doc))
        else:
            print(cbor_json.dumps(cbor_json.to_json(output)))
        ext.close()
    finally:
        host.close()
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect_package, render_text
    from .packaging.revocation import MemoryFloor

    registry = default_registry()
    package = load_package(
        args.source, registry.capabilities(), _trust(args), _ssh(args, args.source)
    )
    revocations = _revocations(args)
    if revocations is not None:
        revocations.check(package, revocations.floor or MemoryFloor())
    report = inspect_package(package, registry, _cli_policy(package, args.grant, args), args.grant)
    if args.json:
        print(cbor_json.dumps(report, indent=2))
    else:
        print(render_text(report))  # every field escaped by render_text
    return 0 if report["admission"]["admitted"] else EXIT_FAILURE


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
        print(f"roll back with: wasihost rollback {pkg.id}{_state_flag(args)}")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    with _state_host(args) as host:
        before = host.require_state().package(args.extension)
        pkg = host.rollback(args.extension)
        was = before.version if before is not None else "?"
        print(f"rolled back {pkg.id} {was} -> {pkg.version}{_signed_by(pkg)}")
    return 0


def _cmd_install(args: argparse.Namespace) -> int:
    with _state_host(args) as host:
        pkg = host.install(args.source, allow_downgrade=args.allow_downgrade, **_ssh_pair(args))
        print(
            f"installed {pkg.id} {pkg.version} (sha256 {pkg.sha256[:16]}{_signed_by(pkg)}) "
            f"into {pkg.path}"
        )
        held = sorted(host.grants.state(pkg.id).entries)
        if held:
            print(f"it holds the grants it had: {', '.join(held)}")
        else:
            print(f"it holds no grants yet: wasihost grants grant {pkg.id} CAP{_state_flag(args)}")
    return 0


def _cmd_endorse(args: argparse.Namespace) -> int:
    from .packaging.files import read_signing_key
    from .packaging.trust import TrustStore

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
    from .packaging.files import write_key_pair
    from .packaging.trust import SigningKey

    if not args.out:
        raise UsageError("--out is empty: give a file prefix, such as acme")
    if args.out.endswith("/") or Path(args.out).is_dir():
        # PREFIX names the files (PREFIX.key, PREFIX.pub): a directory would give .key and
        # .pub, hidden files named for nothing.
        example = f"{args.out.rstrip('/')}/acme"
        raise UsageError(f"--out {args.out} is a directory: give a file prefix, such as {example}")
    key = SigningKey.generate(args.publisher)
    private, public = write_key_pair(args.out, key)
    print(f"wrote {private} (private, mode 600) and {public} (a trust-file line)")
    return 0


def _whpkg(path: Path, flag: str) -> Path:
    if not is_archive(path):
        raise UsageError(f"{flag}: {path} must end in {PACKAGE_SUFFIX}")
    return path


def _cmd_pack(args: argparse.Namespace) -> int:
    from .packaging.archive import read_archive, write_archive
    from .packaging.files import pack_directory, write_package_file

    output = _whpkg(args.output, "-o")
    files = pack_directory(args.directory)
    data = write_archive(files)
    archive = read_archive(data)
    # What pack writes, run would accept: the manifest parses and names a packed module.
    manifest, _ = archive_parts(archive, str(args.directory), default_registry().capabilities())
    write_package_file(output, data)
    print(
        f"packed {manifest.id} {manifest.version}: {len(files)} files into {output} "
        f"(package sha256 {archive.digest})"
    )
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    from .packaging import signing
    from .packaging.archive import write_archive
    from .packaging.files import read_signing_key, write_package_file

    path = _whpkg(args.package, "sign")
    key = read_signing_key(args.key)
    archive, manifest, wasm = open_archive(path, default_registry().capabilities())
    who = identity(manifest, hashlib.sha256(wasm).hexdigest())
    record = signing.sign(who, archive.digest, key)
    write_package_file(path, write_archive(archive.files, record))
    print(
        f"signed {manifest.id} {manifest.version} as {key.publisher} "
        f"(package sha256 {archive.digest})"
    )
    return 0


def _check_revocation_entries(args: argparse.Namespace) -> None:
    """The operator's entries, refused as usage errors naming the flag: a malformed one would
    otherwise be refused by the list's own parser as if the list were corrupt, and an entry
    that no package can match (an extension version that is not SemVer) would revoke nothing
    while the command reported success."""
    from .manifest import is_extension_id, is_version
    from .packaging.trust import KEY_BYTES, PUBLISHER_ID, b64_exact

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
    from .packaging import revocation
    from .packaging.archive import read_archive
    from .packaging.files import read_package_file, read_signing_key, write_package_file
    from .packaging.revocation import RevocationList
    from .packaging.trust import TrustStore

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
        from .updates import revoke_installed

        with _state_host(args) as host:
            for extension, why in sorted(revoke_installed(host, merged).items()):
                print(f"disabled installed {extension}: {why}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .packaging.revocation import MemoryFloor

    path = _whpkg(args.package, "verify")
    ssh = _ssh(args, path)
    if ssh is None and args.trust is None:
        raise UsageError("give --trust TRUSTFILE, or --allowed-signers FILE (and --ssh-sig)")
    package = load_package(path, default_registry().capabilities(), _trust(args), ssh)
    revocations = _revocations(args)
    if revocations is not None:
        revocations.check(package, revocations.floor or MemoryFloor())
    if package.signer is None or package.manifest is None:
        raise UnsignedPackageError(f"{path} is not signed")
    print(
        f"verified: {package.manifest.id} {package.manifest.version} published by "
        f"{package.signer} (package sha256 {package.package_digest})"
    )
    return 0


def _state_flag(args: argparse.Namespace) -> str:
    """The ``--state-dir`` to repeat in a suggested command, when the user gave one."""
    state_dir = getattr(args, "state_dir", None)
    return f" --state-dir {state_dir}" if state_dir is not None else ""


def _remedy(exc: WasihostError, args: argparse.Namespace | None) -> str | None:
    """What to type to lift a refusal, when the refusal says which capability was missing."""
    trust = getattr(args, "trust", None)
    if isinstance(exc, UntrustedKeyError) and trust is not None:
        return f"if you trust this publisher, append its PREFIX.pub line to {trust}"
    if isinstance(exc, UnsignedPackageError):
        target = getattr(args, "package", None) or getattr(args, "source", None) or "FILE.whpkg"
        return f"sign it: wasihost sign {target} --key PREFIX.key"
    if (
        args is not None
        and args.cmd == "run"
        and type(exc) is PackageError
        and "/" not in args.source
        and not args.source.endswith((".wasm", ".whpkg"))
        and exc.message
        in (f"{args.source} is not installed", f"module {args.source} does not exist")
    ):
        # RUN's source is a path or an installed id: say both were looked for, and where.
        where = args.state_dir if args.state_dir is not None else _state_dir(args)
        return (
            f"{args.source} is neither a file here nor an extension installed in {where}"
            + ("; one installed elsewhere needs --state-dir DIR" if args.state_dir is None else "")
        )
    if (
        args is not None
        and args.cmd == "run"
        and type(exc) is ConfigError
        and f"command {args.command!r} takes bytes" in exc.message
    ):
        # The embedding API's words (bytes, a memoryview) in the CLI's terms.
        return (
            "give the bytes with --input-bytes FILE ('-': stdin) or "
            "--input '{\"$bytes\": \"HEX\"}'"
        )
    if not isinstance(exc, AdmissionError) or not exc.ungranted or args is None:
        return None
    caps = exc.ungranted
    if args.cmd == "run" and Path(args.source).exists():
        return "grant it: " + " ".join(f"--grant {c}" for c in caps)
    if args.cmd in ("run", "install"):
        ext = args.source
        return "grant it: " + "; ".join(
            f"wasihost grants grant {ext} {c}{_state_flag(args)}" for c in caps
        )
    return None


def _cmd_remove(args: argparse.Namespace) -> int:
    with _state_host(args) as host:
        if args.purge:
            from .updates import purge

            purge(host, args.extension)
        else:
            host.require_state().remove(args.extension, purge=False)
        print(f"removed {args.extension}" + (" and its data" if args.purge else ""))
    return 0


def _cmd_grants(args: argparse.Namespace) -> int:
    from .runtime import check_extension_id

    check_extension_id(args.extension)
    if args.grants_cmd == "list":
        _state_dir_to_read(args)
    with _state_host(args) as host:
        ext = args.extension
        store = host.require_state()
        if args.grants_cmd != "list" and store.package(ext) is None:
            # Allowed (grants may be set before the install), but a typo would pass silently.
            # Said once the change is made: a refused one waits for nothing.
            pending_note = (
                f"note: {printable(ext)} is not installed in {store.directory}: "
                "the change waits for it"
            )
        else:
            pending_note = None
        if args.grants_cmd == "reinstate" and host.grants.state(ext).revoked is None:
            print(f"{ext} is not revoked: nothing to reinstate")
            return 0
        if args.grants_cmd == "grant":
            scope = None
            if args.scope is not None:
                try:
                    scope = cbor_json.loads(args.scope)
                except cbor_json.JsonFormError as exc:
                    raise UsageError(f"--scope: {exc}") from None
            epoch = host.grant(ext, args.capability, scope)
            print(f"granted {args.capability} to {ext} (epoch {epoch})")
        elif args.grants_cmd == "revoke":
            epoch = host.revoke(ext, args.capability, args.reason)
            what = args.capability or "everything (the extension is revoked)"
            print(f"revoked {what} from {ext} (epoch {epoch})")
        elif args.grants_cmd == "reinstate":
            epoch = host.reinstate(ext)
            # A whole-extension revocation withdrew every grant: none comes back by itself.
            held = sorted(host.grants.state(ext).entries)
            print(
                f"reinstated {ext} (epoch {epoch}); "
                + (
                    f"it holds: {', '.join(held)}"
                    if held
                    else f"it holds no grants: give each again with "
                    f"wasihost grants grant {ext} CAP{_state_flag(args)}"
                )
            )
        else:
            state = host.grants.state(ext)
            rows = [
                {"capability": e.capability, "scope": e.scope_value, "since_epoch": e.since_epoch}
                for e in state.entries.values()
            ]
            if args.json:
                print(
                    cbor_json.dumps(
                        {
                            "extension": ext,
                            "epoch": state.epoch,
                            "revoked": state.revoked,
                            "grants": rows,
                        }
                    )
                )
            else:
                print(
                    f"{ext}: epoch {state.epoch}"
                    + (f", REVOKED: {printable(state.revoked)}" if state.revoked else "")
                )
                for row in rows:
                    print(
                        f"  {row['capability']}  scope={cbor_json.dumps(row['scope'])}  "
                        f"since epoch {row['since_epoch']}"
                    )
                if not rows:
                    print("  (no grants)")
        if pending_note is not None:
            print(pending_note, file=sys.stderr)
    return 0


def _status_of(host: Host, ext: str) -> dict[str, Any]:
    store = host.require_state()
    pkg = store.package(ext)
    grants = host.grants.state(ext)
    recorded = store.lifecycle(ext)
    why: str | None
    if grants.revoked is not None:
        state, why = "revoked", grants.revoked
    elif recorded is not None:
        state, why = recorded
    else:
        state, why = ("installed" if pkg else "unknown"), None
    return {
        "extension": ext,
        "version": pkg.version if pkg else None,
        "state": state,
        "why": why,
        "epoch": grants.epoch,
        "grants": sorted(grants.entries),
        "remaining": store.remaining_data(ext),
        "recent": [f"{e.kind}: {e.detail}" for e in store.events(ext, 5)],
        "crashes_by_class": store.crash_counts(ext),
        # None when the state keeps nothing of ``ext``: `remove --purge` would refuse it.
        "remove": (
            f"wasihost remove {ext} --purge"
            + (f" --state-dir {store.directory}" if store.directory else "")
            if store.keeps(ext)
            else None
        ),
    }


def _metrics_line(metrics: dict[str, Any]) -> str:
    """One line of host metrics for `wasihost status` (counts only)."""
    source = {
        "live": f"live, {metrics['live_hosts']} host(s)",
        "last host": "last published by a host now closed",
        "state": "from the journal",
    }[metrics["source"]]
    states = ", ".join(f"{s} {n}" for s, n in metrics["extensions_by_state"].items()) or "none"
    errors = metrics["host_call_errors"]
    refused = sum(errors["statuses"].values())
    failed = sum(errors["failures"].values())
    crashes = sum(metrics["crashes_by_class"].values())
    return (
        f"metrics ({source}): extensions {states}; crashes {crashes}; "
        f"quarantines {metrics['quarantines']}; throttles {metrics['throttles']}; "
        f"host calls refused {refused}, failed {failed}"
    )


def _cmd_status(args: argparse.Namespace) -> int:
    from .runtime import check_extension_id

    if args.extension is not None:
        check_extension_id(args.extension)
    _state_dir_to_read(args)
    with _state_host(args) as host:
        store = host.require_state()
        names = [args.extension] if args.extension else store.extensions()
        reports = [_status_of(host, n) for n in names]
        from .opmetrics import status_metrics

        metrics = status_metrics(store)
        if args.json:
            # An object since the metrics joined (the list of reports is its "extensions").
            print(cbor_json.dumps({"extensions": reports, "metrics": metrics}, indent=2))
            return 0
        if not reports:
            print(f"no extensions in {store.directory}")
        print(_metrics_line(metrics))
        for r in reports:
            print(
                f"{r['extension']} {r['version'] or ''}".rstrip()
                + f": {r['state']}"
                + (f" ({printable(r['why'])})" if r["why"] else "")  # may quote a guest
            )
            print(f"  grants (epoch {r['epoch']}): {', '.join(r['grants']) or 'none'}")
            rem = r["remaining"]
            print(
                f"  kept: package {rem['package'] or '-'}; data {rem['data_bytes']} bytes; "
                f"{rem['journal_events']} journal events"
            )
            if r["crashes_by_class"]:
                counts = ", ".join(f"{c} {n}" for c, n in r["crashes_by_class"].items())
                print(f"  crashes in the journal: {counts}")
            for line in r["recent"]:
                print(f"  recent: {printable(line)}")
            if r["remove"] is None:
                print("  nothing is kept for it in this state directory")
            else:
                print(f"  to remove everything: {r['remove']}")
    return 0


def _cmd_abi(args: argparse.Namespace) -> int:
    from .inspect import abi_listing, render_abi_text

    version = None
    if args.version is not None:
        try:
            version = AbiVersion.parse(args.version)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    listing = abi_listing(default_registry(), version)
    if args.json:
        print(cbor_json.dumps(listing, indent=2))
    else:
        print(render_abi_text(listing))
    return 0


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    # Host warnings (a disabled module cache, a rejected cache entry) are for the operator:
    # one plain line, no source location.
    print(f"warning: {printable(str(message))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():  # scoped: an embedding caller keeps its own handler
        warnings.showwarning = _show_warning
        return _main(argv)


def _cmd_wasi(args: argparse.Namespace) -> int:
    from .wasi import cli as wasi_cli

    return wasi_cli.run(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import cli as bench_cli

    return bench_cli.run(args)


def _main(argv: Sequence[str] | None) -> int:
    args: argparse.Namespace | None = None
    try:
        args = _parser(_command_of(argv)).parse_args(argv)
        handler = {
            "run": _cmd_run,
            "inspect": _cmd_inspect,
            "keygen": _cmd_keygen,
            "pack": _cmd_pack,
            "sign": _cmd_sign,
            "verify": _cmd_verify,
            "revoke": _cmd_revoke,
            "abi": _cmd_abi,
            "install": _cmd_install,
            "endorse": _cmd_endorse,
            "update": _cmd_update,
            "rollback": _cmd_rollback,
            "remove": _cmd_remove,
            "grants": _cmd_grants,
            "status": _cmd_status,
            "wasi": _cmd_wasi,
            "bench": _cmd_bench,
        }[args.cmd]
        return handler(args)
    except UsageError as exc:
        print(f"error: usage: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except WasihostError as exc:
        print(f"error: {exc.error_class}: {printable(exc.message)}", file=sys.stderr)
        remedy = exc.hint or _remedy(exc, args)
        if remedy is not None:
            print(f"hint: {printable(remedy)}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        # The reader went away (`wasihost abi | head -1`): stop quietly, as Unix tools do.
        # stdout is pointed at /dev/null so that the interpreter's final flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        print(f"error: internal: {type(exc).__name__}: {printable(str(exc))}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    # `python -m wasihost.cli` runs this file as __main__, a second copy of the module: the
    # subcommands raise wasihost.cli's UsageError, which only that module's main catches.
    from wasihost.cli import main as _entry

    sys.exit(_entry())
