"""WASI options carried by grant scopes, so an operator's grant table can hold mounts, argv,
env and the clock profile, not only the embedder's code.

A scope is the JSON object stored with a grant (``wasihost grants grant EXT wasi.fs.read
--scope '{"mounts": [...]}'``). Each capability accepts its own keys, and anything else is
refused (fail closed). Scope values add to the embedder's :class:`WasiOptions`; where both set
the same thing, the embedder's value stands, and a conflicting env name is an error; a write
budget (``wasi.fs.write``'s ``max_write_bytes``) only ever lowers the embedder's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..core.errors import ConfigError
from .config import Mount, WasiOptions
from .registry import CAP_ARGS, CAP_CLOCK, CAP_ENV, CAP_FS_READ, CAP_FS_WRITE

SCOPE_KEYS: Mapping[str, frozenset[str]] = {
    CAP_FS_READ: frozenset({"mounts"}),
    CAP_FS_WRITE: frozenset({"max_write_bytes"}),
    CAP_ARGS: frozenset({"argv"}),
    CAP_ENV: frozenset({"env"}),
    CAP_CLOCK: frozenset({"profile"}),
}
MOUNT_KEYS = frozenset({"host", "guest", "writable"})


def check_scope(capability: str, scope: Mapping[str, Any]) -> None:
    """Refuse a scope this capability does not understand, before it is stored."""
    apply_scopes(WasiOptions(), {capability: scope})


def _mount(raw: Any) -> Mount:
    if (
        not isinstance(raw, Mapping)
        or not set(raw) <= MOUNT_KEYS
        or not {"host", "guest"} <= set(raw)
    ):
        raise ConfigError('a mount in a grant scope is {"host": path, "guest": path, "writable"?}')
    host, guest, writable = raw["host"], raw["guest"], raw.get("writable", False)
    if not isinstance(host, str) or not isinstance(guest, str) or not isinstance(writable, bool):
        raise ConfigError("mount host and guest must be text, writable a boolean")
    return Mount(Path(host), guest, writable)


def apply_scopes(options: WasiOptions, scopes: Mapping[str, Mapping[str, Any]]) -> WasiOptions:
    """``options`` with what the grant scopes add; raises ConfigError for a malformed scope."""
    changes: dict[str, Any] = {}
    for capability, scope in scopes.items():
        if not isinstance(scope, Mapping):
            raise ConfigError("a grant scope must be a JSON object")
        allowed = SCOPE_KEYS.get(capability)
        if allowed is None:
            if scope:
                raise ConfigError(f"grant scope of {capability} takes no keys")
            continue
        unknown = sorted(set(scope) - allowed)
        if unknown:
            raise ConfigError(f"grant scope of {capability}: unknown keys {', '.join(unknown)}")
        if "mounts" in scope:
            raw = scope["mounts"]
            if not isinstance(raw, list):
                raise ConfigError("grant scope mounts must be a list")
            changes["mounts"] = tuple(options.mounts) + tuple(_mount(m) for m in raw)
        if "argv" in scope and not options.argv:
            argv = scope["argv"]
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ConfigError("grant scope argv must be a list of text")
            changes["argv"] = tuple(argv)
        if "env" in scope:
            env = scope["env"]
            if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise ConfigError("grant scope env must map text to text")
            mine = dict(options.env)
            clash = sorted(k for k in env if k in mine and mine[k] != env[k])
            if clash:
                raise ConfigError(
                    f"grant scope env conflicts with the host's on {', '.join(clash)}"
                )
            changes["env"] = tuple({**env, **mine}.items())
        if "max_write_bytes" in scope:
            budget = scope["max_write_bytes"]
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise ConfigError("grant scope max_write_bytes must be a non-negative integer")
            # The operator's budget can only tighten the embedder's.
            changes["max_write_bytes"] = min(options.max_write_bytes, budget)
        if "profile" in scope and options.clock is None:
            changes["clock"] = scope["profile"]
    return attrs.evolve(options, **changes) if changes else options
