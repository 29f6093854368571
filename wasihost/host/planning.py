"""Planning a package's admission: resources, effective grant and the static check.

Pure: no engine, no I/O beyond what the package already holds. The host runs this before it
compiles anything, and again when an extension's grant changes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from ..core import limits
from ..core.admission import (
    AdmissionPlan,
    admit,
    admit_cached,
    admit_native,
    command_profile,
)
from ..core.errors import AdmissionError, ConfigError
from ..core.manifest import DEFAULT_RUNTIME, NATIVE_RUNTIME, Manifest, Resources
from ..core.registry import AbiVersion, Registry
from ..core.wasmbin import ModuleHeader, WasmFormatError, read_header_cached
from ..packaging.package import Package
from .policy import (
    IN_PROCESS,
    PROCESS_ONLY,
    RUNTIME_ENV,
    Policy,
    effective_grant,
    runtime_mode_of,
)

if TYPE_CHECKING:
    from ..core.grants import Grant


def resolve_runtime(package: Package, override: str | None, policy: Policy) -> str:
    """The mode an extension runs under: the caller's ``override``, else the policy's, else
    the ``WASIHOST_RUNTIME`` environment variable, else what its manifest asks. A manifest
    asking for ``wasm-process`` is never run in this process: that would quietly give it
    weaker isolation than it asked for."""
    import os

    asked = package.manifest.runtime if package.manifest is not None else DEFAULT_RUNTIME
    if asked == NATIVE_RUNTIME:
        return _native_runtime(package, override)
    if override is not None:
        mode = runtime_mode_of(override, "load")
    elif policy.runtime is not None:
        mode = policy.runtime
    elif os.environ.get(RUNTIME_ENV):
        mode = runtime_mode_of(os.environ[RUNTIME_ENV], RUNTIME_ENV)
    else:
        mode = PROCESS_ONLY if asked == "wasm-process" else IN_PROCESS
    if asked == "wasm-process" and mode != PROCESS_ONLY:
        if mode == IN_PROCESS:
            raise AdmissionError(
                [
                    f"{package.name} asks for runtime 'wasm-process' (a walled child process); "
                    "running it in-process would weaken its isolation: use runtime "
                    "'process-only' or 'prefer-process' for it"
                ]
            )
        mode = PROCESS_ONLY  # never the in-process fallback for a package that asked
    return mode


def _native_runtime(package: Package, override: str | None) -> str:
    """A native plugin runs only in a walled child: ``process-only``, whatever the policy or
    the environment default to; a caller asking for ``in-process`` by name is refused (there
    is no in-process fallback for machine code)."""
    if override is not None and runtime_mode_of(override, "load") == IN_PROCESS:
        raise AdmissionError(
            [
                f"{package.name} is a native plugin (runtime 'native-process'): it runs only in "
                "a walled child process, never in-process; use runtime 'process-only'"
            ]
        )
    return PROCESS_ONLY


def is_native(package: Package) -> bool:
    """Whether the package is a native plugin: its module is an executable, not Wasm."""
    return package.manifest is not None and package.manifest.runtime == NATIVE_RUNTIME


def check_package_policy(package: Package, policy: Policy) -> None:
    """What the policy says of the package as a whole, whatever it imports: its signature.
    Checked at admission and again when the policy changes."""
    if policy.require_signed and package.signer is None:
        raise AdmissionError([unsigned_refusal(package)])


def plan_package(
    package: Package,
    registry: Registry,
    policy: Policy,
    *,
    grants: Iterable[str] | None = None,
    fuel: int | None = None,
    timeout_ms: int | None = None,
    granted: frozenset[str] | None = None,
    epoch: int = 0,
    command_memory: Mapping[str, int] | None = None,
    unchecked: frozenset[str] = frozenset(),
) -> tuple[AdmissionPlan, Grant, Resources]:
    """Resources, effective grant and static admission of a package; pure, nothing runs.

    ``unchecked`` names application capabilities the manifest requests that this host does
    not serve (:class:`~wasihost.core.registry.OpenCapabilities`): for a command that does
    not run the guest (an install), they count as allowed, and imports of their namespaces
    are not judged. The application's host judges them at load.

    ``granted`` is what the operator's grant table holds for the extension (a stateful host);
    the policy then only caps it. Without it, the policy alone decides (a stateless host).
    ``command_memory`` maps a profile's import module to the memory a plain command of that
    profile may grow to (``WasiOptions.max_memory_bytes``); a profile it does not name gives
    ``limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES``.
    """
    grants = grant_names(grants)
    check_package_policy(package, policy)
    manifest = package.manifest
    if manifest is not None and manifest.runtime == NATIVE_RUNTIME:
        return _plan_native(
            package, manifest, registry, policy, grants, fuel, timeout_ms, granted, epoch
        )
    try:
        header = read_header_cached(package.wasm)
    except WasmFormatError as exc:
        raise AdmissionError([f"not a valid module: {exc}"]) from None
    if manifest is not None:
        base = manifest.resources
    else:
        base = bare_module_resources(header, registry, command_memory or {})
    resources = policy.cap(_with_overrides(base, fuel, timeout_ms))
    if manifest is not None:
        _check_served(manifest, registry, unchecked)
    if unchecked:
        taken_on_trust = attrs.evolve(policy, allow=policy.allow | unchecked)
        grant = _grant_of(package, registry, taken_on_trust, grants, granted, epoch)
        plan = admit(
            header,
            registry,
            grant,
            max_memory_bytes=resources.max_memory_bytes,
            max_table_elements=resources.max_table_elements,
            manifest_abi=_manifest_abi(manifest),
            unchecked_namespaces=frozenset(c.split(".", 1)[0] for c in unchecked),
        )
        return plan, grant, resources
    grant = _grant_of(package, registry, policy, grants, granted, epoch)
    try:
        plan = admit_cached(
            header,
            registry,
            grant,
            module_digest=package.sha256,
            max_memory_bytes=resources.max_memory_bytes,
            max_table_elements=resources.max_table_elements,
            manifest_abi=_manifest_abi(manifest),
        )
    except AdmissionError as exc:
        raise _with_requests(exc, manifest) from None
    return plan, grant, resources


def _check_served(manifest: Manifest, registry: Registry, unchecked: frozenset[str]) -> None:
    """Refuse a manifest requesting capabilities this host does not serve. A manifest read open
    to application capabilities (an install, the check of an installed package) may name
    them; to run it, the application's functions must be registered."""
    requested = manifest.required | manifest.optional
    unserved = sorted(requested - registry.capabilities() - unchecked)
    if unserved:
        names = ", ".join(repr(c) for c in unserved)
        raise AdmissionError(
            [
                f"{names}: application capabilit{'ies' if len(unserved) > 1 else 'y'} this "
                "host does not serve: register the application's functions (Host.function, "
                "docs/host-functions.md) before loading"
            ],
            unserved=tuple(unserved),
        )


