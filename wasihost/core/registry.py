"""The versioned host-function registry: what a guest may import, per ABI version.

Pure data, no engine: entries are frozen descriptors read from the normative
``abi/v<major>/registry.json`` (shipped as package data). A :class:`RegistryView` is what one
guest sees: the entries of its major whose ``since`` is not newer than its declared minor.
Implementations are bound elsewhere (brokers); this module only describes.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Any

import attrs

from .errors import ConfigError

WASM_VALUE_TYPES = frozenset({"i32", "i64", "f32", "f64"})

# Versions come from guests (the marker section) and manifests as well as our registry files.
# Each number is at most 4 digits (a marker is at most 16 bytes) without leading zeros, and
# the pattern must match the whole text: ``$`` alone would admit a trailing newline.
_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})")

# What a host works out from its sealed registry and keeps (Registry.memo): one admission plan
# per distinct module, grant and caps, one hello request per view's features. A host admitting
# more distinct combinations than this works the oldest out again.
MEMO_ENTRIES = 256
_MEMO_LOCK = threading.Lock()
# Held while a deferred profile is made (Registry.deferred), so that it is made once.
_DEFERRED_LOCK = threading.Lock()

CORE_CAPABILITY = "core"
"""Always granted: the ABI's own plumbing (``abort``) that every guest needs."""

# Embedder namespaces: a short lowercase identifier, so that ``<namespace>_v<major>`` is a
# readable import module and a custom section name (``wasihost_abi.<namespace>``) fits easily.
_NAMESPACE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_FUNCTION_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_CAPABILITY_RE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
# Namespaces that would collide with the core ABI (``wasihost_v*``) or WASI's modules
# (``wasi_snapshot_preview1``, ``wasi_unstable``, ``wasi:...``): reserved for the host.
RESERVED_NAMESPACE_PREFIXES = ("wasihost", "wasi")
# A host call copies its request and response once each way through Python bytes; bulk data is
# for the raw-bytes convention, not CBOR. 1 MiB is 250x the largest core entry (4 KiB).
MAX_FUNCTION_PAYLOAD_BYTES = 1024 * 1024
# A host call costs the host microseconds: no entry is cheaper than the core's cheapest
# (``abort``, 100), and moving a byte costs at least what a wasm memory.copy would (1).
MIN_FUEL_BASE = 100
MIN_FUEL_PER_BYTE = 1
# Far above any call's budget (limits.MAX_FUEL_PER_CALL): a price is a number, not a trap door.
MAX_FUEL_PRICE = 10**12
CBOR_PARAMS = ("i32", "i32", "i32", "i32")
CBOR_RESULTS = ("i32",)
CONVENTIONS = ("cbor", "native")
# The native convention for embedders carries integers only: a float has no exact meaning a
# host function could check (NaN payloads, signed zeros) and a pointer would hand the embedder
# raw guest memory. Structured values and bytes are for the cbor convention.
NATIVE_VALUE_TYPES = frozenset({"i32", "i64"})
# Eight integers are more than any hot call needs (Extism's functions take one or two); past
# that a request is structured and belongs in CBOR. Wasm's C ABI in Rust 1.63 returns at most
# one value, so a native function has no result or one.
MAX_NATIVE_FUNCTION_PARAMS = 8
MAX_NATIVE_FUNCTION_RESULTS = 1


