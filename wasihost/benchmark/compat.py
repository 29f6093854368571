"""The compatibility matrix: every guest x every ABI view the host serves x runtime class.

The host serves every minor of every major it knows (1.0, 1.1 and 2.0) from one registry, all
at once. A view V covers a guest declaring the same major and a minor not newer than V's: for
those cells the verdict is the real one, ``Host.admit`` (which links the guest at its declared
version, a subset of V, minors being additive), then a start (instantiate + handshake), then,
for a guest with a ``noop`` command, its per-call cost. Other cells are refused with the reason:
a guest of another major (its imports are another import module: ABI majors do not mix), or one
declaring a newer minor than V, naming every import V lacks.

Each row has a ``reason_class`` a test can pin (timings and texts aside): None (ran),
``wasi-command`` / ``start-failed`` (linked), ``other-major`` / ``newer-minor`` /
``admission`` / ``package`` (refused); each cell twice, in-process and out-of-process (each
instance in a walled child, docs/process-runtime.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import attrs

from .guests import V2_LOG_SIGNATURE, abi_guest_wat
from .hosts import bench_policy
from .runner import Budget, interleave, median, spread

RUNTIME_CLASSES = ("in-process", "out-of-process")
# Each runtime class and the mode a guest is admitted under for it (docs/process-runtime.md).
RUNTIMES = (("in-process", "in-process"), ("out-of-process", "process-only"))


@attrs.frozen
class Guest:
    name: str
    source: str  # a fixture directory, or "built at run time"
    package: Any  # wasihost.packaging.package.Package, None when it could not be loaded
    commands: frozenset[str]
    load_error: str | None = None
    grants: tuple[str, ...] = ()


def _fixture_guests(fixtures: Path, capabilities: frozenset[str]) -> list[Guest]:
    from ..core.errors import WasihostError
    from ..packaging.package import Package, load_package

    guests = []
    for directory in sorted(p for p in fixtures.iterdir() if p.is_dir()):
        modules = sorted(directory.glob("*.wasm"))
        if not modules:
            # A source-only directory (a shared crate), or a native plugin (an executable,
            # runtime "native-process", with one ABI and no view to vary): not a Wasm guest.
            continue
        if (directory / "extension.toml").is_file():
            try:
                package = load_package(directory, capabilities)
            except WasihostError as exc:
                error = f"refused before admission: {exc.error_class}: {exc.message}"
                guests.append(Guest(directory.name, str(directory), None, frozenset(), error))
                continue
            manifest = package.manifest
            commands = (
                frozenset(c.name for c in manifest.commands)
                if manifest is not None
                else frozenset()
            )
        else:
            wasm = modules[0].read_bytes()
            package = Package(str(modules[0]), None, wasm, hashlib.sha256(wasm).hexdigest())
            commands = frozenset()
        guests.append(Guest(directory.name, str(directory), package, commands))
    return guests


def _wat_guests(registry: Any) -> list[Guest]:
    """Guests built at run time for the edges fixtures do not cover."""
    from ..engine.benchraw import wat_to_wasm
    from ..packaging.package import Package

    newer = next(f for f in registry.functions() if str(f.since) != "1.0")
    wat = {
        "wat-1.0-noop": abi_guest_wat("1.0"),
        f"wat-1.1-imports-{newer.name}": abi_guest_wat(
            "1.1", imports=((newer.module, newer.name),)
        ),
        f"wat-1.0-imports-{newer.name}": abi_guest_wat(
            "1.0", imports=((newer.module, newer.name),)
        ),
        "wat-2.0-noop": abi_guest_wat("2.0"),
        # ABI 2.0's one breaking change, and the import that must never cross majors.
        "wat-2.0-imports-log": abi_guest_wat(
            "2.0", imports=(("wasihost_v2", "log"),), signature=V2_LOG_SIGNATURE
        ),
        "wat-2.0-imports-wasihost_v1": abi_guest_wat("2.0", imports=(("wasihost_v1", "log"),)),
    }
    guests = []
    for name, text in wat.items():
        wasm = wat_to_wasm(text)
        package = Package(f"{name}.wasm", None, wasm, hashlib.sha256(wasm).hexdigest())
        grants = (
            (("log",) if name.endswith(("-log", "wasihost_v1")) else (newer.capability,))
            if "imports" in name
            else ()
        )
        guests.append(Guest(name, "built at run time", package, frozenset({"noop"}), grants=grants))
    return guests


def served_views(registry: Any) -> list[Any]:
    from ..core.registry import AbiVersion

    return [
        AbiVersion(latest.major, minor)
        for latest in registry.versions
        for minor in range(latest.minor + 1)
    ]


def _declared(package: Any) -> Any:
    """The ABI version the module's marker declares, None for a plain profile command."""
    from ..core.admission import command_profile, declared_version
    from ..core.errors import AdmissionError
    from ..core.wasmbin import read_header
    from ..host.defaults import default_registry

    header = read_header(package.wasm)
    if command_profile(header, default_registry()) is not None:
        return None, header
    try:
        return declared_version(header), header
    except AdmissionError:
        return None, header


