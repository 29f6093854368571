"""Brokers: the host side of capabilities.

A broker never sees a guest pointer. The engine adapter has already checked bounds, the gate
and the payload limit, and decoded the request with the entry's CBOR bounds; a broker validates
the request's *shape*, does the work, and answers a value or raises
:class:`~wasihost.core.status.HostStatus`.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

# The built-in brokers most modules never use, by name (also their module's) and class: their
# modules (threads, sockets, the key-value store, the file code) are imported on first use.
# What the host needs to know of each before then, the registry entries it serves and their
# capability, is read from the shipped registry: each serves the ABI 1.x entries of the
# capability named like it (tests/test_startup.py checks that this is its class's own).
DEFERRED: tuple[tuple[str, str], ...] = (
    ("secrets", "SecretsBroker"),
    ("events", "EventsBroker"),
    ("files", "FilesBroker"),
    ("http", "HttpBroker"),
    ("storage", "StorageBroker"),
    ("jobs", "JobsBroker"),
)


class DeferredBroker:
    """A built-in broker made (its module imported, its class instantiated with no arguments)
    the first time anything but its name, entries and capabilities is asked of it. Until then
    it holds nothing: no extension has opened it, so there is nothing to quiesce, checkpoint
    or shut down (:meth:`loaded` tells; the host skips it then)."""

    def __init__(self, name: str, cls: str) -> None:
        from ..core.registry import shipped_major  # parsed once per process

        self.name = name
        self.functions = tuple(
            f.qualified_name for f in shipped_major(1).functions if f.capability == name
        )
        self.capabilities = frozenset({name})
        self.conventions = frozenset({"cbor"})  # every deferred built-in speaks cbor only
        self._where = (f"{__name__}.{name}", cls)
        self._broker: Any = None
        self._lock = threading.Lock()

    def real(self) -> Any:
        """The broker itself, made now if it was not yet."""
        broker = self._broker
        if broker is None:
            with self._lock:
                broker = self._broker
                if broker is None:
                    module, cls = self._where
                    broker = self._broker = getattr(importlib.import_module(module), cls)()
        return broker

    @property
    def loaded(self) -> bool:
        return self._broker is not None

    def open(self, ext: Any) -> Any:
        return self.real().open(ext)

    def handler(self, entry: Any, state: Any) -> Any:
        return self.real().handler(entry, state)

    def close(self, state: Any) -> None:
        self.real().close(state)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in ("_broker", "_lock", "_where"):
            raise AttributeError(attr)
        return getattr(self.real(), attr)


def resolved(broker: Any) -> Any:
    """``broker`` itself, or the broker a :class:`DeferredBroker` stands for (made now)."""
    return broker.real() if isinstance(broker, DeferredBroker) else broker


def builtin_brokers() -> tuple[Any, ...]:
    """The brokers every host registers (through :meth:`Host.add_broker`, as an embedder
    would): ``abort``, ``log``, ``clock_now`` and ``random_bytes`` of ABI v1.0, and the
    brokers of v1.1 (``secret_hmac``, ``events_*``, ``file_*``, ``http_request``,
    ``storage_*``, ``jobs_*``), the latter as :class:`DeferredBroker`. An embedder replaces
    one by passing its own of the same name
    (``Host(brokers=[SecretsBroker(FileSecretStore(path))])``)."""
    from .clock import ClockBroker
    from .core import CoreBroker
    from .log import LogBroker
    from .random import RandomBroker

    return (
        CoreBroker(),
        LogBroker(),
        ClockBroker(),
        RandomBroker(),
        *(DeferredBroker(*row) for row in DEFERRED),
    )
