"""wasihost: run untrusted WebAssembly extensions behind a versioned host-function registry.

The daily-use names live here. They are loaded lazily so that the pure core
(``wasihost.core.registry``, ``wasihost.core.admission``, ``wasihost.core.codec`` ...) can be
imported and
tested without loading the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AdmissionError",
    "AsyncExtension",
    "AsyncHost",
    "Broker",
    "BudgetPolicy",
    "CallContext",
    "CallError",
    "EngineSettings",
    "EnvSecretStore",
    "EvictionPolicy",
    "Extension",
    "ExtensionRevoked",
    "ExtensionUnavailable",
    "FailureClass",
    "FileSecretStore",
    "Governor",
    "Host",
    "HostBusy",
    "HostFull",
    "HostStatus",
    "LogRecord",
    "MemorySecretStore",
    "Policy",
    "Priority",
    "Scheduler",
    "SecretsBroker",
    "SignatureError",
    "Status",
    "Throttled",
    "TrustStore",
    "WasihostError",
    "to_logging",
]

_LAZY = {
    "BudgetPolicy": "wasihost.core.budgets",
    "EvictionPolicy": "wasihost.supervisor.eviction",
    "HostFull": "wasihost.supervisor.eviction",
    "Throttled": "wasihost.supervisor.governor",
    "Governor": "wasihost.supervisor.governor",
    "Scheduler": "wasihost.supervisor.scheduling",
    "Priority": "wasihost.supervisor.scheduling",
    "HostBusy": "wasihost.supervisor.scheduling",
    "AsyncHost": "wasihost.host.aio",
    "AsyncExtension": "wasihost.host.aio",
    "Host": "wasihost.host.runtime",
    "Extension": "wasihost.host.extension",
    "Policy": "wasihost.host.policy",
    "TrustStore": "wasihost.packaging.trust",
    "SignatureError": "wasihost.core.errors",
    "EngineSettings": "wasihost.core.settings",
    "WasihostError": "wasihost.core.errors",
    "AdmissionError": "wasihost.core.errors",
    "CallError": "wasihost.core.errors",
    "FailureClass": "wasihost.core.errors",
    "ExtensionRevoked": "wasihost.core.lifecycle",
    "ExtensionUnavailable": "wasihost.core.lifecycle",
    "LogRecord": "wasihost.core.extlog",
    "to_logging": "wasihost.core.extlog",
    "Broker": "wasihost.core.serving",
    "CallContext": "wasihost.core.serving",
    "HostStatus": "wasihost.core.status",
    "Status": "wasihost.core.status",
    "SecretsBroker": "wasihost.brokers.secrets",
    "FileSecretStore": "wasihost.store.secrets",
    "EnvSecretStore": "wasihost.store.secrets",
    "MemorySecretStore": "wasihost.store.secrets",
}

if TYPE_CHECKING:
    from .brokers.secrets import SecretsBroker
    from .core.budgets import BudgetPolicy
    from .core.errors import AdmissionError, CallError, FailureClass, SignatureError, WasihostError
    from .core.extlog import LogRecord, to_logging
    from .core.lifecycle import ExtensionRevoked, ExtensionUnavailable
    from .core.serving import Broker, CallContext
    from .core.settings import EngineSettings
    from .core.status import HostStatus, Status
    from .host.aio import AsyncExtension, AsyncHost
    from .host.extension import Extension
    from .host.policy import Policy
    from .host.runtime import Host
    from .packaging.trust import TrustStore
    from .store.secrets import EnvSecretStore, FileSecretStore, MemorySecretStore
    from .supervisor.eviction import EvictionPolicy, HostFull
    from .supervisor.governor import Governor, Throttled
    from .supervisor.scheduling import HostBusy, Priority, Scheduler


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wasihost' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
