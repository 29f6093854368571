"""wasihost: run untrusted WebAssembly extensions behind a versioned host-function registry.

The daily-use names live here. They are loaded lazily so that the pure core
(``wasihost.registry``, ``wasihost.admission``, ``wasihost.codec`` ...) can be imported and
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
    "BudgetPolicy": "wasihost.budgets",
    "EvictionPolicy": "wasihost.eviction",
    "HostFull": "wasihost.eviction",
    "Throttled": "wasihost.governor",
    "Governor": "wasihost.governor",
    "Scheduler": "wasihost.scheduling",
    "Priority": "wasihost.scheduling",
    "HostBusy": "wasihost.scheduling",
    "AsyncHost": "wasihost.aio",
    "AsyncExtension": "wasihost.aio",
    "Host": "wasihost.runtime",
    "Extension": "wasihost.extension",
    "Policy": "wasihost.policy",
    "TrustStore": "wasihost.packaging.trust",
    "SignatureError": "wasihost.errors",
    "EngineSettings": "wasihost.settings",
    "WasihostError": "wasihost.errors",
    "AdmissionError": "wasihost.errors",
    "CallError": "wasihost.errors",
    "FailureClass": "wasihost.errors",
    "ExtensionRevoked": "wasihost.lifecycle",
    "ExtensionUnavailable": "wasihost.lifecycle",
    "LogRecord": "wasihost.extlog",
    "to_logging": "wasihost.extlog",
    "Broker": "wasihost.hostfn",
    "CallContext": "wasihost.hostfn",
    "HostStatus": "wasihost.status",
    "Status": "wasihost.status",
    "SecretsBroker": "wasihost.brokers.secrets",
    "FileSecretStore": "wasihost.secrets",
    "EnvSecretStore": "wasihost.secrets",
    "MemorySecretStore": "wasihost.secrets",
}

if TYPE_CHECKING:
    from .aio import AsyncExtension, AsyncHost
    from .brokers.secrets import SecretsBroker
    from .budgets import BudgetPolicy
    from .errors import AdmissionError, CallError, FailureClass, SignatureError, WasihostError
    from .eviction import EvictionPolicy, HostFull
    from .extension import Extension
    from .extlog import LogRecord, to_logging
    from .governor import Governor, Throttled
    from .hostfn import Broker, CallContext
    from .lifecycle import ExtensionRevoked, ExtensionUnavailable
    from .packaging.trust import TrustStore
    from .policy import Policy
    from .runtime import Host
    from .scheduling import HostBusy, Priority, Scheduler
    from .secrets import EnvSecretStore, FileSecretStore, MemorySecretStore
    from .settings import EngineSettings
    from .status import HostStatus, Status


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wasihost' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
