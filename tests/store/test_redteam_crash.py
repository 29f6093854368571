"""Red-team review of crash consistency: the state directory after a host process is killed
(SIGKILL) at a chosen point of an install, update, rollback or purge, and two hosts working on
one state directory at once.

Every kill point is deterministic: the child process (the real CLI, or a small host script)
runs under a wrapper that kills it with SIGKILL at the Kth call of a named function, so no
production code carries a test hook and nothing depends on timing. The state is then opened in
a fresh host and checked: it opens, the installed version is whole, what a guest stored is there
(or is gone, after a purge), and the interrupted operation can be repeated to completion.

Each test here was seen to fail against the code it guards (see the commit that added it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.host.test_redteam_embed import UPDATE, DurableNotes, die_in_migration
from tests.host.test_updates import CAPS, KEY, Notes, installed_running, make_host
from tests.host.test_updates import ID as NOTES_ID
from tests.host.test_updates import package as update_package
from tests.support.common import FIXTURES, ROOT, bare
from wasihost.core.errors import UpdateError
from wasihost.host import updates
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.store import presence
from wasihost.store.kvtypes import DB_NAME as STORAGE_DB

STORAGE = "org.wasihost.fixtures.storage"

# Wraps the function named by $KILL_AT
# ("module:Qual.name:K") so that its Kth call kills the process before it runs; or the one
# named by $PAUSE_AT so that its Kth call first makes the file $PAUSE_DIR/paused, then waits
# until the test makes $PAUSE_DIR/go (or, with $PAUSE_SQL, before an SQL statement holding
# that text). KILLING_CLI then runs ``wasihost.cli.main(argv)``.
KILLING = """
import importlib, os, signal, sys, time
def wrap(spec, act):
    module, qualname, nth = spec.split(":")
    owner = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    calls = [0]
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == int(nth):
            act()
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)
def pause():
    where = os.environ["PAUSE_DIR"]
    open(os.path.join(where, "paused"), "w").close()
    for _ in range(6000):
        if os.path.exists(os.path.join(where, "go")):
            return
        time.sleep(0.01)
if os.environ.get("KILL_AT"):
    wrap(os.environ["KILL_AT"], lambda: os.kill(os.getpid(), signal.SIGKILL))
if os.environ.get("PAUSE_AT"):
    wrap(os.environ["PAUSE_AT"], pause)
if os.environ.get("PAUSE_SQL"):
    import sqlite3
    class Pausing(sqlite3.Connection):
        def execute(self, sql, *args):
            if os.environ["PAUSE_SQL"] in sql:
                pause()
            return super().execute(sql, *args)
    connect = sqlite3.connect
    sqlite3.connect = lambda *a, **k: connect(*a, factory=Pausing, **k)
"""
KILLING_CLI = (
    KILLING
    + """