def _with_requests(exc: AdmissionError, manifest: Manifest | None) -> AdmissionError:
    """``exc`` with the capabilities its imports need split by the manifest: those it requests
    (a grant lifts the refusal) and those it does not (only the manifest can)."""
    if manifest is None or not exc.ungranted:
        return exc
    requested = manifest.required | manifest.optional
    unrequested = [c for c in exc.ungranted if c not in requested]
    problems = list(exc.problems)
    for c in unrequested:  # admission's words suggest a grant, which cannot be given
        granted_by = (
            f"which is not granted (Host.load(..., grants=[{c!r}]) within the policy's allow)"
        )
        asked_by = "which its manifest does not request (extension.toml [capabilities])"
        problems = [p.replace(granted_by, asked_by) for p in problems]
    return AdmissionError(
        problems,
        ungranted=tuple(c for c in exc.ungranted if c in requested),
        unserved=exc.unserved,
        unrequested=tuple(unrequested),
    )


def grant_names(grants: object) -> frozenset[str] | None:
    """A load's ``grants`` as the set of names it is, read once: an iterator read twice (the
    plan, then the grant table's record) gave the second reader nothing. None stays None."""
    if grants is None:
        return None
    if isinstance(grants, (str, bytes)):
        # A string is an iterable of one-letter "capabilities": always a caller's mistake.
        raise ConfigError(f"grants must be a collection of capability names, not {grants!r}")
    if not isinstance(grants, Iterable):
        raise ConfigError(
            f"grants must be a collection of capability names, not {type(grants).__name__}"
        )
    names = tuple(grants)
    wrong = [name for name in names if not isinstance(name, str)]
    if wrong:
        raise ConfigError(
            f"grants must be capability names (strings), not {type(wrong[0]).__name__} "
            f"{wrong[0]!r}"
        )
    return frozenset(names)


def _grant_of(
    package: Package,
    registry: Registry,
    policy: Policy,
    grants: Iterable[str] | None,
    granted: frozenset[str] | None,
    epoch: int,
) -> Grant:
    """The effective grant of a package: requested ∩ granted ∩ allowed (docs/grants.md).

    ``granted`` is the operator's grant table (a host with a state directory, or a grant
    change): the load's ``grants`` join it. Without it, the load's ``grants`` are the
    optional capabilities given (all of them when it names none) beside the required."""
    manifest = package.manifest
    asked = None if grants is None else frozenset(grants)
    if asked is not None:
        _check_asked(package, registry, policy, asked)
    if granted is not None:
        granted = granted | (asked or frozenset())
        required = manifest.required if manifest is not None else frozenset()
        requested = (manifest.required | manifest.optional) if manifest is not None else granted
        missing = sorted(required - granted)
        if missing:
            raise AdmissionError(
                [
                    f"required capability {c!r} is not granted "
                    f"(Host.grant({package.name!r}, {c!r}), or name it in the load's grants)"
                    for c in missing
                ],
                ungranted=tuple(missing),
            )
        return effective_grant(required, requested & granted, policy, epoch=epoch)
    if manifest is not None:
        return effective_grant(manifest.required, load_choice(package, asked), policy)
    return effective_grant(asked or (), (), policy)


