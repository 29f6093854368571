"""The hint printed under a refusal: what to type to lift it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import (
    AdmissionError,
    ConfigError,
    PackageError,
    UnsignedPackageError,
    UntrustedKeyError,
    WasihostError,
)
from .options import _state_dir, _state_flag


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
    if isinstance(exc, AdmissionError) and exc.unserved and args is not None:
        if args.cmd in ("run", "wasi", "update"):
            return (
                "these are served by the application that embeds wasihost: give its functions "
                "with --functions MODULE:ATTR (a function that registers them on the Host it "
                "is given; docs/host-functions.md)"
            )
        return None
    if isinstance(exc, AdmissionError) and exc.unrequested and not exc.ungranted:
        names = ", ".join(exc.unrequested)
        return (
            f"the module imports functions of {names}, which its extension.toml does not "
            f"request: add {names} to [capabilities] optional there (and to the guest's "
            "features, guest-sdk/README.md), then grant it; or build the guest without them"
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
