"""Brokers: the host side of capabilities.

A broker never sees a guest pointer. The engine adapter has already checked bounds, the gate
and the payload limit, and decoded the request with the entry's CBOR bounds; a broker validates
the request's *shape*, does the work, and answers a value or raises
:class:`~wasihost.status.HostStatus`.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

# The built-in brokers most modules never use, with what the host needs to know of each before
# any extension uses it (the registry entries it serves and their capabilities): their modules
# (threads, sockets, the key-value store, the file code) are imported on first use. Each row
# equals its class's own attributes (tests/test_startup.py checks).
DEFERRED: tuple[tuple[str, str, str, tuple[str, ...], frozenset[str]], ...] = (
    ("secrets", "secrets", "SecretsBroker", ("wasihost_v1.secret_hmac",), frozenset({"secrets"})),
    (
        "events",
        "events",
        "EventsBroker",
        ("wasihost_v1.events_subscribe", "wasihost_v1.events_unsubscribe"),
        frozenset({"events"}),
    ),
    (
        "files",
        "files",
        "FilesBroker",
        (
            "wasihost_v1.file_open",
            "wasihost_v1.file_temp",
            "wasihost_v1.file_read",
            "wasihost_v1.file_write",
            "wasihost_v1.file_close",
        ),
        frozenset({"files"}),
    ),
    ("http", "http", "HttpBroker", ("wasihost_v1.http_request",), frozenset({"http"})),
    (
        "storage",
        "storage",
        "StorageBroker",
        (
            "wasihost_v1.storage_get",
            "wasihost_v1.storage_put",
            "wasihost_v1.storage_delete",
            "wasihost_v1.storage_list",
            "wasihost_v1.storage_cas",
        ),
        frozenset({"storage"}),
    ),
    (
        "jobs",
        "jobs",
        "JobsBroker",
        ("wasihost_v1.jobs_schedule", "wasihost_v1.jobs_cancel"),
        frozenset({"jobs"}),
    ),
)


class DeferredBroker:
    """A built-in broker made (its module imported, its class instantiated with no arguments)
    the first time anything but its name, entries and capabilities is asked of it. Until then
    it holds nothing: no extension has opened it, so there is nothing to quiesce, checkpoint
    or shut down (:meth:`loaded` tells; the host skips it then)."""

    def __init__(
        self, name: str, module: str, cls: str, functions: tuple[str, ...], caps: frozenset[str]
    ) -> None:
        self.name = name
        self.functions = functions
        self.capabilities = caps
        self.conventions = frozenset({"cbor"})  # every deferred built-in speaks cbor only
        self._where = (f"{__name__}.{module}", cls)
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
