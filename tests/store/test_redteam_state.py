"""Red-team review of issue 28 (packages and state): extension ids that are paths, the state
directory's resolution and the paths its records keep, the digest of unsigned installs, and
damaged state directories.

Each test here was seen to fail against the code it guards (see the commit that added it).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES
from wasihost.cli import main
from wasihost.core.errors import ConfigError, PackageError
from wasihost.host import updates
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

# -- ids that are paths (issue 28 item 1) ---------------------------------------------------

PATH_IDS = ["..", ".", "../victim", "../../victim", "a/b", "../../../x", "\udcff", ""]


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_remove_and_rollback_of_an_id_that_is_a_path_are_refused_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``remove .. --purge`` printed "removed .. and its data" and emptied the state
    directory (``data/..`` exists once ``data/`` does, so the id counted as kept);
    ``remove ../../victim --purge`` deleted a directory beside it; ``rollback
    ../../../x`` made ``x.lock`` outside it (``../../../../tmp/x``: in /tmp) before looking
    the id up; ``rollback a/b`` and
    a non-UTF-8 id were internal errors (exit 70). Each is now one ``config`` line, exit 1,
    and nothing on disk changes."""
    state = tmp_path / "base" / "state"
    state.mkdir(parents=True, mode=0o700)
    (state.parent / "victim").mkdir()
    (state.parent / "victim" / "keep").write_text("mine")
    flags = ["--state-dir", str(state)]
    assert main(["grants", "grant", "org.example.a", "log", *flags]) == 0
    (state / "data" / "org.example.a").mkdir(parents=True)
    capsys.readouterr()
    before = _listing(tmp_path)
    for bad in PATH_IDS:
        for argv in (["remove", bad, "--purge"], ["remove", bad], ["rollback", bad]):
            assert main([*argv, *flags]) == 1, argv
            err = capsys.readouterr().err
            assert err.startswith("error: config: ") and "not an extension id" in err, (argv, err)
    assert _listing(tmp_path) == before  # no lock file made beside the state directory either
    assert main(["status", "org.example.a", *flags]) == 0


@pytest.mark.parametrize("bad", [*PATH_IDS, 5, None, "x\ny", "a" * 256], ids=repr)
def test_every_python_entry_point_naming_an_installed_id_checks_it_first(
    tmp_path: Path, bad: Any
) -> None:
    """``updates.remove``/``purge``, ``Host.rollback``, ``Host.load_installed`` and the
    state's own ``remove`` and path builders refuse what is no extension id before any path
    is made of it."""
    state = tmp_path / "state"
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
        host.grant("org.example.a", "log")
        (state / "data").mkdir()
        store = host.require_state()
        before = _listing(tmp_path)
        for action in (
            lambda: updates.remove(host, bad, purge=True),
            lambda: updates.remove(host, bad, purge=False),
            lambda: updates.purge(host, bad),
            lambda: updates.rollback(host, bad),
            lambda: host.rollback(bad),
            lambda: host.load_installed(bad),
            lambda: store.remove(bad, purge=True),
            lambda: store.data_dir(bad),
            lambda: store.package_dir(bad),
            lambda: store.checkpoint_dir(bad),
        ):
            with pytest.raises(ConfigError, match="extension id"):
                action()
        assert _listing(tmp_path) == before
        assert store.extensions() == ["org.example.a"]


# -- the state directory's resolution and its records (issue 28 items 2 and 7) ---------------

HELLO = "org.wasihost.fixtures.hello"


def _hello(tmp: Path, name: str = "hello", edit: str = "") -> Path:
    """An unsigned package directory of fixtures/hello; ``edit`` is appended to its manifest."""
    root = tmp / name
    shutil.copytree(FIXTURES / "hello", root, ignore=shutil.ignore_patterns("src", "Cargo.*"))
    if edit:
        manifest = root / "extension.toml"
        manifest.write_text(manifest.read_text() + edit)
    return root


