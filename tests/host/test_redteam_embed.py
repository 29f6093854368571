"""Red-team review of what lies outside the guest's own calls: files the host reads as data
(packages, keys, trust and revocation files), the CLI's answers to bad arguments, updates and
rollbacks racing calls in flight, and the embedding API under concurrent operator actions.

Each test here was seen to fail against the code it guards (see the commit that added it).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.host.test_updates import ID, UPDATE, Notes, installed_running, make_host
from tests.host.test_updates import package as update_package
from tests.support.common import FIXTURES, ROOT
from wasihost.cli import main
from wasihost.core.errors import CallError, ConfigError, UpdateError, WasihostError
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.host import runtime
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.trust import SigningKey

# A refusal is a quick local check: far below this. A read that blocks on a FIFO never ends.
HANG_S = 5.0


def _unblock_fifos(root: Path) -> None:
    """Give every FIFO under ``root`` a writer that goes away at once, so that a reader the
    code under test blocked in ``open()`` (the failure this file guards against) gets EOF."""
    for path in root.rglob("*"):
        if path.is_fifo():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def finishes(fn: Callable[[], Any], root: Path) -> Any:
    """``fn()``'s result (or what it raised), failing the test if it is still running after
    ``HANG_S``."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # handed to the test to inspect
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        while thread.is_alive():
            _unblock_fifos(root)
            thread.join(0.1)
        pytest.fail(f"still blocked after {HANG_S} s: {fn}")
    return outcome[0]


