"""The key-value store behind the ``storage`` capability: SQLite, one namespace per
(extension, tenant), quotas kept in the same transaction as the data.

No engine, no guest: the broker (:mod:`wasihost.brokers.storage`) validates a guest's request
and hands this module bytes. Keys are kept as BLOBs, so SQLite orders them by their bytes, and
the namespace is two columns of its own: no key, however it is spelt, names another
extension's or another tenant's rows.

Every write is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction, in a WAL database with
``synchronous=FULL``: a process killed at any point leaves each value whole (old or new) and
the usage counters equal to the content.

A deleted value leaves no copy in the files: ``secure_delete`` zeroes the space a row gave up,
and :meth:`KVStore.replace` (a purge, a rollback) checkpoints the write-ahead log and truncates
it, which holds every value written since the last checkpoint. Without that, another host with
the database open kept the WAL, and a purged value in it, alive (red-team 2026-12-01).
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, TypeVar

from ..core.errors import ConfigError
from .kvtypes import (
    DB_NAME,
    MAX_KEY_BYTES,
    MAX_PAGE_KEYS,
    MAX_PREFIX_BYTES,
    MAX_VALUE_BYTES,
    Namespace,
    Quota,
    QuotaExceeded,
    StoreError,
    Usage,
    prefix_end,
)

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
# A second process on the same file (another host on the same state directory) holds the
# write lock for one short transaction; waiting longer than this means something is stuck.
BUSY_TIMEOUT_MS: Final = 5000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    extension TEXT NOT NULL, tenant TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (extension, tenant, key)
);
CREATE TABLE IF NOT EXISTS usage (
    extension TEXT NOT NULL, tenant TEXT NOT NULL,
    bytes INTEGER NOT NULL, objects INTEGER NOT NULL,
    PRIMARY KEY (extension, tenant)
);
"""


