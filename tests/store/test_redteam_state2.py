"""Second red-team pass on issue 28's package and state fixes: what an id's kept state is bound
to, the directory walks of the state directory and the module cache, and the state directory
as an attacker leaves it (hand-edited records, links in its trees).

Each test here was seen to fail against the code it guards (see the commit that added it),
unless its docstring says it guards what already held.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from tests.support.packages import PUBLISHER, hello_dir, hello_files, signed_archive, trust_of
from wasihost.cli import main
from wasihost.core.errors import AdmissionError, ConfigError, PackageError, UpdateError
from wasihost.engine.cachedir import UnsafeCacheDir, open_private_dir
from wasihost.host import updates
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.files import write_key_pair
from wasihost.packaging.revocation import StateDirFloor
from wasihost.packaging.trust import SigningKey
from wasihost.store.statedir import UnsafeStateDir, resolve_state_dir

HELLO = "org.wasihost.fixtures.hello"
OTHER = "other.example"

# -- kept state goes only to its publisher's package, however it is loaded (issue 28 item 3) --


def _two_publishers(tmp: Path) -> tuple[Path, Path, Policy, Path]:
    """Ours and theirs, two signed packages of the hello id, a policy trusting both, and the
    trust file of both."""
    ours, theirs = SigningKey.generate(PUBLISHER), SigningKey.generate(OTHER)
    first = tmp / "ours.whpkg"
    first.write_bytes(signed_archive(hello_files(tmp / "a"), ours))
    other = tmp / "theirs.whpkg"
    other.write_bytes(signed_archive(hello_files(tmp / "b", publisher=OTHER), theirs))
    trust = tmp / "trust"
    trust.write_text(ours.public_line() + theirs.public_line())
    return first, other, Policy(allow=ALL_CAPS, trusted_publishers=trust_of(ours, theirs)), trust


def test_a_package_loaded_from_a_path_gets_an_ids_kept_state_only_as_its_publisher(
    tmp_path: Path,
) -> None:
    """``Host.load(path)`` admitted another publisher's package (or an unverified one, or a bare
    module named after the id) under the grants a ``remove`` without ``--purge`` kept, and
    with the id's data and storage rows: the pin was checked by install and update only.
    Now every admission on a state directory is checked as an install is."""
    first, other, policy, _ = _two_publishers(tmp_path)
    bare = tmp_path / f"{HELLO}.wasm"  # a bare module's id is its file name's stem
    shutil.copy(FIXTURES / "hello" / "hello.wasm", bare)
    unsigned = hello_dir(tmp_path / "c", publisher=OTHER)
    with Host(policy, cache_dir=None, state_dir=tmp_path / "state") as host:
        host.install(first)
        host.grant(HELLO, "log")
        host.grant(HELLO, "clock")
        # Installed: another publisher's package is not admitted under its grants either.
        with pytest.raises(AdmissionError, match=f"is installed, and the grants .* '{PUBLISHER}'"):
            host.load(other)
        updates.remove(host, HELLO, purge=False)
        for source, what in (
            (other, f"published by '{OTHER}'"),
            (unsigned, "not verified"),
            (bare, "not verified"),
        ):
            # Before: admitted, holding "clock" and "log" and the id's data.
            with pytest.raises(
                AdmissionError,
                match=f"was removed, .* belong to publisher '{PUBLISHER}'; this package is {what}",
            ):
                host.load(source, grants=["log"])
            assert host.extension(HELLO) is None
        ext = host.load(first)  # its own publisher's package takes them
        assert {"clock", "log"} <= ext.grant.capabilities
        ext.close("checked")
        host.forget(ext)
        # Handed over by the operator: the adopter's package is admitted from then on.
        host.install(other, adopt_data=True)
        host.load(other).close("checked")


def test_run_of_another_publishers_package_beside_a_state_directory_takes_nothing_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's side of the same: ``run FILE --state-dir S`` of a package that is not
    installed runs on a host without the state (the CLI's grants, no data), and ``install``
    of it is refused; only ``install --adopt-data`` hands the kept grants over. (This held on
    main already: ``run FILE`` never opened the state's grants; it guards that it stays so.)"""
    first, other, _, trust = _two_publishers(tmp_path)
    state = tmp_path / "state"
    flags = ["--state-dir", str(state), "--trust", str(trust)]
    assert main(["install", str(first), *flags]) == 0
    assert main(["grants", "grant", HELLO, "log", "--state-dir", str(state)]) == 0
    assert main(["remove", HELLO, "--state-dir", str(state)]) == 0
    capsys.readouterr()
    run = ["run", str(other), "greet", "--input", '{"name": "x"}', "--no-cache"]
    assert main([*run, *flags]) == 0
    assert '"hello, x"' in capsys.readouterr().out
    assert main(["install", str(other), *flags]) == 1
    assert f"belong to publisher '{PUBLISHER}'" in capsys.readouterr().err
    assert main(["install", str(other), "--adopt-data", *flags]) == 0
    assert main(["run", HELLO, "greet", "--input", '{"name": "y"}', *flags]) == 0
    assert '"hello, y"' in capsys.readouterr().out


