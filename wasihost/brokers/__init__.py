"""Brokers: the host side of capabilities.

A broker never sees a guest pointer. The engine adapter has already checked bounds, the gate
and the payload limit, and decoded the request with the entry's CBOR bounds; a broker validates
the request's *shape*, does the work, and answers a value or raises
:class:`~wasihost.status.HostStatus`.
"""

from __future__ import annotations

from typing import Any


def builtin_brokers() -> tuple[Any, ...]:
    """The brokers every host registers (through :meth:`Host.add_broker`, as an embedder
    would): ``abort``, ``log``, ``clock_now`` and ``random_bytes`` of ABI v1.0, and the
    brokers of v1.1 (``secret_hmac``, ``events_*``, ``file_*``, ``http_request``,
    ``storage_*``, ``jobs_*``). An embedder replaces one by passing its own of the same name
    (``Host(brokers=[SecretsBroker(FileSecretStore(path))])``)."""
    from .clock import ClockBroker
    from .core import CoreBroker
    from .events import EventsBroker
    from .files import FilesBroker
    from .http import HttpBroker
    from .jobs import JobsBroker
    from .log import LogBroker
    from .random import RandomBroker
    from .secrets import SecretsBroker
    from .storage import StorageBroker

    return (
        CoreBroker(),
        LogBroker(),
        ClockBroker(),
        RandomBroker(),
        SecretsBroker(),
        EventsBroker(),
        FilesBroker(),
        HttpBroker(),
        StorageBroker(),
        JobsBroker(),
    )
