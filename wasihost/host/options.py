"""The embedding API's checks of what an embedder hands a :class:`~wasihost.host.runtime.Host`:
its options, the brokers and packages it is given, and the extension ids operator actions
name. Each refuses a value of the wrong kind with a ``ConfigError`` naming it, before
anything is opened or changed. Pure: nothing here opens a file or touches the engine."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError

# The rule of an extension id lives with the manifest's id rules (the state store, below the
# host, checks ids too); exported here as well (``as``: an explicit re-export, for mypy).
from ..core.manifest import MAX_EXTENSION_ID_BYTES as MAX_EXTENSION_ID_BYTES  # noqa: PLC0414
from ..core.manifest import check_extension_id as check_extension_id  # noqa: PLC0414
from ..core.registry import Profile, Registry
from ..core.settings import EngineSettings
from ..packaging.package import Package
from ..supervisor.governor import Governor
from ..supervisor.supervision import Supervisor
from .policy import Policy

# Host(cache_dir=...)'s default: the user's cache directory (None turns the cache off).
DEFAULT_CACHE_DIR: Any = object()

def iterable_option(name: str, value: object) -> Iterable[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"Host({name}=...) must be a collection, not {type(value).__name__}")
    return value


def _check_kind(name: str, value: object, kind: type) -> None:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(
            f"Host({name}=...) must be a {kind.__module__}.{kind.__name__} or None, "
            f"not {type(value).__name__}"
        )


def _check_path(name: str, value: object) -> Path | None:
    """A directory option: None, a str or an os.PathLike of str (as pathlib takes them)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"Host({name}=...) must be a path, not {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str):  # an os.PathLike whose __fspath__ gives bytes
        raise ConfigError(f"Host({name}=...) must be a path of text, not bytes")
    if not text or "\x00" in text:
        # Path("") is the working directory: an empty string would put the state there.
        raise ConfigError(f"Host({name}=...) is not a usable path: {text!r}")
    return Path(text)


def check_host_options(
    *,
    policy: object,
    settings: object,
    cache_dir: object,
    registry: object,
    clock: object,
    log_sink: object,
    profiles: tuple[Any, ...],
    state_dir: object,
    brokers: tuple[Any, ...],
    supervisor: object,
    governor: object,
    eviction: object,
    scheduler: object,
) -> Path | None:
    """Refuse, naming it, every Host option of the wrong kind; returns ``state_dir`` as a
    Path. Pure: nothing is opened."""
    _check_kind("policy", policy, Policy)
    _check_kind("settings", settings, EngineSettings)
    _check_kind("registry", registry, Registry)
    _check_kind("supervisor", supervisor, Supervisor)
    _check_kind("governor", governor, Governor)
    if cache_dir is not DEFAULT_CACHE_DIR:
        _check_path("cache_dir", cache_dir)
    if clock is not None and not all(
        callable(getattr(clock, name, None)) for name in ("realtime_ns", "monotonic_ns")
    ):
        raise ConfigError("Host(clock=...) must have realtime_ns() and monotonic_ns()")
    if log_sink is not None and not callable(log_sink):
        raise ConfigError(
            f"Host(log_sink=...) must be callable as fn(extension_id, record), "
            f"not {type(log_sink).__name__}"
        )
    for item in profiles:
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], Profile)
            and callable(item[1])
        ):
            raise ConfigError("Host(profiles=...) holds (Profile, factory) pairs")
    for broker in brokers:
        check_broker(broker)
    if eviction is not None:
        from ..supervisor.eviction import EvictionPolicy, Evictor

        if not isinstance(eviction, (EvictionPolicy, Evictor)):
            raise ConfigError("Host(eviction=...) must be an EvictionPolicy (or an Evictor)")
    if scheduler is not None:
        from ..supervisor.scheduling import Scheduler

        if not isinstance(scheduler, Scheduler):
            raise ConfigError(f"scheduler must be a wasihost.Scheduler: {scheduler!r}")
    return _check_path("state_dir", state_dir)


def check_broker(broker: object) -> None:
    """What the host reads of a broker before serving it: a name and the entries it serves."""
    name = getattr(broker, "name", None)
    functions = getattr(broker, "functions", None)
    if (
        not isinstance(name, str)
        or not name
        or isinstance(functions, (str, bytes))
        or not isinstance(functions, Iterable)
        or not all(isinstance(f, str) for f in functions)
        or not all(callable(getattr(broker, m, None)) for m in ("open", "handler", "close"))
    ):
        raise ConfigError(
            f"{type(broker).__name__} is not a broker: one has a name, the qualified names "
            "of the entries it serves (functions), and open(), handler() and close()"
        )


def check_package(package: object) -> None:
    if not isinstance(package, Package):
        raise ConfigError(
            f"expected a wasihost.packaging.package.Package (Host.load_package makes one), not "
            f"{type(package).__name__}; Host.load takes a path"
        )