@pytest.fixture
def odd_files(tmp_path: Path) -> Path:
    """A FIFO and a directory standing where the host reads files."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    return tmp_path


def _echo_with(tmp: Path, name: str, replace: str, kind: str) -> Path:
    """The echo fixture's package with ``replace`` (its manifest or module) a FIFO or a
    directory."""
    root = tmp / name
    root.mkdir()
    for part in ("extension.toml", "echo.wasm"):
        target = root / part
        if part != replace:
            shutil.copy(FIXTURES / "echo" / part, target)
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.mkdir()
    return root


@pytest.mark.parametrize("replace", ["extension.toml", "echo.wasm"])
@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_a_package_whose_manifest_or_module_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path, replace: str, kind: str
) -> None:
    """A package directory is untrusted input: a FIFO in it used to hang ``Host.load`` for
    ever (``open()`` waits for a writer), and a directory ended in an ``IsADirectoryError``
    (the CLI's internal error, exit 70)."""
    root = _echo_with(tmp_path, "pkg", replace, kind)
    with Host(Policy(allow=frozenset()), cache_dir=None) as host:
        outcome = finishes(lambda: host.load(root), tmp_path)
    assert isinstance(outcome, WasihostError), outcome
    assert outcome.error_class == "package"
    assert replace in outcome.message
    assert ("a directory" if kind == "dir" else "not a regular file") in outcome.message


def _cli(argv: list[str], root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = finishes(lambda: main(argv), root)
    assert isinstance(code, int), code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["inspect", "{r}/fifo.whpkg"], "package {r}/fifo.whpkg cannot be opened: not a regular"),
        (
            ["verify", "{r}/x.whpkg", "--trust", "{r}/fifo"],
            "config: trust file {r}/fifo cannot be read: not a regular file",
        ),
        (
            ["verify", "{r}/x.whpkg", "--trust", "{r}/dir"],
            "config: trust file {r}/dir cannot be read: not a regular file but a directory",
        ),
        (
            ["verify", "{r}/x.whpkg", "--allowed-signers", "{r}/fifo"],
            "allowed_signers file {r}/fifo cannot be read: not a regular file",
        ),
        (
            ["verify", "{r}/x.whpkg", "--allowed-signers", "{r}/signers", "--ssh-sig", "{r}/dir"],
            "SSH signature {r}/dir cannot be read: not a regular file but a directory",
        ),
        (
            ["verify", "{r}/x.whpkg", "--trust", "{r}/trust", "--revocations", "{r}/fifo"],
            "revocation list: {r}/fifo cannot be read: not a regular file",
        ),
        (
            ["sign", "{r}/x.whpkg", "--key", "{r}/private"],
            "key file {r}/private cannot be opened: not a regular file but a directory",
        ),
        (["sign", "{r}/x.whpkg", "--key", "{r}/fifo"], "key file {r}/fifo cannot be opened: not a"),
        (["sign", "{r}/dir.whpkg", "--key", "{r}/k.key"], "package {r}/dir.whpkg cannot be opened"),
        (["pack", "{r}/pkg", "-o", "{r}/o.whpkg"], "cannot pack echo.wasm: not a regular file"),
    ],
)
def test_the_cli_refuses_a_fifo_or_directory_for_a_file_in_its_own_words(
    odd_files: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    """Every file the CLI reads as data: one ``error:`` line and exit 1, never a hang on a
    FIFO and never the internal error (exit 70) of an ``IsADirectoryError``."""
    r = odd_files
    os.mkfifo(r / "fifo.whpkg")
    (r / "dir.whpkg").mkdir()
    (r / "private").mkdir(mode=0o700)
    os.chmod(r / "private", 0o700)
    _echo_with(r, "pkg", "echo.wasm", "fifo")
    main(["pack", str(FIXTURES / "echo"), "-o", str(r / "x.whpkg")])
    main(["keygen", "--publisher", "acme", "--out", str(r / "k")])
    (r / "trust").write_text((r / "k.pub").read_text())
    wire = b"".join(len(s).to_bytes(4, "big") + s for s in (b"ssh-ed25519", bytes(range(32))))
    (r / "signers").write_text(f"acme ssh-ed25519 {base64.b64encode(wire).decode()}\n")
    capsys.readouterr()
    code, err = _cli([a.format(r=r) for a in argv], r, capsys)
    assert code == 1, err
    assert says.format(r=r) in err
    assert "internal" not in err and len(err.strip().splitlines()) <= 2


# -- updates racing calls in flight -------------------------------------------------------------


class SlowNotes(Notes):
    """The update tests' notes, where ``remember("in flight")`` is a call still running when
    the update begins: it writes its note when the update's checkpoint is taken (or after
    ``IN_FLIGHT_S``, whichever comes first), and the checkpoint waits for that call to end."""

    IN_FLIGHT_S = 0.4

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.checkpointed = threading.Event()
        self.done = threading.Event()

    def handler(self, entry: Any, state: Any) -> Callable[[Any, Any], Any]:
        inner = super().handler(entry, state)
        if entry.name != "remember":
            return inner

        def remember(call: Any, request: Any) -> Any:
            if request == "in flight":
                self.entered.set()
                self.checkpointed.wait(self.IN_FLIGHT_S)
            return inner(call, request)

        return remember

    def checkpoint(self, host: Host, extension: str, directory: Path) -> None:
        super().checkpoint(host, extension, directory)
        self.checkpointed.set()
        self.done.wait(HANG_S)


def test_a_failed_update_keeps_the_write_of_a_call_that_was_in_flight(tmp_path: Path) -> None:
    """A call of the old version that began before the update and acknowledged its write
    keeps it: the update waits for the call to end before its checkpoint. It used to pause
    (which refuses new calls only) and checkpoint at once, so a failed update's restore erased
    the write the call had acknowledged after the checkpoint: data loss."""
    notes = SlowNotes()
    with make_host(tmp_path / "state", notes) as host:
        old = installed_running(host, tmp_path)
        answers: list[Any] = []

        def in_flight() -> None:
            answers.append(old.call("remember", "in flight"))
            notes.done.set()

        caller = threading.Thread(target=in_flight)
        caller.start()
        assert notes.entered.wait(HANG_S)
        notes.healthy = False  # the new version's health command fails: the update is undone
        with pytest.raises(UpdateError, match="0.1.0 kept"):
            host.update_installed(update_package(tmp_path, "0.2.0", UPDATE))
        caller.join(HANG_S)
        assert answers == [1]  # the caller was told its note is the first
        assert notes.notes[ID] == ["in flight"]
        assert host.extension(ID) is old and old.lifecycle.state.value == "running"


class FailingNotes(Notes):
    """Notes whose broker refuses to open for an extension of version ``fail_open``: an
    earlier version that cannot start again when a rollback needs it."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_open: str | None = None

    def open(self, ext: Any) -> Any:
        if ext.manifest.version == self.fail_open:
            raise ConfigError("the application cannot serve this extension now")
        return super().open(ext)


@pytest.mark.parametrize("reversible", [False, True])
def test_a_failed_rollback_leaves_the_running_versions_data_as_it_was(
    tmp_path: Path, reversible: bool
) -> None:
    """A rollback that fails after its data step (the earlier version does not start) says
    "NEW kept", and NEW keeps running: on its own data. It used to run on the restored
    checkpoint (everything NEW wrote since the update lost) or on data its own down-migration
    had already moved back to the earlier version's form."""
    notes = FailingNotes()
    update = 'migrate = "remember"' + ("\nreversible = true" if reversible else "")
    with make_host(tmp_path / "state", notes) as host:
        installed_running(host, tmp_path).call("remember", "written by 0.1.0")
        host.update_installed(update_package(tmp_path, "0.2.0", update))
        new = host.extension(ID)
        assert new is not None
        new.call("remember", "written by 0.2.0")
        before = list(notes.notes[ID])
        notes.fail_open = "0.1.0"
        with pytest.raises(UpdateError, match="rollback of .* to 0.1.0 failed, 0.2.0 kept"):
            host.rollback(ID)
        notes.fail_open = None
        assert notes.notes[ID] == before
        assert host.extension(ID) is new and new.call("remember", "still 0.2.0") == len(before) + 1


class DurableNotes(Notes):
    """Notes kept in the extension's data directory (which every checkpoint copies), so they
    outlive the host process; a migration note ``{"direction": "up"}`` may kill the process
    right after it is written: a host dying in the middle of an update."""

    def __init__(self, die_in_migration: bool = False) -> None:
        super().__init__()
        self.die_in_migration = die_in_migration

    @staticmethod
    def file(host: Host) -> Path:
        return host.require_state().data_dir(ID) / "notes.json"

    def handler(self, entry: Any, state: Any) -> Callable[[Any, Any], Any]:
        if entry.name != "remember":
            return super().handler(entry, state)
        path = self.file(state.host)

        def remember(call: Any, request: Any) -> Any:
            notes = json.loads(path.read_text()) if path.exists() else []
            notes.append(request)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(notes))
            if self.die_in_migration and isinstance(request, dict):
                os.kill(os.getpid(), signal.SIGKILL)
            return len(notes)

        return remember

    def checkpoint(self, host: Host, extension: str, directory: Path) -> None:
        pass  # the data directory is checkpointed by the update itself

    def restore(self, host: Host, extension: str, directory: Path) -> None:
        pass


