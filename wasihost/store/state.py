"""Durable host state in one SQLite file under the state directory.

Installed packages, grants and their epochs, lifecycle states with their reasons, and a bounded
journal of runtime events (starts, crashes, revocations). A host restarted on the same
directory rebuilds from here; a grant revoked before the restart stays revoked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from ..core.errors import AdmissionError, ConfigError, PackageError
from ..core.grants import GrantEntry, GrantState
from ..core.manifest import check_extension_id, is_version
from .dirtrust import UntrustedDir, open_trusted_dir
from .statedir import UnsafeStateDir, own_dir_problem, resolve_state_dir

DB_NAME = "state.sqlite3"
SCHEMA_VERSION = 3
# Hosts keep their latest operator metrics here (wasihost.supervisor.opmetrics); a state directory
# shared
# by an application and many short CLI runs keeps the 16 most recent, enough to find the live
# ones, and the table never grows with the runs.
MAX_METRICS_SNAPSHOTS = 16
# Events are for "what happened lately"; the journal keeps the last 1000 per extension so a
# crash-looping guest cannot fill the disk.
MAX_EVENTS_PER_EXTENSION = 1000
# An event's detail is one line for a human.
MAX_EVENT_DETAIL_CHARS = 500
# The high-water key of grant epochs deleted with a purged extension: a later grant of any id
# is drawn above them (grants.py), so a re-installed id never repeats an epoch it had.
GRANT_EPOCH_KEY = "grant_epoch"
# Ids per query when the grant epochs of many extensions are read at once (Host.sync_grants):
# below the 999 parameters of older SQLite builds.
GRANT_EPOCHS_BATCH = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS packages (
    id TEXT PRIMARY KEY, version TEXT NOT NULL, sha256 TEXT NOT NULL,
    path TEXT NOT NULL, installed_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS package_records (
    id TEXT PRIMARY KEY, record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS publisher_pins (
    extension TEXT PRIMARY KEY, publisher TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS grant_epochs (
    extension TEXT PRIMARY KEY, epoch INTEGER NOT NULL, revoked TEXT
);
CREATE TABLE IF NOT EXISTS grants (
    extension TEXT NOT NULL, capability TEXT NOT NULL, scope TEXT NOT NULL,
    since_epoch INTEGER NOT NULL, PRIMARY KEY (extension, capability)
);
CREATE TABLE IF NOT EXISTS lifecycle (
    extension TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT, updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, extension TEXT NOT NULL, kind TEXT NOT NULL,
    detail TEXT NOT NULL, at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_extension ON events (extension, id);
CREATE TABLE IF NOT EXISTS metrics_snapshots (
    host TEXT PRIMARY KEY, pid INTEGER NOT NULL, snapshot TEXT NOT NULL,
    published_at INTEGER NOT NULL, closed INTEGER NOT NULL
);
"""


# The tables every schema had since the first: a database without one of them is damaged.
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIRST_TABLES = frozenset({"meta", "packages", "grant_epochs", "grants", "lifecycle", "events"})


def _damaged(database: Path, what: str) -> ConfigError:
    return ConfigError(
        f"state database {database}: {what}; the state directory is damaged: restore it from a "
        "backup"
    )