def test_a_rollback_from_a_verified_publishers_version_to_an_unverified_one_is_refused(
    tmp_path: Path,
) -> None:
    """The same check on a rollback: an unverified install never replaces a verified one, and
    returning to one would hand the verified publisher's grants and data (and what its
    version wrote) to a package nobody vouches for; it rolled back unasked."""
    ours = SigningKey.generate(PUBLISHER)
    newer = tmp_path / "v2.whpkg"
    newer.write_bytes(signed_archive(hello_files(tmp_path / "a", version="0.2.0"), ours))
    policy = Policy(allow=ALL_CAPS, trusted_publishers=trust_of(ours))
    with Host(policy, cache_dir=None, state_dir=tmp_path / "state") as host:
        host.install(hello_dir(tmp_path / "u"))
        host.grant(HELLO, "log")
        assert host.install(newer).signer == PUBLISHER
        with pytest.raises(UpdateError, match="this package is not verified"):
            host.rollback(HELLO)
        installed = host.require_state().package(HELLO)
        assert installed is not None and installed.signer == PUBLISHER


# -- one walk for the module cache and the state directory (issue 28 item 2) ----------------

OTHER_UID = 65534  # "another user" (the tests run as root, which may chown a link)


def _shared_links(tmp: Path) -> tuple[Path, Path, Path]:
    """A directory of ours (0700), and in a sticky shared directory two links to it: one
    owned by another user, one of ours."""
    mine = tmp / "mine"
    mine.mkdir(mode=0o700)
    mine.chmod(0o700)
    shared = tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "theirs"
    theirs.symlink_to(mine)
    os.lchown(theirs, OTHER_UID, OTHER_UID)
    own = shared / "own"
    own.symlink_to(mine)
    return mine, theirs, own


def test_the_module_cache_follows_no_other_users_link_on_its_way(tmp_path: Path) -> None:
    """``open_private_dir`` resolved its path with ``os.path.realpath`` before its no-follow
    walk, so another user's link on the way was followed: that user could point it at a
    directory of their own key and entries before the host started (docs/security.md said
    "walked from / without following symlinks"). Now the cache and the state directory share
    one walk, and another user's link is refused by both, naming it; one of ours is followed."""
    mine, theirs, own = _shared_links(tmp_path)
    with pytest.raises(UnsafeCacheDir, match=f"theirs is a symbolic link owned by uid {OTHER_UID}"):
        os.close(open_private_dir(theirs / "modules"))
    with pytest.raises(UnsafeStateDir, match=f"theirs is a symbolic link owned by uid {OTHER_UID}"):
        resolve_state_dir(theirs / "state")
    assert not (mine / "modules").exists() and not (mine / "state").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Host(Policy(allow=ALL_CAPS), cache_dir=theirs / "modules") as host:
            assert host.engine.cache.directory is None
    assert any(
        "module cache disabled" in str(w.message) and f"owned by uid {OTHER_UID}" in str(w.message)
        for w in caught
    ), [str(w.message) for w in caught]
    fd = open_private_dir(own / "modules")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(mine / "modules"))
        assert (mine / "modules").stat().st_mode & 0o777 == 0o700
    finally:
        os.close(fd)
    assert resolve_state_dir(own / "state") == mine / "state"