DIE_IN_MIGRATION = """
import sys
sys.path.insert(0, ".")
from pathlib import Path
from tests.host.test_redteam_embed import ID, UPDATE, DurableNotes, make_host, update_package
from tests.host.test_updates import CAPS
from wasihost.packaging.trust import SigningKey
tmp = Path(sys.argv[1])
key = SigningKey.parse((tmp / "publisher.key").read_text(), "publisher.key")
host = make_host(tmp / "state", DurableNotes(die_in_migration=True), key)
host.install(update_package(tmp, "0.1.0", key=key))
for cap in sorted(CAPS):
    host.grant(ID, cap)
host.load_installed(ID).call("remember", "written by 0.1.0")
host.update_installed(update_package(tmp, "0.2.0", UPDATE, key=key))
"""


def die_in_migration(tmp_path: Path) -> SigningKey:
    """Run DIE_IN_MIGRATION in a child process, killed (SIGKILL) while 0.2.0's migration
    runs over what 0.1.0 wrote; the publisher key the packages were signed with."""
    key = SigningKey.generate("acme.example")
    (tmp_path / "publisher.key").write_text(key.private_text())
    child = subprocess.run(
        [sys.executable, "-c", DIE_IN_MIGRATION, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RUST_BACKTRACE": "0", "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    return key


def test_a_host_killed_in_the_middle_of_an_update_leaves_the_old_versions_data_whole(
    tmp_path: Path,
) -> None:
    """SIGKILL while the new version's migration runs: the next start of the extension finds
    the old version still installed and its data as the checkpoint kept it, not half migrated
    by a version that never took over (the update used to leave no trace of itself, and the
    old version then ran on whatever the migration had written)."""
    key = die_in_migration(tmp_path)
    with make_host(tmp_path / "state", DurableNotes(), key) as host:
        migrated = json.loads(DurableNotes.file(host).read_text())
        assert migrated[-1] == {"from": "0.1.0", "to": "0.2.0", "direction": "up"}
        ext = host.load_installed(ID)
        assert ext.manifest is not None and ext.manifest.version == "0.1.0"
        assert json.loads(DurableNotes.file(host).read_text()) == ["written by 0.1.0"]
        assert ext.call("remember", "after the crash") == 2
        assert list((host.require_state().checkpoints_dir / ID).iterdir()) == []
        # The update can be made again, and this time completes.
        host.update_installed(update_package(tmp_path, "0.2.0", UPDATE, key=key))
        assert json.loads(DurableNotes.file(host).read_text())[-1]["direction"] == "up"


class WaitingHealth(Notes):
    """Notes whose health command (``lookup``) waits until the test lets it answer."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = threading.Event()
        self.answer = threading.Event()

    def handler(self, entry: Any, state: Any) -> Callable[[Any, Any], Any]:
        inner = super().handler(entry, state)
        if entry.name != "lookup" or state.manifest.version != "0.2.0":
            return inner

        def lookup(call: Any, request: Any) -> Any:
            self.asked.set()
            self.answer.wait(HANG_S)
            return inner(call, request)

        return lookup


def test_another_host_on_the_state_directory_never_undoes_an_update_under_way(
    tmp_path: Path,
) -> None:
    """The marker that lets a later start undo a dead host's update is locked while the update
    runs: a second host on the same state directory (the CLI beside an application) is told an
    update is under way instead of taking it for a dead one and restoring the checkpoint under
    the running migration."""
    notes = WaitingHealth()
    with make_host(tmp_path / "state", notes) as host:
        installed_running(host, tmp_path).call("remember", "written by 0.1.0")
        done: list[Any] = []
        updater = threading.Thread(
            target=lambda: done.append(
                host.update_installed(update_package(tmp_path, "0.2.0", UPDATE))
            )
        )
        updater.start()
        try:
            assert notes.asked.wait(HANG_S)  # migrated, now in its health check
            with make_host(tmp_path / "state", notes) as other:
                with pytest.raises(UpdateError, match="under way in another host"):
                    other.load_installed(ID)
                # Refused by the extension's transaction lock, before the marker is read.
                with pytest.raises(UpdateError, match="install, update or rollback of it is under"):
                    other.rollback(ID)
        finally:
            notes.answer.set()
            updater.join(HANG_S)
        assert done and done[0].version == "0.2.0"
        up = {"from": "0.1.0", "to": "0.2.0", "direction": "up"}
        assert notes.notes[ID] == ["written by 0.1.0", up]


# -- operator actions naming an extension ---------------------------------------------------------

NOT_IDS = [5, None, "", ".", "..", "a/b", "../../etc", "x\x1b[2J", "bad\nid", "a" * 256, "é" * 128]


@pytest.mark.parametrize("bad", NOT_IDS, ids=repr)
def test_an_operator_action_on_something_that_cannot_be_an_extension_id_is_refused(
    tmp_path: Path, bad: Any
) -> None:
    """``grant``, ``revoke``, ``disable`` and ``reinstate`` of an id no extension could have
    are a ``ConfigError`` and write nothing. They were all accepted into the durable grant
    table (an integer, a path with '/', 100,000 characters...), after which ``wasihost status``
    on that state directory died with the internal error of an over-long file name."""
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=tmp_path / "state") as host:
        for action in (
            lambda: host.grant(bad, "log"),
            lambda: host.revoke(bad, "log"),
            lambda: host.disable(bad),
            lambda: host.reinstate(bad),
        ):
            with pytest.raises(ConfigError, match="extension id"):
                action()
        assert host.require_state().extensions() == []
        # An id nobody admitted yet is still granted ahead of its first start.
        assert host.grant("org.example.later", "log") >= 1


def test_the_cli_refuses_an_id_that_is_not_one_and_status_keeps_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    # An existing state directory: status refuses to create a missing one (test_cli.py::
    # test_reading_commands_do_not_create_a_mistyped_state_directory).
    (tmp_path / "state").mkdir(mode=0o700)
    for argv in (
        ["grants", "grant", "a" * 300, "log"],
        ["grants", "list", "a" * 300],
        ["status", "a" * 300],
        ["grants", "revoke", "../x"],
    ):
        assert main([*argv, "--state-dir", state]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: config: ") and "not an extension id" in err, err
    assert main(["status", "--state-dir", state]) == 0


def test_grants_given_as_one_string_are_refused_not_spelt_out(tmp_path: Path) -> None:
    """``Host.load(path, grants="clock")`` used to be read letter by letter (an admission
    error about grants 'c', 'l', 'o'...); like ``Policy(allow="log")`` it is the caller's
    mistake, said as such."""
    with Host(Policy(allow={"clock", "log"}), cache_dir=None) as host:
        with pytest.raises(ConfigError, match="collection of capability names"):
            host.load(FIXTURES / "hello", grants="clock")
        assert "clock" in host.load(FIXTURES / "hello", grants=["clock"]).grant.capabilities


# -- the state directory ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d.mkdir(mode=0o777) or d.chmod(0o777), "is writable by group or others"),
        (lambda d: d.mkdir(mode=0o700) or d.chmod(0o770), "is writable by group or others"),
        (lambda d: d.mkdir(mode=0o700) or os.chown(d, 65534, 65534), "is owned by uid 65534"),
        (lambda d: d.parent.chmod(0o777), "is writable by group or others (mode 0777)"),
        (lambda d: d.write_text("not a directory"), "Not a directory"),
    ],
    ids=["world-writable", "group-writable", "another-owner", "parent-writable", "a-file"],
)
def test_a_state_directory_others_can_write_is_refused(
    tmp_path: Path, make: Callable[[Path], Any], says: str
) -> None:
    """The state directory holds the grant table and the install records (an unsigned
    package is trusted by the digest its record holds): another user who can write it, or
    rename it, grants an extension anything. It used to be adopted as found; now the host
    refuses it, as the compiled-code cache refuses such a directory."""
    if os.geteuid() != 0 and "owned" in says:
        pytest.skip("making a directory of another user needs root")
    state = tmp_path / "shared" / "state"
    state.parent.mkdir(mode=0o700)
    make(state)
    with pytest.raises(ConfigError, match="state directory refused: .*" + re.escape(says)):
        Host(Policy(allow={"log"}), cache_dir=None, state_dir=state)
    state.parent.chmod(0o700)
    if state.is_dir():
        state.chmod(0o700)
        os.chown(state, os.geteuid(), os.getegid())
        with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
            assert host.grant("org.example.mine", "log") >= 1


def test_a_huge_integer_input_is_refused_in_the_clis_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An integer literal of thousands of digits used to be refused with Python's own advice
    ("use sys.set_int_max_str_digits() to increase the limit"), which a CLI user cannot act on."""
    code = main(["run", str(FIXTURES / "echo"), "echo", "--input", "9" * 5000, "--no-cache"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: usage: --input: not valid JSON: an integer of thousands"), err
    assert "sys." not in err


# -- grant changes made by another host on the same state directory ------------------------------

LOGGER = "org.wasihost.fixtures.logger"


@pytest.mark.parametrize("what", ["everything", "log"])
def test_a_revocation_by_another_host_reaches_a_running_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """``wasihost grants revoke EXT [CAP] --state-dir D`` (another process, another Host)
    answered "revoked" while the application's host on D went on committing the
    extension's effects for as long as it ran: its grants lived in memory, read once. Now a
    committing host call reads the durable grant epochs again when they are over
    ``GRANT_SYNC_S`` old (set to 0 here: the next commit) and adopts the change."""
    monkeypatch.setattr(runtime, "GRANT_SYNC_S", 0.0, raising=False)
    state = tmp_path / "state"
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=state) as host:
        host.install(FIXTURES / "logger")
        host.grant(LOGGER, "log")
        ext = host.load_installed(LOGGER)
        assert ext.call("run", {"lines": 1})["logged"] == 1
        argv = ["grants", "revoke", LOGGER, *([] if what == "everything" else [what])]
        assert main([*argv, "--state-dir", str(state)]) == 0  # another host, as the CLI is
        before = len(ext.logs())
        if what == "everything":
            # The call that finds out: its log is denied, or it is stopped as revoked.
            with pytest.raises((ExtensionRevoked, CallError)):
                ext.call("run", {"lines": 1})
            with pytest.raises(ExtensionRevoked):
                ext.call("run", {"lines": 1})
        else:
            with contextlib.suppress(CallError):
                ext.call("run", {"lines": 1})  # its log call is denied
        assert len(ext.logs()) == before
        assert "log" not in host.grants.state(LOGGER).entries


def test_a_path_named_like_an_installed_extension_does_not_stand_in_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``wasihost run EXT_ID CMD --state-dir D`` used to run a directory named EXT_ID in the
    current directory, if there was one, instead of the installed extension: whoever could
    leave a directory there had their package run under the CLI's grants in its place."""
    monkeypatch.chdir(tmp_path)
    state = str(tmp_path / "state")
    assert main(["install", str(FIXTURES / "echo"), "--state-dir", state]) == 0
    echo = "org.wasihost.fixtures.echo"
    shutil.copytree(FIXTURES / "echo", tmp_path / echo)
    capsys.readouterr()
    assert main(["run", echo, "echo", "--input", "1", "--state-dir", state, "--no-cache"]) == 2
    assert "give ./org.wasihost.fixtures.echo to run the path" in capsys.readouterr().err
    assert main(["run", f"./{echo}", "echo", "--input", "7", "--no-cache"]) == 0
    assert capsys.readouterr().out == "7\n"
    shutil.rmtree(tmp_path / echo)
    assert main(["run", echo, "echo", "--input", "8", "--state-dir", state]) == 0
    assert capsys.readouterr().out == "8\n"


# -- keys for which a signature proves nothing -----------------------------------------------------

# Encodings of points of small order (and a non-canonical one, y = p): as Ed25519 public keys,
# a signature (R, S) = (a small-order point, 0) verifies for many messages, chosen by nobody.
SMALL_ORDER = [
    "0100000000000000000000000000000000000000000000000000000000000000",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
]


def _forged_for(key: bytes, message: bytes) -> bytes | None:
    """A signature anyone can make that ``key`` verifies over ``message``, if one of the
    small-order R with S = 0 does."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    public = Ed25519PublicKey.from_public_bytes(key)
    for r in SMALL_ORDER:
        signature = bytes.fromhex(r) + bytes(32)
        with contextlib.suppress(InvalidSignature):
            public.verify(signature, message)
            return signature
    return None


@pytest.mark.parametrize("key", SMALL_ORDER, ids=lambda k: k[:8])
def test_a_small_order_key_is_refused_by_the_trust_file_and_allowed_signers(key: str) -> None:
    """Such a key (``acme ed25519 AQAAAA...``) was accepted in a trust file (publisher,
    revocation-list or endorsing key) and in allowed_signers: a signature "by" it is made by
    anyone, so every package or list it vouched for was forgeable. Shown here with the
    identity point, for which the forgery verifies whatever the message."""
    from wasihost.packaging.allowed_signers import AllowedSigners
    from wasihost.packaging.trust import TrustStore

    raw = bytes.fromhex(key)
    if key.startswith("01"):
        assert _forged_for(raw, b"any package digest at all") is not None
    text = base64.b64encode(raw).decode()
    for line in (f"acme ed25519 {text}", f"acme ed25519 {text} revocations"):
        with pytest.raises(ConfigError, match="small order"):
            TrustStore.parse(line + "\n", "trust")
    good = SigningKey.generate("acme")
    endorsed = (
        f"{good.public_line().strip()} endorsed-by={text}:{base64.b64encode(bytes(64)).decode()}"
    )
    with pytest.raises(ConfigError, match="small order"):
        TrustStore.parse(endorsed + "\n", "trust")
    wire = b"".join(len(s).to_bytes(4, "big") + s for s in (b"ssh-ed25519", raw))
    with pytest.raises(ConfigError, match="small order"):
        AllowedSigners.parse(f"acme ssh-ed25519 {base64.b64encode(wire).decode()}\n", "signers")
    TrustStore.parse(good.public_line(), "trust")  # an ordinary key still reads


def test_an_install_whose_source_changes_while_it_is_read_installs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``install`` checks the package it loaded, then reads the source again to write the
    installed tree. A manifest swapped in between (here: by the second read) was installed
    under the first one's record, and ``load_installed(A)`` then admitted a package claiming
    another id, under that id's grants. The tree is now verified against its record before it
    is activated, and (red-team pass of 2026-12-01) the manifest read again is compared whole
    with the one checked before anything is written."""
    from wasihost.host import updates

    source = tmp_path / "hello"
    shutil.copytree(FIXTURES / "hello", source)
    swapped = (
        (source / "extension.toml")
        .read_bytes()
        .replace(b"org.wasihost.fixtures.hello", b"org.wasihost.fixtures.other")
    )
    monkeypatch.setattr(updates, "manifest_text", lambda root: swapped)
    with Host(Policy(allow={"log", "clock"}), cache_dir=None, state_dir=tmp_path / "state") as host:
        with pytest.raises(WasihostError, match="extension.toml changed while it was installed"):
            host.install(source)
        assert host.require_state().packages() == []
        assert not list((host.require_state().packages_dir).glob("*/*"))


def test_keygen_refuses_a_directory_as_its_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``keygen --out DIR/`` wrote DIR/.key and DIR/.pub, hidden and named for nothing, and
    said it had done so."""
    for out in (f"{tmp_path}/", str(tmp_path)):
        assert main(["keygen", "--publisher", "acme", "--out", out]) == 2
        assert "is a directory: give a file prefix" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_extension_revoked_by_another_host_is_refused_even_if_it_commits_nothing(
    tmp_path: Path,
) -> None:
    """The echo fixture makes no host call, so no commit re-reads the grants: the host's
    periodic state work (the metrics thread, every ``METRICS_PUBLISH_S``) adopts the change,
    and its calls are refused within a period or so (they ran on for as long as the host did)."""
    from wasihost.supervisor.opmetrics import METRICS_PUBLISH_S

    state = tmp_path / "state"
    echo = "org.wasihost.fixtures.echo"
    with Host(Policy(allow=frozenset()), cache_dir=None, state_dir=state) as host:
        host.install(FIXTURES / "echo")
        ext = host.load_installed(echo)
        assert ext.call("echo", 1) == 1
        assert main(["grants", "revoke", echo, "--state-dir", str(state)]) == 0
        deadline = time.monotonic() + 3 * METRICS_PUBLISH_S
        with pytest.raises(ExtensionRevoked):  # noqa: PT012 - polled until the period passed
            while time.monotonic() < deadline:
                ext.call("echo", 2)
                time.sleep(0.05)


def test_a_grant_change_here_does_not_undo_a_revocation_made_by_another_host(
    tmp_path: Path,
) -> None:
    """A host changes the grants it holds in memory and writes the result: a revocation
    another host had written meanwhile was overwritten by this host's next grant (the
    extension un-revoked, durably). Each operator action now adopts the store's newer state
    first."""
    state = tmp_path / "state"
    with Host(Policy(allow={"log", "clock"}), cache_dir=None, state_dir=state) as host:
        host.install(FIXTURES / "logger")
        host.grant(LOGGER, "log")
        host.load_installed(LOGGER)
        assert main(["grants", "revoke", LOGGER, "--state-dir", str(state)]) == 0
        host.grant(LOGGER, "clock")
        assert host.grants.state(LOGGER).revoked is not None
    with Host(Policy(allow={"log", "clock"}), cache_dir=None, state_dir=state) as later:
        assert later.grants.state(LOGGER).revoked is not None


# -- what closed extensions leave behind -----------------------------------------------------------


def test_the_crash_history_of_closed_extensions_does_not_pile_up() -> None:
    """Every id that ever crashed kept its supervisor history (up to 100 crash records with
    their messages, ~5.6 KB after three crashes) for the host's life: an application admitting
    extensions under new ids (per tenant, per upload) grew without bound. A closed id's
    records go at its close, and the rest once no restart window needs it."""
    from tests.support.common import bare
    from tests.support.guests import build, guest_wat
    from wasihost.supervisor.supervision import BoundedRetry, Supervisor

    clock = [0.0]
    supervisor = Supervisor(BoundedRetry(max_restarts=5, window_s=60), clock=lambda: clock[0])
    trapping = build(guest_wat("(unreachable)"))
    with Host(Policy(allow=frozenset()), cache_dir=None, supervisor=supervisor) as host:
        for i in range(40):
            ext = host.admit(bare(trapping, f"tenant{i}.wasm"))
            for _ in range(2):
                with pytest.raises(CallError):
                    ext.call("run")
            assert supervisor.crashes(ext.id)
            ext.close()
            assert supervisor.crashes(ext.id) == ()
        # Within the window a re-admitted id keeps its restarts: closing is no way out of a
        # crash loop's budget.
        again = host.admit(bare(trapping, "tenant0.wasm"))
        assert len(supervisor._history["tenant0"].restarts) == 1
        again.close()
        clock[0] += 61
        host.admit(bare(trapping, "late.wasm")).close()
        assert supervisor._history == {}


def test_an_admitted_bare_module_whose_name_is_no_extension_id_can_still_be_disabled() -> None:
    """A bare module's id is its file's stem, which may hold a control character: the id
    check of operator actions must not leave such an admitted extension beyond
    ``disable`` (nor a revocation-list refresh, which disables through it)."""
    from tests.support.common import bare

    with Host(Policy(allow=frozenset()), cache_dir=None) as host:
        wasm = (FIXTURES / "echo" / "echo.wasm").read_bytes()
        ext = host.admit(bare(wasm, "odd\x1bname.wasm"))
        assert ext.id == "odd\x1bname"
        host.disable(ext.id)
        with pytest.raises(ExtensionRevoked):
            ext.call("echo", 1)


def test_a_grant_to_an_id_not_installed_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Granting ahead of an install is allowed, but ``grants grant org.exmaple.x log`` (a
    typo) used to answer "granted" and nothing else."""
    state = str(tmp_path / "state")
    assert main(["grants", "grant", "org.exmaple.x", "log", "--state-dir", state]) == 0
    assert "note: org.exmaple.x is not installed in" in capsys.readouterr().err
    assert main(["install", str(FIXTURES / "hello"), "--state-dir", state]) == 0
    capsys.readouterr()
    assert (
        main(["grants", "grant", "org.wasihost.fixtures.hello", "log", "--state-dir", state]) == 0
    )
    assert "note:" not in capsys.readouterr().err


def test_stopping_a_crashed_extension_stops_it_without_a_lifecycle_error() -> None:
    """``Extension.stop()`` of an extension whose last call crashed (state ``failed``) raised
    ``LifecycleError: no transition from stopped on stopped``: from failed, STOP leads to
    stopped at once, and stop() then fired STOPPED again. Found by cancelling acalls during
    start-up while stopping the extension."""
    from tests.support.common import bare
    from tests.support.guests import build, guest_wat

    with Host(Policy(allow=frozenset()), cache_dir=None) as host:
        ext = host.admit(bare(build(guest_wat("(unreachable)")), "t.wasm"))
        with pytest.raises(CallError):
            ext.call("run")
        assert ext.lifecycle.state.value == "failed"
        ext.stop()
        assert ext.lifecycle.state.value == "stopped"
        ext.stop()  # idempotent
        with pytest.raises(CallError):
            ext.call("run")  # restarts, runs, crashes again: a call, not a lifecycle error


# -- asyncio cancellation that comes late ----------------------------------------------------------


def test_a_cancellation_after_the_call_finished_stops_no_other_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task cancelled after its call had finished on the call thread, but before the loop
    delivered the result: the cancellation used to reach the call's instance, by then idle
    in the pool, and stop it. The next call, anyone's, failed ``interrupted by the host``
    (class ``deadline``) and counted as a crash against the extension's restart budget; with
    ``max_concurrency`` > 1 it could stop another task's running call. A ticket now lets go
    of its instance before the instance goes back to the pool. (The loop does not watch for
    the outcome here, host/acall.py's quick way: the result must wait for the loop.)"""
    import asyncio

    from wasihost.host import acall

    monkeypatch.setattr(acall, "WAIT_FLAG", None)

    async def scenario() -> tuple[Any, tuple[Any, ...]]:
        with Host(Policy(allow=frozenset()), cache_dir=None) as host:
            ext = host.load(FIXTURES / "echo")
            assert await ext.acall("echo", 0) == 0  # an idle instance in the pool
            task = asyncio.ensure_future(ext.acall("echo", 1))
            await asyncio.sleep(0)  # the call starts on a call thread
            time.sleep(0.2)  # the loop is busy: the call ends, its result waits for the loop
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return ext.call("echo", 2), host.supervisor.crashes(ext.id)

    answer, crashes = asyncio.run(scenario())
    assert (answer, crashes) == (2, ())


def test_the_grant_epochs_of_a_thousand_extensions_are_read_on_any_sqlite(tmp_path: Path) -> None:
    """``Host.sync_grants`` reads the durable epochs of every live extension at once: in one
    query of as many parameters, which SQLite builds before 3.32 (999 parameters at most)
    refuse with an error out of every committing host call of a host holding 1,000
    extensions. Read in batches; the limit of such a build is set here."""
    import sqlite3

    from wasihost.store.state import StateStore

    store = StateStore(tmp_path / "state")
    try:
        store._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        with Host(Policy(allow={"log"}), cache_dir=None, state_dir=tmp_path / "state") as host:
            for i in range(3):
                host.grant(f"org.example.x{i}", "log")
        ids = [f"org.example.x{i}" for i in range(1200)]
        assert sorted(store.grant_epochs(ids)) == ids[:3]
    finally:
        store.close()


# -- attacks that held, kept as tests --------------------------------------------------------------


@pytest.mark.parametrize("form", ["directory", "archive"])
def test_a_manifest_that_lies_about_its_modules_digest_is_refused(tmp_path: Path, form: str) -> None:
    """``[extension] sha256`` is checked against the module's bytes, in a package directory
    and in a ``.whpkg`` alike (it held; nothing tested it)."""
    import hashlib

    from wasihost.core.errors import PackageError

    root = tmp_path / "echo"
    shutil.copytree(FIXTURES / "echo", root)
    manifest = root / "extension.toml"
    text = manifest.read_text()
    real = hashlib.sha256((root / "echo.wasm").read_bytes()).hexdigest()
    with Host(Policy(allow=frozenset()), cache_dir=None) as host:
        for claimed, ok in (("0" * 64, False), (real, True)):
            manifest.write_text(text.replace('abi = "1.0"', f'abi = "1.0"\nsha256 = "{claimed}"'))
            source = root
            if form == "archive":
                source = tmp_path / f"echo-{claimed[:4]}.whpkg"
                assert main(["pack", str(root), "-o", str(source)]) == 0
            if ok:
                assert host.load(source).call("echo", 3) == 3
            else:
                with pytest.raises(PackageError, match=f"the manifest says {claimed}"):
                    host.load(source)


def test_a_commit_whose_grants_cannot_be_read_again_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grant sync of a committing call fails closed: with the state database unreadable
    (closed under a late call, say) the log line is not committed, and the call does not end
    in a sqlite3 error out of a host call."""
    monkeypatch.setattr(runtime, "GRANT_SYNC_S", 0.0)
    with Host(Policy(allow={"log"}), cache_dir=None, state_dir=tmp_path / "state") as host:
        host.install(FIXTURES / "logger")
        host.grant(LOGGER, "log")
        ext = host.load_installed(LOGGER)
        assert ext.call("run", {"lines": 1})["logged"] == 1
        state = host.require_state()
        real = state._db
        state._db = sqlite3.connect(":memory:")  # no grant tables: every read fails
        try:
            with contextlib.suppress(CallError):
                ext.call("run", {"lines": 1})  # its log call is denied
            assert len(ext.logs()) == 1
            assert host.supervisor.crashes(LOGGER) == ()  # not a host_error crash
        finally:
            state._db.close()
            state._db = real
