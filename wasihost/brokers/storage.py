"""The storage broker: ``storage_get``, ``storage_put``, ``storage_delete``, ``storage_list``
and ``storage_cas`` of ABI 1.1, on a :class:`~wasihost.store.kvstore.KVStore`.

The guest names keys, never a namespace: the namespace is the calling extension's id and the
tenant of the operator's ``storage`` grant scope (``{"tenant": "acme"}``), each its own column
in the store. A request is checked whole (types, sizes, control characters) before the store
is touched, and every write runs inside the grant table's commit, so nothing lands after a
revocation returns.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..core import limits
from ..core.budgets import Resource
from ..core.errors import ConfigError
from ..core.grants import GrantEntry
from ..core.status import HostStatus, Status
from ..store.kvtypes import (
    DB_NAME,
    MAX_KEY_BYTES,
    MAX_PAGE_KEYS,
    MAX_PREFIX_BYTES,
    MAX_VALUE_BYTES,
    Namespace,
    Quota,
    QuotaExceeded,
    StoreError,
)

if TYPE_CHECKING:
    from ..core.registry import HostFunction
    from ..core.serving import ExtensionView, HostView
    from ..store.kvstore import KVStore

LOG = logging.getLogger("wasihost")

CAPABILITY: Final = "storage"
# The file an update's checkpoint keeps this broker's entries of one extension in.
CHECKPOINT_NAME: Final = "storage.sqlite3"
OPERATIONS: Final = ("get", "put", "delete", "list", "cas")
# A tenant is a short label the operator picks (a customer, a workspace): lowercase so that
# two spellings never name two namespaces, at most 64 characters.
# Each key a storage_list page may hold (its limit, plus the one more that says whether a next
# page exists): read from the index, copied, decoded and encoded, about 1 to 1.5 us of host CPU each
# (benchmarks/bench_hostcall_prices.py). Charged for the whole page the guest asks for, before
# the query, so the page's price follows its limit rather than the fixed base price.
FUEL_PER_LISTED_KEY: Final = 2_000
TENANT_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
SCOPE_KEYS: Final = frozenset({"tenant", "max_bytes", "max_objects"})
# C0, DEL and C1: the control characters a key may not hold (a key is shown to operators,
# and NUL ends a string in many of the tools they use).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

Handler = Callable[[Any, Any], Any]


def _invalid() -> HostStatus:
    return HostStatus(Status.INVALID_ARGUMENT)


def _text(value: Any, minimum: int, maximum: int) -> bytes:
    """``value`` as UTF-8, if it is text of ``minimum..maximum`` bytes without control
    characters; INVALID_ARGUMENT otherwise."""
    # A character is at least one byte: a string longer than the limit in characters is
    # refused before it is scanned or encoded.
    if not isinstance(value, str) or len(value) > maximum or _CONTROL.search(value):
        raise _invalid()
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: not text
        raise _invalid() from None
    if not minimum <= len(raw) <= maximum:
        raise _invalid()
    return raw


def parse_key(value: Any) -> bytes:
    return _text(value, 1, MAX_KEY_BYTES)


def _value(value: Any, *, nullable: bool = False) -> bytes | None:
    if value is None and nullable:
        return None
    if not isinstance(value, bytes) or len(value) > MAX_VALUE_BYTES:
        raise _invalid()
    return value


def _array(request: Any, length: int) -> list[Any]:
    if not isinstance(request, list) or len(request) != length:
        raise _invalid()
    return request


def _limit(value: Any) -> int:
    if type(value) is not int or not 1 <= value <= MAX_PAGE_KEYS:
        raise _invalid()
    return value


def _quota_field(scope: Mapping[str, Any], name: str, bound: limits.ResourceBound) -> int | None:
    value = scope.get(name)
    if value is None:
        return None
    if type(value) is not int or not bound.minimum <= value <= bound.maximum:
        raise ConfigError(
            f"storage scope: {name} must be an integer in {bound.minimum}..{bound.maximum}"
        )
    return value


def parse_scope(scope: Mapping[str, Any]) -> tuple[str, int | None, int | None]:
    """A storage grant scope: (tenant, ``""`` for the default namespace; max_bytes,
    max_objects, each None when the scope does not lower it). ConfigError names a fault."""
    if not isinstance(scope, Mapping):
        raise ConfigError("storage scope must be a JSON object")
    unknown = sorted(set(scope) - SCOPE_KEYS)
    if unknown:
        raise ConfigError(f"storage scope: unknown keys {unknown} (known: {sorted(SCOPE_KEYS)})")
    tenant = scope.get("tenant")
    if tenant is not None and (
        not isinstance(tenant, str) or TENANT_PATTERN.fullmatch(tenant) is None
    ):
        raise ConfigError(
            "storage scope: tenant must be 1 to 64 of [a-z0-9._-], starting with a letter or digit"
        )
    bounds = limits.RESOURCE_BOUNDS
    return (
        tenant or "",
        _quota_field(scope, "max_bytes", bounds["storage_max_bytes"]),
        _quota_field(scope, "max_objects", bounds["storage_max_objects"]),
    )


class ExtensionStorage:
    """One extension's use of the store: where its keys live and how much they may take,
    read from its grant under the call's epoch."""

    def __init__(self, ext: ExtensionView, store: KVStore) -> None:
        self.ext = ext
        self.store = store
        # The grant entry the namespace was last parsed from, with what it says: entries are
        # immutable and replaced whole on every re-scope, so identity says whether to parse
        # again. One attribute, replaced whole: concurrent calls of a pooled extension read
        # and fill it, and two attributes stored one after the other let a call of a new
        # grant pair its entry with the tenant a stale call had just parsed (red-team 2026-12-01).
        self._parsed: tuple[GrantEntry | None, tuple[str, int | None, int | None]] = (
            None,
            ("", None, None),
        )

    def where(self) -> tuple[Namespace, Quota]:
        """The namespace and quota of the call in flight: those of the grant its epoch
        authorised (DENIED if the grant has moved on since, as the gate would answer)."""
        ext = self.ext
        grants = ext.host.grants
        state = grants.current(ext.id) or grants.state(ext.id)
        entry = state.entries.get(CAPABILITY)
        if entry is None or state.revoked is not None or state.epoch != ext.call_epoch:
            raise HostStatus(Status.DENIED)
        parsed = self._parsed
        if entry is not parsed[0]:
            try:
                parsed = (entry, parse_scope(entry.scope_value))
            except ConfigError as exc:
                # Refused when granted; a scope that fails now came from elsewhere (an edited
                # state file): fail closed rather than guess a namespace.
                LOG.warning("extension %s: storage grant scope refused: %s", ext.id, exc)
                raise HostStatus(Status.DENIED) from None
            self._parsed = parsed
        tenant, max_bytes, max_objects = parsed[1]
        resources = ext.resources
        quota = Quota(
            min(resources.storage_max_bytes, max_bytes)
            if max_bytes is not None
            else resources.storage_max_bytes,
            min(resources.storage_max_objects, max_objects)
            if max_objects is not None
            else resources.storage_max_objects,
        )
        return Namespace(ext.id, tenant), quota

    def commit(self, action: Callable[[], Any]) -> Any:
        """Run a write through the grant table: only if the call's epoch still authorises
        ``storage``, atomically with every grant change."""
        authorised, result = self.ext.commit(CAPABILITY, action)
        if not authorised:
            raise HostStatus(Status.DENIED)
        return result