# -- a state database is made whole, so an empty one is always damage (issue 28 item 11) -----


@pytest.mark.parametrize("how", ["zero-length", "tables dropped"])
def test_a_state_directory_holding_only_its_database_is_refused_when_that_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """The fix of item 11 refused an empty database only beside ``packages/`` or ``data/``.
    A state directory the CLI keeps the revocation list's version floor in (``run FILE
    --revocations LIST --state-dir S``), or one of grants and revocations only, holds nothing
    else: truncated, it opened as a new state and the floor was 0 (an older list verified
    again), the whole-extension revocation gone. A database is now made whole aside and
    linked into place, so one that is empty or lacks a table is damage wherever it is."""
    state = tmp_path / "state"
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
        host.grant("org.example.a", "log")
        host.disable("org.example.a", "compromised")
        host.require_state().raise_high_water("revocation_list", 7)
    assert sorted(p.name for p in state.iterdir()) == ["state.sqlite3"]
    database = state / "state.sqlite3"
    if how == "zero-length":
        database.write_bytes(b"")
        said = "is empty"
    else:
        with sqlite3.connect(database) as db:
            db.execute("DROP TABLE grant_epochs")
        said = "is without its tables grant_epochs"
    with pytest.raises(ConfigError, match=f"is damaged: its database state.sqlite3 {said}"):
        StateDirFloor(state).highest()
    with pytest.raises(ConfigError, match="revocation-list floor would be lost"):
        Host(Policy(allow={"log"}), cache_dir=None, state_dir=state)
    assert main(["status", "--state-dir", str(state)]) == 1
    assert capsys.readouterr().err.startswith(f"error: config: state directory {state} is damaged")
    # A new state directory is made whole, nothing left beside it; two hosts may make it at once.
    new = tmp_path / "new"
    with Host(cache_dir=None, state_dir=new), Host(cache_dir=None, state_dir=new) as second:
        assert second.require_state().extensions() == []
    assert sorted(p.name for p in new.iterdir()) == ["state.sqlite3"]


# -- a purge removes the data where data/<id> leads (issue 28 item 3) ------------------------