from wasihost.cli import main
sys.exit(main(sys.argv[1:]))
"""
)

ENV = {**os.environ, "RUST_BACKTRACE": "0", "PYTHONPATH": str(ROOT)}
for _name in ("KILL_AT", "PAUSE_AT", "PAUSE_SQL", "PAUSE_DIR"):
    ENV.pop(_name, None)


def cli(state: Path, *argv: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``wasihost ARGV --state-dir STATE`` in a child process; with ``kill_at``, SIGKILLed
    at that call (the test checks it was)."""
    env = dict(ENV)
    if kill_at is not None:
        env["KILL_AT"] = kill_at
    child = subprocess.run(
        [sys.executable, "-c", KILLING_CLI, *argv, "--state-dir", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    if kill_at is not None:
        assert child.returncode == -signal.SIGKILL, (kill_at, child.stdout, child.stderr[-2000:])
    assert "Traceback" not in child.stderr, child.stderr[-2000:]
    return child


def ok(state: Path, *argv: str) -> str:
    child = cli(state, *argv)
    assert child.returncode == 0, (argv, child.stdout, child.stderr[-2000:])
    return child.stdout


def storage_host(state: Path) -> Host:
    return Host(Policy(allow={"storage"}), cache_dir=None, state_dir=state)


def stored_rows(state: Path, extension: str) -> int:
    with sqlite3.connect(state / STORAGE_DB) as db:
        return int(
            db.execute("SELECT COUNT(*) FROM entries WHERE extension=?", (extension,)).fetchone()[0]
        )


@pytest.fixture
def installed_storage(tmp_path: Path) -> Path:
    """A state directory with the storage fixture installed, granted, and one value put."""
    state = tmp_path / "state"
    ok(state, "install", str(FIXTURES / "storage"))
    ok(state, "grants", "grant", STORAGE, "storage")
    with storage_host(state) as host:
        host.load_installed(STORAGE).call("put", {"key": "k", "value": b"kept"})
    return state


# -- purge --------------------------------------------------------------------------------------


def test_a_purge_killed_midway_can_be_repeated_and_leaves_no_stored_value(
    installed_storage: Path,
) -> None:
    # Break (red-team 2026-12-01): `remove --purge` deleted the state records first and the
    # storage broker's rows after; killed in between, it left the rows with nothing the state
    # knew of the id, so a second `remove --purge` refused ("not installed and nothing is kept
    # for it") and the rows stayed for good, handed to the next install of that id.
    state = installed_storage
    cli(state, "remove", STORAGE, "--purge", kill_at="wasihost.store.kvstore:KVStore.replace:1")
    ok(state, "remove", STORAGE, "--purge")
    assert stored_rows(state, STORAGE) == 0
    ok(state, "install", str(FIXTURES / "storage"))
    ok(state, "grants", "grant", STORAGE, "storage")
    with storage_host(state) as host:
        assert host.load_installed(STORAGE).call("get", {"key": "k"}) is None


def test_a_remove_never_runs_beside_an_install_update_or_rollback(installed_storage: Path) -> None:
    # Break (red-team 2026-12-01): `remove` and `remove --purge` took no lock, so they ran
    # beside an update of the same id in another host: the update then activated a record
    # naming the tree the purge had just deleted, over storage it had emptied.
    state = installed_storage
    with storage_host(state) as holder, updates.exclusive(holder, STORAGE):
        for argv in (("remove", STORAGE, "--purge"), ("remove", STORAGE)):
            child = cli(state, *argv)
            assert child.returncode == 1, child.stdout
            assert "install, update or rollback of it is under way" in child.stderr
    with storage_host(state) as host:
        assert host.load_installed(STORAGE).call("get", {"key": "k"}) == b"kept"


# -- install -----------------------------------------------------------------------------------


def test_a_reinstall_of_the_installed_version_killed_midway_keeps_it_whole(
    installed_storage: Path,
) -> None:
    # Break (red-team 2026-12-01): installing the installed version again (same content, which
    # is allowed) deleted the live tree before renaming the new copy to its name; killed in
    # between, the install record named a tree that no longer existed and nothing started.
    state = installed_storage
    cli(state, "install", str(FIXTURES / "storage"), kill_at="pathlib:Path.rename:1")
    with storage_host(state) as host:
        assert host.load_installed(STORAGE).call("get", {"key": "k"}) == b"kept"
    ok(state, "install", str(FIXTURES / "storage"))
    with storage_host(state) as host:
        assert host.load_installed(STORAGE).call("get", {"key": "k"}) == b"kept"


def test_an_install_after_a_host_died_mid_update_first_undoes_that_update(tmp_path: Path) -> None:
    # Break (red-team 2026-12-01): only a start, an update and a rollback looked for the marker
    # a host killed mid-update leaves; an install did not. Installing another version then took
    # the place of the one the marker names, so the next start took the update for committed
    # and kept the state the dead update's migration had half written.
    key = die_in_migration(tmp_path)
    # Break (red-team 2026-12-01): `status` showed the old version and the half-migrated data
    # as if nothing had happened; it now says the update was interrupted and what undoes it.
    status = ok(tmp_path / "state", "status", NOTES_ID)
    assert "interrupted: a host stopped during an update or rollback" in status
    report = json.loads(ok(tmp_path / "state", "status", NOTES_ID, "--json"))
    assert report["extensions"][0]["interrupted"] is True
    with make_host(tmp_path / "state", DurableNotes(), key) as host:
        host.install(update_package(tmp_path, "0.3.0", key=key))
        ext = host.load_installed(NOTES_ID)
        assert ext.manifest is not None and ext.manifest.version == "0.3.0"
        assert json.loads(DurableNotes.file(host).read_text()) == ["written by 0.1.0"]
        assert not (host.require_state().checkpoints_dir / NOTES_ID / "pending.json").exists()
    assert "interrupted" not in ok(tmp_path / "state", "status", NOTES_ID)


# -- two hosts on one state directory --------------------------------------------------------------


def version_2(tmp: Path) -> Path:
    """The storage fixture's package claiming version 0.2.0: its guest still says 0.1.0, so
    an update to it fails its handshake, after the checkpoint, and restores it."""
    root = tmp / "storage-0.2.0"
    shutil.copytree(FIXTURES / "storage", root)
    manifest = root / "extension.toml"
    manifest.write_text(manifest.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    return root


def test_an_update_is_refused_while_another_host_runs_the_extension(
    installed_storage: Path, tmp_path: Path
) -> None:
    # Break (red-team 2026-12-01): an update paused the running version only in its own host.
    # From the CLI beside an application's host running the extension, it checkpointed the
    # state under the application's calls, and its failure restored that checkpoint: a value
    # the guest had been told was stored (put while the new version started) was gone.
    state = installed_storage
    gate = tmp_path / "gate"
    gate.mkdir()
    with storage_host(state) as app:
        ext = app.load_installed(STORAGE)
        ext.call("put", {"key": "before", "value": b"1"})
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                KILLING_CLI,
                "update",
                str(version_2(tmp_path)),
                "--state-dir",
                str(state),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**ENV, "PAUSE_AT": "wasihost.host.updates:_start_checked:1", "PAUSE_DIR": str(gate)},
        )
        try:
            while child.poll() is None and not (gate / "paused").exists():
                time.sleep(0.01)
            if (gate / "paused").exists():  # the update got past its checkpoint
                ext.call("put", {"key": "during", "value": b"2"})
            (gate / "go").touch()
            out, err = child.communicate(timeout=120)
        finally:
            (gate / "go").touch()
            if child.poll() is None:
                child.kill()
                child.wait()
        assert ext.call("get", {"key": "before"}) == b"1"
        if (gate / "paused").exists():
            assert ext.call("get", {"key": "during"}) == b"2"
        assert child.returncode == 1, out
        assert "running in another host" in err, err
    with storage_host(state) as host:
        assert host.load_installed(STORAGE).call("get", {"key": "before"}) == b"1"


# -- an update killed at each of its steps (held) -------------------------------------------------

# A host with the application's notes broker (kept in the data directory, which a checkpoint
# copies) updating org.wasihost.fixtures.appfns to 0.2.0, whose migration adds a note.
UPDATING = (
    KILLING
    + """
sys.path.insert(0, ".")
from pathlib import Path
from tests.host.test_redteam_embed import UPDATE, DurableNotes, make_host, update_package
from wasihost.host.extension import Extension
from wasihost.packaging.trust import SigningKey
tmp = Path(sys.argv[1])
key = SigningKey.parse((tmp / "publisher.key").read_text(), "publisher.key")
with make_host(tmp / "state", DurableNotes(), key) as host:
    host.update_installed(update_package(tmp, "0.2.0", UPDATE, key=key))
"""
)

UPDATE_STEPS = [
    "wasihost.store.state:StateStore.write_tree:1",
    "wasihost.host.updates:take_checkpoint:1",
    "os:replace:1",  # the pending marker
    "wasihost.host.updates:_start_checked:1",
    "wasihost.store.state:StateStore.activate:1",
    "wasihost.host.updates:_clear_pending:1",
    "wasihost.host.updates:prune:1",
]


def test_an_update_killed_at_any_step_leaves_one_whole_version_on_its_own_data(
    tmp_path: Path,
) -> None:
    """Held: SIGKILL at each step of an update (tree written, checkpoint, marker, start and
    migration, the switch's record, the marker's removal, pruning): the next start runs 0.1.0
    on 0.1.0's data or 0.2.0 on the migrated data, never a mix, and a rollback then returns
    to 0.1.0 on its own data. (A sweep over every rename, unlink, fsync, copy and SQLite
    commit of an update, rollback and purge, 43, 60 and 17 points, found no other break.)"""
    key = KEY  # installed_running's publisher
    template = tmp_path / "template"
    (tmp_path / "publisher.key").write_text(key.private_text())
    with make_host(tmp_path / "state", DurableNotes(), key) as host:
        installed_running(host, tmp_path).call("remember", "written by 0.1.0")
    update_package(tmp_path, "0.2.0", UPDATE, key=key)  # made once: the children reuse it
    shutil.copytree(tmp_path / "state", template, symlinks=True)
    up = {"from": "0.1.0", "to": "0.2.0", "direction": "up"}
    seen = set()
    for step in UPDATE_STEPS:
        shutil.rmtree(tmp_path / "state")  # the state paths are absolute: same place each time
        shutil.copytree(template, tmp_path / "state", symlinks=True)
        child = subprocess.run(
            [sys.executable, "-c", UPDATING, str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**ENV, "KILL_AT": step},
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, (step, child.stderr[-2000:])
        with make_host(tmp_path / "state", DurableNotes(), key) as host:
            ext = host.load_installed(NOTES_ID)
            assert ext.manifest is not None
            version = ext.manifest.version
            seen.add(version)
            notes = json.loads(DurableNotes.file(host).read_text())
            assert notes == (
                ["written by 0.1.0", up] if version == "0.2.0" else ["written by 0.1.0"]
            )
            assert not (host.require_state().checkpoints_dir / NOTES_ID / "pending.json").exists()
            if version == "0.2.0":
                ext.close()
                host.rollback(NOTES_ID)
                assert json.loads(DurableNotes.file(host).read_text()) == ["written by 0.1.0"]
    assert seen == {"0.1.0", "0.2.0"}


def test_two_hosts_opening_a_new_state_directory_at_once_both_open_it(tmp_path: Path) -> None:
    # Break (red-team 2026-12-01): each host creating the state database read "no schema
    # recorded" and then inserted it; a second host doing the same between the two made the
    # first fail with "state database ...: UNIQUE constraint failed: meta.key" (two CLI
    # commands started at once on a new state directory, or the CLI beside a starting host).
    state = tmp_path / "state"
    gate = tmp_path / "gate"
    gate.mkdir()
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLING_CLI,
            "grants",
            "grant",
            "org.example.a",
            "log",
            "--state-dir",
            str(state),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "PAUSE_SQL": "INTO meta VALUES ('schema'", "PAUSE_DIR": str(gate)},
    )
    try:
        while first.poll() is None and not (gate / "paused").exists():
            time.sleep(0.01)
        ok(state, "grants", "grant", "org.example.b", "log")  # opens and records the schema
        (gate / "go").touch()
        _, err = first.communicate(timeout=120)
    finally:
        (gate / "go").touch()
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (gate / "paused").exists()  # the second host opened it in between
    assert first.returncode == 0, err
    assert "org.example.a" in ok(state, "status")