def _beyond(view: Any, declared: Any, header: Any, registry: Any) -> list[str]:
    """Why the ``view`` does not link a guest declaring ``declared``."""
    if declared.major != view.major:
        return [
            f"module declares ABI {declared}; the {view} view serves major {view.major} "
            f"(imports from wasihost_v{view.major}) only: majors do not mix"
        ]
    problems = [f"module declares ABI {declared}; the {view} view serves {view.major}.0 to {view}"]
    if declared.major == view.major:
        lacking = registry.view(view)
        problems += [
            f"import {i.module}.{i.name}: not in ABI {view} (added later)"
            for i in header.imports
            if i.kind == "func" and lacking.lookup(i.module, i.name) is None
        ]
    return problems


class _Verdict:
    def __init__(
        self,
        verdict: str,
        reason: str | None,
        cost: dict[str, Any] | None = None,
        reason_class: str | None = None,
    ) -> None:
        self.verdict, self.reason, self.cost = verdict, reason, cost
        self.reason_class = reason_class


def _admit_and_run(host: Any, guest: Guest, budget: Budget, runtime: str) -> _Verdict:
    from ..core.errors import AdmissionError, WasihostError

    required = guest.package.manifest.required if guest.package.manifest else frozenset()
    try:
        ext = host.admit(
            guest.package, grants=sorted({*required, *guest.grants}), runtime=runtime
        )
    except AdmissionError as exc:
        return _Verdict("refused", "; ".join(exc.problems), reason_class="admission")
    try:
        if ext.plan.is_command:
            return _Verdict(
                "linked",
                "a WASI command (_start): run it with `wasihost wasi`",
                reason_class="wasi-command",
            )
        try:
            ext.start()
        except WasihostError as exc:
            return _Verdict(
                "linked",
                f"did not start here: {exc.error_class}: {exc.message}",
                reason_class="start-failed",
            )
        if "noop" not in guest.commands:
            return _Verdict("ran", "started (instantiate + handshake); no no-op command to time")
        samples = interleave({"noop": lambda: ext.call("noop")}, budget)["noop"]
        cost = {
            "median_us": round(median(samples), 3),
            "spread": round(spread(samples), 3),
            "runs": len(samples),
        }
        return _Verdict("ran", None, cost)
    finally:
        ext.close()


def matrix(fixtures: Path, budget: Budget) -> list[dict[str, Any]]:
    from ..host.defaults import default_registry
    from ..host.runtime import Host

    registry = default_registry()
    host = Host(bench_policy(registry.capabilities()))
    rows: list[dict[str, Any]] = []
    try:
        guests = _fixture_guests(fixtures, host.registry.capabilities()) + _wat_guests(registry)
        views = served_views(registry)
        for guest in guests:
            if guest.package is None:
                declared, header = None, None
            else:
                declared, header = _declared(guest.package)
            real: dict[str, _Verdict] = {}
            for view in views:
                covered = declared is None or (
                    declared.major == view.major and declared.minor <= view.minor
                )
                base = {
                    "guest": guest.name,
                    "source": guest.source,
                    "declares": str(declared) if declared else None,
                    "view": str(view),
                }
                for runtime_class, mode in RUNTIMES:
                    if guest.load_error is not None:
                        verdict = _Verdict("refused", guest.load_error, reason_class="package")
                    elif covered:
                        if mode not in real:
                            real[mode] = _admit_and_run(host, guest, budget, mode)
                        verdict = real[mode]
                    else:
                        assert declared is not None  # a guest declaring nothing is covered
                        verdict = _Verdict(
                            "refused",
                            "; ".join(_beyond(view, declared, header, registry)),
                            reason_class="other-major"
                            if declared.major != view.major
                            else "newer-minor",
                        )
                    rows.append(
                        base
                        | {
                            "runtime": runtime_class,
                            "verdict": verdict.verdict,
                            "reason": verdict.reason,
                            "reason_class": verdict.reason_class,
                            "call_cost": verdict.cost,
                        }
                    )
    finally:
        host.close()
    return rows