def test_a_purge_removes_the_data_a_linked_data_directory_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``data/<id>`` may be a link (data kept on another disk). A purge removed the data
    directory with errors ignored, and a link cannot be removed so: the data stayed where the
    link led, the CLI said "removed ... and its data", and the id's next package, of any
    publisher since the pin went with the purge, was given it. Now the data the link leads to
    is removed, then the link; one reached through another user's link is refused by name
    and kept, and the id with it, so the purge can be run again."""
    first, other, policy, _ = _two_publishers(tmp_path)
    state = tmp_path / "state"
    disk = tmp_path / "disk" / HELLO
    disk.mkdir(parents=True, mode=0o700)
    (disk / "secret").write_text("ours")
    (disk / "sub").mkdir()
    (disk / "sub" / "more").write_text("ours")
    with Host(policy, cache_dir=None, state_dir=state) as host:
        host.install(first)
        (state / "data").mkdir()
        (state / "data" / HELLO).symlink_to(disk)
    flags = ["--state-dir", str(state)]
    capsys.readouterr()
    assert main(["remove", HELLO, "--purge", *flags]) == 0
    assert capsys.readouterr().out.strip() == f"removed {HELLO} and its data"
    assert list(disk.iterdir()) == []  # before: secret and sub/more were left
    assert not os.path.lexists(state / "data" / HELLO)
    assert main(["status", HELLO, *flags]) == 0
    assert "nothing is kept for it in this state directory" in capsys.readouterr().out
    # Reached through another user's link: refused by name, the data and the id kept.
    _, theirs, _ = _shared_links(tmp_path)
    (theirs / "secret").write_text("mine")
    with Host(policy, cache_dir=None, state_dir=state) as host:
        host.install(other)
        (state / "data" / HELLO).symlink_to(theirs)
        with pytest.raises(PackageError, match=f"is not this user's own .*owned by uid {OTHER_UID}"):
            updates.remove(host, HELLO, purge=True)
        assert (theirs / "secret").read_text() == "mine"
        assert host.require_state().keeps(HELLO)


# -- a hand-edited or damaged state directory is an error naming it, never exit 70 (item 10) -


def _edit_record(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def damage(state: Path) -> None:
        with sqlite3.connect(state / "state.sqlite3") as db:
            (text,) = db.execute("SELECT record FROM package_records").fetchone()
            changed = edit(json.loads(text))
            db.execute(
                "UPDATE package_records SET record=?",
                (changed if isinstance(changed, str) else json.dumps(changed),),
            )

    return damage


def _nested_previous(record: dict[str, Any]) -> str:
    """The record with a ``previous`` chain 5,000 deep (json.dumps cannot write it)."""
    body = json.dumps({k: v for k, v in record.items() if k != "previous"})[:-1]
    return (body + ', "previous": ') * 5000 + json.dumps(record) + "}" * 5000


def _sql(statement: str) -> Callable[[Path], None]:
    def damage(state: Path) -> None:
        with sqlite3.connect(state / "state.sqlite3") as db:
            db.execute(statement)

    return damage


def _in_place_of(relative: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(state: Path) -> None:
        path = state / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        make(path)

    return damage


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "record previous 5000 deep": (_edit_record(_nested_previous), "install record of"),
    "record digest a number": (
        _edit_record(lambda r: {**r, "content_digest": 5}),
        "(content_digest is 5)",
    ),
    "record time a string": (
        _edit_record(lambda r: {**r, "installed_at": "x"}),
        "(installed_at is 'x')",
    ),
    "record previous a string": (_edit_record(lambda r: {**r, "previous": "x"}), "previous is"),
    "record a list": (_edit_record(lambda r: [r]), "the record is list"),
    "grant epoch a string": (
        _sql("UPDATE grant_epochs SET epoch='x'"),
        "holds 'x', not a whole number",
    ),
    "high water a string": (
        _sql("INSERT INTO meta VALUES ('hw:grant_epoch', 'x')"),
        "meta hw:grant_epoch holds 'x'",
    ),
    "grant scope no JSON": (_sql("UPDATE grants SET scope='{bad'"), "with scope '{bad'"),
    "lock file a link": (
        _in_place_of(f"locks/{HELLO}.lock", lambda p: p.symlink_to("/tmp/nowhere")),
        f"{HELLO}.lock is a symbolic link",
    ),
    "lock file a directory": (
        _in_place_of(f"locks/{HELLO}.lock", lambda p: p.mkdir()),
        f"{HELLO}.lock: Is a directory",
    ),
    "presence file a directory": (
        _in_place_of("locks/admitted", lambda p: p.mkdir()),
        "admitted: Is a directory",
    ),
    "update marker a link": (
        _in_place_of(f"checkpoints/{HELLO}/pending.json", lambda p: p.symlink_to("/etc/passwd")),
        "an interrupted update left",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_hand_edited_or_damaged_state_directory_is_an_error_naming_the_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """Each of these was an internal error (exit 70) at some command: an install record
    whose field has the wrong type (a digest that is a number failed at ``run``) or whose
    ``previous`` nests thousands deep (RecursionError), a grant epoch or high-water mark that
    is no number, a grant scope that is no JSON, a link or a directory where the host keeps
    a lock file, the presence file or an update's marker (a record that is a list, or whose
    ``previous`` is a string, was refused already, naming a Python exception). Now every
    command on it either
    works (what it reads is sound) or fails with one line naming the damage, and the
    commands that use what is damaged fail so."""
    src = hello_dir(tmp_path / "src", publisher=None)
    state = tmp_path / "state"
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        host.install(src)
        host.grant(HELLO, "log")
    make, named = DAMAGES[damage]
    make(state)
    failed = []
    for argv in (
        ["status"],
        ["grants", "list", HELLO],
        ["grants", "grant", HELLO, "clock"],
        ["run", HELLO, "greet", "--input", '{"name": "a"}'],
        ["install", str(src)],
        ["update", str(src)],
        ["rollback", HELLO],
        ["remove", HELLO],
        ["remove", HELLO, "--purge"],
    ):
        code = main([*argv, "--state-dir", str(state)])
        err = capsys.readouterr().err
        assert code in (0, 1), (argv, code, err)
        if code == 1 and argv[0] != "update":  # update: "0.1.0 is already installed" first
            assert err.startswith(("error: config: ", "error: package: ")), (argv, err)
            assert named in err, (argv, err)
        if code == 1:
            failed.append(argv[0])
    assert "rollback" in failed  # which reads every part damaged here


def test_a_checkpoint_is_restored_into_the_directory_a_linked_data_directory_leads_to(
    tmp_path: Path,
) -> None:
    """Restoring a checkpoint (a failed update or rollback, a host killed in one) removed
    ``data/<id>`` and copied the checkpoint in its place: a link to data kept on another
    disk became a local directory, and what the link led to stayed there, newer than the
    checkpoint, for no purge to find. The checkpoint is restored into that directory now."""
    state, disk = tmp_path / "state", tmp_path / "disk"
    disk.mkdir(mode=0o700)
    (disk / "value").write_text("before")
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
        host.grant("org.example.a", "log")
        (state / "data").mkdir()
        (state / "data" / "org.example.a").symlink_to(disk)
        checkpoint = updates.take_checkpoint(host, "org.example.a", "1.0.0")
        (disk / "value").write_text("after")
        (disk / "new").write_text("after")
        updates.restore_checkpoint(host, "org.example.a", checkpoint)
        assert (state / "data" / "org.example.a").is_symlink()  # before: a local copy
        assert sorted(p.name for p in disk.iterdir()) == ["value"]
        assert (disk / "value").read_text() == "before"
        updates.remove(host, "org.example.a", purge=True)
        assert list(disk.iterdir()) == []


def test_a_version_that_is_a_path_names_no_checkpoint_outside_the_state_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint is named after a version: ``updates.take_checkpoint(host, id,
    '../../../escaped')`` made a directory outside the state directory and copied the
    extension's data into it, and a rollback took the version from the install record,
    which was read as any string (a hand-edited ``../../../../escaped`` reached the path).
    Now a record's version must be SemVer, its sha256 a digest, and a checkpoint's name one
    component, for every caller."""
    state = tmp_path / "base" / "state"
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        host.install(hello_dir(tmp_path / "v1", publisher=None))
        host.install(hello_dir(tmp_path / "v2", version="0.2.0", publisher=None))
        host.grant(HELLO, "log")
        host.require_state().data_dir(HELLO).mkdir(parents=True)
        before = sorted(p.name for p in tmp_path.iterdir())
        for version in ("../../../escaped", "/abs", ".hidden", "a/b"):
            with pytest.raises(ConfigError, match="a checkpoint is named after a version"):
                updates.take_checkpoint(host, HELLO, version)
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    with sqlite3.connect(state / "state.sqlite3") as db:
        (text,) = db.execute("SELECT record FROM package_records").fetchone()
        record = {**json.loads(text), "version": "../../../../escaped"}
        db.execute("UPDATE package_records SET record=?", (json.dumps(record),))
        db.execute("UPDATE packages SET version=?", (record["version"],))
    capsys.readouterr()
    for argv in (["rollback", HELLO], ["status", HELLO]):
        assert main([*argv, "--state-dir", str(state)]) == 1
        err = capsys.readouterr().err
        assert "(version is '../../../../escaped', not a SemVer version)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_name_longer_than_a_file_name_may_be_is_no_internal_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run NAME``, ``install NAME``, ``inspect NAME`` and ``wasi NAME`` with a NAME of 300
    bytes were internal errors (exit 70: "File name too long" at the first look at it as a
    path). ``run`` now takes it for the id it is not (a ``config`` error), and a package
    source so long is a ``package`` error naming it."""
    state = tmp_path / "state"
    name = "a" * 300
    for argv, kind in (
        (["run", name, "greet", "--state-dir", str(state)], "config"),
        (["run", f"{name}.wasm", "greet"], "package"),
        (["install", name, "--state-dir", str(state)], "package"),
        (["inspect", name], "package"),
        (["wasi", name], "package"),
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {kind}: "), (argv, err)


def test_revoke_with_a_state_dir_goes_past_a_damaged_install_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``wasihost revoke LIST --state-dir D`` read every install record at once, and one that
    could not be read (not JSON, or one of the fields checked now) stopped the pass with a
    ``config`` error before anything was disabled: the extensions the list revokes stayed
    enabled (item 4's hole, reopened by a damaged record). A damaged record is matched on
    its packages row now (id, version, module digest) and disabled if that is revoked,
    reported otherwise; the others are all matched."""
    state = tmp_path / "state"
    ops = SigningKey.generate("ops.example")
    ops_key = str(write_key_pair(str(tmp_path / "ops"), ops)[0])
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        for name in ("org.aaa.damaged", "org.bbb.damaged", "org.ccc.revoked"):
            root = hello_dir(tmp_path / name, publisher=None)
            manifest = root / "extension.toml"
            manifest.write_text(manifest.read_text().replace(HELLO, name))
            host.install(root)
    with sqlite3.connect(state / "state.sqlite3") as db:
        db.execute("UPDATE package_records SET record='{' WHERE id LIKE '%.damaged'")
    argv = ["revoke", str(tmp_path / "list"), "--key", ops_key, "--state-dir", str(state)]
    for name in ("org.aaa.damaged", "org.ccc.revoked"):
        argv += ["--extension", name, "0.1.0"]
    capsys.readouterr()
    assert main(argv) == 1  # one was not checked
    out, err = capsys.readouterr()
    assert "disabled installed org.aaa.damaged: extension org.aaa.damaged 0.1.0 is revoked" in out
    assert "disabled installed org.ccc.revoked: extension org.ccc.revoked 0.1.0 is revoked" in out
    assert "installed org.bbb.damaged was not checked against the list" in err
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        assert host.grants.state("org.aaa.damaged").revoked is not None
        assert host.grants.state("org.ccc.revoked").revoked is not None
        assert host.grants.state("org.bbb.damaged").revoked is None