def _stored_int(database: Path, value: Any, what: str) -> int:
    """An epoch or counter read from the state database: SQLite keeps whatever was written
    (a hand edit's 'x' too), and it was an internal error (exit 70) at the first ``int()``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,30}", value):
        return int(value)
    raise _damaged(database, f"{what} holds {value!r}, not a whole number")


def _stored_grant(database: Path, extension: str, row: Any) -> GrantEntry:
    """A row of the grants table, as ``save_grants`` writes it: a capability name, a scope
    that is a JSON object, the epoch it was held since."""
    capability, scope, since = row
    try:
        ok = isinstance(capability, str) and isinstance(json.loads(scope), dict)
    except (TypeError, ValueError, RecursionError):
        ok = False
    if not ok:
        raise _damaged(database, f"a grant of {extension} is {capability!r} with scope {scope!r}")
    return GrantEntry(capability, scope, _stored_int(database, since, f"a grant of {extension}"))


def _raise_in(db: sqlite3.Connection, database: Path, key: str, value: int) -> None:
    """In a transaction: record ``value`` under high-water ``key`` unless a higher one is."""
    row = db.execute("SELECT value FROM meta WHERE key=?", (f"hw:{key}",)).fetchone()
    if row is None or _stored_int(database, row[0], f"meta hw:{key}") < value:
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"hw:{key}", str(value)))


def _installed(directory: Path, row: Any, record: Any) -> InstalledPackage | None:
    if row is None:
        return None
    try:
        if record is not None:
            found = InstalledPackage.from_record(row[0], json.loads(record[0]), directory)
            if found.version == row[1] and found.sha256 == row[2]:
                return found
        # A row of schema 1 (no record), or one a later host than the record wrote.
        if (
            not all(isinstance(v, str) for v in row[:4])
            or not isinstance(row[4], int)
            or not is_version(row[1])
        ):
            raise ValueError(f"its row is {tuple(row)!r}")
        path = record_path(directory, row[0], PACKAGES_DIR_NAME, row[3])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ConfigError(
            f"state database {directory / DB_NAME}: the install record of {row[0]!r} cannot "
            f"be read ({exc}); the state directory is damaged: restore it from a backup"
        ) from None
    return InstalledPackage(row[0], row[1], row[2], path, row[4])


PACKAGES_DIR_NAME = "packages"
CHECKPOINTS_DIR_NAME = "checkpoints"
DATA_DIR_NAME = "data"
# The directories the host makes in a state directory as it needs them (presence.LOCKS_DIR_NAME
# is "locks"), and in each but data/ one per extension: a file or link in the place of one is
# damage, refused by name (it was an internal error, exit 70, at the first write under it).
# data/ and data/<id> may be links to a directory (data kept on another disk).
_OWN_DIRS = (PACKAGES_DIR_NAME, CHECKPOINTS_DIR_NAME, "locks")


def record_path(directory: Path, extension: str, kind: str, text: str) -> Path:
    """The tree or checkpoint that a record of the state in ``directory`` names: a directory
    ``<kind>/<id>/<name>`` of it, kept relative so that a copied or moved state directory
    uses its own, never the old location's. A record written before names were relative
    holds an absolute path: its last three components are taken, for the same reason.
    Anything else is a ``ConfigError``: the state directory is damaged."""
    parts = PurePosixPath(text).parts
    if parts[:1] == ("/",):
        parts = parts[-3:]
    if len(parts) != 3 or parts[:2] != (kind, extension) or parts[2] in (".", ".."):
        raise ConfigError(
            f"state database {directory / DB_NAME}: a record of {extension} names {text!r}, "
            f"not a directory of {kind}/{extension}/; the state directory is damaged (restore "
            "it from a backup, or remove the extension and install it again)"
        )
    return directory.joinpath(*parts)


def relative_name(directory: Path, path: Path) -> str:
    """How a record names ``path``, a tree or checkpoint of the state in ``directory``."""
    return path.relative_to(directory).as_posix()


def make_read_only(tree: Path) -> None:
    """Files 0444 and directories 0555, deepest first."""
    for path in sorted(tree.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if not path.is_symlink():
            path.chmod(0o555 if path.is_dir() else 0o444)
    tree.chmod(0o555)


def sync_tree(tree: Path) -> None:
    """fsync every regular file and directory under ``tree`` (``tree`` included), and the
    directory holding it: what a later step records as written (an install record, the marker
    of an update's checkpoint) must not outlive it in a power cut. (A killed process loses
    nothing the kernel has; this is for the machine going down.)"""
    for path in [*tree.rglob("*"), tree, tree.parent]:
        if not path.is_symlink() and (path.is_dir() or path.is_file()):
            fsync_path(path)


def fsync_path(path: Path) -> None:
    """fsync one file or directory (a directory: the names in it, after a rename)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(tree: Path) -> None:
    """Remove ``tree`` even where it was made read-only (no error if it is absent). A file
    or link is unlinked (a temporary file a killed host left among the trees)."""
    if not tree.exists() and not tree.is_symlink():
        return
    if tree.is_symlink() or not tree.is_dir():
        with contextlib.suppress(OSError):  # as rmtree's ignore_errors below
            tree.unlink(missing_ok=True)
        return
    for path in [tree, *tree.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o700)
    shutil.rmtree(tree, ignore_errors=True)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "wasihost"