def load_choice(package: Package, grants: Iterable[str] | None) -> frozenset[str]:
    """What a load gives a package, before the policy: the manifest's required capabilities
    and the optional ones its ``grants`` name (all of them when it names none); for a bare
    module, its ``grants``, which are its whole request. A host without a state directory
    keeps this as the extension's grant-table record, so that a later policy allowing more
    widens the grant without a reload."""
    asked = None if grants is None else frozenset(grants)
    manifest = package.manifest
    if manifest is None:
        return asked or frozenset()
    return manifest.required | (manifest.optional if asked is None else asked)


def _check_asked(
    package: Package, registry: Registry, policy: Policy, asked: frozenset[str]
) -> None:
    """Refuse a load's ``grants`` naming what cannot be given, each with its own remedy."""
    manifest = package.manifest
    if manifest is None:
        unknown = sorted(asked - registry.capabilities())
        if unknown:
            raise AdmissionError([f"unknown capability {c!r}" for c in unknown])
        return
    requested = manifest.required | manifest.optional
    # Two causes, two remedies: the manifest does not ask for it, or the policy does not
    # allow what it asks for (one message named the manifest for both).
    problems = [
        f"grant {c!r} was not requested by the manifest (a guest that uses it lists it in "
        "extension.toml's [capabilities] optional)"
        for c in sorted(asked - requested)
    ] + [
        f"grant {c!r} is requested by the manifest but not allowed by the host's policy "
        f"(Policy(allow=...) does not name it: add {c!r} there to grant it)"
        for c in sorted((asked & requested) - policy.allow)
    ]
    if problems:
        raise AdmissionError(problems)


def _plan_native(
    package: Package,
    manifest: Manifest,
    registry: Registry,
    policy: Policy,
    grants: Iterable[str] | None,
    fuel: int | None,
    timeout_ms: int | None,
    granted: frozenset[str] | None,
    epoch: int,
) -> tuple[AdmissionPlan, Grant, Resources]:
    """plan_package of a native plugin: its executable checked (elfbin.native_problem), its
    grant worked out as a Wasm extension's, and its entries those its capabilities reach
    (admission.admit_native)."""
    import platform

    # The ELF reader (and the dataclasses module under it) is for native plugins alone: a Wasm
    # run does not load it.
    from ..core.elfbin import native_problem

    problem = native_problem(package.wasm, platform.machine())
    if problem is not None:
        raise AdmissionError(
            [f"{manifest.module} is not a native plugin this host can run: {problem}"]
        )
    resources = policy.cap(_with_overrides(manifest.resources, fuel, timeout_ms))
    grant = _grant_of(package, registry, policy, grants, granted, epoch)
    requested = manifest.required | manifest.optional
    plan = admit_native(_abi_version(manifest.abi), registry, grant, requested)
    return plan, grant, resources


def bare_module_resources(
    header: ModuleHeader, registry: Registry, command_memory: Mapping[str, int]
) -> Resources:
    """The resources of a module without a manifest: an extension's defaults, but a plain
    command of a profile (a WASI program) may grow its memory as a command-line program needs
    (see ``limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES``); a plugin's 16 MiB made malloc fail."""
    resources = Resources.default()
    profile = command_profile(header, registry)
    if profile is None:
        return resources
    memory = command_memory.get(profile.module, limits.DEFAULT_COMMAND_MAX_MEMORY_BYTES)
    return attrs.evolve(resources, max_memory_bytes=memory)


def unsigned_refusal(package: Package) -> str:
    """Why an unverified package is refused where a signature is required."""
    if package.package_digest is None:
        kind = "a package directory" if package.manifest is not None else "a bare module"
        return (
            f"{package.source} is {kind}, not a signed .whpkg: the host requires packages "
            "signed by a trusted publisher (wasihost pack, then wasihost sign)"
        )
    return (
        f"{package.source} carries no signature verified by a trusted publisher, and the host "
        "requires one"
    )


def _manifest_abi(manifest: Manifest | None) -> AbiVersion | None:
    return _abi_version(manifest.abi) if manifest is not None else None


# Manifests name a handful of versions; parsing one anew was a few µs of every admission.
# Only valid versions are kept (a parse error is raised, never remembered).
@functools.lru_cache(maxsize=64)
def _abi_version(text: str) -> AbiVersion:
    return AbiVersion.parse(text)


def _with_overrides(resources: Resources, fuel: int | None, timeout_ms: int | None) -> Resources:
    """The caller's overrides; Resources' own validators refuse out-of-range values."""
    changes = {
        name: value
        for name, value in (("fuel_per_call", fuel), ("timeout_ms", timeout_ms))
        if value is not None
    }
    return attrs.evolve(resources, **changes) if changes else resources