@attrs.frozen(order=True)
class AbiVersion:
    """An ABI version ``MAJOR.MINOR``; ordering compares major, then minor."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> AbiVersion:
        m = _VERSION_RE.fullmatch(text)
        if m is None:
            raise ValueError(f"ABI version {text!r} is not MAJOR.MINOR")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def import_module(self) -> str:
        return f"wasihost_v{self.major}"


@attrs.frozen
class HostFunction:
    """One registry entry: a function a guest may import, with its price and limits."""

    module: str
    name: str
    capability: str
    since: AbiVersion
    params: tuple[str, ...]
    results: tuple[str, ...]
    max_request_bytes: int
    max_response_bytes: int
    fuel_base: int
    fuel_per_byte: int
    blocking: bool
    doc: str = ""
    request: str = ""
    response: str = ""
    # "cbor": the ABI's uniform (req_ptr, req_len, resp_ptr, resp_cap) -> i32 convention, decoded
    # and bounded by the engine. "native": typed arguments, and the broker reads and writes
    # guest memory itself through a bounds-checked accessor (WASI preview1 functions).
    convention: str = "cbor"
    # For native entries that must stay linkable when not granted (a WASI program imports
    # fd_write whether or not it gets stdio): the gate answers this value instead, and
    # admission does not refuse the import. None: an ungranted import refuses the module.
    denied_result: int | None = None
    # The entry ends the call and never answers the guest (``abort``): the convention runs its
    # handler whatever the request (outside memory, oversized, malformed) and never returns a
    # status, so a guest cannot carry on past it.
    never_returns: bool = False
    # The entry commits an effect a later call can observe (``log`` appends a record): the
    # convention answers BUFFER_TOO_SMALL before running it unless ``resp_cap`` can hold any
    # response, so a guest that retries with a bigger buffer does not commit twice.
    commits: bool = False
    # Native entries of embedders: integer arguments reach the function as signed values (wasm's
    # i32 and i64 as Rust's), where WASI's arrive unsigned (pointers and lengths).
    signed_args: bool = False
    # For native core entries (v2's ``log``): what a call answers when its capability is no
    # longer granted (revoked after admission), e.g. -1 for -DENIED, as the cbor convention
    # answers. None: the call ends with class ``denied`` (or answers ``denied_result``).
    revoked_result: int | None = None

    @property
    def refused_when_ungranted(self) -> bool:
        return self.denied_result is None

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def signature(self) -> str:
        return f"({', '.join(self.params)}) -> ({', '.join(self.results)})"

    def fuel_price(self, payload_bytes: int) -> int:
        return self.fuel_base + self.fuel_per_byte * payload_bytes

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "module": self.module,
            "name": self.name,
            "capability": self.capability,
            "since": str(self.since),
            "params": list(self.params),
            "results": list(self.results),
            "max_request_bytes": self.max_request_bytes,
            "max_response_bytes": self.max_response_bytes,
            "fuel_base": self.fuel_base,
            "fuel_per_byte": self.fuel_per_byte,
            "blocking": self.blocking,
            "request": self.request,
            "response": self.response,
            "doc": self.doc,
        }
        if self.convention != "cbor":
            doc |= {"convention": self.convention, "denied_result": self.denied_result}
        if self.revoked_result is not None:
            doc["revoked_result"] = self.revoked_result
        if self.never_returns:
            doc["never_returns"] = True
        if self.commits:
            doc["commits"] = True
        if self.signed_args:
            doc["signed_args"] = True
        return doc


@attrs.frozen
class ExportSpec:
    """An export the ABI requires of every guest of a major."""

    name: str
    kind: str
    params: tuple[str, ...] = ()
    results: tuple[str, ...] = ()


@attrs.frozen
class Feature:
    """A feature flag of an ABI major: a named behaviour the host offers a guest whose view
    includes it (``since`` not newer than the guest's version), sent in ``wasihost.hello``."""

    name: str
    since: AbiVersion
    doc: str = ""


@attrs.frozen
class MajorSpec:
    """Everything one ABI major fixes: its functions, required exports and status codes."""

    major: int
    latest_minor: int
    import_module: str
    marker_section: str
    status_codes: Mapping[str, int]
    exports: tuple[ExportSpec, ...]
    reserved_commands: tuple[str, ...]
    functions: tuple[HostFunction, ...]
    features: tuple[Feature, ...] = ()

    @property
    def latest(self) -> AbiVersion:
        return AbiVersion(self.major, self.latest_minor)


@attrs.frozen
class Profile:
    """Entries under a foreign import module (e.g. WASI preview1) that the host implements.

    A profile's entries are visible to every ABI view (a wasihost guest may import them), and a
    module with no ABI marker whose imports all come from the profile's module and which exports
    ``command_export`` runs as a plain command of that profile.
    """

    name: str
    module: str
    functions: tuple[HostFunction, ...]
    command_export: str = "_start"
    # Capabilities the profile's bindings check themselves rather than any one entry (WASI's
    # ``wasi.stdio`` decides where fd 1 and 2 go): grantable like the entries' capabilities.
    capabilities: tuple[str, ...] = ()

    @property
    def exports(self) -> tuple[ExportSpec, ...]:
        return (ExportSpec("memory", "memory"), ExportSpec(self.command_export, "func"))


def profile_capabilities(profile: Profile) -> frozenset[str]:
    """Every capability a profile's entries and bindings name (``core`` aside)."""
    names = {f.capability for f in profile.functions} | set(profile.capabilities)
    return frozenset(names - {CORE_CAPABILITY})


class DeferredProfile:
    """A profile a registry serves before its entries exist: its name, import module and
    capabilities (what a registry answers without the entries), and how to make it.

    The registry makes it the first time something needs an entry: a guest importing its
    module, a listing of every entry. Building WASI's 46 entries with their errno and layout
    tables was a tenth of a short run's own work for a guest that imports no WASI (issue 12
    section 4). What it makes must have this name, module and capabilities (checked)."""

    __slots__ = ("capabilities", "make", "module", "name")

    def __init__(
        self, name: str, module: str, capabilities: frozenset[str], make: Callable[[], Profile]
    ) -> None:
        self.name = name
        self.module = module
        self.capabilities = capabilities
        self.make = make

    def __repr__(self) -> str:
        return f"DeferredProfile({self.name!r}, {self.module!r})"


@attrs.frozen
class RegistryView:
    """The entries one guest may link against, keyed by (import module, name).

    ``version`` is None for a plain profile command (no wasihost ABI): then ``profile`` names
    the profile whose command convention applies.
    """

    version: AbiVersion | None
    spec: MajorSpec | None
    entries: Mapping[tuple[str, str], HostFunction]
    profile: Profile | None = None
    # The import modules of profiles the registry has not made yet, and the registry that
    # makes them: a lookup in one of them makes its profile and adds its entries here.
    deferred: frozenset[str] = frozenset()
    registry: Registry | None = attrs.field(default=None, eq=False, repr=False)
    # Read at every admission and start (three times per fresh extension): sorted once.
    _features: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        features: tuple[str, ...] = ()
        if self.spec is not None and self.version is not None:
            version = self.version
            features = tuple(sorted(f.name for f in self.spec.features if f.since <= version))
        object.__setattr__(self, "_features", features)

    @property
    def required_exports(self) -> tuple[ExportSpec, ...]:
        if self.spec is not None:
            return self.spec.exports
        assert self.profile is not None
        return self.profile.exports

    @property
    def label(self) -> str:
        if self.version is not None:
            return f"ABI {self.version}"
        assert self.profile is not None
        return f"the {self.profile.name} profile"

    def lookup(self, module: str, name: str) -> HostFunction | None:
        found = self.entries.get((module, name))
        if found is None and module in self.deferred and self.registry is not None:
            profile = self.registry.profile_for_module(module)
            assert profile is not None
            assert isinstance(self.entries, dict)  # view() makes a dict
            # The same entries every view of the registry has, added on first need (updating
            # with the same items from two threads at once leaves the same dict).
            self.entries.update({(f.module, f.name): f for f in profile.functions})
            found = self.entries.get((module, name))
        return found

    @property
    def features(self) -> tuple[str, ...]:
        """The feature flags this view offers (sent in ``wasihost.hello``), sorted."""
        return self._features

    @property
    def modules(self) -> frozenset[str]:
        return frozenset(module for module, _ in self.entries) | self.deferred


def namespace_module(namespace: str, major: int) -> str:
    """The import module of an embedder namespace's major: ``myapp`` 1 -> ``myapp_v1``."""
    return f"{namespace}_v{major}"


def namespace_marker(namespace: str) -> str:
    """The custom section in which a guest declares the version of a namespace it imports."""
    return f"wasihost_abi.{namespace}"


_NAMESPACE_MODULE_RE = re.compile(r"([a-z][a-z0-9_]{0,31})_v[1-9][0-9]{0,3}")


def is_application_capability(name: object) -> bool:
    """Whether ``name`` reads as an application's own capability, namespaced as an embedder
    function's must be (``app.users``: an embedder namespace, a dot, more), and not a
    reserved one (``wasi.*``). Only the application that registers it can say what it is."""
    if not isinstance(name, str) or not _CAPABILITY_RE.fullmatch(name) or "." not in name:
        return False
    namespace, rest = name.split(".", 1)
    return (
        bool(rest)
        and bool(_NAMESPACE_RE.fullmatch(namespace))
        and not namespace.startswith(RESERVED_NAMESPACE_PREFIXES)
    )


def module_namespace(module: str) -> str | None:
    """The embedder namespace an import module names (``myapp_v1`` -> ``myapp``), or None."""
    found = _NAMESPACE_MODULE_RE.fullmatch(module)
    if found is None or found.group(1).startswith(RESERVED_NAMESPACE_PREFIXES):
        return None
    return found.group(1)


class OpenCapabilities(frozenset[str]):
    """The capabilities a command that does not run the guest knows: a registry's, and every
    namespaced application capability (:func:`is_application_capability`), which only the
    application that serves it can check. ``name in known`` holds for both, so a manifest
    requesting ``app.users`` parses; :meth:`unchecked` says which names were taken on trust,
    for the command to say so."""

    def __contains__(self, name: object) -> bool:
        return frozenset.__contains__(self, name) or is_application_capability(name)

    def unchecked(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` this registry does not serve: application capabilities."""
        return sorted(n for n in names if not frozenset.__contains__(self, n))


def split_function_name(qualified: str) -> tuple[str, str]:
    """``"myapp.lookup"`` -> ``("myapp", "lookup")``, or a ConfigError saying what is wrong."""
    if not isinstance(qualified, str):  # a raw AttributeError out of add_function before
        raise ConfigError(
            f"host function name must be a string NAMESPACE.NAME, not {type(qualified).__name__}"
        )
    namespace, dot, name = qualified.partition(".")
    if not dot or not _NAMESPACE_RE.fullmatch(namespace) or not _FUNCTION_NAME_RE.fullmatch(name):
        raise ConfigError(
            f"host function name {qualified!r} is not NAMESPACE.NAME (namespace: a lowercase "
            "identifier of at most 32 characters; name: at most 64 of [a-z0-9_])"
        )
    if namespace.startswith(RESERVED_NAMESPACE_PREFIXES):
        raise ConfigError(
            f"namespace {namespace!r} collides with the host's own import modules "
            "(wasihost_v*, wasi_*): choose another"
        )
    return namespace, name


def _bounded(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name}={value!r}: must be an int in {low}..{high}")
    return value


def _native_types(qualified: str, what: str, values: object, most: int) -> tuple[str, ...]:
    if not isinstance(values, (tuple, list)):
        raise ConfigError(f"{qualified}: {what} must be a tuple of 'i32'/'i64', not {values!r}")
    types = tuple(values)
    if len(types) > most or not all(t in NATIVE_VALUE_TYPES for t in types):
        raise ConfigError(
            f"{qualified}: {what}={values!r}: at most {most} of 'i32' and 'i64' (the native "
            "convention carries integers only; use the cbor convention for anything else)"
        )
    return types


def embedder_function(
    qualified: str,
    *,
    capability: str,
    since: str,
    convention: str = "cbor",
    params: object = None,
    results: object = None,
    max_request_bytes: int | None = None,
    max_response_bytes: int | None = None,
    fuel_base: int,
    fuel_per_byte: int | None = None,
    blocking: bool = False,
    commits: bool = False,
    doc: str = "",
    request: str = "",
    response: str = "",
) -> HostFunction:
    """The registry entry of an embedder function, checked: the same limits and pricing as a
    core entry, under the import module ``<namespace>_v<major>``.

    ``convention="cbor"`` (the default) is the ABI's uniform ``(req_ptr, req_len, resp_ptr,
    resp_cap) -> i32``, with its payload limits and per-byte price. ``convention="native"``
    takes integer ``params`` and at most one integer result (``("i64", "i64")`` and
    ``("i64",)``): nothing crosses through guest memory, so it has no payload limits, no
    per-byte price and no status slot; its price is ``fuel_base`` per call."""
    namespace, name = split_function_name(qualified)
    # Checked, not coerced: ``commits="no"`` was bool("no"), a committing entry, and a bytes
    # ``doc`` broke ``wasihost abi --json`` long after the registration that took it.
    if not isinstance(commits, bool):
        raise ConfigError(f"{qualified}: commits={commits!r} must be a bool")
    for what, text in (("doc", doc), ("request", request), ("response", response)):
        if not isinstance(text, str):
            raise ConfigError(f"{qualified}: {what} must be a string, not {type(text).__name__}")
    if convention not in CONVENTIONS:
        raise ConfigError(f"{qualified}: convention={convention!r} is not one of {CONVENTIONS}")
    if convention == "native":
        cbor_only = {
            "max_request_bytes": max_request_bytes,
            "max_response_bytes": max_response_bytes,
            "fuel_per_byte": fuel_per_byte,
            "commits": commits or None,
        }
        given = sorted(k for k, v in cbor_only.items() if v is not None)
        if given:
            raise ConfigError(
                f"{qualified}: {', '.join(given)}: for the cbor convention's payloads; a native "
                "function moves no bytes (and commits through ctx.commit)"
            )
        signature = (
            _native_types(qualified, "params", params, MAX_NATIVE_FUNCTION_PARAMS),
            _native_types(qualified, "results", results, MAX_NATIVE_FUNCTION_RESULTS),
        )
        max_request_bytes = max_response_bytes = fuel_per_byte = 0
        least_response, least_per_byte = 0, 0
    else:
        if params is not None or results is not None:
            raise ConfigError(
                f"{qualified}: params and results are for convention='native'; a cbor "
                "function's signature is the ABI's"
            )
        missing = [
            key
            for key, value in (
                ("max_request_bytes", max_request_bytes),
                ("max_response_bytes", max_response_bytes),
                ("fuel_per_byte", fuel_per_byte),
            )
            if value is None
        ]
        if missing:
            raise ConfigError(f"{qualified}: a cbor function needs {', '.join(missing)}")
        signature = (CBOR_PARAMS, CBOR_RESULTS)
        least_response, least_per_byte = 1, MIN_FUEL_PER_BYTE
    try:
        version = AbiVersion.parse(since)
    except (TypeError, ValueError):
        raise ConfigError(f"{qualified}: since={since!r} is not MAJOR.MINOR") from None
    if version.major < 1:
        raise ConfigError(f"{qualified}: since={since!r}: majors start at 1")
    if (
        not isinstance(capability, str)
        or not _CAPABILITY_RE.fullmatch(capability)
        or not (capability == namespace or capability.startswith(namespace + "."))
    ):
        # Under the namespace: an embedder function can neither hide behind a core or WASI
        # capability (granting ``log`` would grant it too) nor be granted to everyone (core).
        raise ConfigError(
            f"{qualified}: capability {capability!r} must be {namespace!r} or start with "
            f"{namespace + '.'!r}"
        )
    return HostFunction(
        module=namespace_module(namespace, version.major),
        name=name,
        capability=capability,
        since=version,
        params=signature[0],
        results=signature[1],
        max_request_bytes=_bounded(
            "max_request_bytes", max_request_bytes, 0, MAX_FUNCTION_PAYLOAD_BYTES
        ),
        max_response_bytes=_bounded(
            "max_response_bytes", max_response_bytes, least_response, MAX_FUNCTION_PAYLOAD_BYTES
        ),
        fuel_base=_bounded("fuel_base", fuel_base, MIN_FUEL_BASE, MAX_FUEL_PRICE),
        fuel_per_byte=_bounded("fuel_per_byte", fuel_per_byte, least_per_byte, MAX_FUEL_PRICE),
        blocking=bool(blocking),
        doc=doc,
        request=request,
        response=response,
        commits=bool(commits),
        convention=convention,
        signed_args=convention == "native",
    )


@attrs.define
class Registry:
    """All ABI majors this host serves, plus entries added by later profiles (e.g. WASI) and
    by embedders (their own namespaces, ``<namespace>_v<major>``)."""

    majors: dict[int, MajorSpec] = attrs.field(factory=dict)
    # The profiles made (``profiles`` makes the deferred ones too); replaced, never changed in
    # place, so that a reader on another thread iterates a whole one.
    _profiles: dict[str, Profile] = attrs.field(factory=dict)
    # Profiles served but not made yet (:class:`DeferredProfile`), by name; replaced likewise.
    deferred: dict[str, DeferredProfile] = attrs.field(factory=dict)
    # namespace -> its entries, every major together, in registration order.
    namespaces: dict[str, tuple[HostFunction, ...]] = attrs.field(factory=dict)
    # Set once a host admits its first extension: what guests were admitted against must not
    # change under them (and admission on another thread must not see a half-added entry).
    sealed: bool = False
    # What was worked out from the sealed registry (admission plans, handshake requests): never
    # stale, because nothing they depend on changes once sealed (a major may still be added:
    # keys that depend on the majors include their count).
    memo: dict[Any, Any] = attrs.field(factory=dict, init=False, repr=False, eq=False)
    # Held by a change that takes more than one step (an embedder function: its entry, then
    # its broker) and by seal(): an admission on another thread seals either before the change
    # began (which is then refused) or after it ended, never half-way (an entry whose broker
    # was not there yet).
    changing: threading.RLock = attrs.field(
        factory=threading.RLock, init=False, repr=False, eq=False
    )

    def seal(self) -> None:
        with self.changing:
            self.sealed = True

    @property
    def profiles(self) -> dict[str, Profile]:
        """Every profile served, by name (the deferred ones are made)."""
        self._make_deferred()
        return self._profiles

    def _make_deferred(self, module: str | None = None) -> None:
        """Make the deferred profiles (those of import module ``module``, or all). They were
        served from their registration on, so this changes nothing a guest was admitted
        against: allowed on a sealed registry too."""
        if not self.deferred:
            return
        with _DEFERRED_LOCK:
            for name, deferred in list(self.deferred.items()):
                if module is not None and deferred.module != module:
                    continue
                profile = deferred.make()
                said = (deferred.name, deferred.module, deferred.capabilities)
                made = (profile.name, profile.module, profile_capabilities(profile))
                if made != said:
                    raise ConfigError(f"deferred profile {said} made a different profile {made}")
                # Made before it stops being deferred: a reader in between sees it twice, the
                # same either way, never not at all.
                self._profiles = {**self._profiles, name: profile}
                self.deferred = {k: v for k, v in self.deferred.items() if k != name}

    def remember(self, key: Any, value: Any) -> None:
        """Keep ``value`` in :attr:`memo` (only once sealed: before, what it was worked out
        from may still change). Bounded: beyond MEMO_ENTRIES the oldest goes."""
        if not self.sealed:
            return
        with _MEMO_LOCK:
            memo = self.memo
            while len(memo) >= MEMO_ENTRIES:
                del memo[next(iter(memo))]
            memo[key] = value

    def check_open(self, what: str) -> None:
        if self.sealed:
            raise ConfigError(
                f"cannot add {what}: this registry already serves admitted extensions "
                "(register host functions before loading extensions)"
            )

    def _modules(self) -> set[str]:
        taken = {p.module for p in self._profiles.values()}
        taken.update(d.module for d in self.deferred.values())
        taken.update(spec.import_module for spec in self.majors.values())
        return taken

    def add_profile(self, profile: Profile | DeferredProfile) -> None:
        """Serve ``profile``; a :class:`DeferredProfile` is made when first needed."""
        self.check_open(f"profile {profile.name}")
        if profile.module in self._modules() or any(
            profile.module == f.module for fs in self.namespaces.values() for f in fs
        ):
            raise ConfigError(f"import module {profile.module} is registered twice")
        # One name, one profile: a made one and a deferred one of the same name would each
        # hide the other.
        if profile.name in self._profiles or profile.name in self.deferred:
            raise ConfigError(f"profile {profile.name} is registered twice")
        if isinstance(profile, DeferredProfile):
            self.deferred = {**self.deferred, profile.name: profile}
        else:
            self._profiles = {**self._profiles, profile.name: profile}

    def serves_profile(self, module: str) -> bool:
        """Whether a profile (made or deferred) owns import module ``module``."""
        return any(p.module == module for p in self._profiles.values()) or any(
            d.module == module for d in self.deferred.values()
        )

    def add_function(self, entry: HostFunction) -> None:
        """Add an embedder entry (made by :func:`embedder_function`) to its namespace."""
        self.check_open(f"host function {entry.qualified_name}")
        namespace = entry.module.rpartition("_v")[0]
        if entry.module in self._modules():
            raise ConfigError(f"import module {entry.module} belongs to the host")
        entries = self.namespaces.get(namespace, ())
        if any(f.name == entry.name and f.module == entry.module for f in entries):
            raise ConfigError(f"host function {entry.qualified_name} is registered twice")
        self.namespaces[namespace] = (*entries, entry)

    def namespace_latest(self, namespace: str, major: int) -> AbiVersion | None:
        """The newest version of ``namespace``'s ``major`` served (its entries' newest
        ``since``), or None."""
        versions = [f.since for f in self.namespaces.get(namespace, ()) if f.since.major == major]
        return max(versions) if versions else None

    def namespace_versions(self) -> dict[str, list[str]]:
        """Every embedder namespace and the newest version of each of its majors."""
        out: dict[str, list[str]] = {}
        for namespace in sorted(self.namespaces):
            majors = sorted({f.since.major for f in self.namespaces[namespace]})
            out[namespace] = [str(self.namespace_latest(namespace, m)) for m in majors]
        return out

    def profile_for_module(self, module: str) -> Profile | None:
        self._make_deferred(module)
        return next((p for p in self._profiles.values() if p.module == module), None)

    def profile_view(self, profile: Profile) -> RegistryView:
        entries = {(f.module, f.name): f for f in profile.functions}
        return RegistryView(version=None, spec=None, entries=entries, profile=profile)

    def add_major(self, spec: MajorSpec) -> None:
        if spec.major in self.majors:
            raise ConfigError(f"ABI major {spec.major} is registered twice")
        names = [f.qualified_name for f in spec.functions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"duplicate registry entries: {', '.join(duplicates)}")
        self.majors[spec.major] = spec

    @property
    def versions(self) -> tuple[AbiVersion, ...]:
        return tuple(self.majors[m].latest for m in sorted(self.majors))

    def supports(self, version: AbiVersion) -> bool:
        spec = self.majors.get(version.major)
        return spec is not None and version.minor <= spec.latest_minor

    def view(
        self, version: AbiVersion, namespaces: Mapping[str, AbiVersion] | None = None
    ) -> RegistryView:
        """The view of a guest declaring ABI ``version`` and, for each embedder namespace it
        imports, the version it declares (its entries up to that minor, as for the core)."""
        spec = self.majors.get(version.major)
        if spec is None or version.minor > spec.latest_minor:
            served = ", ".join(str(v) for v in self.versions) or "none"
            raise ConfigError(f"ABI {version} is not served by this host (serves {served})")
        entries = {
            (f.module, f.name): f
            for f in spec.functions
            if f.since.major == version.major and f.since.minor <= version.minor
        }
        for profile in self._profiles.values():
            entries.update({(f.module, f.name): f for f in profile.functions})
        for namespace, declared in (namespaces or {}).items():
            entries.update(
                {
                    (f.module, f.name): f
                    for f in self.namespaces.get(namespace, ())
                    if f.since.major == declared.major and f.since.minor <= declared.minor
                }
            )
        deferred = frozenset(d.module for d in self.deferred.values()) - {m for m, _ in entries}
        return RegistryView(
            version=version, spec=spec, entries=entries, deferred=deferred, registry=self
        )

    def is_core(self, entry: HostFunction) -> bool:
        """Whether ``entry`` belongs to one of the ABI majors (not a profile or namespace)."""
        spec = next((s for s in self.majors.values() if s.import_module == entry.module), None)
        return spec is not None and entry in spec.functions

    def carried(
        self, entries: Iterable[HostFunction], conventions: Iterable[str] = ("cbor",)
    ) -> list[HostFunction]:
        """The entries of other core majors that carry ``entries`` over: the same name and
        capability, and either the same convention and signature or a changed one the broker
        speaks (``conventions``). Entries that are not core entries carry nothing."""
        speaks = frozenset(conventions)
        core = {spec.import_module: spec for spec in self.majors.values()}
        given = {(e.module, e.name) for e in entries}
        out: list[HostFunction] = []
        for entry in entries:
            if entry.module not in core:
                continue
            for spec in self.majors.values():
                for later in spec.functions:
                    if (
                        (later.module, later.name) in given
                        or later.name != entry.name
                        or later.capability != entry.capability
                        or later in out
                    ):
                        continue
                    same = (later.convention, later.params, later.results) == (
                        entry.convention,
                        entry.params,
                        entry.results,
                    )
                    if same or later.convention in speaks:
                        out.append(later)
        return out

    def capabilities(self) -> frozenset[str]:
        """Capability names a manifest may request (``core`` is implicit, never requested)."""
        names = {f.capability for f in self._functions()}
        names.update(c for p in self._profiles.values() for c in p.capabilities)
        names.update(c for d in self.deferred.values() for c in d.capabilities)
        return frozenset(names - {CORE_CAPABILITY})

    def functions(self, version: AbiVersion | None = None) -> Iterable[HostFunction]:
        self._make_deferred()
        if version is not None:
            yield from self.view(version).entries.values()
            return
        yield from self._functions()

    def _functions(self) -> Iterable[HostFunction]:
        """Every entry made so far (a deferred profile's are not, until it is made)."""
        for major in sorted(self.majors):
            yield from self.majors[major].functions
        profiles = self._profiles
        for name in sorted(profiles):
            yield from profiles[name].functions
        for namespace in sorted(self.namespaces):
            yield from self.namespaces[namespace]

    def lookup(self, module: str, name: str) -> HostFunction | None:
        """Any entry by import module and name, whatever view it belongs to."""
        self._make_deferred(module)
        return next((f for f in self._functions() if (f.module, f.name) == (module, name)), None)


def _require(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ConfigError(f"registry: {key!r} missing or of the wrong type")
    return value


def _optional_flag(doc: Mapping[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"registry: {key!r} must be true or false")
    return value


def _types(values: Any, where: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not all(v in WASM_VALUE_TYPES for v in values):
        raise ConfigError(f"registry: {where} must list wasm value types")
    return tuple(values)


def major_from_json(doc: Mapping[str, Any]) -> MajorSpec:
    """Build a :class:`MajorSpec` from the registry JSON, refusing anything malformed."""
    major = _require(doc, "abi_major", int)
    import_module = _require(doc, "import_module", str)
    functions = []
    for raw in _require(doc, "functions", list):
        name = _require(raw, "name", str)
        since = AbiVersion.parse(_require(raw, "since", str))
        if since.major != major:
            raise ConfigError(f"registry: {name} since {since} is not of major {major}")
        functions.append(
            HostFunction(
                module=import_module,
                name=name,
                capability=_require(raw, "capability", str),
                since=since,
                params=_types(raw.get("params"), f"{name}.params"),
                results=_types(raw.get("results"), f"{name}.results"),
                max_request_bytes=_require(raw, "max_request_bytes", int),
                max_response_bytes=_require(raw, "max_response_bytes", int),
                fuel_base=_require(raw, "fuel_base", int),
                fuel_per_byte=_require(raw, "fuel_per_byte", int),
                blocking=_require(raw, "blocking", bool),
                doc=raw.get("doc", ""),
                request=raw.get("request", ""),
                response=raw.get("response", ""),
                never_returns=_optional_flag(raw, "never_returns"),
                commits=_optional_flag(raw, "commits"),
                **_convention(raw, name),
            )
        )
    features = []
    for raw in doc.get("features", []):
        since = AbiVersion.parse(_require(raw, "since", str))
        if since.major != major:
            raise ConfigError(f"registry: feature since {since} is not of major {major}")
        features.append(Feature(_require(raw, "name", str), since, raw.get("doc", "")))
    exports = tuple(
        ExportSpec(
            name=_require(e, "name", str),
            kind=_require(e, "kind", str),
            params=_types(e.get("params", []), "export params"),
            results=_types(e.get("results", []), "export results"),
        )
        for e in _require(doc, "exports", list)
    )
    return MajorSpec(
        major=major,
        latest_minor=_require(doc, "latest_minor", int),
        import_module=import_module,
        marker_section=_require(doc, "marker_section", str),
        status_codes=dict(_require(doc, "status_codes", dict)),
        exports=exports,
        reserved_commands=tuple(_require(doc, "reserved_commands", list)),
        functions=tuple(functions),
        features=tuple(features),
    )


# The conventions a core entry may use: the uniform cbor one, or typed arguments whose broker
# reads guest memory itself (ABI 2.0's ``log``). The native dispatch's arity bound applies.
CORE_CONVENTIONS = ("cbor", "native")


def _convention(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The calling convention of a core entry and, for a native one, its ungranted answers."""
    convention = raw.get("convention", "cbor")
    if convention not in CORE_CONVENTIONS:
        raise ConfigError(f"registry: {name}: convention {convention!r} is not one of "
                          f"{', '.join(CORE_CONVENTIONS)}")  # fmt: skip
    if convention == "cbor":
        if "denied_result" in raw or "revoked_result" in raw:
            raise ConfigError(f"registry: {name}: only a native entry has denied/revoked results")
        return {}
    out: dict[str, Any] = {"convention": convention}
    for key in ("denied_result", "revoked_result"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"registry: {name}: {key} must be an int or null")
        out[key] = value
    return out


def load_major_json(major: int) -> dict[str, Any]:
    """The registry JSON of one major, as shipped with the package."""
    text = resources.files("wasihost.core.abi_data").joinpath(f"v{major}.json").read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


SHIPPED_MAJORS = (1, 2)


@functools.cache  # the shipped JSON never changes; a CLI run makes two registries
def shipped_major(major: int) -> MajorSpec:
    """The spec of a shipped major, parsed once per process (a MajorSpec is immutable)."""
    return major_from_json(load_major_json(major))
