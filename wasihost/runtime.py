"""The embedding API: a :class:`Host` admits packages into :class:`Extension` objects, which
start (instantiate + handshake) on first use and run commands.

Data flows one way: package -> admission (pure) -> compile (cached) -> instance -> call ->
broker. An extension keeps one live instance and discards it after any failure that may have
corrupted the guest; the next call starts a fresh one.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from . import limits
from .admission import AdmissionPlan, admit
from .brokers.clock import Clock, SystemClock, clock_handler
from .brokers.core import abort_handler
from .brokers.log import ExtensionLog, LogRecord, log_handler
from .brokers.random import SeededRandom, random_handler
from .codec import CodecLimits, decode, encode
from .engine import BoundImport, CompiledModule, Instance, StoreLimits, WasmEngine
from .errors import AdmissionError, CallError, CodecError, ConfigError, FailureClass
from .manifest import Manifest, Resources
from .package import Package, load_package
from .policy import Grant, Policy, effective_grant
from .registry import HostFunction, Profile, Registry, default_registry
from .settings import EngineSettings
from .wasmbin import WasmFormatError, read_header

RESERVED_PREFIX = "wasihost."
# A command name crosses into the guest on every call; the ABI bounds it at 255 bytes.
MAX_COMMAND_NAME_BYTES = 255
# Handshake answers are a few short fields; anything bigger is a confused or hostile guest.
MAX_HANDSHAKE_BYTES = 4096
# A guest's error map is for a human: class and message, bounded.
MAX_GUEST_ERROR_BYTES = 2048
MAX_GUEST_ERROR_TEXT = 512
RUNTIME_ID_BYTES = 16
READINESS = ("ready", "degraded", "failed")


def default_cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wasihost" / "modules"


_DEFAULT = object()


class ProfileBinding(Protocol):
    """The brokers of one profile (e.g. WASI) for one instance of one extension.

    Made fresh for every instance, because profile state (open file descriptors, for WASI)
    belongs to the instance and must not survive a discarded one.
    """

    def handler(self, entry: HostFunction) -> Callable[..., Any]: ...

    def close(self) -> None: ...


ProfileFactory = Callable[["Extension"], ProfileBinding]


class Host:
    """The plugin engine of an application: one wasm engine, one registry, one policy."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        settings: EngineSettings | None = None,
        cache_dir: Path | object | None = _DEFAULT,
        registry: Registry | None = None,
        clock: Clock | None = None,
        profiles: Iterable[tuple[Profile, ProfileFactory]] = (),
    ) -> None:
        self.policy = policy if policy is not None else Policy()
        self.registry = registry if registry is not None else default_registry()
        self.profile_factories: dict[str, ProfileFactory] = {}
        for profile, factory in profiles:
            self.registry.add_profile(profile)
            self.profile_factories[profile.module] = factory
        directory = default_cache_dir() if cache_dir is _DEFAULT else cache_dir
        if directory is not None and not isinstance(directory, Path):
            directory = Path(str(directory))
        self.engine = WasmEngine(settings or EngineSettings(), directory)
        self.clock: Clock = clock if clock is not None else SystemClock()

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(
        self,
        source: str | Path,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Extension:
        """Load and admit a package directory, or a bare module with explicit ``grants``."""
        package = load_package(source, self.registry.capabilities())
        return self.admit(package, grants=grants, fuel=fuel, timeout_ms=timeout_ms)

    def plan(
        self,
        package: Package,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> tuple[AdmissionPlan, Grant, Resources]:
        """Static admission only: no compile, no instantiation, nothing of the guest runs."""
        return plan_package(
            package, self.registry, self.policy, grants=grants, fuel=fuel, timeout_ms=timeout_ms
        )

    def admit(
        self,
        package: Package,
        *,
        grants: Iterable[str] | None = None,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Extension:
        plan, grant, resources = self.plan(package, grants=grants, fuel=fuel, timeout_ms=timeout_ms)
        try:
            compiled = self.engine.compile(package.wasm, package.sha256)
        except CallError as exc:
            raise AdmissionError([exc.message]) from None
        return Extension(self, package, plan, grant, resources, compiled)


def plan_package(
    package: Package,
    registry: Registry,
    policy: Policy,
    *,
    grants: Iterable[str] | None = None,
    fuel: int | None = None,
    timeout_ms: int | None = None,
) -> tuple[AdmissionPlan, Grant, Resources]:
    """Resources, effective grant and static admission of a package; pure, nothing runs."""
    manifest = package.manifest
    resources = _with_overrides(
        manifest.resources if manifest is not None else Resources.default(), fuel, timeout_ms
    )
    try:
        header = read_header(package.wasm)
    except WasmFormatError as exc:
        raise AdmissionError([f"not a valid module: {exc}"]) from None
    if manifest is not None:
        grant = effective_grant(manifest.required, manifest.optional, policy)
        extra = sorted(set(grants or ()) - grant.capabilities)
        if extra:
            raise AdmissionError([f"grant {c!r} was not requested by the manifest" for c in extra])
    else:
        requested = frozenset(grants or ())
        unknown = sorted(requested - registry.capabilities())
        if unknown:
            raise AdmissionError([f"unknown capability {c!r}" for c in unknown])
        grant = effective_grant(requested, (), policy)
    plan = admit(
        header,
        registry,
        grant,
        max_memory_bytes=resources.max_memory_bytes,
        max_table_elements=resources.max_table_elements,
        manifest_abi=_manifest_abi(manifest),
    )
    return plan, grant, resources


def _manifest_abi(manifest: Manifest | None) -> Any:
    from .registry import AbiVersion

    return AbiVersion.parse(manifest.abi) if manifest is not None else None


def _with_overrides(resources: Resources, fuel: int | None, timeout_ms: int | None) -> Resources:
    changes: dict[str, int] = {}
    for name, value in (("fuel_per_call", fuel), ("timeout_ms", timeout_ms)):
        if value is None:
            continue
        bound = limits.RESOURCE_BOUNDS[name]
        if isinstance(value, bool) or not bound.minimum <= value <= bound.maximum:
            raise ConfigError(f"{name}={value!r} outside {bound.minimum}..{bound.maximum}")
        changes[name] = value
    return attrs.evolve(resources, **changes) if changes else resources


@attrs.frozen
class Handshake:
    """What the guest said at start-up and what the host answered."""

    runtime_id: bytes
    guest_id: str
    guest_version: str
    abi: str
    requested: tuple[str, ...]
    granted: tuple[str, ...]
    epoch: int
    readiness: str
    reason: str | None


class Extension:
    """An admitted extension: its grant, its log, and (once started) one live instance."""

    def __init__(
        self,
        host: Host,
        package: Package,
        plan: AdmissionPlan,
        grant: Grant,
        resources: Resources,
        compiled: CompiledModule,
    ) -> None:
        self.host = host
        self.package = package
        self.plan = plan
        self.grant = grant
        self.resources = resources
        self._compiled = compiled
        self.log = ExtensionLog(resources.max_log_bytes)
        self._input_limits = CodecLimits(max_bytes=resources.max_input_bytes)
        self._output_limits = CodecLimits(max_bytes=resources.max_output_bytes)
        self._lock = threading.Lock()
        self._instance: Instance | None = None
        self.handshake: Handshake | None = None
        self.last_fuel_used = 0
        self.starts = 0
        self._bindings: dict[str, ProfileBinding] = {}
        policy = host.policy
        self._random = SeededRandom(policy.random_seed) if policy.random_seed is not None else None

    @property
    def id(self) -> str:
        return self.package.name

    @property
    def manifest(self) -> Manifest | None:
        return self.package.manifest

    def _gate(self, entry: HostFunction) -> bool:
        return self.grant.allows(entry.capability)

    def _handler(self, entry: HostFunction) -> Callable[..., Any]:
        binding = self._bindings.get(entry.module)
        if binding is not None:
            return binding.handler(entry)
        factories: Mapping[str, Callable[[], Callable[[Any], Any]]] = {
            "abort": lambda: abort_handler(self.log),
            "log": lambda: log_handler(self.log),
            "clock_now": lambda: clock_handler(
                self.host.clock, self.host.policy.clock_resolution_ns
            ),
            "random_bytes": lambda: (
                random_handler(self._random) if self._random is not None else random_handler()
            ),
        }
        factory = factories.get(entry.name) if entry.module.startswith("wasihost_v") else None
        if factory is None:
            raise ConfigError(f"registry entry {entry.qualified_name} has no broker in this host")
        return factory()

    def _store_limits(self) -> StoreLimits:
        r = self.resources
        return StoreLimits(
            max_memory_bytes=r.max_memory_bytes,
            max_table_elements=r.max_table_elements,
            fuel=r.fuel_per_call,
            timeout_ms=r.timeout_ms,
        )

    def start(self) -> Handshake:
        """Instantiate and run the handshake now (calls do it lazily)."""
        with self._lock:
            self._ensure_started()
            assert self.handshake is not None
            return self.handshake

    def _instantiate(self) -> Instance:
        self._close_bindings()
        for module in {e.module for e in self.plan.imports}:
            factory = self.host.profile_factories.get(module)
            if factory is not None:
                self._bindings[module] = factory(self)
        bound = [BoundImport(entry, self._handler(entry)) for entry in self.plan.imports]
        profile = self.plan.view.profile
        return self.host.engine.instantiate(
            self._compiled,
            bound,
            self._gate,
            self._store_limits(),
            command_export=profile.command_export if self.plan.is_command and profile else None,
        )

    def _close_bindings(self) -> None:
        bindings, self._bindings = self._bindings, {}
        for binding in bindings.values():
            binding.close()

    def run_command(self) -> int:
        """Run a plain profile command (a WASI ``_start``) once; return its exit code."""
        if not self.plan.is_command:
            raise ConfigError(f"{self.id} is a wasihost ABI guest: call its commands instead")
        with self._lock:
            self._discard()
            instance = self._instantiate()
            self.starts += 1
            try:
                with instance.lock:
                    return instance.run_command()
            finally:
                self.last_fuel_used = instance.last_call_fuel
                instance.close()
                self._close_bindings()

    def _ensure_started(self) -> Instance:
        if self._instance is not None:
            return self._instance
        if self.plan.is_command:
            raise ConfigError(f"{self.id} is a plain command module: use run_command()")
        instance = self._instantiate()
        self.starts += 1
        try:
            self.handshake = self._run_handshake(instance)
        except BaseException:
            instance.close()
            raise
        self._instance = instance
        return instance

    def _reserved(self, instance: Instance, command: str, value: Any) -> Any:
        try:
            with instance.lock:
                result = instance.call(command.encode(), encode(value), MAX_HANDSHAKE_BYTES)
        except CallError as exc:
            if exc.failure in (FailureClass.PROTOCOL, FailureClass.GUEST_ERROR):
                raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None
            raise
        if result.status != 0:
            raise CallError(
                FailureClass.HANDSHAKE,
                f"{command}: guest answered status {result.status} "
                f"({_guest_error_text(result.body)})",
            )
        try:
            return decode(result.body, CodecLimits(max_bytes=MAX_HANDSHAKE_BYTES))
        except CodecError as exc:
            raise CallError(FailureClass.HANDSHAKE, f"{command}: {exc.message}") from None

    def _run_handshake(self, instance: Instance) -> Handshake:
        versions = [str(v) for v in self.host.registry.versions]
        hello = self._reserved(instance, "wasihost.hello", {"host": "wasihost", "abi": versions})
        fields = _require_fields(
            hello, "wasihost.hello", {"id": str, "version": str, "abi": str, "features": list}
        )
        features = fields["features"]
        if not all(isinstance(f, str) for f in features):
            raise CallError(FailureClass.HANDSHAKE, "wasihost.hello: features must be text")
        if fields["abi"] != str(self.plan.version):
            raise CallError(
                FailureClass.HANDSHAKE,
                f"wasihost.hello: guest says ABI {fields['abi']!r}, its marker says "
                f"{self.plan.version}",
            )
        manifest = self.manifest
        if manifest is not None and (fields["id"], fields["version"]) != (
            manifest.id,
            manifest.version,
        ):
            raise CallError(
                FailureClass.HANDSHAKE,
                f"wasihost.hello: guest says {fields['id']} {fields['version']}, the manifest "
                f"says {manifest.id} {manifest.version}",
            )
        runtime_id = secrets.token_bytes(RUNTIME_ID_BYTES)
        granted = sorted(self.grant.capabilities)
        welcome = self._reserved(
            instance,
            "wasihost.welcome",
            {"runtime_id": runtime_id, "granted": granted, "epoch": self.grant.epoch},
        )
        answer = _require_fields(welcome, "wasihost.welcome", {"status": str})
        readiness = answer["status"]
        reason = welcome.get("reason")
        if readiness not in READINESS or (reason is not None and not isinstance(reason, str)):
            raise CallError(FailureClass.HANDSHAKE, f"wasihost.welcome: bad answer {welcome!r}")
        if readiness == "failed":
            raise CallError(
                FailureClass.HANDSHAKE, f"guest reported failed start-up: {reason or 'no reason'}"
            )
        return Handshake(
            runtime_id=runtime_id,
            guest_id=fields["id"],
            guest_version=fields["version"],
            abi=fields["abi"],
            requested=tuple(features),
            granted=tuple(granted),
            epoch=self.grant.epoch,
            readiness=readiness,
            reason=reason,
        )

    def _check_command(self, command: str) -> bytes:
        if not isinstance(command, str) or not command:
            raise ConfigError("command name must be a non-empty string")
        if command.startswith(RESERVED_PREFIX):
            raise ConfigError(f"command {command!r} is reserved for the host")
        name = command.encode()
        if len(name) > MAX_COMMAND_NAME_BYTES:
            raise ConfigError(f"command name of {len(name)} bytes exceeds {MAX_COMMAND_NAME_BYTES}")
        manifest = self.manifest
        if manifest is not None and manifest.command(command) is None:
            declared = ", ".join(c.name for c in manifest.commands)
            raise ConfigError(f"command {command!r} is not declared (declared: {declared})")
        return name

    def call(self, command: str, value: Any = None) -> Any:
        """Run ``command`` with ``value`` (any CBOR-encodable value) and return its output."""
        name = self._check_command(command)
        r = self.resources
        payload = encode(value, self._input_limits)
        with self._lock:
            instance = self._ensure_started()
            try:
                with instance.lock:
                    result = instance.call(name, payload, r.max_output_bytes)
            except CallError as exc:
                self.last_fuel_used = instance.last_call_fuel
                if exc.failure.discards_instance:
                    self._discard()
                raise
            self.last_fuel_used = result.fuel_used
        if result.status != 0:
            raise CallError(FailureClass.GUEST_ERROR, _guest_error_text(result.body))
        try:
            return decode(result.body, self._output_limits)
        except CodecError as exc:
            with self._lock:
                self._discard()
            raise CallError(FailureClass.PROTOCOL, f"command output: {exc.message}") from None

    def _discard(self) -> None:
        if self._instance is not None:
            self._instance.close()
            self._instance = None
        self._close_bindings()

    def logs(self) -> tuple[LogRecord, ...]:
        return self.log.records

    def close(self) -> None:
        with self._lock:
            self._discard()


def _require_fields(value: Any, where: str, fields: Mapping[str, type]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CallError(FailureClass.HANDSHAKE, f"{where}: answer is not a map")
    for key, kind in fields.items():
        if not isinstance(value.get(key), kind):
            raise CallError(FailureClass.HANDSHAKE, f"{where}: field {key!r} missing or mistyped")
    return value


def _guest_error_text(body: bytes) -> str:
    """The guest's ``{"class", "message"}``, bounded; never trusted to be well-formed."""
    try:
        value = decode(body, CodecLimits(max_bytes=MAX_GUEST_ERROR_BYTES))
    except CodecError:
        return "guest error (malformed error body)"
    if not isinstance(value, dict):
        return "guest error (malformed error body)"
    cls = value.get("class")
    msg = value.get("message")
    cls = cls[:64] if isinstance(cls, str) else "error"
    msg = msg[:MAX_GUEST_ERROR_TEXT] if isinstance(msg, str) else ""
    return f"{cls}: {msg}" if msg else cls
