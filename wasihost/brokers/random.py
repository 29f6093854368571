"""The random broker: OS CSPRNG bytes, or a seeded deterministic stream for reproducible runs."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.serving import refuse_any_scope
from ..core.sources import SeededRandom
from ..core.status import HostStatus, Status

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView

# One call's worth; the registry's response limit (4099) is this plus CBOR framing.
MAX_RANDOM_BYTES_PER_CALL = 4096
# What an extension's stream key is derived under (with its id), so that no other use of the
# policy's seed derives the same key.
STREAM_LABEL = b"wasihost random_bytes stream\0"

# SeededRandom moved to core.sources (the WASI profile draws from it too); kept here by name.
__all__ = [
    "MAX_RANDOM_BYTES_PER_CALL",
    "STREAM_LABEL",
    "RandomBroker",
    "SeededRandom",
    "random_handler",
]


def random_handler(source: Callable[[int], bytes] = os.urandom) -> Callable[[Any, Any], Any]:
    """The ``random_bytes`` entry: ``uint n`` (0..4096) -> ``n`` bytes."""

    def handle(call: Any, request: Any) -> bytes:
        if (
            not isinstance(request, int)
            or isinstance(request, bool)
            or not 0 <= request <= MAX_RANDOM_BYTES_PER_CALL
        ):
            raise HostStatus(Status.INVALID_ARGUMENT)
        return source(request)

    return handle


class RandomBroker:
    """Serves ``random_bytes``: the OS CSPRNG, or with the policy's ``random_seed`` one seeded
    stream per extension, which continues across its restarts (a run reproduces as a whole)."""

    name = "random"
    functions = ("wasihost_v1.random_bytes",)
    capabilities = frozenset({"random"})


    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        refuse_any_scope(capability, scope)
    def open(self, ext: ExtensionView) -> Callable[[int], bytes]:
        seed = ext.host.policy.random_seed
        if seed is None:
            return os.urandom
        # Each extension's own key, derived from the seed and its id: still reproducible, but
        # one extension reading its stream learns nothing of another's (with the seed itself
        # as every extension's key, they all drew the same bytes).
        key = hmac.new(seed, STREAM_LABEL + ext.id.encode(), hashlib.sha256).digest()
        return SeededRandom(key)

    def handler(
        self, entry: HostFunction, state: Callable[[int], bytes]
    ) -> Callable[[Any, Any], Any]:
        return random_handler(state)

    def close(self, state: Callable[[int], bytes]) -> None:
        pass