def _serving(action: Callable[[], Any], state: ExtensionStorage | None = None) -> Any:
    """``action``'s answer, its failures as the guest's status; a write past the quota
    (``state`` given: a write) also reports the storage_bytes level to the governor."""
    try:
        return action()
    except QuotaExceeded:
        if state is not None:
            _quota_crossed(state)
        raise HostStatus(Status.QUOTA_EXCEEDED) from None
    except StoreError:
        LOG.exception("storage database failed")
        raise HostStatus(Status.UNAVAILABLE) from None


def _quota_crossed(state: ExtensionStorage) -> None:
    """budgets: the storage_bytes level refused a write; its action fires."""
    ext = state.ext
    try:
        namespace, quota = state.where()
        used = state.store.usage(namespace).bytes
    except (HostStatus, StoreError):
        return  # nothing to say it with: the refusal stands on its own
    ext.host.governor.level_crossed(
        ext,
        Resource.STORAGE_BYTES,
        used,
        quota.max_bytes,
        "a write over the storage quota was refused",
        in_call=True,
    )


def _get(state: ExtensionStorage) -> Handler:
    def handle(call: Any, request: Any) -> bytes:
        key = parse_key(request)
        ns, _ = state.where()
        value = _serving(lambda: state.store.get(ns, key))
        if value is None:
            raise HostStatus(Status.NOT_FOUND)
        return value  # type: ignore[no-any-return]

    return handle


