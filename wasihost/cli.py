"""The ``wasihost`` command line: run, inspect, abi.

Every failure ends as one line ``error: <class>: <message>`` on stderr and a non-zero exit
status; a traceback is a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import WasihostError
from .package import Package, load_package
from .policy import Policy
from .registry import AbiVersion, default_registry

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits EX_SOFTWARE: a bug in wasihost, not in the guest or the input
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad command-line arguments."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def to_json_value(value: Any) -> Any:
    """CBOR values to JSON: byte strings become ``{"$bytes": hex}`` (as in abi/vectors)."""
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, list):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="wasihost", description="Run untrusted WebAssembly extensions safely.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one command of a package or module")
    run.add_argument("source", help="package directory or .wasm module")
    run.add_argument("command", help="command name")
    run.add_argument("--input", default="null", help="command input as JSON (default: null)")
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
    run.add_argument("--cache-dir", type=Path, help="compiled-module cache directory")
    run.add_argument("--no-cache", action="store_true", help="do not use the on-disk cache")

    inspect = sub.add_parser("inspect", help="show imports, exports and the admission verdict")
    inspect.add_argument("source", help="package directory or .wasm module")
    inspect.add_argument("--grant", action="append", default=[], metavar="CAP")
    inspect.add_argument("--json", action="store_true")

    abi = sub.add_parser("abi", help="list the host-function registry")
    abi.add_argument("--version", help="an ABI version such as 1.0 (default: every version)")
    abi.add_argument("--json", action="store_true")
    return p


def _cli_policy(package: Package, grants: Sequence[str]) -> Policy:
    """The CLI grants what the manifest requires, plus each ``--grant``; nothing else."""
    required = package.manifest.required if package.manifest is not None else frozenset()
    return Policy(allow=frozenset(required) | frozenset(grants))


def _host(policy: Policy, args: argparse.Namespace) -> Any:
    from .runtime import Host, default_cache_dir

    if getattr(args, "no_cache", False):
        cache: Path | None = None
    else:
        cache = getattr(args, "cache_dir", None) or default_cache_dir()
    return Host(policy, cache_dir=cache)


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        value = json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--input is not valid JSON: {exc.msg} at column {exc.colno}") from None
    registry = default_registry()
    package = load_package(args.source, registry.capabilities())
    host = _host(_cli_policy(package, args.grant), args)
    try:
        ext = host.admit(
            package,
            grants=args.grant,
            fuel=args.fuel,
            timeout_ms=args.timeout_ms,
        )
        try:
            output = ext.call(args.command, value)
        finally:
            records = ext.log.drain()
            if not args.json:
                for r in records:
                    print(f"[{ext.id}] {r.level.name.lower()}: {r.message}", file=sys.stderr)
        if args.json:
            doc = {
                "output": to_json_value(output),
                "fuel_used": ext.last_fuel_used,
                "logs": [r.to_json() for r in records],
            }
            print(json.dumps(doc))
        else:
            print(json.dumps(to_json_value(output)))
        ext.close()
    finally:
        host.close()
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect_package, render_text

    registry = default_registry()
    package = load_package(args.source, registry.capabilities())
    report = inspect_package(package, registry, _cli_policy(package, args.grant), args.grant)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report))
    return 0 if report["admission"]["admitted"] else EXIT_FAILURE


def _cmd_abi(args: argparse.Namespace) -> int:
    registry = default_registry()
    if args.version is not None:
        try:
            version = AbiVersion.parse(args.version)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        entries = list(registry.functions(version))
        versions = [str(version)]
    else:
        entries = list(registry.functions())
        versions = [str(v) for v in registry.versions]
    if args.json:
        print(
            json.dumps(
                {"versions": versions, "functions": [e.to_json() for e in entries]}, indent=2
            )
        )
        return 0
    print(f"ABI versions: {', '.join(versions)}")
    for e in entries:
        print(
            f"{e.qualified_name} {e.signature}  capability={e.capability} since={e.since} "
            f"request<={e.max_request_bytes}B response<={e.max_response_bytes}B "
            f"fuel={e.fuel_base}+{e.fuel_per_byte}/B"
        )
        if e.doc:
            print(f"    {e.doc}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        handler = {"run": _cmd_run, "inspect": _cmd_inspect, "abi": _cmd_abi}[args.cmd]
        return handler(args)
    except UsageError as exc:
        print(f"error: usage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WasihostError as exc:
        print(f"error: {exc.error_class}: {exc.message}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        print(f"error: internal: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