def test_a_failed_update_to_the_version_kept_for_rollback_keeps_it(tmp_path: Path) -> None:
    # Break (red-team 2026-12-01): an update to the release kept for a rollback (a downgrade to
    # it) wrote over that release's tree, which has the same name, and its failure removed the
    # tree: the install record still offered a rollback to it, which then found nothing.
    notes = Notes()
    with make_host(tmp_path / "state", notes) as host:
        first = update_package(tmp_path, "0.1.0", UPDATE)
        host.install(first)
        for cap in sorted(CAPS):
            host.grant(NOTES_ID, cap)
        host.update_installed(update_package(tmp_path, "0.2.0", UPDATE))
        notes.healthy = False  # the update back to 0.1.0 fails its health command
        with pytest.raises(UpdateError, match="0.2.0 kept"):
            host.update_installed(first, allow_downgrade=True)
        notes.healthy = True
        assert host.rollback(NOTES_ID).version == "0.1.0"
        assert host.load_installed(NOTES_ID).call("lookup") == "healthy"


def test_the_admitted_locks_of_many_extensions_take_one_descriptor(tmp_path: Path) -> None:
    """The shared lock a host holds per admitted id (so that another host's update refuses)
    is a byte of one file through one descriptor on Linux: a host with a state directory runs
    thousands of extensions (docs/density.md), past the usual limit of 1,024 descriptors."""
    fds = Path("/proc/self/fd")
    if not fds.exists() or presence._OFD_SETLK is None:
        pytest.skip("open-file-description locks are Linux's")
    logger = (FIXTURES / "logger" / "logger.wasm").read_bytes()
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=tmp_path / "state") as host:

        def admit(name: str) -> Extension:
            host.grant(name, "log")
            return host.admit(bare(logger, f"{name}.wasm"), grants=["log"])

        admit("warm").close()
        before = len(list(fds.iterdir()))
        opened = [admit(f"ext{i}") for i in range(64)]
        assert len(list(fds.iterdir())) - before < 8
        for ext in opened:
            ext.close()
