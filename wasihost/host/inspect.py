"""``wasihost inspect``: what a module imports and exports, whether it would be admitted, and
which protections are enforced by the host versus merely declared by the package.

Nothing is compiled or run: the report comes from the module's bytes, the manifest, the
registry and the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.admission import command_profile, declared_namespaces, declared_version
from ..core.codeshape import scan_module
from ..core.errors import AdmissionError, WasihostError
from ..core.registry import AbiVersion, OpenCapabilities, Registry, module_namespace
from ..core.terminal import printable
from ..core.wasmbin import WasmFormatError, read_header
from ..packaging.package import Package
from .planning import is_native, plan_package, resolve_runtime
from .policy import IN_PROCESS, Policy

if TYPE_CHECKING:
    from ..core.admission import AdmissionPlan
    from ..core.grants import Grant
    from ..core.manifest import Resources
    from ..core.registry import HostFunction, RegistryView
    from ..core.wasmbin import ImportEntry, ModuleHeader


def inspect_package(
    package: Package,
    registry: Registry,
    policy: Policy,
    grants: Sequence[str],
    runtime: str | None = None,
) -> dict[str, Any]:
    """What admission would say of ``package``, and which of its protections the host
    enforces. For the process runtime (``runtime``, else the policy's and the manifest's
    choice), the walls are those a probe child gets on this machine (``wasihost doctor``)."""
    report: dict[str, Any] = {
        "source": package.source,
        "sha256": package.sha256,
        "size": len(package.wasm),
        "manifest": _manifest_report(package),
        "signature": _signature_report(package),
    }
    if is_native(package):
        return _inspect_native(package, registry, policy, grants, runtime, report)
    try:
        header = read_header(package.wasm)
    except WasmFormatError as exc:
        report["admission"] = {"admitted": False, "problems": [f"not a valid module: {exc}"]}
        return report
    view = _abi_report(header, registry, report)
    report["imports"] = [_import_row(imp, view) for imp in header.imports]
    report["exports"] = [
        {"name": e.name, "kind": e.kind, "type": str(e.func_type) if e.func_type else None}
        for e in header.exports
    ]
    try:
        report["runtime"] = resolve_runtime(package, runtime, policy)
        if report["runtime"] != IN_PROCESS:
            from ..engine.walls import probe_walls

            report["walls"] = [w.as_json() for w in probe_walls()]
        manifest = package.manifest
        requested = manifest.required | manifest.optional if manifest is not None else ()
        # An application's capabilities: its host serves and checks them, not this one.
        unchecked = frozenset(OpenCapabilities(registry.capabilities()).unchecked(requested))
        namespaces = {c.split(".", 1)[0] for c in unchecked}
        for row in report["imports"]:
            if row["entry"] is None and module_namespace(row["module"]) in namespaces:
                row["application"] = True
        plan, grant, resources = plan_package(
            package, registry, policy, grants=grants if grants else None, unchecked=unchecked
        )
        # The compile budget's static half: a module over a shape limit would be refused at
        # load, so inspect says so now (nothing is compiled).
        scan_module(header, package.wasm)
    except WasihostError as exc:
        problems = list(exc.problems) if isinstance(exc, AdmissionError) else [exc.message]
        report["admission"] = {"admitted": False, "problems": problems}
        return report
    report["admission"] = {
        "admitted": True,
        "abi": str(plan.version) if plan.version is not None else plan.view.label,
        "granted": sorted(grant.capabilities),
        "runtime": report["runtime"],
        "not_checked_here": sorted(unchecked),
    }
    report["enforced"], report["declared"] = _protections(package, plan, grant, resources)
    _runtime_protections(report)
    return report


def _inspect_native(
    package: Package,
    registry: Registry,
    policy: Policy,
    grants: Sequence[str],
    runtime: str | None,
    report: dict[str, Any],
) -> dict[str, Any]:
    """inspect_package of a native plugin: its executable's header in place of a module's
    imports and exports, the registry entries it is offered, and what is enforced for
    machine code (docs/native.md)."""
    import platform

    from ..core.elfbin import ElfFormatError, read_elf_header

    try:
        header = read_elf_header(package.wasm)
        report["native"] = {
            "machine": header.machine,
            "kind": header.kind,
            "interpreter": header.interpreter,
        }
    except ElfFormatError as exc:
        report["native"] = {"problem": str(exc)}
    manifest = package.manifest
    assert manifest is not None
    report["abi"] = manifest.abi
    report["exports"] = []
    try:
        report["runtime"] = resolve_runtime(package, runtime, policy)
        from ..engine.walls import probe_walls

        report["walls"] = [w.as_json() for w in probe_walls()]
        plan, grant, resources = plan_package(
            package, registry, policy, grants=grants if grants else None
        )
    except WasihostError as exc:
        problems = list(exc.problems) if isinstance(exc, AdmissionError) else [exc.message]
        report["admission"] = {"admitted": False, "problems": problems}
        return report
    report["imports"] = [
        {"module": e.module, "name": e.name, "kind": "func", "type": e.signature}
        | {"entry": _entry(e)}
        for e in plan.imports
    ]
    report["admission"] = {
        "admitted": True,
        "abi": manifest.abi,
        "granted": sorted(grant.capabilities),
        "runtime": f"{report['runtime']} (native plugin on {platform.machine()})",
    }
    report["enforced"], report["declared"] = _protections(
        package, plan, grant, resources, native=True
    )
    _runtime_protections(report, native=True)
    return report


def _runtime_protections(report: dict[str, Any], native: bool = False) -> None:
    """The process runtime's rows: the second wall, and each OS wall as this machine gives
    it (enforced, or declared only with the reason it is not)."""
    walls = report.get("walls")
    if walls is None:
        return
    report["enforced"].append(
        "a second wall: each instance runs in its own child process; its host calls are "
        "served by this host (grants, quotas and state never enter the child); the deadline "
        "is the host's kill of the child's process group; a dead child fails its call "
        "native_process_exit"
    )
    for wall in walls:
        if wall["state"] == "enforced" and native and wall["name"] in _NATIVE_WALLS:
            report["enforced"].append(f"process wall {wall['name']}: {_NATIVE_WALLS[wall['name']]}")
        elif wall["state"] == "enforced" and wall["name"] == "rlimits":
            # The probe's values are its own; say what each child of this runtime gets.
            report["enforced"].append(
                "process wall rlimits: address space = the guest memory's reservation + 2 GiB, "
                "3600 CPU seconds in all, 64 open files, file size 0, core dumps 0"
            )
        elif wall["state"] == "enforced":
            report["enforced"].append(f"process wall {wall['name']}: {wall['detail']}")
        else:
            report["declared"].append(
                f"process wall {wall['name']}: not on this machine ({wall['detail']})"
            )


# What the launcher's walls are for a native plugin, where they differ from the probe's.
_NATIVE_WALLS = {
    "rlimits": "address space as above, 3600 CPU seconds in all, 64 open files, file size 0, "
    "core dumps 0",
    "landlock": "executes only the dynamic loader; reads only the library cache and the C "
    "library; writes nothing",
    "seccomp": "the allow-list of every child, plus replacing its own program (the launcher's "
    "exec of the plugin); no socket, no new process, default EPERM",
}


def _signature_report(package: Package) -> dict[str, Any] | None:
    """Who signed the package and how it was verified; None when it is not signed."""
    if package.signer is None:
        return None
    return {
        "publisher": package.signer,
        "package_sha256": package.package_digest,
        "verified": True,
        "verified_by": package.verified_by or "an Ed25519 key of the trust file",
    }


def _manifest_report(package: Package) -> dict[str, Any] | None:
    """What the manifest declares; None for a bare module."""
    manifest = package.manifest
    if manifest is None:
        return None
    return {
        "id": manifest.id,
        "version": manifest.version,
        "publisher": manifest.publisher,
        "abi": manifest.abi,
        "required": sorted(manifest.required),
        "optional": sorted(manifest.optional),
        "commands": {c.name: c.description for c in manifest.commands},
        "events": (
            {
                "classes": list(manifest.events.classes),
                "command": manifest.events.command,
                "on_overflow": manifest.events.on_overflow,
                "queue_depth": manifest.events.queue_depth,
            }
            if manifest.events is not None
            else None
        ),
        "identity": "enforced" if package.signer is not None else "declared",
    }


def _abi_report(
    header: ModuleHeader, registry: Registry, report: dict[str, Any]
) -> RegistryView | None:
    """Put the module's ABI (and the view's features) in ``report``; the registry view its
    imports are looked up in, None when there is none."""
    profile = command_profile(header, registry)
    view = None
    if profile is not None:
        report["abi"] = f"none: a plain {profile.name} command"
        view = registry.profile_view(profile)
    else:
        try:
            version = declared_version(header)
            report["abi"] = str(version)
            namespaces, _ = declared_namespaces(header, registry)
            view = registry.view(version, namespaces) if registry.supports(version) else None
            if view is not None:
                report["features"] = list(view.features)
        except AdmissionError:
            report["abi"] = None
    return view


def _import_row(imp: ImportEntry, view: RegistryView | None) -> dict[str, Any]:
    """One import, with the registry entry that serves it (None when none does)."""
    row: dict[str, Any] = {
        "module": imp.module,
        "name": imp.name,
        "kind": imp.kind,
        "type": str(imp.func_type) if imp.func_type else None,
        "entry": None,
    }
    entry = view.lookup(imp.module, imp.name) if view is not None else None
    if entry is not None:
        row["entry"] = _entry(entry)
    return row


def _entry(entry: HostFunction) -> dict[str, Any]:
    """A registry entry's limits and prices, as an import's row shows them."""
    shown: dict[str, Any] = {
        "capability": entry.capability,
        "max_request_bytes": entry.max_request_bytes,
        "max_response_bytes": entry.max_response_bytes,
        "fuel_base": entry.fuel_base,
        "fuel_per_byte": entry.fuel_per_byte,
    }
    if entry.convention != "cbor":  # as the registry's JSON says it
        shown["convention"] = entry.convention
    return shown


def _protections(
    package: Package,
    plan: AdmissionPlan,
    grant: Grant,
    resources: Resources,
    native: bool = False,
) -> tuple[list[str], list[str]]:
    """What the host enforces for an admitted package, and what the package merely declares.
    A ``native`` plugin has no Wasm sandbox: its process is its only wall, and the rows of
    the sandbox (isolation, pointer checks, fuel, epoch deadline, linear memory) give way to
    what the host enforces for machine code."""
    manifest = package.manifest
    enforced = []
    if not native:
        enforced.append(
            "wasm isolation: the guest reaches the host only through the imports listed above"
        )
    enforced += [
        f"imports limited to the registry view of {plan.view.label} and the granted capabilities",
        "capability checked again on every host call; payload limits per registry entry",
    ]
    if not native:
        enforced += [
            "guest pointers and lengths bounds-checked before every host read or write",
            f"fuel: {resources.fuel_per_call} per call, host calls charged",
            f"wall-clock deadline: {resources.timeout_ms} ms per call (epoch interruption)",
            f"linear memory: at most {resources.max_memory_bytes} bytes; "
            f"tables: at most {resources.max_table_elements} elements",
        ]
    enforced.append(
        f"command input <= {resources.max_input_bytes} B, output <= "
        f"{resources.max_output_bytes} B, log <= {resources.max_log_bytes} B"
    )
    if "storage" in grant.capabilities:
        enforced.append(
            f"storage: the extension's own namespace, at most {resources.storage_max_bytes} B "
            f"in {resources.storage_max_objects} keys (a grant scope may lower both)"
        )
    declared = [
        "command descriptions and optional capabilities the guest may or may not use",
    ]
    events = manifest.events if manifest is not None else None
    if events is not None and "events" in grant.capabilities:
        enforced.append(
            f"events: subscriptions only within {', '.join(events.classes)} (and the grant's "
            f"scope); each queue <= {events.queue_depth} events, '{events.on_overflow}' when "
            f"full; delivered through {events.command} under the per-call budget"
        )
    if package.signer is not None and manifest is not None:
        enforced.insert(
            0,
            f"extension id {manifest.id}, version {manifest.version} and publisher "
            f"{package.signer}: verified by "
            + (
                f"{package.verified_by} over the archive file"
                if package.verified_by
                else f"a trusted Ed25519 key of {package.signer} over the package digest "
                f"{package.package_digest}"
            )
            + ", which covers every file",
        )
    else:
        declared.insert(
            0,
            "extension id, version and publisher: taken from the manifest, not verified "
            "(only a signed .whpkg checked against a trust store is verified)",
        )
    if native:
        enforced += [
            f"host calls priced by the host: {resources.fuel_per_call} fuel per call, each "
            "host call charged before it runs",
            f"wall-clock deadline: {resources.timeout_ms} ms per call (the host kills the "
            "plugin's process group)",
            f"address space: {resources.max_memory_bytes} bytes + 256 MiB for the executable, "
            "the C library and the stacks (RLIMIT_AS); CPU time measured and charged to budgets",
        ]
        declared += [
            "no fuel metering of the plugin's own code: its computing is bounded by the "
            "deadline and charged by the CPU time the host measures, not counted instruction "
            "by instruction",
            "no sandbox inside the process: the plugin is machine code, confined by the "
            "process walls alone (a wall unavailable here is not replaced by anything)",
        ]
    return enforced, declared


def render_text(report: dict[str, Any]) -> str:
    """The report as lines for a terminal. Names and texts come from the package (the
    manifest, the module's imports, exports and sections), so each is escaped where it is put
    in a line: a name holding a line break or an escape sequence cannot forge a line."""
    s = printable
    lines = [f"source:  {s(report['source'])}", f"sha256:  {report['sha256']}"]
    if report.get("manifest"):
        m = report["manifest"]
        lines.append(f"manifest: {s(m['id'])} {s(m['version'])} (abi {s(m['abi'])})")
    if report.get("signature"):
        sig = report["signature"]
        lines.append(
            f"signed:  by {s(sig['publisher'])} (verified; package {sig['package_sha256']})"
        )
    lines.append(f"abi:     {s(report.get('abi') or 'none declared')}")
    if "features" in report:
        lines.append(f"features: {s(', '.join(report['features'])) or '(none)'}")
    lines.append("imports:")
    for imp in report.get("imports", []):
        entry = imp["entry"]
        desc = (
            f"capability={entry['capability']} request<={entry['max_request_bytes']}B "
            f"response<={entry['max_response_bytes']}B "
            f"fuel={entry['fuel_base']}+{entry['fuel_per_byte']}/B"
            if entry
            else "application function: not checked here"
            if imp.get("application")
            else "NOT A REGISTRY ENTRY"
        )
        lines.append(f"  {s(imp['module'])}.{s(imp['name'])} {imp['type'] or imp['kind']}  {desc}")
    lines.append("exports:")
    for exp in report.get("exports", []):
        lines.append(f"  {s(exp['name'])} {exp['type'] or exp['kind']}")
    adm = report["admission"]
    if adm["admitted"]:
        lines.append(f"admission: admitted (granted: {s(', '.join(adm['granted'])) or 'nothing'})")
        if adm.get("not_checked_here"):
            lines.append(
                f"  not checked here: {s(', '.join(adm['not_checked_here']))}: application "
                "capabilities; the application's host checks them, and its imports of them, "
                "when it loads the extension"
            )
        lines.append(f"runtime: {adm['runtime']}")
        lines.append("enforced by the host:")
        lines += [f"  - {s(e)}" for e in report["enforced"]]
        lines.append("declared only (not enforced):")
        lines += [f"  - {s(d)}" for d in report["declared"]]
    else:
        lines.append("admission: REFUSED")
        lines += [f"  - {s(p)}" for p in adm["problems"]]
    return "\n".join(lines)


def abi_listing(registry: Registry, version: AbiVersion | None = None) -> dict[str, Any]:
    """What ``wasihost abi --json`` prints for ``registry``: its ABI versions, its embedder
    namespaces and their versions, and every entry (an embedding application passes its own
    host's registry to list its functions too). With ``version``, that view of the core ABI
    only."""
    if version is not None:
        entries = list(registry.functions(version))
        versions = [str(version)]
    else:
        entries = list(registry.functions())
        versions = [str(v) for v in registry.versions]
    # Every view served (each minor of each major), with the feature flags its handshake
    # offers: a host at 2.0 still serves the 1.0 view to a 1.0 guest.
    views = (
        [version]
        if version is not None
        else [AbiVersion(v.major, m) for v in registry.versions for m in range(v.minor + 1)]
    )
    return {
        "versions": versions,
        "features": {str(v): list(registry.view(v).features) for v in views},
        "namespaces": registry.namespace_versions() if version is None else {},
        "functions": [e.to_json() for e in entries],
    }


def render_abi_text(listing: dict[str, Any]) -> str:
    lines = [f"ABI versions: {', '.join(listing['versions'])}"]
    for view, flags in listing.get("features", {}).items():
        lines.append(f"view {view}: features {', '.join(flags) or '(none)'}")
    for namespace, versions in listing["namespaces"].items():
        lines.append(f"namespace {namespace}: {', '.join(versions)}")
    for e in listing["functions"]:
        # A native entry moves no payload (WASI's read and write guest memory themselves).
        payload = (
            f"native fuel={e['fuel_base']}/call"
            if e.get("signed_args")
            else f"request<={e['max_request_bytes']}B response<={e['max_response_bytes']}B "
            f"fuel={e['fuel_base']}+{e['fuel_per_byte']}/B"
        )
        lines.append(
            f"{e['module']}.{e['name']} ({', '.join(e['params'])}) -> ({', '.join(e['results'])})"
            f"  capability={e['capability']} since={e['since']} {payload}"
        )
        if e["doc"]:
            lines.append(f"    {e['doc']}")
    return "\n".join(lines)
