"""The files broker's configuration: named mounts, from the embedder and from grant scopes.

A guest names a mount, never a host path: the operator maps names to host directories in the
``files`` grant scope (``{"mounts": {"data": {"host": "/srv/data", "mode": "rw"}},
"max_write_bytes": N}``), and the embedder may give every extension some with
``FilesBroker(mounts=...)``. A scope is refused whole (``ConfigError``) unless every part of it
is understood: unknown keys, a relative host path, a mode other than ``r``/``rw``, a name the
embedder already uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..core.errors import ConfigError

# What a mount name may be: short, printable, no separator, so it can never be read as a path.
MOUNT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# A quota beyond a pebibyte is a typo, not a policy.
MAX_WRITE_QUOTA_BYTES: Final = 1 << 50
SCOPE_KEYS: Final = frozenset({"mounts", "max_write_bytes"})
MOUNT_KEYS: Final = frozenset({"host", "mode"})
MOUNT_MODES: Final = {"r": False, "rw": True}


@attrs.frozen
class FileMount:
    """A host directory a guest may open files under by name; read-only unless ``writable``."""

    host: Path = attrs.field(converter=Path)
    writable: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.host.is_absolute():
            raise ConfigError(f"files mount host path {str(self.host)!r} must be absolute")
        if "\0" in str(self.host):
            raise ConfigError("files mount host path contains a NUL character")


def check_mount_name(name: Any) -> str:
    if not isinstance(name, str) or not MOUNT_NAME.match(name):
        raise ConfigError(
            f"files mount name {name!r} must be 1..64 of [A-Za-z0-9_.-], starting with a letter "
            "or digit"
        )
    return name


def parse_mount(name: str, raw: Any) -> FileMount:
    """One mount of a scope or of the embedder's table: a :class:`FileMount`, or
    ``{"host": "/abs/dir", "mode": "r" | "rw"}`` (mode ``r`` by default)."""
    check_mount_name(name)
    if isinstance(raw, FileMount):
        return raw
    if not isinstance(raw, Mapping) or not set(raw) <= MOUNT_KEYS or "host" not in raw:
        raise ConfigError(f'files mount {name}: expected {{"host": "/abs/dir", "mode": "r"|"rw"}}')
    host, mode = raw["host"], raw.get("mode", "r")
    if not isinstance(host, str) or mode not in MOUNT_MODES:
        raise ConfigError(f'files mount {name}: host must be text and mode "r" or "rw"')
    return FileMount(Path(host), MOUNT_MODES[mode])


def parse_mounts(raw: Any) -> dict[str, FileMount]:
    if not isinstance(raw, Mapping):
        raise ConfigError("files mounts must map names to mounts")
    return {check_mount_name(name): parse_mount(name, value) for name, value in raw.items()}


def require_directories(mounts: Mapping[str, FileMount]) -> None:
    """An operator's typo is caught when the mount is configured, not at a guest's first open."""
    for name, mount in mounts.items():
        if not mount.host.is_dir():
            raise ConfigError(f"files mount {name}: {mount.host} is not a directory")


@attrs.frozen
class FilesScope:
    """What one extension's ``files`` grant scope says."""

    mounts: Mapping[str, FileMount] = attrs.field(factory=dict)
    max_write_bytes: int | None = None


def parse_scope(scope: Any) -> FilesScope:
    """The scope's meaning; ``ConfigError`` for anything not understood (fail closed)."""
    if not isinstance(scope, Mapping):
        raise ConfigError("a files grant scope must be a JSON object")
    unknown = sorted(set(scope) - SCOPE_KEYS)
    if unknown:
        raise ConfigError(f"files grant scope: unknown keys {', '.join(map(str, unknown))}")
    mounts = parse_mounts(scope.get("mounts", {}))
    quota = scope.get("max_write_bytes")
    if quota is not None and (
        isinstance(quota, bool)
        or not isinstance(quota, int)
        or not 0 <= quota <= MAX_WRITE_QUOTA_BYTES
    ):
        raise ConfigError(f"files max_write_bytes must be an integer in 0..{MAX_WRITE_QUOTA_BYTES}")
    return FilesScope(mounts, quota)
