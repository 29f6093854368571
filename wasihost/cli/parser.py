"""The command line's parser: every subcommand and its flags. A short command builds only the
parser of its own subcommand (see :func:`_command_of`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .common import (
    DEFAULT_REVOCATION_DAYS,
    UsageError,
    add_functions_flag,
    add_runtime_flag,
    whole_number,
)


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
        "doctor",
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

    for add_command in _BUILT_IN:
        add_command(sub)

    if only in (None, "wasi"):
        from . import wasi_command as wasi_cli  # its options' types, for its command only

        wasi_cli.add_parser(sub)
    if only in (None, "bench"):
        from . import bench_command as bench_cli  # the benchmark's code, for its command only

        bench_cli.add_parser(sub)

    _add_abi(sub)
    return p


# One function per subcommand, each adding its parser to ``sub`` (the subparsers action, or an
# _OnlySubparsers that drops the others) with every flag in the order ``--help`` lists them.


def _add_run(sub: Any) -> None:
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
    run.add_argument("--fuel", type=whole_number, help="fuel budget per call")
    run.add_argument("--timeout-ms", type=whole_number, help="wall-clock deadline per call")
    add_runtime_flag(run)
    add_functions_flag(run)
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
    _trust_flags(run)
    _ssh_flags(run)
    _revocations_flag(run)
    _state_flag(run)


def _add_inspect(sub: Any) -> None:
    inspect = sub.add_parser("inspect", help="show imports, exports and the admission verdict")
    inspect.add_argument("source", help=".whpkg, package directory or .wasm module")
    inspect.add_argument("--grant", action="append", default=[], metavar="CAP")
    inspect.add_argument("--json", action="store_true")
    add_runtime_flag(inspect)
    _trust_flags(inspect)
    _ssh_flags(inspect)
    _revocations_flag(inspect)
    _state_flag(inspect)


def _add_verify(sub: Any) -> None:
    verify = sub.add_parser("verify", help="verify a .whpkg against trusted publishers")
    verify.add_argument("package", type=Path, metavar="FILE.whpkg")
    verify.add_argument("--trust", type=Path, metavar="TRUSTFILE")
    _ssh_flags(verify)
    _revocations_flag(verify)
    _state_flag(verify)


def _add_keygen(sub: Any) -> None:
    keygen = sub.add_parser("keygen", help="create a publisher's Ed25519 signing key pair")
    keygen.add_argument("--publisher", required=True, metavar="ID", help="publisher id")
    keygen.add_argument(
        "--out", required=True, metavar="PREFIX", help="writes PREFIX.key and PREFIX.pub"
    )


def _add_endorse(sub: Any) -> None:
    endorse = sub.add_parser(
        "endorse", help="print a trust-file line endorsing a publisher's new key with its old one"
    )
    endorse.add_argument("new", type=Path, metavar="NEW.pub", help="the new key's .pub file")
    endorse.add_argument("--key", required=True, type=Path, metavar="OLD.key")


def _add_pack(sub: Any) -> None:
    pack = sub.add_parser("pack", help="pack a package directory into a .whpkg archive")
    pack.add_argument("directory", type=Path)
    pack.add_argument("-o", "--output", required=True, type=Path, metavar="FILE.whpkg")


def _add_sign(sub: Any) -> None:
    sign = sub.add_parser("sign", help="sign a .whpkg (replacing any signature it has)")
    sign.add_argument("package", type=Path, metavar="FILE.whpkg")
    sign.add_argument("--key", required=True, type=Path, metavar="PREFIX.key")


def _add_revoke(sub: Any) -> None:
    revoke = sub.add_parser(
        "revoke", help="add entries to a signed revocation list (a new version, re-signed)"
    )
    revoke.add_argument("list", type=Path, metavar="LIST", help="created if it does not exist")
    revoke.add_argument("--key", required=True, type=Path, metavar="PREFIX.key")
    revoke.add_argument(
        "--expires-days",
        type=whole_number,
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


def _add_install(sub: Any) -> None:
    install = sub.add_parser("install", help="copy a package into the state directory")
    install.add_argument("source", help=".whpkg (verified) or package directory")
    install.add_argument(
        "--adopt-data",
        action="store_true",
        help="give this package the grants and data a removal kept for its id, though another "
        "publisher's package held them",
    )
    _downgrade_flag(install)
    _installed_flags(install)


def _add_update(sub: Any) -> None:
    update = sub.add_parser(
        "update",
        help="update an installed extension: verify, checkpoint, start, health, switch",
    )
    update.add_argument("source", help=".whpkg (verified) or package directory")
    _downgrade_flag(update)
    _installed_flags(update)
    add_functions_flag(update)  # the new version is started: its application's functions


def _add_rollback(sub: Any) -> None:
    rollback = sub.add_parser(
        "rollback", help="return an installed extension to the version its last update replaced"
    )
    rollback.add_argument("extension")
    _installed_flags(rollback)


def _add_remove(sub: Any) -> None:
    remove = sub.add_parser("remove", help="forget an installed package")
    remove.add_argument("extension")
    remove.add_argument(
        "--purge", action="store_true", help="also delete its data, grants history and journal"
    )
    _state_flag(remove)


def _add_grants(sub: Any) -> None:
    grants = sub.add_parser("grants", help="list, grant or revoke capabilities")
    gsub = grants.add_subparsers(dest="grants_cmd", required=True, parser_class=_Parser)
    glist = gsub.add_parser("list", help="active grants and the grant epoch")
    glist.add_argument("extension")
    glist.add_argument("--json", action="store_true")
    _state_flag(glist)
    ggrant = gsub.add_parser("grant", help="grant a capability (bumps the epoch)")
    ggrant.add_argument("extension")
    ggrant.add_argument("capability")
    ggrant.add_argument("--scope", default=None, help="scope as a JSON object")
    _state_flag(ggrant)
    grevoke = gsub.add_parser("revoke", help="revoke a capability, or everything")
    grevoke.add_argument("extension")
    grevoke.add_argument("capability", nargs="?", help="omit to revoke everything (disable)")
    grevoke.add_argument("--reason", default="", help="why (shown by status)")
    _state_flag(grevoke)
    greinstate = gsub.add_parser("reinstate", help="lift a whole-extension revocation")
    greinstate.add_argument("extension")
    _state_flag(greinstate)


def _add_status(sub: Any) -> None:
    status = sub.add_parser("status", help="state, grants and remaining data of extensions")
    status.add_argument("extension", nargs="?")
    status.add_argument("--json", action="store_true")
    _state_flag(status)


def _add_doctor(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="probe which process walls (namespaces, Landlock, ...) this machine enforces"
    )
    doctor.add_argument("--json", action="store_true", help='print {"schema": 1, "walls": [...]}')


def _add_abi(sub: Any) -> None:
    abi = sub.add_parser("abi", help="list the host-function registry")
    abi.add_argument("--version", help="an ABI version such as 1.0 (default: every version)")
    abi.add_argument("--json", action="store_true")


# The built-in subcommands before wasi and bench, in the order ``wasihost --help`` lists them.
_BUILT_IN: tuple[Callable[[Any], None], ...] = (
    _add_run,
    _add_inspect,
    _add_verify,
    _add_keygen,
    _add_endorse,
    _add_pack,
    _add_sign,
    _add_revoke,
    _add_install,
    _add_update,
    _add_rollback,
    _add_remove,
    _add_grants,
    _add_status,
    _add_doctor,
)


def _state_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", type=Path, help="durable state directory (default: per-user data dir)"
    )


def _downgrade_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="install even if a higher version is installed",
    )


def _installed_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the commands that change what is installed: its state directory, and how
    what is installed is verified."""
    _state_flag(parser)
    _trust_flags(parser)
    _ssh_flags(parser)
    _revocations_flag(parser)


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
