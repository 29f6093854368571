"""The registry a host serves unless it is given one: every ABI major this release ships, and
the WASI preview1 profile.

Here, in the host layer, not beside :class:`~wasihost.core.registry.Registry`: the core
describes registries and must not import a profile, while the default one names the WASI
profile (:mod:`wasihost.wasi.registry`). That profile is added deferred
(:class:`~wasihost.core.registry.DeferredProfile`): its table is made only when a guest imports
it or a listing needs every entry, so a run of a guest importing no WASI never loads it.
"""

from __future__ import annotations

from ..core.registry import SHIPPED_MAJORS, DeferredProfile, Profile, Registry, shipped_major

# What a registry knows of the WASI preview1 profile before its table (wasihost.wasi.registry)
# is built: the registry checks the table against them when it is made, and
# tests/test_startup.py checks them against the table.
WASI_PROFILE_NAME = "wasi"
WASI_IMPORT_MODULE = "wasi_snapshot_preview1"
WASI_CAPABILITIES = frozenset(
    {
        "wasi.args",
        "wasi.clock",
        "wasi.env",
        "wasi.fs.read",
        "wasi.fs.write",
        "wasi.random",
        "wasi.sockets",
        "wasi.stdio",
    }
)


def _wasi_profile() -> Profile:
    from ..wasi.registry import PROFILE  # the table, made when first needed

    return PROFILE


# One for every default registry, so that two of them compare equal, as with the table itself.
_WASI_DEFERRED = DeferredProfile(
    WASI_PROFILE_NAME, WASI_IMPORT_MODULE, WASI_CAPABILITIES, _wasi_profile
)


def default_registry() -> Registry:
    """A registry serving every ABI major this release ships, and the WASI preview1 profile
    (made when a guest imports it or a listing needs its entries)."""
    registry = Registry()
    for major in SHIPPED_MAJORS:
        registry.add_major(shipped_major(major))
    registry.add_profile(_WASI_DEFERRED)
    return registry
