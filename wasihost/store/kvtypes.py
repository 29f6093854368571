"""The storage capability's bounds, namespaces, quotas and errors: what the broker needs to
check a request, without the SQLite store (:mod:`wasihost.store.kvstore`), which loads when an
extension first uses storage."""

from __future__ import annotations

from typing import Final

import attrs

DB_NAME: Final = "storage.sqlite3"
# The ABI's bounds (abi/v1/registry.json, storage_*): a key is a short name, not a document;
# 256 bytes holds a path-like key with room to spare and keeps one list page under 26 KiB.
MAX_KEY_BYTES: Final = 256
# 32 KiB per value: one request of the put entry (33,100 bytes) carries it with its key.
MAX_VALUE_BYTES: Final = 32 * 1024
# A prefix is a key or the start of one.
MAX_PREFIX_BYTES: Final = MAX_KEY_BYTES
# 100 keys of at most 256 bytes fit the list entry's 26,624-byte response.
MAX_PAGE_KEYS: Final = 100


class StoreError(Exception):
    """The database failed (disk full, I/O error, locked too long): the operation did nothing."""


class QuotaExceeded(Exception):
    """The write would take the namespace past its quota: nothing was written."""


@attrs.frozen
class Namespace:
    """Whose keys: an extension's, under a tenant (``""``: the extension's default one)."""

    extension: str
    tenant: str = ""


@attrs.frozen
class Quota:
    """The most a namespace may hold: key plus value bytes, and keys."""

    max_bytes: int
    max_objects: int


@attrs.frozen
class Usage:
    """What a namespace holds now."""

    bytes: int = 0
    objects: int = 0


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix`` (None: no
    bound), so a prefix scan is one index range."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
