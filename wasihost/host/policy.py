"""Host policy and the effective grant: what an extension may do is requested ∩ allowed.

Pure: no engine, no I/O. The embedder states a :class:`Policy`; a manifest (or, for a bare
module, the caller) requests capabilities; :func:`effective_grant` intersects them and refuses
admission when a required capability is not allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..core import limits
from ..core.budgets import BudgetPolicy
from ..core.errors import AdmissionError, ConfigError
from ..core.manifest import Resources

if TYPE_CHECKING:
    # Defined in the core, beside the grant table (``as``: exported from here, for mypy).
    from ..core.grants import Grant as Grant  # noqa: PLC0414

    # Types only: a policy without trust material must not load the signature code.
    from ..packaging.allowed_signers import AllowedSigners
    from ..packaging.revocation import Revocations
    from ..packaging.trust import TrustStore


def __getattr__(name: str) -> Any:
    # Grant is defined in wasihost.core.grants and exported here too. Read from there when
    # asked: every command's options build a Policy, and one that admits nothing (pack, sign,
    # abi) does not load the grant table with it.
    if name == "Grant":
        from ..core.grants import Grant

        return Grant
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Coarse by default: 1 ms is enough for timestamps in logs and too coarse for most cache
# timing attacks; an embedder that needs finer time grants it explicitly.
DEFAULT_CLOCK_RESOLUTION_NS = 1_000_000
# Finer than 1 µs buys a guest nothing but a better timer for side channels.
MIN_CLOCK_RESOLUTION_NS = 1_000
# A clock coarser than a minute is a broken clock.
MAX_CLOCK_RESOLUTION_NS = 60_000_000_000


def _capabilities(values: Iterable[str]) -> frozenset[str]:
    if isinstance(values, (str, bytes)):
        # A string would be read letter by letter (and bytes byte by byte, as ints).
        raise ConfigError("policy allow must be a collection of capability names, not a string")
    if isinstance(values, Mapping) or not isinstance(values, Iterable):
        raise ConfigError(
            f"policy allow must be a collection of capability names, not {type(values).__name__}"
        )
    names = frozenset(values)
    odd = sorted(repr(name) for name in names if not isinstance(name, str))
    if odd:
        # A non-string name matches no capability: it would sit in the policy granting nothing.
        raise ConfigError(f"policy allow holds names that are not strings: {', '.join(odd)}")
    return names


def _ceilings(value: Mapping[str, int]) -> Mapping[str, int]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"policy ceilings must be a mapping of resource name to int, not {type(value).__name__}"
        )
    if any(not isinstance(name, str) for name in value):
        raise ConfigError("policy ceilings are keyed by resource name (a string)")
    unknown = sorted(set(value) - set(limits.RESOURCE_BOUNDS))
    if unknown:
        raise ConfigError(f"unknown resource ceilings: {', '.join(unknown)}")
    for name, ceiling in value.items():
        bound = limits.RESOURCE_BOUNDS[name]
        if type(ceiling) is not int or not bound.minimum <= ceiling <= bound.maximum:
            raise ConfigError(
                f"resource ceiling {name}={ceiling!r} outside {bound.minimum}..{bound.maximum}"
            )
    return MappingProxyType(dict(value))


# Shopify Functions run untrusted merchant code in production with these limits: 11M
# instructions, 10 MB of memory, 128 kB of input, 20 kB of output, 1 kB of logs, no clocks and
# no randomness. A good starting point for a host that trusts its extensions least.
STRICT_CEILINGS: Mapping[str, int] = MappingProxyType(
    {
        "fuel_per_call": 11_000_000,
        "max_memory_bytes": 10 * 1024 * 1024,
        "max_input_bytes": 128 * 1024,
        "max_output_bytes": 20 * 1024,
        "max_log_bytes": 1024,
        "timeout_ms": 1000,
        # One instance per extension: least trust, least address space.
        "max_concurrency": 1,
    }
)


# The runtime modes an extension can run under (docs/process-runtime.md): in this process;
# in a walled child, falling back to this process only when no child can start (before any
# guest code ran, so nothing is ever replayed); or only in a walled child.
IN_PROCESS: Final = "in-process"
PREFER_PROCESS: Final = "prefer-process"
PROCESS_ONLY: Final = "process-only"
RUNTIME_MODES: Final = (IN_PROCESS, PREFER_PROCESS, PROCESS_ONLY)
# What the CLI's --runtime and the environment accept besides the modes themselves.
_RUNTIME_ALIASES: Final = {"process": PROCESS_ONLY, "in_process": IN_PROCESS}
# The default mode for extensions whose manifest does not ask for the process runtime, when
# neither the caller nor the policy says: an operator's switch (and the test suite's option).
RUNTIME_ENV: Final = "WASIHOST_RUNTIME"


def runtime_mode_of(text: object, where: str) -> str:
    """``text`` as a runtime mode, or a ConfigError naming the modes."""
    mode = _RUNTIME_ALIASES.get(text, text) if isinstance(text, str) else text
    if mode not in RUNTIME_MODES:
        raise ConfigError(
            f"{where}: runtime {text!r} is not one of {', '.join(RUNTIME_MODES)} "
            "(or 'process' for process-only)"
        )
    return str(mode)


def _runtime(value: object) -> str | None:
    return None if value is None else runtime_mode_of(value, "Policy")


@attrs.frozen
class Policy:
    """What the host is willing to grant, and how it shapes granted capabilities.

    ``ceilings`` caps an extension's resources field by field (a manifest or a caller may ask
    for less, never for more): the resource counterpart of requested ∩ allowed.

    ``trusted_publishers`` verifies signed ``.whpkg`` packages; with ``require_signed`` a
    package that no trusted publisher's key verified (unsigned archives, package directories,
    bare modules) is refused at admission.

    ``revocations`` names the signed revocation list checked at every admission (load,
    update, installed packages): a revoked package, or any package while the list is stale,
    unverifiable or rolled back, is refused (:class:`~wasihost.core.errors.RevocationError`).
    """

    allow: frozenset[str] = attrs.field(converter=_capabilities, factory=frozenset)
    clock_resolution_ns: int = DEFAULT_CLOCK_RESOLUTION_NS
    random_seed: bytes | None = None
    ceilings: Mapping[str, int] = attrs.field(
        converter=_ceilings, factory=dict, eq=False, hash=False
    )
    trusted_publishers: TrustStore | None = None
    require_signed: bool = False
    revocations: Revocations | None = None
    # Verifies again, at each start, the installed packages that an OpenSSH signature
    # verified at install.
    allowed_signers: AllowedSigners | None = None
    # budgets: the rate ceilings and the action each crossing fires (docs/budgets.md).
    budgets: BudgetPolicy = attrs.field(factory=BudgetPolicy)
    # Where extensions run (docs/process-runtime.md): "in-process", "prefer-process" or
    # "process-only"; None leaves it to each manifest (and the WASIHOST_RUNTIME variable).
    runtime: str | None = attrs.field(default=None, converter=_runtime)

    @classmethod
    def strict(cls, allow: Iterable[str] = ("log",)) -> Policy:
        """Least trust: Shopify Functions' production limits, logging only by default."""
        return cls(allow=frozenset(allow), ceilings=STRICT_CEILINGS)

    def cap(self, resources: Resources) -> Resources:
        """``resources`` with every field lowered to its ceiling."""
        changes = {
            name: ceiling
            for name, ceiling in self.ceilings.items()
            if getattr(resources, name) > ceiling
        }
        return attrs.evolve(resources, **changes) if changes else resources

    def __attrs_post_init__(self) -> None:
        # Every field is checked here, where the embedder made the mistake: a wrong type
        # otherwise surfaces later as an AttributeError inside an admission or a call.
        if isinstance(self.clock_resolution_ns, bool) or not isinstance(
            self.clock_resolution_ns, int
        ):
            raise ConfigError(
                "clock_resolution_ns must be an int of nanoseconds, "
                f"not {self.clock_resolution_ns!r}"
            )
        if not MIN_CLOCK_RESOLUTION_NS <= self.clock_resolution_ns <= MAX_CLOCK_RESOLUTION_NS:
            raise ConfigError(
                f"clock_resolution_ns {self.clock_resolution_ns} outside "
                f"{MIN_CLOCK_RESOLUTION_NS}..{MAX_CLOCK_RESOLUTION_NS}"
            )
        if self.random_seed is not None and (
            not isinstance(self.random_seed, bytes) or not 16 <= len(self.random_seed) <= 64
        ):
            raise ConfigError("random_seed must be 16 to 64 bytes (a bytes object)")
        if not isinstance(self.require_signed, bool):
            raise ConfigError(f"require_signed must be a bool, not {self.require_signed!r}")
        if not isinstance(self.budgets, BudgetPolicy):
            raise ConfigError(
                "budgets must be a wasihost.core.budgets.BudgetPolicy, "
                f"not {type(self.budgets).__name__}"
            )
        # The signature code is imported only for a policy that carries trust material.
        if self.trusted_publishers is not None:
            from ..packaging.trust import TrustStore

            _check_kind("trusted_publishers", self.trusted_publishers, TrustStore)
        if self.revocations is not None:
            from ..packaging.revocation import Revocations

            _check_kind("revocations", self.revocations, Revocations)
        if self.allowed_signers is not None:
            from ..packaging.allowed_signers import AllowedSigners

            _check_kind("allowed_signers", self.allowed_signers, AllowedSigners)
        if self.require_signed and self.trusted_publishers is None:
            raise ConfigError("require_signed needs trusted_publishers: nothing could verify")

    @classmethod
    def allowing(cls, capabilities: Iterable[str], **kwargs: object) -> Policy:
        return cls(allow=frozenset(capabilities), **kwargs)  # type: ignore[arg-type]


def _check_kind(name: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise ConfigError(
            f"policy {name} must be a {kind.__module__}.{kind.__name__}, "
            f"not {type(value).__name__}"
        )


def effective_grant(
    required: Iterable[str], optional: Iterable[str], policy: Policy, epoch: int = 0
) -> Grant:
    """Requested ∩ allowed; a denied required capability refuses admission."""
    from ..core.grants import Grant  # loaded with the host that admits; see __getattr__

    required = frozenset(required)
    optional = frozenset(optional)
    denied = sorted(required - policy.allow)
    if denied:
        raise AdmissionError(
            [f"required capability {c!r} is not allowed by the host policy" for c in denied]
        )
    return Grant(capabilities=(required | optional) & policy.allow, epoch=epoch)
