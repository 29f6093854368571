"""Static admission: decide, from the module's bytes alone, whether it may be instantiated.

Pure. Runs on the :class:`~wasihost.core.wasmbin.ModuleHeader` before the engine compiles anything,
so a refused module costs a header scan, never a compile, and none of its code runs. Every
problem found is reported, each naming the import, export or declaration at fault.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import attrs

from .errors import AdmissionError
from .registry import (
    AbiVersion,
    HostFunction,
    Profile,
    Registry,
    RegistryView,
    module_namespace,
    namespace_marker,
    namespace_module,
)
from .wasmbin import PAGE_BYTES, ImportEntry, ModuleHeader, shown_name

if TYPE_CHECKING:
    from .grants import Grant

MARKER_SECTION = "wasihost_abi"
MARKER_MAX_BYTES = 16
# Feature flags a guest cannot run without: a custom section of comma-separated names, read
# before compiling like the marker. A view offers a handful of flags; 256 bytes names dozens.
FEATURES_SECTION = "wasihost_features"
FEATURES_MAX_BYTES = 256
# A flag's name as the registries spell them ("bytes-commands", "native-log").
_FEATURE_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
# Every guest built on the SDK (and every wasi-libc program) has exactly one table; a second
# one buys a guest nothing this ABI offers.
MAX_TABLES = 1
# Each import costs the host ~30 us of Python at every instantiation (its dispatch closure and
# C callback), paid by no fuel: 20,000 imports made every new instance cost 0.6 s of host CPU.
# Views hold ~70 core and WASI entries plus the embedder's, and imports may repeat
# (AssemblyScript emits duplicates), but real modules import at most 46 (the WASI testsuite's
# largest); 1,000 keeps an instance's linking under ~30 ms.
MAX_IMPORTS = 1_000
WASI_MODULE = "wasi_snapshot_preview1"


@attrs.frozen
class AdmissionPlan:
    """An admitted module: its view and, in import order, the entry each import binds to.

    ``version`` is None for a plain profile command (e.g. a WASI program exporting ``_start``).
    """

    version: AbiVersion | None
    view: RegistryView
    imports: tuple[HostFunction, ...]

    @property
    def is_command(self) -> bool:
        return self.version is None


def command_profile(header: ModuleHeader, registry: Registry) -> Profile | None:
    """The profile a module without an ABI marker runs under, if it is a plain command of one:
    every import from the profile's module, and the profile's command entry point exported."""
    if header.custom(MARKER_SECTION):
        return None
    modules = {i.module for i in header.imports}
    exports = {e.name for e in header.exports}
    for profile in registry.profiles.values():
        if modules <= {profile.module} and profile.command_export in exports:
            return profile
    return None


def declared_version(header: ModuleHeader) -> AbiVersion:
    """The ABI version the module's marker declares; refuse a missing or malformed marker."""
    markers = header.custom(MARKER_SECTION)
    if not markers:
        wasi_only = header.imports and all(i.module == WASI_MODULE for i in header.imports)
        hint = (
            " and is not a plain WASI command (those import only wasi_snapshot_preview1 and "
            "export _start, and need a host serving the WASI profile)"
            if wasi_only
            else ""
        )
        raise AdmissionError([f"module has no {MARKER_SECTION!r} custom section{hint}"])
    if len(markers) > 1:
        raise AdmissionError([f"module has {len(markers)} {MARKER_SECTION!r} sections; need one"])
    raw = markers[0]
    if len(raw) > MARKER_MAX_BYTES:
        raise AdmissionError([f"{MARKER_SECTION!r} section of {len(raw)} bytes is malformed"])
    try:
        return AbiVersion.parse(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise AdmissionError([f"{MARKER_SECTION!r} section {raw!r} is not MAJOR.MINOR"]) from None


def required_features(header: ModuleHeader) -> tuple[tuple[str, ...], list[str]]:
    """The feature flags the module's ``wasihost_features`` section requires, and what is
    wrong with the section (at most one, ASCII, comma-separated names, bounded)."""
    sections = header.custom(FEATURES_SECTION)
    if not sections:
        return (), []
    if len(sections) > 1:
        return (), [f"module has {len(sections)} {FEATURES_SECTION!r} sections; at most one"]
    raw = sections[0]
    if len(raw) > FEATURES_MAX_BYTES:
        return (), [f"{FEATURES_SECTION!r} section is {len(raw)} bytes, over {FEATURES_MAX_BYTES}"]
    try:
        names = raw.decode("ascii").split(",")
    except UnicodeDecodeError:
        return (), [f"{FEATURES_SECTION!r} section is not ASCII"]
    bad = [n for n in names if not _FEATURE_NAME.fullmatch(n)]
    if bad:
        return (), [
            f"{FEATURES_SECTION!r} section: {bad[0][:40]!r} is not a feature name "
            "(comma-separated, lowercase letters, digits and '-', no spaces)"
        ]
    return tuple(dict.fromkeys(names)), []


def _missing_features(header: ModuleHeader, view: RegistryView) -> list[str]:
    required, problems = required_features(header)
    offered = view.features
    for name in required:
        if name not in offered:
            problems.append(
                f"module requires feature {name!r}, which {view.label} of this host does not "
                f"offer (it offers: {', '.join(offered) or 'none'})"
            )
    return problems


def declared_namespaces(
    header: ModuleHeader, registry: Registry
) -> tuple[dict[str, AbiVersion], list[str]]:
    """The version of each embedder namespace the module declares (a
    ``wasihost_abi.<namespace>`` section, like the core marker), and what is wrong with them.

    Only namespaces the host serves are read: a section naming another is not ours to judge.
    """
    declared: dict[str, AbiVersion] = {}
    problems: list[str] = []
    for namespace in registry.namespaces:
        section = namespace_marker(namespace)
        markers = header.custom(section)
        if not markers:
            continue
        raw = markers[0]
        try:
            if len(markers) > 1 or len(raw) > MARKER_MAX_BYTES:
                raise ValueError
            version = AbiVersion.parse(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            problems.append(f"{section!r} section is not one MAJOR.MINOR of at most 16 bytes")
            continue
        latest = registry.namespace_latest(namespace, version.major)
        if latest is None or version > latest:
            served = ", ".join(registry.namespace_versions().get(namespace, [])) or "nothing"
            problems.append(
                f"module declares {namespace} {version}; this host serves {namespace} {served}"
            )
            continue
        declared[namespace] = version
    return declared, problems


# An embedder namespace's import module -> (its namespace, its entries by name).
_NamespaceModules = dict[str, tuple[str, dict[str, HostFunction]]]


def _namespace_modules(registry: Registry) -> _NamespaceModules:
    """Each embedder namespace module's entries, indexed once per admission: looking an
    unknown import up by scanning every namespace entry cost imports x entries (100,000
    imports against 200 embedder functions took a second of CPU for a 490 KB module)."""
    index: _NamespaceModules = {}
    for namespace, entries in registry.namespaces.items():
        for f in entries:
            index.setdefault(f.module, (namespace, {}))[1][f.name] = f
    return index


def _namespace_problem(
    modules: _NamespaceModules, declared: dict[str, AbiVersion], module: str, name: str
) -> str | None:
    """Why an import from an embedder namespace's module is not in the guest's view, if it is
    one: the namespace undeclared, declared at another major, or the entry newer."""
    found = modules.get(module)
    if found is None:
        return None
    namespace, entries = found
    version = declared.get(namespace)
    if version is None:
        return (
            f"imports namespace {namespace} but the module declares no version of it "
            f"(a {namespace_marker(namespace)!r} custom section, e.g. "
            f"{str(next(iter(entries.values())).since)!r})"
        )
    if namespace_module(namespace, version.major) != module:
        return f"module declares {namespace} {version}, whose import module is " + (
            namespace_module(namespace, version.major)
        )
    later = entries.get(name)
    if later is not None:
        return f"added in {namespace} {later.since}, but the module declares {version}"
    return f"not an entry of {namespace} {version}"


def _check_limits(
    header: ModuleHeader, max_memory_bytes: int, max_table_elements: int
) -> list[str]:
    problems = []
    if len(header.imports) > MAX_IMPORTS:
        problems.append(f"module has {len(header.imports)} imports; at most {MAX_IMPORTS}")
    for imp in header.imports:
        if imp.kind != "func":
            problems.append(
                f"import {shown_name(imp.module)}.{shown_name(imp.name)}: imports a {imp.kind}; "
                "guests may import only registry functions"
            )
    if len(header.memories) != 1:
        problems.append(f"module defines {len(header.memories)} memories; the ABI needs exactly 1")
    for i, mem in enumerate(header.memories):
        if mem.is_64:
            problems.append(f"memory {i} is a 64-bit memory; only 32-bit memories are supported")
        if mem.shared:
            problems.append(f"memory {i} is shared; shared memories are not supported")
        if mem.minimum * PAGE_BYTES > max_memory_bytes:
            problems.append(
                f"memory {i} declares a minimum of {mem.minimum} pages "
                f"({mem.minimum * PAGE_BYTES} bytes), over the limit of {max_memory_bytes} bytes"
            )
    if len(header.tables) > MAX_TABLES:
        problems.append(f"module defines {len(header.tables)} tables; at most {MAX_TABLES}")
    for i, table in enumerate(header.tables):
        if table.minimum > max_table_elements:
            problems.append(
                f"table {i} declares a minimum of {table.minimum} elements, "
                f"over the limit of {max_table_elements}"
            )
    return problems


def _check_imports(
    header: ModuleHeader,
    view: RegistryView,
    registry: Registry,
    grant: Grant,
    declared: dict[str, AbiVersion] | None = None,
    unchecked: frozenset[str] = frozenset(),
) -> tuple[list[str], list[HostFunction]]:
    problems: list[str] = []
    bound: list[HostFunction] = []
    unknown: _UnknownImports | None = None  # made at the first import not in the view
    for imp in header.imports:
        if imp.kind != "func" or imp.func_type is None:
            continue  # reported by _check_limits
        entry = view.lookup(imp.module, imp.name)
        if entry is None:
            if unchecked and module_namespace(imp.module) in unchecked:
                continue  # an application's namespace this host does not serve: not judged
            if unknown is None:
                unknown = _UnknownImports(view, registry, declared)
            problems.append(f"{_where(imp)}: {unknown.problem(imp.module, imp.name)}")
            continue
        if (tuple(imp.func_type.params), tuple(imp.func_type.results)) != (
            entry.params,
            entry.results,
        ):
            problems.append(
                f"{_where(imp)}: signature {imp.func_type} differs from {entry.signature}"
            )
            continue
        if not grant.allows(entry.capability) and entry.refused_when_ungranted:
            problems.append(
                f"{_where(imp)}: needs capability {entry.capability!r}, which is not granted "
                f"(Host.load(..., grants=[{entry.capability!r}]) within the policy's allow)"
            )
            continue
        bound.append(entry)
    return problems, bound


def _where(imp: ImportEntry) -> str:
    return f"import {shown_name(imp.module)}.{shown_name(imp.name)}"


class _UnknownImports:
    """Why an import is not in the guest's view: added in a later ABI minor, of an embedder
    namespace the module declares otherwise, of a module the view does not serve, or not an
    entry of it. Its indexes are made once, at the first such import (a module may carry
    100,000 of them; an admitted one has none)."""

    def __init__(
        self, view: RegistryView, registry: Registry, declared: dict[str, AbiVersion] | None
    ) -> None:
        self._view = view
        self._declared = declared
        version = view.version
        spec_all = registry.majors[version.major].functions if version is not None else ()
        self._major_entries = {(f.module, f.name): f for f in spec_all}
        self._namespaces = _namespace_modules(registry) if declared is not None else {}
        self._served = ", ".join(sorted(view.modules))

    def problem(self, module: str, name: str) -> str:
        view = self._view
        later = self._major_entries.get((module, name))
        if later is not None:
            return f"added in ABI {later.since}, but the module declares {view.version}"
        if self._declared is not None:
            namespaced = _namespace_problem(self._namespaces, self._declared, module, name)
            if namespaced is not None:
                return namespaced
        if module not in view.modules:
            return (
                f"unknown import module {shown_name(module)!r} ({view.label} serves "
                f"{self._served})"
            )
        return f"not an entry of {view.label}"


def _check_exports(header: ModuleHeader, view: RegistryView) -> list[str]:
    problems = []
    exports = {e.name: e for e in header.exports}
    for spec in view.required_exports:
        found = exports.get(spec.name)
        if found is None:
            problems.append(f"export {spec.name!r} ({spec.kind}) is missing")
        elif found.kind != spec.kind:
            problems.append(f"export {spec.name!r} is a {found.kind}, the ABI needs a {spec.kind}")
        elif found.reexports is not None:
            # The ABI's exports are the guest's code; an import in their place would have the
            # host call a host (or embedder) function itself, outside any guest frame.
            problems.append(
                f"export {spec.name!r} is the imported function {found.reexports}; "
                "the ABI needs the guest's own"
            )
        elif spec.kind == "func" and found.func_type is not None:
            got = (found.func_type.params, found.func_type.results)
            if got != (spec.params, spec.results):
                want = f"({', '.join(spec.params)}) -> ({', '.join(spec.results)})"
                problems.append(
                    f"export {spec.name!r} has signature {found.func_type}, the ABI needs {want}"
                )
    return problems


# A host admits one module again and again (an extension closed and loaded anew, many tenants
# of one package): its plan depends only on the module, the sealed registry, the capabilities
# granted, the memory and table caps and the manifest's ABI, so it is worked out once and kept
# in the registry's memo (bounded by registry.MEMO_ENTRIES).


def admit_cached(
    header: ModuleHeader,
    registry: Registry,
    grant: Grant,
    *,
    module_digest: str,
    max_memory_bytes: int,
    max_table_elements: int,
    manifest_abi: AbiVersion | None = None,
) -> AdmissionPlan:
    """:func:`admit` of the module whose sha256 is ``module_digest``, remembered once
    ``registry`` is sealed. A refusal is never remembered: it is worked out (and raised)
    every time."""
    # The digest names the bytes, so the header they give; the header itself is not kept
    # (its custom sections may be large).
    key = (
        "plan",
        module_digest,
        grant.capabilities,
        max_memory_bytes,
        max_table_elements,
        manifest_abi,
    )
    plan: AdmissionPlan | None = registry.memo.get(key)
    if plan is None:
        plan = admit(
            header,
            registry,
            grant,
            max_memory_bytes=max_memory_bytes,
            max_table_elements=max_table_elements,
            manifest_abi=manifest_abi,
        )
        registry.remember(key, plan)
    return plan


def admit(
    header: ModuleHeader,
    registry: Registry,
    grant: Grant,
    *,
    max_memory_bytes: int,
    max_table_elements: int,
    manifest_abi: AbiVersion | None = None,
    unchecked_namespaces: frozenset[str] = frozenset(),
) -> AdmissionPlan:
    """Admit the module or raise :class:`AdmissionError` listing every problem found.

    Imports of ``unchecked_namespaces`` (application namespaces this host does not serve) are
    neither refused nor bound: a command that does not run the guest (``install``) checks
    all the rest, and the application's own host checks them when it loads the extension."""
    profile = command_profile(header, registry)
    if profile is not None and manifest_abi is None:
        view = registry.profile_view(profile)
        # A command's required flags too (ABI section 1): its view offers none it could use.
        return _admit_with(
            header,
            registry,
            view,
            grant,
            max_memory_bytes,
            max_table_elements,
            found=_missing_features(header, view),
        )
    version = declared_version(header)
    if manifest_abi is not None and manifest_abi != version:
        raise AdmissionError(
            [f"manifest declares ABI {manifest_abi}, the module's marker declares {version}"]
        )
    if not registry.supports(version):
        served = ", ".join(str(v) for v in registry.versions)
        raise AdmissionError([f"module declares ABI {version}; this host serves {served}"])
    declared, problems = declared_namespaces(header, registry)
    view = registry.view(version, declared)
    problems += _missing_features(header, view)
    return _admit_with(
        header,
        registry,
        view,
        grant,
        max_memory_bytes,
        max_table_elements,
        declared,
        problems,
        unchecked_namespaces,
    )


def _admit_with(
    header: ModuleHeader,
    registry: Registry,
    view: RegistryView,
    grant: Grant,
    max_memory_bytes: int,
    max_table_elements: int,
    declared: dict[str, AbiVersion] | None = None,
    found: list[str] | None = None,
    unchecked: frozenset[str] = frozenset(),
) -> AdmissionPlan:
    problems = list(found or [])  # what the caller found already (markers, features)
    problems += _check_limits(header, max_memory_bytes, max_table_elements)
    import_problems, bound = _check_imports(header, view, registry, grant, declared, unchecked)
    problems += import_problems
    problems += _check_exports(header, view)
    if problems:
        ungranted = tuple(
            sorted(
                {
                    e.capability
                    for imp in header.imports
                    if (e := view.lookup(imp.module, imp.name)) is not None
                    and e.refused_when_ungranted
                    and not grant.allows(e.capability)
                }
            )
        )
        raise AdmissionError(problems, ungranted=ungranted)
    return AdmissionPlan(version=view.version, view=view, imports=tuple(bound))


def admit_native(
    version: AbiVersion,
    registry: Registry,
    grant: Grant,
    requested: frozenset[str],
) -> AdmissionPlan:
    """The plan of a native plugin (``runtime = "native-process"``), which has no import
    section to read: the host offers it every entry it may call, and nothing else.

    Those are the core ABI entries of ``version`` and every embedder namespace entry whose
    capability is core or ``requested`` by its manifest, and, of those, the ones granted now
    or that the grant gates at call time (as a Wasm module's import of an ungranted optional
    capability is bound, and denied when called). The child learns this list in LOAD; a host
    call outside it never reaches the host. A WASI capability is refused: a native plugin
    does not run the WASI profile. Raises :class:`AdmissionError` naming every problem."""
    problems: list[str] = []
    if not registry.supports(version):
        served = ", ".join(str(v) for v in registry.versions)
        problems.append(f"manifest declares ABI {version}; this host serves {served}")
    wasi = sorted(c for c in requested if c.startswith("wasi."))
    if wasi:
        problems.append(
            f"a native plugin has no WASI: remove {', '.join(map(repr, wasi))} from its "
            "manifest (its files, clocks and randomness come through the brokers' capabilities)"
        )
    if problems:
        raise AdmissionError(problems)
    view = registry.view(version)
    offered: list[HostFunction] = [
        entry for (module, _), entry in view.entries.items() if module == version.import_module
    ]
    for entries in registry.namespaces.values():
        offered.extend(entries)
    bound = tuple(
        entry
        for entry in offered
        if (entry.capability in requested or grant.allows(entry.capability))
        and (grant.allows(entry.capability) or not entry.refused_when_ungranted)
    )
    return AdmissionPlan(version=version, view=view, imports=bound)