@attrs.frozen
class InstalledPackage:
    """The active install of an extension, and the one it replaced (kept for a rollback).

    ``package_digest`` and ``signer`` are set for an installed ``.whpkg``: what the signature
    vouched for at install, checked again at every start. ``content_digest`` is set for an
    unsigned install (a package directory): the SHA-256 of the content record
    (``packaging/contents``) of its manifest and module, checked again at every start; the
    module's digest alone let another manifest (other commands, limits) run as the same
    install. ``checkpoint`` is the state copy
    taken before the update that installed this version (what a rollback restores)."""

    id: str
    version: str
    sha256: str
    path: Path
    installed_at: int
    package_digest: str | None = None
    signer: str | None = None
    verified_by: str | None = None
    checkpoint: Path | None = None
    migrated: bool = False
    previous: InstalledPackage | None = None
    content_digest: str | None = None

    def to_record(self, directory: Path) -> dict[str, Any]:
        """The JSON of the record, its paths relative to the state in ``directory``."""
        return {
            "version": self.version,
            "sha256": self.sha256,
            "path": relative_name(directory, self.path),
            "installed_at": self.installed_at,
            "package_digest": self.package_digest,
            "signer": self.signer,
            "verified_by": self.verified_by,
            "checkpoint": (
                relative_name(directory, self.checkpoint) if self.checkpoint is not None else None
            ),
            "migrated": self.migrated,
            "previous": self.previous.to_record(directory) if self.previous is not None else None,
            "content_digest": self.content_digest,
        }

    @classmethod
    def from_record(
        cls, extension: str, record: dict[str, Any], directory: Path, *, nested: bool = False
    ) -> InstalledPackage:
        """The record as :meth:`to_record` wrote it; a ``ValueError`` naming the field that is
        not (a hand-edited or damaged record: a digest that is a number failed at the next
        start as an internal error, and a ``previous`` nested thousands deep at the read).
        A record's ``previous`` holds none of its own (activate and rollback drop it)."""
        if not isinstance(record, dict):
            raise ValueError(f"the record is {type(record).__name__}, not an object")

        def text(key: str, *, optional: bool = False) -> Any:
            value = record.get(key)
            if isinstance(value, str) or (optional and value is None):
                return value
            raise ValueError(f"{key} is {value!r}")

        installed_at = record.get("installed_at")
        if not isinstance(installed_at, int) or isinstance(installed_at, bool):
            raise ValueError(f"installed_at is {installed_at!r}")
        migrated = record.get("migrated", False)
        if not isinstance(migrated, bool):
            raise ValueError(f"migrated is {migrated!r}")
        previous = record.get("previous")
        if previous is not None and (nested or not isinstance(previous, dict)):
            raise ValueError("previous is " + ("nested" if nested else repr(previous)))
        checkpoint = text("checkpoint", optional=True)
        version, sha256 = text("version"), text("sha256")
        if not is_version(version):  # it names checkpoints: '../../x' named one outside
            raise ValueError(f"version is {version!r}, not a SemVer version")
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"sha256 is {sha256!r}")
        return cls(
            id=extension,
            version=version,
            sha256=sha256,
            path=record_path(directory, extension, PACKAGES_DIR_NAME, text("path")),
            installed_at=installed_at,
            package_digest=text("package_digest", optional=True),
            signer=text("signer", optional=True),
            verified_by=text("verified_by", optional=True),
            checkpoint=(
                record_path(directory, extension, CHECKPOINTS_DIR_NAME, checkpoint)
                if checkpoint
                else None
            ),
            migrated=migrated,
            previous=(
                cls.from_record(extension, previous, directory, nested=True)
                if previous
                else None
            ),
            content_digest=text("content_digest", optional=True),
        )


@attrs.frozen
class EventRecord:
    kind: str
    detail: str
    at: int


@attrs.frozen
class MetricsSnapshot:
    """One host's latest published metrics (``published_at`` in ns since the epoch)."""

    host: str
    pid: int
    snapshot: dict[str, Any]
    published_at: int
    closed: bool


