"""Host policy and the effective grant: what an extension may do is requested ∩ allowed.

Pure: no engine, no I/O. The embedder states a :class:`Policy`; a manifest (or, for a bare
module, the caller) requests capabilities; :func:`effective_grant` intersects them and refuses
admission when a required capability is not allowed.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .errors import AdmissionError, ConfigError
from .registry import CORE_CAPABILITY

# Coarse by default: 1 ms is enough for timestamps in logs and too coarse for most cache
# timing attacks; an embedder that needs finer time grants it explicitly.
DEFAULT_CLOCK_RESOLUTION_NS = 1_000_000
# Finer than 1 µs buys a guest nothing but a better timer for side channels.
MIN_CLOCK_RESOLUTION_NS = 1_000
# A clock coarser than a minute is a broken clock.
MAX_CLOCK_RESOLUTION_NS = 60_000_000_000


def _capabilities(values: Iterable[str]) -> frozenset[str]:
    if isinstance(values, str):
        raise ConfigError("policy allow must be a collection of capability names, not a string")
    return frozenset(values)


@attrs.frozen
class Policy:
    """What the host is willing to grant, and how it shapes granted capabilities."""

    allow: frozenset[str] = attrs.field(converter=_capabilities, factory=frozenset)
    clock_resolution_ns: int = DEFAULT_CLOCK_RESOLUTION_NS
    random_seed: bytes | None = None

    def __attrs_post_init__(self) -> None:
        if not MIN_CLOCK_RESOLUTION_NS <= self.clock_resolution_ns <= MAX_CLOCK_RESOLUTION_NS:
            raise ConfigError(
                f"clock_resolution_ns {self.clock_resolution_ns} outside "
                f"{MIN_CLOCK_RESOLUTION_NS}..{MAX_CLOCK_RESOLUTION_NS}"
            )
        if self.random_seed is not None and not 16 <= len(self.random_seed) <= 64:
            raise ConfigError("random_seed must be 16 to 64 bytes")

    @classmethod
    def allowing(cls, capabilities: Iterable[str], **kwargs: object) -> Policy:
        return cls(allow=frozenset(capabilities), **kwargs)  # type: ignore[arg-type]


@attrs.frozen
class Grant:
    """The capabilities an extension holds, at one grant epoch."""

    capabilities: frozenset[str]
    epoch: int = 0

    def allows(self, capability: str) -> bool:
        return capability == CORE_CAPABILITY or capability in self.capabilities


def effective_grant(
    required: Iterable[str], optional: Iterable[str], policy: Policy, epoch: int = 0
) -> Grant:
    """Requested ∩ allowed; a denied required capability refuses admission."""
    required = frozenset(required)
    optional = frozenset(optional)
    denied = sorted(required - policy.allow)
    if denied:
        raise AdmissionError(
            [f"required capability {c!r} is not allowed by the host policy" for c in denied]
        )
    return Grant(capabilities=(required | optional) & policy.allow, epoch=epoch)