def _put(state: ExtensionStorage) -> Handler:
    def handle(call: Any, request: Any) -> None:
        raw_key, raw_value = _array(request, 2)
        key = parse_key(raw_key)
        value = _value(raw_value)
        assert value is not None
        ns, quota = state.where()
        _serving(lambda: state.commit(lambda: state.store.put(ns, key, value, quota)), state)

    return handle


def _delete(state: ExtensionStorage) -> Handler:
    def handle(call: Any, request: Any) -> bool:
        key = parse_key(request)
        ns, _ = state.where()
        return bool(_serving(lambda: state.commit(lambda: state.store.delete(ns, key))))

    return handle


def _list(state: ExtensionStorage) -> Handler:
    def handle(call: Any, request: Any) -> list[Any]:
        raw_prefix, raw_after, raw_limit = _array(request, 3)
        prefix = _text(raw_prefix, 0, MAX_PREFIX_BYTES)
        after = None if raw_after is None else parse_key(raw_after)
        limit = _limit(raw_limit)
        ns, _ = state.where()
        call.charge((limit + 1) * FUEL_PER_LISTED_KEY)
        keys, cursor = _serving(lambda: state.store.list(ns, prefix, after, limit))
        # Keys went in as validated UTF-8, so they come out as text.
        return [
            [k.decode("utf-8") for k in keys],
            None if cursor is None else cursor.decode("utf-8"),
        ]

    return handle


def _cas(state: ExtensionStorage) -> Handler:
    def handle(call: Any, request: Any) -> bool:
        raw_key, raw_expected, raw_new = _array(request, 3)
        key = parse_key(raw_key)
        expected = _value(raw_expected, nullable=True)
        new = _value(raw_new, nullable=True)
        ns, quota = state.where()
        return bool(
            _serving(
                lambda: state.commit(lambda: state.store.cas(ns, key, expected, new, quota)),
                state,
            )
        )

    return handle


_HANDLERS: Final[Mapping[str, Callable[[ExtensionStorage], Handler]]] = {
    "storage_get": _get,
    "storage_put": _put,
    "storage_delete": _delete,
    "storage_list": _list,
    "storage_cas": _cas,
}