def test_restore_brings_back_every_extension_but_the_one_whose_record_is_damaged(
    tmp_path: Path,
) -> None:
    """``Host.restore()`` maps each installed extension to its Extension or to the error that
    keeps it down, but read every install record at once: one damaged record raised out of
    it, and no extension came back. Each record is read on its own now."""
    state = tmp_path / "state"
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        for name in ("org.aaa.damaged", HELLO):
            root = hello_dir(tmp_path / name, publisher=None)
            manifest = root / "extension.toml"
            manifest.write_text(manifest.read_text().replace(HELLO, name))
            host.install(root)
            host.grant(name, "log")
    with sqlite3.connect(state / "state.sqlite3") as db:
        db.execute("UPDATE package_records SET record='{' WHERE id='org.aaa.damaged'")
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        restored = host.restore()
        assert isinstance(restored["org.aaa.damaged"], ConfigError)
        assert "install record of 'org.aaa.damaged' cannot be read" in str(
            restored["org.aaa.damaged"]
        )
        fine = restored[HELLO]
        assert not isinstance(fine, Exception)
        assert fine.call("greet", {"name": "x"}) == {"greeting": "hello, x"}


def test_one_extensions_damaged_grant_epoch_stops_no_revocation_of_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new grant epoch is drawn above the highest held, read with ``MAX(epoch)``: with one
    extension's epoch hand-edited to text, every grant and revocation of every other
    extension failed (an internal error, then a ``config`` one), so nothing could be revoked.
    The damaged row is refused where it is read, its own extension's grants, and only
    there."""
    state = tmp_path / "state"
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        host.grant("org.example.damaged", "log")
        host.grant("org.example.other", "log")
    with sqlite3.connect(state / "state.sqlite3") as db:
        db.execute("UPDATE grant_epochs SET epoch='x' WHERE extension='org.example.damaged'")
    capsys.readouterr()
    flags = ["--state-dir", str(state)]
    assert main(["grants", "revoke", "org.example.other", "log", *flags]) == 0
    assert main(["grants", "list", "org.example.damaged", *flags]) == 1
    assert "the grant epoch of org.example.damaged holds 'x'" in capsys.readouterr().err
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=state) as host:
        host.disable("org.example.other", "compromised")
        assert host.grants.state("org.example.other").revoked == "compromised"
