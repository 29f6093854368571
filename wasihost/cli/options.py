"""Readers of the options several commands share: the trust file, the revocation list, an
OpenSSH signature, the brokers, the state directory and the hosts made from them, and the
command input (``--input``, ``--input-file``, ``--input-bytes``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import cbor_json
from ..core.errors import ConfigError
from ..host.policy import Policy
from ..packaging.package import is_archive
from .common import MAX_CLI_INPUT_BYTES, UsageError
from .input_files import read_file_or_stdin

if TYPE_CHECKING:
    from ..host.runtime import Host
    from ..packaging.allowed_signers import SshSigned
    from ..packaging.revocation import Revocations
    from ..packaging.trust import TrustStore


def _revocations(args: argparse.Namespace) -> Revocations | None:
    """The ``--revocations`` list, checked against the ``--trust`` file's revocation keys."""
    path = getattr(args, "revocations", None)
    if path is None:
        return None
    from ..packaging.revocation import Revocations, StateDirFloor
    from ..packaging.trust import TrustStore

    if getattr(args, "trust", None) is None:
        raise UsageError(
            "--revocations needs --trust TRUSTFILE (the file marks the keys that sign the list)"
        )
    trust = TrustStore.from_file(args.trust)
    # With an explicit --state-dir, the highest version seen outlives this command.
    state_dir = getattr(args, "state_dir", None)
    floor = StateDirFloor(state_dir) if state_dir is not None else None
    return Revocations(path, trust, floor=floor)


def _ssh(args: argparse.Namespace, source: str | Path) -> SshSigned | None:
    """The ``--allowed-signers`` / ``--ssh-sig`` verification asked for, if any."""
    if getattr(args, "allowed_signers", None) is None:
        if getattr(args, "ssh_sig", None) is not None:
            raise UsageError("--ssh-sig needs --allowed-signers FILE")
        return None
    from ..packaging.allowed_signers import AllowedSigners, SshSigned, read_ssh_signature

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
        from ..packaging.trust import TrustStore

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
    from ..brokers.secrets import SecretsBroker
    from ..store.secrets import FileSecretStore

    return [SecretsBroker(FileSecretStore(directory))]


def _host(policy: Policy, args: argparse.Namespace) -> Host:
    from ..host.runtime import Host, default_cache_dir

    if getattr(args, "no_cache", False):
        cache: Path | None = None
    else:
        cache = getattr(args, "cache_dir", None) or default_cache_dir()
    host = Host(policy, cache_dir=cache, brokers=_brokers(args))
    return with_application_functions(host, args, widen_policy=False)


FUNCTIONS_FORM = (
    "--functions takes MODULE:ATTR, a function of an importable module (the current directory "
    "is searched first) that registers the application's functions on the Host it is given "
    "(docs/host-functions.md)"
)


def _application_register(spec: str) -> Any:
    """The ``register(host)`` function ``--functions MODULE:ATTR`` names, imported."""
    import importlib
    import os
    import sys

    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise UsageError(f"{FUNCTIONS_FORM}; got {spec[:200]!r}")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)  # as `python -m` finds the caller's own modules
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--functions: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the application's module failed: its error, named, no traceback
        raise ConfigError(
            f"--functions: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise UsageError(f"--functions: {module_name} has no function {attr!r}; {FUNCTIONS_FORM}")
    return found


def _registering(spec: str) -> Any:
    """``register(host)`` of ``--functions MODULE:ATTR``, with its failures as errors that
    name it (the application's code: never a traceback)."""
    register = _application_register(spec)

    def registering(host: Host) -> None:
        try:
            register(host)
        except Exception as exc:
            raise ConfigError(
                f"--functions {spec}: registering the application's functions raised "
                f"{type(exc).__name__}: {exc}"
            ) from None

    return registering


def with_application_functions(host: Host, args: argparse.Namespace, *, widen_policy: bool) -> Host:
    """``host`` with the application's functions of ``--functions`` registered
    (host/packages.py, register_functions)."""
    from ..host.packages import register_functions

    spec = getattr(args, "functions", None)
    if spec is None:
        return host
    try:
        register = _registering(spec)
    except BaseException:
        host.close()
        raise
    return register_functions(host, register, widen_policy=widen_policy)


def _state_dir(args: argparse.Namespace) -> Path:
    from ..store.state import default_state_dir

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
    """A host on the durable state, as the packaging API makes one (host/packages.py): the
    grant table decides; the policy allows every capability the registry knows (and the
    application's, with ``--functions``), so that it caps nothing the operator granted."""
    from ..host.packages import state_host
    from ..packaging.allowed_signers import AllowedSigners

    allowed = getattr(args, "allowed_signers", None)
    spec = getattr(args, "functions", None)
    return state_host(
        _state_dir(args),
        trust=_trust(args),
        allowed_signers=AllowedSigners.from_file(allowed) if allowed is not None else None,
        require_signed=bool(getattr(args, "require_signed", False)),
        revocations=_revocations(args),
        functions=_registering(spec) if spec is not None else None,
        brokers=_brokers(args),
    )


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


def _state_flag(args: argparse.Namespace) -> str:
    """The ``--state-dir`` to repeat in a suggested command, when the user gave one."""
    state_dir = getattr(args, "state_dir", None)
    return f" --state-dir {state_dir}" if state_dir is not None else ""
