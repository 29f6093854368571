"""The commands that run or describe code: ``run``, ``inspect``, ``abi``, and the entry points
of ``wasi`` and ``bench`` (whose code is in :mod:`wasihost.cli.wasi_command` and
:mod:`wasihost.cli.bench_command`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..core import cbor_json
from ..core.errors import CallError, ConfigError
from ..core.registry import AbiVersion, OpenCapabilities
from ..core.terminal import printable
from ..host.defaults import default_registry
from ..host.policy import Policy
from ..packaging.package import Package, is_archive, load_package
from .common import EXIT_FAILURE, UsageError, budget_hint, check_budget_flags
from .options import (
    _host,
    _input_value,
    _revocations,
    _ssh,
    _state_dir,
    _state_host,
    _trust,
)


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


def _not_shadowing(args: argparse.Namespace) -> None:
    """``run NAME --state-dir D`` where NAME is both a path here and an extension installed in
    D: running the path would run whatever a file or directory of that name in the current
    directory holds, under the CLI's grants, instead of the installed, verified extension."""
    from ..core.manifest import check_extension_id
    from ..store.state import StateStore

    try:
        check_extension_id(args.source)
    except ConfigError:
        return  # no extension has that id (a file name that is not UTF-8, say): the path runs
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


def _is_path_here(name: str) -> bool:
    """Whether ``name`` is a file or directory here; a name the system cannot look up (longer
    than a file name may be) is none, and was an internal error (exit 70)."""
    try:
        return Path(name).exists()
    except OSError:
        return False


def _cmd_run(args: argparse.Namespace) -> int:
    value = _input_value(args)
    check_budget_flags(args)
    # An installed extension's id never holds a '/' nor ends like a file: such a source is a
    # path, and one that does not exist is reported as a missing file, not a missing install.
    installed = (
        not is_archive(args.source)
        and "/" not in args.source
        and not args.source.endswith(".wasm")
        and not _is_path_here(args.source)
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
        # Read open to application capabilities: with their functions (--functions) the
        # host serves them; without, admission says that they need them.
        package = load_package(
            args.source, OpenCapabilities(default_registry().capabilities()), _trust(args), ssh
        )
        host = _host(_cli_policy(package, args.grant, args), args)
    try:
        if package is None:
            ext = host.load_installed(
                args.source, fuel=args.fuel, timeout_ms=args.timeout_ms, runtime=args.runtime
            )
        else:
            ext = host.admit(
                package,
                grants=args.grant,
                fuel=args.fuel,
                timeout_ms=args.timeout_ms,
                runtime=args.runtime,
            )
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
            resources = ext.resources
            exc.hint = (
                budget_hint(exc.failure, resources.fuel_per_call, resources.timeout_ms) or exc.hint
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
    from ..host.inspect import inspect_package, render_text
    from ..packaging.revocation import MemoryFloor

    registry = default_registry()
    package = load_package(
        args.source,
        OpenCapabilities(registry.capabilities()),  # inspect runs nothing of the guest
        _trust(args),
        _ssh(args, args.source),
    )
    revocations = _revocations(args)
    if revocations is not None:
        revocations.check(package, revocations.floor or MemoryFloor())
    policy = _cli_policy(package, args.grant, args)
    report = inspect_package(package, registry, policy, args.grant, args.runtime)
    if args.json:
        print(cbor_json.dumps(report, indent=2))
    else:
        print(render_text(report))  # every field escaped by render_text
    return 0 if report["admission"]["admitted"] else EXIT_FAILURE


def _cmd_abi(args: argparse.Namespace) -> int:
    from ..host.inspect import abi_listing, render_abi_text

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


def _cmd_wasi(args: argparse.Namespace) -> int:
    from . import wasi_command as wasi_cli

    return wasi_cli.run(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import bench_command as bench_cli

    return bench_cli.run(args)