class StorageBroker:
    """Serves the ``storage_*`` entries from one SQLite database.

    Where the database lives, first that applies: ``store`` (an open
    :class:`~wasihost.store.kvstore.KVStore` the embedder owns and closes), ``path``, the host's
    state directory (``<state_dir>/storage.sqlite3``), or else memory. A database file is
    opened with the first extension that uses storage and closed with the last; an in-memory
    one lives until :meth:`shutdown` (which ``Host.close`` calls): its content is lost then.
    """

    name = "storage"
    functions = tuple(f"wasihost_v1.{name}" for name in _HANDLERS)
    capabilities = frozenset({CAPABILITY})

    def __init__(self, path: Path | str | None = None, *, store: KVStore | None = None) -> None:
        if path is not None and store is not None:
            raise ConfigError("StorageBroker takes a path or a store, not both")
        self._path = Path(path) if path is not None else None
        self._given = store
        self._store: KVStore | None = store
        self._users = 0
        self._lock = threading.Lock()

    @property
    def store(self) -> KVStore | None:
        """The database serving now (None while no extension has opened it)."""
        return self._store

    def _path_for(self, ext: ExtensionView) -> Path | None:
        if self._path is not None:
            return self._path
        state = ext.host.state
        return state.directory / DB_NAME if state is not None else None

    def open(self, ext: ExtensionView) -> ExtensionStorage:
        # SQLite loads with the first extension that uses storage, not with every host.
        from ..store.kvstore import KVStore

        with self._lock:
            store = self._store
            if store is None or store.closed:
                store = self._store = KVStore(self._path_for(ext))
            elif store is not self._given and store.path != self._path_for(ext):
                raise ConfigError(
                    f"this storage broker serves {store.path or 'memory'}: give each host its "
                    "own StorageBroker"
                )
            self._users += 1
            return ExtensionStorage(ext, store)

    def handler(self, entry: HostFunction, state: ExtensionStorage) -> Handler:
        return _HANDLERS[entry.name](state)

    def usage(self, state: ExtensionStorage) -> dict[str, int]:
        """budgets: the bytes the extension's namespace holds now (Extension.usage); nothing
        while its grant does not name one."""
        try:
            namespace, _ = state.where()
            return {"storage_bytes": state.store.usage(namespace).bytes}
        except (HostStatus, StoreError):
            return {}

    def close(self, state: ExtensionStorage) -> None:
        with self._lock:
            self._users -= 1
            store = self._store
            # A file outlives its connection; memory does not, so it stays open for the next
            # extension until the broker itself closes.
            if (
                self._users == 0
                and store is not None
                and store is not self._given
                and store.path is not None
            ):
                store.close()
                self._store = None

    def shutdown(self) -> None:
        """The host closes: close the database this broker opened (an in-memory one is
        lost). A store the embedder gave is left open."""
        with self._lock:
            store, self._store = self._store, self._given
            if store is not None and store is not self._given:
                store.close()

    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        parse_scope(scope)

    # -- update checkpoints (wasihost.host.updates) ------------------------------------------------

    def _store_for(self, host: HostView) -> tuple[KVStore | None, bool]:
        """The database that holds ``host``'s extensions' entries, and whether it was opened
        here (to be closed again); None for memory no extension has opened (nothing in it)."""
        from ..store.kvstore import KVStore

        with self._lock:
            store = self._store
            if store is not None and not store.closed:
                return store, False
        if self._path is not None:
            path: Path | None = self._path
        else:
            path = host.state.directory / DB_NAME if host.state is not None else None
        return (KVStore(path), True) if path is not None else (None, False)

    def checkpoint(self, host: HostView, extension: str, directory: Path) -> None:
        """Copy ``extension``'s entries (every tenant) into ``directory``."""
        directory.mkdir(parents=True, mode=0o700)
        store, opened = self._store_for(host)
        if store is None:
            return
        try:
            store.export(extension, directory / CHECKPOINT_NAME)
        finally:
            if opened:
                store.close()

    def restore(self, host: HostView, extension: str, directory: Path) -> None:
        """Make ``extension``'s entries those of the checkpoint in ``directory``."""
        saved = directory / CHECKPOINT_NAME
        store, opened = self._store_for(host)
        if store is None:
            return
        try:
            store.replace(extension, saved if saved.exists() else None)
        except StoreError as exc:
            # An operator's command (remove --purge, rollback): a refusal with its remedy.
            raise ConfigError(f"storage of {extension}: {exc}") from None
        finally:
            if opened:
                store.close()