class StateStore:
    """The SQLite state file; one connection, serialised by a lock (calls are short)."""

    def __init__(self, directory: Path) -> None:
        try:
            # Resolved once (made if missing) and checked: every path the host makes, and
            # every record it keeps, is relative to this resolved directory.
            directory = resolve_state_dir(directory)
        except UnsafeStateDir as exc:
            raise ConfigError(f"state directory refused: {exc}") from None
        self.directory = directory
        self._database = directory / DB_NAME
        for name in _OWN_DIRS:
            self._own_dir(directory / name)
        self._own_dir(directory / DATA_DIR_NAME, links=True)
        self._lock = threading.Lock()
        # What the host made here besides the database: it made the database first, so with
        # any of them a missing database is not a new state but a lost one.
        made = [n for n in (*_OWN_DIRS, DATA_DIR_NAME) if os.path.lexists(directory / n)]
        database = directory / DB_NAME
        if not os.path.lexists(database):
            if made:
                raise self._lost_database(made)
            self._create_database(database)
        try:
            # The database appears only whole (_create_database): one that is empty, or
            # without a table every schema had, is damage, also in a state directory that
            # holds nothing else (one the CLI keeps the revocation list's floor in).
            self._db = sqlite3.connect(database, check_same_thread=False, isolation_level=None)
            tables = {
                r[0]
                for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            missing = sorted(_FIRST_TABLES - tables)
            if missing:
                self._db.close()
                raise self._lost_database(made, missing=missing)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is not None and row[0] in ("1", "2"):
                # Schema 2 only adds the package_records table, schema 3 the metrics_snapshots
                # table (both created above): the install records of schema 1 are still whole,
                # without signer or history, and no host had published metrics.
                self._db.execute(
                    "UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),)
                )
            elif row is None:
                # A database an older host made in place and left before it recorded the
                # schema (a new one is made whole now). OR IGNORE: another host opening it at
                # once may have recorded it since the read above.
                self._db.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
                )
            elif row[0] != str(SCHEMA_VERSION):
                raise ConfigError(
                    f"state directory {directory} has schema {row[0]}; "
                    f"this host reads {SCHEMA_VERSION}"
                )
        except sqlite3.Error as exc:
            raise self._db_error(exc) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _lost_database(self, made: list[str], missing: list[str] | None = None) -> ConfigError:
        """A state directory whose database is missing though the host made ``made`` in it,
        or is empty or without its tables (``missing``): opened as a new state, it silently
        lost the grants, the whole-extension revocations and the revocation list's version
        floor."""
        if missing is None:
            what = "missing"
        elif len(missing) == len(_FIRST_TABLES):
            what = "empty"
        else:
            what = f"without its tables {', '.join(missing)}"
        held = f", but it holds {', '.join(f'{n}/' for n in made)}" if made else ""
        return ConfigError(
            f"state directory {self.directory} is damaged: its database {DB_NAME} is {what}"
            f"{held} (its grants, revocations and revocation-list floor would be lost): "
            "restore the database from a backup, or move the directory away to start a new "
            "state"
        )

    @staticmethod
    def _create_database(database: Path) -> None:
        """Make a new state database whole beside ``database`` and link it into place: a
        database file is never seen empty or half made, so one that is (truncated, its
        tables dropped) is damage, not a new state. A host that loses the race to another
        making it at once uses the other's."""
        tmp = database.with_name(f".{database.name}.{os.getpid()}.{time.time_ns()}.new")
        try:
            made = sqlite3.connect(tmp, isolation_level=None)
            try:
                made.execute("PRAGMA journal_mode=WAL")
                made.executescript(_SCHEMA)
                made.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            finally:
                made.close()  # the last connection: its log is checkpointed into the file
            fsync_path(tmp)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, database)
            fsync_path(database.parent)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot create the state database {database}: {exc}") from None
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    os.unlink(f"{tmp}{suffix}")

    def _own_dir(self, path: Path, *, links: bool = False) -> Path:
        """``path``, a directory the host makes under the state directory; a ``ConfigError``
        if something else is in its place (with ``links``, a link to a directory is one)."""
        try:
            st = os.stat(path, follow_symlinks=links)
        except FileNotFoundError:
            return path
        except OSError as exc:
            raise ConfigError(
                f"state directory {self.directory} is damaged: {path}: {exc.strerror}"
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            kind = (
                "a symbolic link"
                if stat.S_ISLNK(st.st_mode)
                else "a file" if stat.S_ISREG(st.st_mode) else "not a directory"
            )
            raise ConfigError(
                f"state directory {self.directory} is damaged: {path} is {kind}, where the host "
                "keeps a directory; move it away, or restore the state directory from a backup"
            )
        return path

    def _db_error(self, exc: sqlite3.Error) -> ConfigError:
        """What a failed statement on the state database is: a ``config`` error naming the
        file (a corrupt page was an internal error, exit 70, at the first read of it)."""
        what = f"state database {self.directory / DB_NAME}: {exc}"
        if type(exc) is sqlite3.DatabaseError:  # "database disk image is malformed", ...
            what += "; the state directory is damaged: restore it from a backup"
        return ConfigError(what)

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, for statements outside a transaction."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise self._db_error(exc) from None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._db_error(exc) from None

    # -- counters that only go up ----------------------------------------------------------

    def high_water(self, key: str) -> int:
        """The highest value recorded under ``key`` (0 when none was)."""
        with self._reading() as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (f"hw:{key}",)).fetchone()
        return _stored_int(self._database, row[0], f"meta hw:{key}") if row is not None else 0

    def raise_high_water(self, key: str, value: int) -> None:
        """Record ``value`` under ``key`` unless a higher one is recorded (atomically)."""
        with self._tx() as db:
            _raise_in(db, self._database, key, value)

    # -- packages ---------------------------------------------------------------------------

    @property
    def packages_dir(self) -> Path:
        return self.directory / PACKAGES_DIR_NAME

    # Each path below is made of an id checked first (check_extension_id): an id is a name in
    # these directories, and '..' or 'a/b' named a directory beside them (a purge of '..'
    # emptied the state directory).

    def package_dir(self, extension: str) -> Path:
        """``packages/<id>``: the trees of ``extension``'s installs."""
        return self._own_dir(self.packages_dir / check_extension_id(extension))

    def data_dir(self, extension: str) -> Path:
        data = self.directory / DATA_DIR_NAME / check_extension_id(extension)
        return self._own_dir(data, links=True)

    @property
    def checkpoints_dir(self) -> Path:
        return self.directory / CHECKPOINTS_DIR_NAME

    def checkpoint_dir(self, extension: str) -> Path:
        """``checkpoints/<id>``: ``extension``'s checkpoints and its pending-update marker."""
        return self._own_dir(self.checkpoints_dir / check_extension_id(extension))

    def write_tree(
        self, extension: str, version: str, digest: str, files: dict[str, bytes]
    ) -> Path:
        """Write a package's files into a new read-only directory of the state directory
        (``packages/<id>/<version>-<digest prefix>``): nothing the runtime does writes to an
        installed tree, and every start re-verifies it."""
        target = self.package_dir(extension) / f"{version}-{digest[:12]}"
        if target.exists() or target.is_symlink():
            # The same release installed again (or kept for a rollback): the tree an install
            # record may name is never deleted to make room, since a host killed between that
            # and the rename below left the record naming nothing. A fresh name instead; the
            # tree no record keeps any more is pruned after the switch.
            target = target.with_name(f"{target.name}-{time.time_ns()}")
        tmp = target.with_name(f".{target.name}.installing")
        remove_tree(tmp)
        tmp.mkdir(parents=True, mode=0o700)
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # a module in a subfolder
            (tmp / name).write_bytes(data)
        sync_tree(tmp)
        tmp.rename(target)
        make_read_only(target)
        fsync_path(target.parent)  # the rename, before a record names the tree
        return target

    def activate(self, package: InstalledPackage) -> None:
        """Make ``package`` the installed version of its extension (its ``previous`` is what
        a rollback returns to), in one transaction."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO packages VALUES (?, ?, ?, ?, ?)",
                (
                    package.id,
                    package.version,
                    package.sha256,
                    relative_name(self.directory, package.path),
                    package.installed_at,
                ),
            )
            db.execute(
                "INSERT OR REPLACE INTO package_records VALUES (?, ?)",
                (package.id, json.dumps(package.to_record(self.directory), sort_keys=True)),
            )
            # The id's grants and data now belong to this package's publisher (none: the
            # package is unverified, and so was what it replaced or adopted).
            if package.signer is not None:
                db.execute(
                    "INSERT OR REPLACE INTO publisher_pins VALUES (?, ?)",
                    (package.id, package.signer),
                )
            else:
                db.execute("DELETE FROM publisher_pins WHERE extension=?", (package.id,))
        detail = f"{package.version} sha256 {package.sha256[:16]}"
        if package.signer is not None:
            detail += f" signed by {package.signer}"
        self.record_event(package.id, "installed", detail)

    def package(self, extension: str) -> InstalledPackage | None:
        with self._reading() as db:
            row = db.execute(
                "SELECT id, version, sha256, path, installed_at FROM packages WHERE id=?",
                (extension,),
            ).fetchone()
            record = db.execute(
                "SELECT record FROM package_records WHERE id=?", (extension,)
            ).fetchone()
        found = _installed(self.directory, row, record)
        if found is not None:
            self.package_dir(extension)  # a file in its place is damage, said as such
        return found

    def packages(self) -> list[InstalledPackage]:
        with self._reading() as db:
            rows = db.execute(
                "SELECT id, version, sha256, path, installed_at FROM packages ORDER BY id"
            ).fetchall()
            records = dict(db.execute("SELECT id, record FROM package_records").fetchall())
        found = [
            _installed(self.directory, r, (records[r[0]],) if r[0] in records else None)
            for r in rows
        ]
        return [p for p in found if p is not None]

    def package_rows(self) -> list[tuple[str, Any, Any]]:
        """The id, version and module digest of every installed extension, as the packages
        table holds them, whatever its install record holds (``revoke_installed`` matches
        one whose record is damaged by these); an id that is no text is skipped."""
        with self._reading() as db:
            rows = db.execute("SELECT id, version, sha256 FROM packages ORDER BY id").fetchall()
        return [(r[0], r[1], r[2]) for r in rows if isinstance(r[0], str)]

    def remove(self, extension: str, *, purge: bool) -> None:
        """Forget a package; with ``purge`` also its data, grants history and journal.

        ``purge`` also serves an id no longer installed (removed without it before, or granted
        before its install) whose records remain: what ``wasihost status`` shows as kept must
        be removable. An id the state knows nothing of is refused, so a typo is not silent.

        The trees go before the records, and a purge's data directory (which :meth:`keeps`
        sees) after them: a host killed on the way leaves something by which the same
        ``remove`` finds the id again and completes (``wasihost.host.updates.remove`` holds the
        extension's transaction lock around it)."""
        self.check_removable(extension, purge=purge)
        installed = self.package(extension)
        remove_tree(self.package_dir(extension))
        remove_tree(self.checkpoint_dir(extension))
        with self._tx() as db:
            if not purge and installed is not None and installed.signer is not None:
                # The publisher pin outlives the install record: the grants, data and storage
                # rows kept for the id are its publisher's, and a package of another publisher
                # gets them only by `--adopt-data` (or after a purge). Written here as well as
                # by activate, for a record activated before pins were kept.
                db.execute(
                    "INSERT OR REPLACE INTO publisher_pins VALUES (?, ?)",
                    (extension, installed.signer),
                )
            db.execute("DELETE FROM packages WHERE id=?", (extension,))
            db.execute("DELETE FROM package_records WHERE id=?", (extension,))
            if purge:
                # The purged epoch stays the floor of every later one (highest_grant_epoch).
                row = db.execute(
                    "SELECT epoch FROM grant_epochs WHERE extension=?", (extension,)
                ).fetchone()
                if row is not None:
                    epoch = _stored_int(self._database, row[0], f"the grant epoch of {extension}")
                    _raise_in(db, self._database, GRANT_EPOCH_KEY, epoch)
                for table in ("grants", "grant_epochs", "lifecycle", "events", "publisher_pins"):
                    db.execute(f"DELETE FROM {table} WHERE extension=?", (extension,))  # noqa: S608
        if purge:
            self._purge_data(extension)

    def _purge_data(self, extension: str) -> None:
        """Delete ``extension``'s data, and ``data/<id>`` with it (a link too): see
        :meth:`clear_data`."""
        self.clear_data(extension, keep_link=False)

    def clear_data(self, extension: str, *, keep_link: bool) -> Path:
        """Delete ``extension``'s data, and return where its data now goes. Where
        ``data/<id>`` is a link (data kept on another disk), everything in the directory it
        leads to is deleted, and the link kept (``keep_link``: a checkpoint is restored
        into that directory) or unlinked; else ``data/<id>`` is removed.

        A purge removed the data directory with errors ignored, and a link cannot be
        removed so: the data stayed where the link led, reported removed, and the id's next
        package, any publisher's since the pin went with the purge, was given it. A restored
        checkpoint replaced the link by a local copy, leaving the data where it led for no
        purge to find. The directory a link leads to is reached by the state directory's
        walk (another user's link on the way is refused), and what cannot be removed is a
        ``PackageError`` naming it (the id is still kept then, and the same purge can be run
        again)."""
        data = self.data_dir(extension)
        if data.is_symlink() and data.is_dir():
            try:
                target, fd = open_trusted_dir(
                    data.parent / os.readlink(data), own_dir_problem, what="data directory"
                )
            except UntrustedDir as exc:
                raise PackageError(
                    f"{extension}: its data directory {data} is a link, and what it leads to "
                    f"is not this user's own ({exc}): its data was not removed; remove it and "
                    "the link by hand"
                ) from None
            os.close(fd)
            for child in target.iterdir():
                remove_tree(child)
            left = [str(p) for p in target.iterdir()]
            if not left and not keep_link:
                data.unlink()
            where = target if keep_link else data
        else:
            # A directory, or a link to nothing (no data of the id is left where it led).
            remove_tree(data)
            left = [str(data)] if os.path.lexists(data) else []
            where = data
        if left:
            raise PackageError(
                f"{extension}: not all of its data could be removed "
                f"({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}): remove it by "
                f"hand (a purge can be run again: wasihost remove {extension} --purge)"
            )
        return where

    def publisher_pin(self, extension: str) -> str | None:
        """The publisher whose verified package last held ``extension``: what is kept for the
        id (grants, data, storage rows) is that publisher's, also after a ``remove`` without
        ``--purge``; None if no verified package held it since the last purge."""
        with self._reading() as db:
            row = db.execute(
                "SELECT publisher FROM publisher_pins WHERE extension=?", (extension,)
            ).fetchone()
        return row[0] if row is not None else None

    def kept_publisher(self, extension: str) -> str | None:
        """The publisher what the state keeps for ``extension`` (grants, data, storage rows)
        belongs to: its pin, or the signer of an install recorded before pins were kept;
        None if no verified package held the id since its last purge."""
        pinned = self.publisher_pin(extension)
        if pinned is not None:
            return pinned
        installed = self.package(extension)
        return installed.signer if installed is not None else None

    def check_heir(self, extension: str, signer: str | None, *, adopt_data: bool = False) -> None:
        """Raise :class:`AdmissionError` unless a package verified as ``signer``'s (None: not
        verified) may be bound to what the state keeps for ``extension``: its grants, its data
        directory and its storage rows, as an install, an update, a rollback or an admission
        (``Host.load``, ``Host.load_installed``) binds it. They are the kept publisher's
        (:meth:`kept_publisher`), installed or removed without ``--purge``, and go to another
        publisher's package (or an unverified one) only by an install with ``adopt_data``.
        The one check of every such binding: an admission of a package loaded from a path
        took them with none."""
        owner = self.kept_publisher(extension)
        if owner is None or signer == owner or adopt_data:
            return
        installed = self.package(extension) is not None
        raise AdmissionError(
            [
                f"{extension} "
                + ("is installed" if installed else "was removed")
                + f", and the grants and data kept for it belong to publisher {owner!r}; "
                "this package is "
                + ("not verified" if signer is None else f"published by {signer!r}")
                + (
                    f": verify it as {owner!r}'s, or remove the install with its data first "
                    f"(wasihost remove {extension} --purge)"
                    if installed
                    else f": remove them first (wasihost remove {extension} --purge), or give "
                    "them to this package by installing it with adopt_data=True (--adopt-data)"
                )
            ]
        )

    def check_removable(self, extension: str, *, purge: bool) -> None:
        """Raise :class:`PackageError` unless :meth:`remove` has something to remove (a
        ``ConfigError`` for what is no extension id)."""
        check_extension_id(extension)
        if self.package(extension) is None and not (purge and self.keeps(extension)):
            raise PackageError(
                f"{extension} is not installed"
                + (" and nothing is kept for it" if purge else "")
            )

    # -- grants (the GrantStore protocol) ----------------------------------------------------

    def save_grants(self, extension: str, state: GrantState) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO grant_epochs VALUES (?, ?, ?)",
                (extension, state.epoch, state.revoked),
            )
            db.execute("DELETE FROM grants WHERE extension=?", (extension,))
            db.executemany(
                "INSERT INTO grants VALUES (?, ?, ?, ?)",
                [(extension, e.capability, e.scope, e.since_epoch) for e in state.entries.values()],
            )

    def highest_grant_epoch(self) -> int:
        """The highest grant epoch held now or purged before (GrantStore)."""
        with self._reading() as db:
            # Numbers only: MAX() ranks text above every number. A row whose epoch is none is
            # damage, refused where it is read (load_grants, grant_epochs) and nowhere else:
            # it stopped every grant and revocation of every other extension here.
            row = db.execute(
                "SELECT MAX(epoch) FROM grant_epochs WHERE typeof(epoch) = 'integer'"
            ).fetchone()
        held = int(row[0] or 0)
        return max(held, self.high_water(GRANT_EPOCH_KEY))

    def grant_epochs(self, extensions: list[str]) -> dict[str, int]:
        """The durable grant epoch of each of ``extensions`` that has one, a query per
        GRANT_EPOCHS_BATCH ids (SQLite before 3.32 takes at most 999 parameters)."""
        found: dict[str, int] = {}
        for start in range(0, len(extensions), GRANT_EPOCHS_BATCH):
            batch = extensions[start : start + GRANT_EPOCHS_BATCH]
            marks = ",".join("?" * len(batch))
            # An error (closed under a late call, say) is a ConfigError: the caller fails closed.
            with self._reading() as db:
                rows = db.execute(
                    f"SELECT extension, epoch FROM grant_epochs WHERE extension IN ({marks})",  # noqa: S608
                    batch,
                ).fetchall()
            found.update(
                (r[0], _stored_int(self._database, r[1], f"the grant epoch of {r[0]!r}"))
                for r in rows
            )
        return found

    def load_grants(self, extension: str) -> GrantState | None:
        with self._reading() as db:
            head = db.execute(
                "SELECT epoch, revoked FROM grant_epochs WHERE extension=?", (extension,)
            ).fetchone()
            if head is None:
                return None
            rows = db.execute(
                "SELECT capability, scope, since_epoch FROM grants WHERE extension=?",
                (extension,),
            ).fetchall()
        entries = {r[0]: _stored_grant(self._database, extension, r) for r in rows}
        epoch = _stored_int(self._database, head[0], f"the grant epoch of {extension}")
        if head[1] is not None and not isinstance(head[1], str):
            raise _damaged(self._database, f"the revocation of {extension} is {head[1]!r}")
        return GrantState(entries, epoch, head[1])

    # -- lifecycle and journal ---------------------------------------------------------------

    def record_state(self, extension: str, state: str, reason: str | None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO lifecycle VALUES (?, ?, ?, ?)",
                (extension, state, reason, time.time_ns()),
            )

    def lifecycle(self, extension: str) -> tuple[str, str | None] | None:
        with self._reading() as db:
            row = db.execute(
                "SELECT state, reason FROM lifecycle WHERE extension=?", (extension,)
            ).fetchone()
        return (row[0], row[1]) if row else None

    def record_event(self, extension: str, kind: str, detail: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO events (extension, kind, detail, at) VALUES (?, ?, ?, ?)",
                (extension, kind, detail[:MAX_EVENT_DETAIL_CHARS], time.time_ns()),
            )
            db.execute(
                "DELETE FROM events WHERE extension=? AND id NOT IN "
                "(SELECT id FROM events WHERE extension=? ORDER BY id DESC LIMIT ?)",
                (extension, extension, MAX_EVENTS_PER_EXTENSION),
            )

    def events(self, extension: str, limit: int = 20) -> list[EventRecord]:
        with self._reading() as db:
            rows = db.execute(
                "SELECT kind, detail, at FROM events WHERE extension=? ORDER BY id DESC LIMIT ?",
                (extension, limit),
            ).fetchall()
        return [EventRecord(r[0], r[1], r[2]) for r in reversed(rows)]

    def crash_counts(self, extension: str) -> dict[str, int]:
        """Crashes of ``extension`` by class, over its journal (the last
        ``MAX_EVENTS_PER_EXTENSION`` events): the leading word of each crash line."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT detail FROM events WHERE extension=? AND kind='crash'", (extension,)
            ).fetchall()
        counts: dict[str, int] = {}
        for (detail,) in rows:
            cls = detail.split(":", 1)[0]
            counts[cls] = counts.get(cls, 0) + 1
        return dict(sorted(counts.items()))

    # -- operator metrics ----------------------------------------------------------------------

    def publish_metrics(
        self, host: str, pid: int, snapshot: dict[str, Any], *, closed: bool
    ) -> None:
        """Keep ``snapshot`` (counts only, see wasihost.supervisor.opmetrics) as host ``host``'s
        latest,
        dropping all but the ``MAX_METRICS_SNAPSHOTS`` most recent hosts'."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO metrics_snapshots VALUES (?, ?, ?, ?, ?)",
                (host, pid, json.dumps(snapshot, sort_keys=True), time.time_ns(), int(closed)),
            )
            db.execute(
                "DELETE FROM metrics_snapshots WHERE host NOT IN (SELECT host FROM "
                "metrics_snapshots ORDER BY published_at DESC LIMIT ?)",
                (MAX_METRICS_SNAPSHOTS,),
            )

    def metrics_snapshots(self) -> list[MetricsSnapshot]:
        """The hosts' latest metrics, most recent first."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT host, pid, snapshot, published_at, closed FROM metrics_snapshots "
                "ORDER BY published_at DESC"
            ).fetchall()
        return [MetricsSnapshot(r[0], r[1], json.loads(r[2]), r[3], bool(r[4])) for r in rows]

    def lifecycle_counts(self) -> dict[str, int]:
        """Extensions by recorded lifecycle state (what a closed host left)."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT state, COUNT(*) FROM lifecycle GROUP BY state ORDER BY state"
            ).fetchall()
        return {r[0]: r[1] for r in rows}

    def keeps(self, extension: str) -> bool:
        """Whether the state holds anything of ``extension``: a package, grant records, a
        lifecycle state, journal events, a publisher pin or a data directory."""
        with self._reading() as db:
            row = db.execute(
                "SELECT 1 FROM packages WHERE id=?1 UNION ALL SELECT 1 FROM grant_epochs "
                "WHERE extension=?1 UNION ALL SELECT 1 FROM lifecycle WHERE extension=?1 "
                "UNION ALL SELECT 1 FROM events WHERE extension=?1 UNION ALL SELECT 1 FROM "
                "publisher_pins WHERE extension=?1 LIMIT 1",
                (extension,),
            ).fetchone()
        return row is not None or self.data_dir(extension).exists()

    def extensions(self) -> list[str]:
        """Every extension the state knows of, installed or not (revoked ones keep records)."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT id FROM packages UNION SELECT extension FROM grant_epochs "
                "UNION SELECT extension FROM lifecycle ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    def remaining_data(self, extension: str) -> dict[str, Any]:
        """What the host still keeps for ``extension`` (shown by ``wasihost status``)."""
        pkg = self.package(extension)
        data = self.data_dir(extension)
        data_bytes = (
            sum(p.stat().st_size for p in data.rglob("*") if p.is_file()) if data.exists() else 0
        )
        with self._reading() as db:
            n_events = db.execute(
                "SELECT COUNT(*) FROM events WHERE extension=?", (extension,)
            ).fetchone()[0]
            n_grants = db.execute(
                "SELECT COUNT(*) FROM grants WHERE extension=?", (extension,)
            ).fetchone()[0]
        # The storage broker's entries live in their own database beside this one.
        from .kvstore import stored_by
        from .kvtypes import DB_NAME as STORAGE_DB_NAME
        from .kvtypes import StoreError

        storage_error = None
        try:
            stored = stored_by(self.directory / STORAGE_DB_NAME, extension)
        except StoreError as exc:
            stored, storage_error = None, str(exc)
        return {
            "package": str(pkg.path) if pkg else None,
            "data_dir": str(data) if data.exists() else None,
            "data_bytes": data_bytes,
            "storage_bytes": stored.bytes if stored is not None else None,
            "storage_entries": stored.objects if stored is not None else None,
            "storage_error": storage_error,
            "journal_events": n_events,
            "active_grants": n_grants,
        }