class KVStore:
    """One SQLite database of namespaced key-value entries: one connection, serialised by a
    lock (each operation is one short statement or transaction), usable from any thread.

    ``path=None`` is an in-memory database: it lives as long as this object and is lost at
    :meth:`close`."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            if path is None:
                self._db = sqlite3.connect(
                    ":memory:", check_same_thread=False, isolation_level=None
                )
            else:
                # Created private before SQLite opens it (its -wal and -shm files copy the mode).
                os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
                self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if mode != "wal":
                    raise ConfigError(f"storage database {path}: cannot use WAL (got {mode})")
                self._db.execute("PRAGMA synchronous=FULL")
            # Deleted rows are overwritten with zeros, not left in free space for a file read to
            # find (the purge's promise; the WAL is truncated by replace()).
            self._db.execute("PRAGMA secure_delete=ON")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                # OR IGNORE: another host opening the new database at once may have recorded it
                # since the read above (as in state.py).
                self._db.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                )
            elif row[0] != str(SCHEMA_VERSION):
                raise ConfigError(
                    f"storage database {path} has schema {row[0]}; this host reads {SCHEMA_VERSION}"
                )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"storage database {path}: {exc}") from None
        self.closed = False

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self._db.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self.closed:
                raise StoreError("the storage database is closed")
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise StoreError(str(exc)) from exc

    def _write(self, action: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``action`` as one transaction: all of it lands, or (on any exception, a quota
        refusal included) none of it."""
        with self._reading() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                result = action(db)
                db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (a full disk can); a failed COMMIT
                # leaves the transaction open, and the next write must not start inside it.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return result

    # -- reads ----------------------------------------------------------------------------

    def get(self, ns: Namespace, key: bytes) -> bytes | None:
        with self._reading() as db:
            row = db.execute(
                "SELECT value FROM entries WHERE extension=? AND tenant=? AND key=?",
                (ns.extension, ns.tenant, key),
            ).fetchone()
        return None if row is None else bytes(row[0])

    def list(
        self, ns: Namespace, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[builtins.list[bytes], bytes | None]:
        """Up to ``limit`` keys starting with ``prefix``, greater than ``after``, in byte
        order; and the cursor of the next page (None: this one is the last)."""
        if not 1 <= limit <= MAX_PAGE_KEYS:
            raise ValueError(f"limit {limit} outside 1..{MAX_PAGE_KEYS}")
        sql = "SELECT key FROM entries WHERE extension=? AND tenant=? AND key>=?"
        args: list[object] = [ns.extension, ns.tenant, prefix]
        end = prefix_end(prefix)
        if end is not None:
            sql += " AND key<?"
            args.append(end)
        if after is not None:
            sql += " AND key>?"
            args.append(after)
        sql += " ORDER BY key LIMIT ?"
        args.append(limit + 1)  # one more than asked says whether there is a next page
        with self._reading() as db:
            keys = [bytes(row[0]) for row in db.execute(sql, args)]
        if len(keys) > limit:
            return keys[:limit], keys[limit - 1]
        return keys, None

    def usage(self, ns: Namespace) -> Usage:
        with self._reading() as db:
            return _usage(db, ns)

    # -- writes ---------------------------------------------------------------------------

    def put(self, ns: Namespace, key: bytes, value: bytes, quota: Quota) -> None:
        """Store ``value`` under ``key``; :class:`QuotaExceeded` (nothing written) past
        ``quota``. A replacement counts only the difference."""
        self._write(lambda db: _put(db, ns, key, value, quota))

    def delete(self, ns: Namespace, key: bytes) -> bool:
        return self._write(lambda db: _delete(db, ns, key))

    def cas(
        self, ns: Namespace, key: bytes, expected: bytes | None, new: bytes | None, quota: Quota
    ) -> bool:
        """If the value under ``key`` is ``expected`` (None: absent), make it ``new`` (None:
        delete) and answer True; otherwise change nothing and answer False."""

        def swap(db: sqlite3.Connection) -> bool:
            if _value(db, ns, key) != expected:
                return False
            if new is None:
                _delete(db, ns, key)
            else:
                _put(db, ns, key, new, quota)
            return True

        return self._write(swap)

    # -- checkpoints ----------------------------------------------------------------------

    def export(self, extension: str, target: Path) -> None:
        """Copy every entry of ``extension`` (all its tenants) and their usage counters into a
        new database file ``target`` (an update's checkpoint)."""
        with self._reading() as db:
            db.execute("ATTACH DATABASE ? AS cp", (str(target),))
            try:
                db.execute(
                    "CREATE TABLE cp.entries AS SELECT * FROM entries WHERE extension=?",
                    (extension,),
                )
                db.execute(
                    "CREATE TABLE cp.usage AS SELECT * FROM usage WHERE extension=?", (extension,)
                )
            finally:
                db.execute("DETACH DATABASE cp")

    def replace(self, extension: str, source: Path | None) -> None:
        """Make ``extension``'s entries exactly those exported to ``source`` (None: none), in
        one transaction; then move the write-ahead log into the database and truncate it, so
        the values dropped are in neither file (another host holding the database open keeps
        the WAL from being removed at close). :class:`StoreError` if another process kept the
        log busy past the busy timeout: the entries are replaced, and the same call can be
        made again to drop the old copies."""
        with self._reading() as db:
            if source is not None:
                db.execute("ATTACH DATABASE ? AS cp", (str(source),))
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    for table in ("entries", "usage"):
                        db.execute(f"DELETE FROM {table} WHERE extension=?", (extension,))  # noqa: S608
                        if source is not None:
                            db.execute(
                                f"INSERT INTO {table} SELECT * FROM cp.{table} WHERE extension=?",  # noqa: S608
                                (extension,),
                            )
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            finally:
                if source is not None:
                    db.execute("DETACH DATABASE cp")
            if self.path is not None:
                busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:
                    raise StoreError(
                        f"{extension}'s entries were replaced, but another process kept the "
                        f"storage database {self.path} busy, so its write-ahead log may still "
                        "hold the old values: run the same command again"
                    )

    # -- checks ---------------------------------------------------------------------------

    def check(self) -> builtins.list[str]:
        """Problems with the database, for operators and tests: SQLite's integrity check,
        and every namespace whose usage counters differ from its content. Empty if sound."""
        with self._reading() as db:
            problems = [row[0] for row in db.execute("PRAGMA integrity_check") if row[0] != "ok"]
            actual = {
                (ext, tenant): (size, count)
                for ext, tenant, size, count in db.execute(
                    "SELECT extension, tenant, SUM(length(key) + length(value)), COUNT(*) "
                    "FROM entries GROUP BY extension, tenant"
                )
            }
            counted = {
                (ext, tenant): (size, count)
                for ext, tenant, size, count in db.execute(
                    "SELECT extension, tenant, bytes, objects FROM usage WHERE objects > 0 "
                    "OR bytes > 0"
                )
            }
        for ns in sorted(set(actual) | set(counted)):
            if actual.get(ns) != counted.get(ns):
                problems.append(
                    f"namespace {ns}: holds {actual.get(ns, (0, 0))} (bytes, keys), usage "
                    f"says {counted.get(ns, (0, 0))}"
                )
        return problems


def _value(db: sqlite3.Connection, ns: Namespace, key: bytes) -> bytes | None:
    row = db.execute(
        "SELECT value FROM entries WHERE extension=? AND tenant=? AND key=?",
        (ns.extension, ns.tenant, key),
    ).fetchone()
    return None if row is None else bytes(row[0])


def _usage(db: sqlite3.Connection, ns: Namespace) -> Usage:
    row = db.execute(
        "SELECT bytes, objects FROM usage WHERE extension=? AND tenant=?",
        (ns.extension, ns.tenant),
    ).fetchone()
    return Usage() if row is None else Usage(row[0], row[1])


def _count(db: sqlite3.Connection, ns: Namespace, size: int, objects: int) -> None:
    db.execute(
        "INSERT INTO usage VALUES (?, ?, ?, ?) ON CONFLICT (extension, tenant) DO UPDATE "
        "SET bytes = bytes + excluded.bytes, objects = objects + excluded.objects",
        (ns.extension, ns.tenant, size, objects),
    )


def _put(db: sqlite3.Connection, ns: Namespace, key: bytes, value: bytes, quota: Quota) -> None:
    row = db.execute(
        "SELECT length(value) FROM entries WHERE extension=? AND tenant=? AND key=?",
        (ns.extension, ns.tenant, key),
    ).fetchone()
    used = _usage(db, ns)
    size = len(value) - row[0] if row is not None else len(key) + len(value)
    objects = 0 if row is not None else 1
    # Only growth is refused: a namespace over a quota an operator lowered may still shrink.
    if (size > 0 and used.bytes + size > quota.max_bytes) or (
        objects and used.objects + objects > quota.max_objects
    ):
        raise QuotaExceeded
    db.execute(
        "INSERT INTO entries VALUES (?, ?, ?, ?) ON CONFLICT (extension, tenant, key) "
        "DO UPDATE SET value = excluded.value",
        (ns.extension, ns.tenant, key, value),
    )
    _count(db, ns, size, objects)


def _delete(db: sqlite3.Connection, ns: Namespace, key: bytes) -> bool:
    where = (ns.extension, ns.tenant, key)
    row = db.execute(
        "SELECT length(value) FROM entries WHERE extension=? AND tenant=? AND key=?", where
    ).fetchone()
    if row is None:
        return False
    db.execute("DELETE FROM entries WHERE extension=? AND tenant=? AND key=?", where)
    _count(db, ns, -(len(key) + row[0]), -1)
    return True


def stored_by(path: Path, extension: str) -> Usage:
    """What ``extension`` keeps in the storage database at ``path``, over all its tenants:
    (bytes, entries), as its quota counts them. Read-only: a missing file is nothing stored,
    and this never creates one. Raises StoreError when the file is not a readable storage
    database (``wasihost status`` says so rather than report 0)."""
    if not path.exists():
        return Usage()
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"storage database {path}: {exc}") from None
    try:
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        row = db.execute(
            "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(objects), 0) FROM usage "
            "WHERE extension=?",
            (extension,),
        ).fetchone()
    except sqlite3.Error as exc:
        raise StoreError(f"storage database {path}: {exc}") from None
    finally:
        db.close()
    return Usage(int(row[0]), int(row[1]))


__all__ = [
    "DB_NAME",
    "MAX_KEY_BYTES",
    "MAX_PAGE_KEYS",
    "MAX_PREFIX_BYTES",
    "MAX_VALUE_BYTES",
    "KVStore",
    "Namespace",
    "Quota",
    "QuotaExceeded",
    "StoreError",
    "Usage",
    "prefix_end",
    "stored_by",
]