def _bump(root: Path, version: str = "0.2.0") -> Path:
    manifest = root / "extension.toml"
    manifest.write_text(manifest.read_text().replace('version = "0.1.0"', f'version = "{version}"'))
    return root


def _host(state: Path) -> Host:
    return Host(Policy(allow={"log", "clock"}), cache_dir=None, state_dir=state)


def _records(state: Path) -> tuple[str, dict[str, Any]]:
    with sqlite3.connect(state / "state.sqlite3") as db:
        (path,) = db.execute("SELECT path FROM packages WHERE id=?", (HELLO,)).fetchone()
        (record,) = db.execute("SELECT record FROM package_records WHERE id=?", (HELLO,)).fetchone()
    return path, json.loads(record)


@pytest.mark.skipif(os.geteuid() != 0, reason="a link of another user needs root to make")
def test_a_state_directory_reached_through_another_users_link_is_refused(tmp_path: Path) -> None:
    """``/shared/link -> ~/state``, the link owned by another user in a sticky directory,
    was accepted (the check resolved links first), and the host kept using the path through
    the link: its owner could point it at a tree of their own under a running host. Such a
    link is refused now; one of this user's own is followed, and the host keeps the resolved
    path only."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "theirs"
    theirs.symlink_to(mine)
    os.lchown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="theirs is a symbolic link owned by uid 65534"):
        _host(theirs)
    own = shared / "own"
    own.symlink_to(mine)
    with _host(own / "state") as host:
        assert host.require_state().directory == mine / "state"
        host.install(_hello(tmp_path))
        assert host.require_state().package(HELLO).path.is_relative_to(mine / "state")


def test_install_records_name_their_trees_relative_to_the_state_directory(
    tmp_path: Path,
) -> None:
    """The records kept the absolute path of each tree (through a link, as given): a link
    re-pointed, or the directory copied or moved, had the host run trees of another
    location."""
    state = tmp_path / "state"
    with _host(state) as host:
        host.install(_hello(tmp_path))
        host.install(_bump(_hello(tmp_path, "v2")))
        installed = host.require_state().package(HELLO)
        assert installed is not None and installed.previous is not None
    path, record = _records(state)
    assert path == record["path"] == installed.path.relative_to(state).as_posix()
    assert path.startswith(f"packages/{HELLO}/")
    assert record["previous"]["path"].startswith(f"packages/{HELLO}/")


def test_a_copied_or_moved_state_directory_runs_its_own_trees(tmp_path: Path) -> None:
    """A state directory copied elsewhere named the old location's trees: with the old one
    gone the copy could not start its extensions, and with the old one changed it ran
    those. A record from before paths were relative (absolute) is read by its last three
    components, in the state directory it is in."""
    old = tmp_path / "old"
    with _host(old) as host:
        host.install(_hello(tmp_path))
        host.grant(HELLO, "log")
    new = tmp_path / "new"
    shutil.copytree(old, new, symlinks=True)
    shutil.rmtree(old, onerror=lambda f, p, e: (os.chmod(os.path.dirname(p), 0o700), f(p)))
    with _host(new) as host:
        ext = host.load_installed(HELLO)
        assert ext.call("greet", {"name": "x"}) == {"greeting": "hello, x"}
        assert host.require_state().package(HELLO).path.is_relative_to(new)
    # A record written before: the absolute path of the old location.
    path, record = _records(new)
    legacy = str(old / path)
    record["path"] = legacy
    with sqlite3.connect(new / "state.sqlite3") as db:
        db.execute("UPDATE packages SET path=?", (legacy,))
        db.execute("UPDATE package_records SET record=?", (json.dumps(record),))
    with _host(new) as host:
        assert host.require_state().package(HELLO).path == new / path
        assert host.load_installed(HELLO).call("greet", {"name": "y"}) == {"greeting": "hello, y"}


def test_the_manifest_of_an_unsigned_install_is_covered_by_its_record(tmp_path: Path) -> None:
    """The record of an unsigned install held the module's digest only: a manifest changed
    in the installed tree (an extra command, a 600 s timeout) was admitted at the next start
    as what was installed. The record now holds the digest of the manifest and module."""
    state = tmp_path / "state"
    with _host(state) as host:
        installed = host.install(_hello(tmp_path))
        host.grant(HELLO, "log")
    manifest = installed.path / "extension.toml"
    installed.path.chmod(0o700)
    manifest.chmod(0o600)
    original = manifest.read_text()
    manifest.write_text(
        original.replace("timeout_ms = 1000", "timeout_ms = 600000")
        + 'extra = { description = "the attacker\'s" }\n'
    )
    with _host(state) as host, pytest.raises(PackageError, match="manifest or module changed"):
        host.load_installed(HELLO)
    # A record from before unsigned installs recorded the digest is refused until installed
    # again (it could vouch for no manifest).
    manifest.write_text(original)
    _, record = _records(state)
    del record["content_digest"]
    with sqlite3.connect(state / "state.sqlite3") as db:
        db.execute("UPDATE package_records SET record=?", (json.dumps(record),))
    with _host(state) as host:
        with pytest.raises(PackageError, match="install it again"):
            host.load_installed(HELLO)
        host.install(_hello(tmp_path, "again"))
        assert host.load_installed(HELLO).call("greet", {"name": "z"}) == {"greeting": "hello, z"}


def test_a_package_directory_of_the_installed_version_with_another_manifest_is_refused(
    tmp_path: Path,
) -> None:
    """``install`` of a directory of the installed version whose manifest differs (an extra
    command, ``timeout_ms = 600000``) replaced it as "the same 0.1.0": only the module's
    digest was compared. The same content again is still a reinstall."""
    state = tmp_path / "state"
    edit = '\n[commands.extra]\ndescription = "more"\n'
    with _host(state) as host:
        first = host.install(_hello(tmp_path))
        for name, other in (
            ("extra", _hello(tmp_path, "extra", edit)),
            ("timeout", _hello(tmp_path, "timeout")),
        ):
            if name == "timeout":
                manifest = other / "extension.toml"
                manifest.write_text(
                    manifest.read_text().replace("timeout_ms = 1000", "timeout_ms = 600000")
                )
            with pytest.raises(PackageError, match="installed with other content"):
                host.install(other)
        assert host.require_state().package(HELLO) == first
        again = host.install(_hello(tmp_path, "again"))
        assert again.content_digest == first.content_digest


# -- damaged state directories (issue 28 items 10 and 11) -------------------------------------


def _installed_state(tmp: Path) -> Path:
    state = tmp / "state"
    with _host(state) as host:
        host.install(_hello(tmp))
        host.grant(HELLO, "log")
        host.require_state().data_dir(HELLO).mkdir(parents=True)
    return state


def _commands(tmp: Path) -> list[list[str]]:
    return [
        ["status"],
        ["grants", "list", HELLO],
        ["run", HELLO, "greet", "--input", '{"name": "a"}'],
        ["install", str(_hello(tmp, "again"))],
        ["rollback", HELLO],
        ["remove", HELLO],
        ["remove", HELLO, "--purge"],
    ]


def _damage_is_named(
    tmp: Path, state: Path, capsys: pytest.CaptureFixture[str], named: str
) -> None:
    """Every command on ``state``: no internal error (exit 70); a failure is one ``config``
    line naming ``named``; the install, which writes everywhere, fails so."""
    results = {}
    for argv in _commands(tmp):
        code = main([*argv, "--state-dir", str(state)])
        err = capsys.readouterr().err
        assert code in (0, 1), (argv, code, err)
        if code == 1:
            assert err.startswith("error: config: ") and named in err, (argv, err)
        results[argv[0]] = code
    assert results["install"] == 1


@pytest.mark.parametrize(
    "replaced", ["locks", "checkpoints", "packages", "data", f"packages/{HELLO}", f"checkpoints/{HELLO}"]
)
def test_a_directory_of_the_state_replaced_by_a_file_is_a_config_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], replaced: str
) -> None:
    """``locks``, ``checkpoints`` or ``packages`` replaced by a file: every command that wrote
    there was ``error: internal: FileExistsError`` or ``NotADirectoryError`` (exit 70)."""
    state = _installed_state(tmp_path)
    target = state / replaced
    if target.exists():
        shutil.rmtree(target, onerror=lambda f, p, e: (os.chmod(os.path.dirname(p), 0o700), f(p)))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.parent.chmod(0o700)
    target.write_text("not a directory")
    capsys.readouterr()
    _damage_is_named(tmp_path, state, capsys, str(target))


def _corrupt_table(database: Path, table: str) -> None:
    """Overwrite the head of ``table``'s root page (after moving the WAL into the file)."""
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
        (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()
    db.close()
    with database.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * 64)


@pytest.mark.parametrize("table", ["packages", "grant_epochs", "package_records", "events"])
def test_a_corrupt_page_of_the_state_database_is_a_config_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str
) -> None:
    """A corrupt page in the ``packages`` or ``grant_epochs`` table was ``error: internal:
    DatabaseError: database disk image is malformed`` (exit 70) at the first read of it."""
    state = _installed_state(tmp_path)
    _corrupt_table(state / "state.sqlite3", table)
    _damage_is_named(tmp_path, state, capsys, f"state database {state / 'state.sqlite3'}")


def test_an_install_record_that_is_not_json_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _installed_state(tmp_path)
    with sqlite3.connect(state / "state.sqlite3") as db:
        db.execute("UPDATE package_records SET record='{\"version\": '")
    capsys.readouterr()
    _damage_is_named(tmp_path, state, capsys, f"state database {state / 'state.sqlite3'}")


@pytest.mark.parametrize("how", ["zero-length", "deleted"])
def test_a_state_directory_whose_database_is_empty_or_gone_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """A zero-length ``state.sqlite3`` beside ``packages/`` and ``data/`` opened as a new
    state: the extension revoked as a whole ran again, and the revocation list's version
    floor was gone (an older list would verify). It is damage now, refused by name; a new
    state directory still opens."""
    state = _installed_state(tmp_path)
    with _host(state) as host:
        host.disable(HELLO, "compromised")
        host.require_state().raise_high_water("revocation_list", 7)
    database = state / "state.sqlite3"
    for leftover in (state / "state.sqlite3-wal", state / "state.sqlite3-shm"):
        leftover.unlink(missing_ok=True)
    if how == "deleted":
        database.unlink()
    else:
        database.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is damaged: its database state.sqlite3 is (missing|empty), but it holds"):
        _host(state)
    assert main(["status", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: config: state directory {state} is damaged"), err
    assert "packages/" in err and "data/" in err
    assert database.exists() == (how != "deleted")  # nothing made in its place
    with _host(tmp_path / "new") as host:
        assert host.require_state().extensions() == []


def test_run_of_a_file_whose_name_is_not_utf8_beside_a_state_directory_is_no_internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run <file> CMD --state-dir S`` looks the name up among S's installs first (a path must
    not shadow an installed extension); a file name that is not UTF-8 reached SQLite and was
    ``error: internal: UnicodeEncodeError``. No extension has such an id: the path runs (and is
    refused in the words of a bare module)."""
    state = _installed_state(tmp_path)
    monkeypatch.chdir(tmp_path)
    name = os.fsdecode(b"\xff")
    shutil.copy(FIXTURES / "hello" / "hello.wasm", name)
    capsys.readouterr()
    assert main(["run", name, "greet", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: package: ") and "not valid UTF-8; rename the file" in err, err
