"""Installed signed packages, verified updates and rollbacks, through the real engine.

The plugin is fixtures/appfns (commands ``lookup`` and ``remember``, which call the host's
``myapp_v1.lookup`` and ``myapp_v1.remember``), repackaged per version with an ``[update]``
table: ``migrate = "remember"`` records the migration in the host's notes, ``health =
"lookup"`` asks the host whether the new version is healthy. The host's notes broker
checkpoints and restores its per-extension state like the storage broker does.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES
from tests.support.guests import build, guest_wat
from tests.support.packages import trust_of
from wasihost.cli import main
from wasihost.core.errors import AdmissionError, PackageError, UntrustedKeyError, UpdateError
from wasihost.core.manifest import parse_manifest
from wasihost.core.registry import HostFunction, embedder_function
from wasihost.core.status import HostStatus, Status
from wasihost.host import updates
from wasihost.host.defaults import default_registry
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.host.updates import ARCHIVE_NAME
from wasihost.packaging import contents, signing
from wasihost.packaging.archive import write_archive
from wasihost.packaging.files import pack_directory
from wasihost.packaging.package import identity
from wasihost.packaging.trust import SigningKey

PUBLISHER = "acme.example"
KEY = SigningKey.generate(PUBLISHER)
OTHER = SigningKey.generate("other.example")
ID = "org.wasihost.fixtures.appfns"
CAPS = {"myapp.read", "myapp.write"}


RESP_AT, RESP_CAP = 8192, 1024


def plugin(version: str) -> bytes:
    """The appfns plugin of ``version`` (its handshake reports it): ``lookup`` and ``remember``
    pass their input to the host function of the same name and answer its response, or fail
    with its negative status (as a CBOR integer error body)."""
    call = """(call ${fn} (i32.add (local.get $ptr) (local.get $cmd_len)) (local.get $in_len)
                          (i32.const {at}) (i32.const {cap}))"""
    args = {"at": RESP_AT + 4, "cap": RESP_CAP}
    body = f"""
    (global.set $r
      (if (result i32) (i32.eq (local.get $cmd_len) (i32.const 6))
        (then {call.format(fn="lookup", **args)})
        (else {call.format(fn="remember", **args)})))
    (i32.store (i32.const {RESP_AT}) (i32.const 0))
    (if (i32.lt_s (global.get $r) (i32.const 0))
      (then
        (i32.store (i32.const {RESP_AT}) (i32.const 1))
        (i32.store8 (i32.const {RESP_AT + 4}) (i32.sub (i32.const 0x1f) (global.get $r)))
        (return (call $packed (i32.const {RESP_AT}) (i32.const 5)))))
    (call $packed (i32.const {RESP_AT}) (i32.add (global.get $r) (i32.const 4)))"""
    imports = "".join(
        f'(import "myapp_v1" "{name}" (func ${name} (param i32 i32 i32 i32) (result i32)))'
        for name in ("lookup", "remember")
    )
    hello = {"id": ID, "version": version, "abi": "1.0", "features": sorted(CAPS)}
    return build(
        guest_wat(
            body,
            imports=imports + '(@custom "wasihost_abi.myapp" "1.0")',
            extra="(global $r (mut i32) (i32.const 0))",
            hello=hello,
        )
    )


def appfns_dir(tmp: Path, version: str, update: str = "", publisher: str = PUBLISHER) -> Path:
    root = tmp / f"appfns-{version}-{publisher}-{abs(hash(update)) % 10**6}"
    root.mkdir()
    (root / "appfns.wasm").write_bytes(plugin(version))
    text = (FIXTURES / "appfns" / "extension.toml").read_text()
    text = text.replace('version = "0.1.0"', f'version = "{version}"\npublisher = "{publisher}"')
    (root / "extension.toml").write_text(text + (f"\n[update]\n{update}\n" if update else ""))
    return root


def signed_archive(files: dict[str, bytes], key: SigningKey) -> bytes:
    """``files`` archived with ``key``'s signature (as ``wasihost sign`` would make it), for a
    manifest that requests the application's capabilities."""
    caps = default_registry().capabilities() | CAPS
    manifest = parse_manifest(files["extension.toml"].decode(), caps)
    module = hashlib.sha256(files[manifest.module]).hexdigest()
    digest = hashlib.sha256(contents.render(files)).hexdigest()
    return write_archive(files, signing.sign(identity(manifest, module), digest, key))


def package(tmp: Path, version: str, update: str = "", key: SigningKey = KEY) -> Path:
    files = pack_directory(appfns_dir(tmp, version, update, key.publisher))
    path = tmp / f"appfns-{version}-{key.publisher}-{abs(hash(update)) % 10**6}.whpkg"
    path.write_bytes(signed_archive(files, key))
    return path


class Notes:
    """The application's side of ``myapp_v1.lookup``/``remember``: notes per extension, and
    a health answer the test controls. Checkpointed like any broker's durable state."""

    name = "notes"
    functions = ("myapp_v1.lookup", "myapp_v1.remember")
    capabilities = frozenset(CAPS)

    def __init__(self) -> None:
        self.notes: dict[str, list[Any]] = {}
        self.healthy = True

    def open(self, ext: Extension) -> Extension:
        return ext

    def handler(self, entry: HostFunction, state: Extension) -> Callable[[Any, Any], Any]:
        ext = state
        if entry.name == "lookup":

            def lookup(call: Any, request: Any) -> Any:
                if not self.healthy:
                    raise HostStatus(Status.UNAVAILABLE)
                return "healthy"

            return lookup

        def remember(call: Any, request: Any) -> Any:
            self.notes.setdefault(ext.id, []).append(request)
            return len(self.notes[ext.id])

        return remember

    def close(self, state: Extension) -> None:
        pass

    def checkpoint(self, host: Host, extension: str, directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "notes.json").write_text(json.dumps(self.notes.get(extension, [])))

    def restore(self, host: Host, extension: str, directory: Path) -> None:
        self.notes[extension] = json.loads((directory / "notes.json").read_text())


def entries() -> list[HostFunction]:
    limits = {"max_request_bytes": 1024, "max_response_bytes": 64, "fuel_base": 1000}
    return [
        embedder_function(
            "myapp.lookup", capability="myapp.read", since="1.0", fuel_per_byte=1, **limits
        ),
        embedder_function(
            "myapp.remember",
            capability="myapp.write",
            since="1.0",
            fuel_per_byte=1,
            commits=True,
            **limits,
        ),
    ]


def make_host(state: Path, notes: Notes, key: SigningKey = KEY) -> Host:
    host = Host(
        Policy(allow=CAPS, trusted_publishers=trust_of(key)), cache_dir=None, state_dir=state
    )
    for entry in entries():
        host.registry.add_function(entry)
    host.add_broker(notes)
    return host


@pytest.fixture
def notes() -> Notes:
    return Notes()


@pytest.fixture
def host(tmp_path: Path, notes: Notes) -> Iterator[Host]:
    with make_host(tmp_path / "state", notes) as h:
        yield h


def installed_running(host: Host, tmp: Path, version: str = "0.1.0", update: str = "") -> Extension:
    host.install(package(tmp, version, update))
    for cap in sorted(CAPS):
        host.grant(ID, cap)
    ext = host.load_installed(ID)
    assert ext.call("lookup") == "healthy"
    return ext


def version_of(host: Host) -> str:
    pkg = host.require_state().package(ID)
    assert pkg is not None
    return pkg.version


# -- install -----------------------------------------------------------------------------------


def test_a_signed_package_installs_read_only_and_is_verified_again_at_each_start(
    host: Host, tmp_path: Path, notes: Notes
) -> None:
    pkg = host.install(package(tmp_path, "0.1.0"))
    assert (pkg.signer, pkg.version) == (PUBLISHER, "0.1.0") and pkg.package_digest
    archive = pkg.path / ARCHIVE_NAME
    assert stat.S_IMODE(archive.stat().st_mode) == 0o444
    assert stat.S_IMODE(pkg.path.stat().st_mode) == 0o555
    for cap in sorted(CAPS):
        host.grant(ID, cap)
    host.load_installed(ID).close()
    host.forget(host.extension(ID) or host.load_installed(ID))

    # The same state, read by a host that no longer trusts the publisher: refused at start.
    with (
        make_host(tmp_path / "state", Notes(), OTHER) as stranger,
        pytest.raises(PackageError, match="no longer verifies as installed"),
    ):
        stranger.load_installed(ID)
    # A byte of the stored archive changed: refused at start, by every host.
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 1
    os.chmod(archive, 0o644)
    archive.write_bytes(bytes(data))
    with make_host(tmp_path / "state", Notes()) as again, pytest.raises(PackageError):
        again.load_installed(ID)


def test_an_archive_that_does_not_verify_is_not_installed(host: Host, tmp_path: Path) -> None:
    unsigned = tmp_path / "unsigned.whpkg"
    unsigned.write_bytes(write_archive(pack_directory(appfns_dir(tmp_path, "0.1.0"))))
    with pytest.raises(AdmissionError, match="installs only verified"):
        host.install(unsigned)
    with pytest.raises(UntrustedKeyError, match="'other.example' is not in the trust store"):
        host.install(package(tmp_path, "0.1.0", key=OTHER))
    assert host.require_state().packages() == []


def test_installing_over_keeps_the_publisher_the_version_order_and_one_content_per_version(
    host: Host, tmp_path: Path
) -> None:
    host.install(package(tmp_path, "0.2.0"))
    other_host_trust = trust_of(KEY, OTHER)
    with pytest.raises(AdmissionError, match="must be verified as 'acme.example'"):
        host.install(package(tmp_path, "0.3.0", key=OTHER), trust=other_host_trust)
    with pytest.raises(PackageError, match="would downgrade"):
        host.install(package(tmp_path, "0.1.0"))
    with pytest.raises(PackageError, match="other content"):
        host.install(package(tmp_path, "0.2.0", 'health = "lookup"'))
    assert version_of(host) == "0.2.0"


# -- update ------------------------------------------------------------------------------------

UPDATE = 'migrate = "remember"\nhealth = "lookup"'


def test_an_update_migrates_checks_health_switches_and_rolls_back(
    host: Host, tmp_path: Path, notes: Notes
) -> None:
    old = installed_running(host, tmp_path)
    old.call("remember", "before the update")
    record = host.update_installed(package(tmp_path, "0.2.0", UPDATE))
    assert (record.version, record.previous and record.previous.version) == ("0.2.0", "0.1.0")
    new = host.extension(ID)
    assert new is not None and new is not old and new.manifest and new.manifest.version == "0.2.0"
    assert notes.notes[ID] == [
        "before the update",
        {"from": "0.1.0", "to": "0.2.0", "direction": "up"},
    ]
    new.call("remember", "after the update")
    assert old.lifecycle.state.value == "closed"

    back = host.rollback(ID)
    assert back.version == "0.1.0" and version_of(host) == "0.1.0"
    # A forward-only migration is undone by the checkpoint taken before it: what the new
    # version wrote since is gone with it.
    assert notes.notes[ID] == ["before the update"]
    running = host.extension(ID)
    assert running is not None and running.manifest and running.manifest.version == "0.1.0"
    assert running.call("lookup") == "healthy"
    with pytest.raises(UpdateError, match="nothing to roll back to"):
        host.rollback(ID)


def test_one_install_update_or_rollback_of_an_extension_runs_at_a_time(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reads what is installed and then writes on it: an update held at its checkpoint
    (the old version paused, the new one written) turns every other transaction of the same
    extension away at once, and finishes as if alone. Before, nothing kept a second update
    from checkpointing, migrating and activating over the first."""
    installed_running(host, tmp_path)
    entered, release = threading.Event(), threading.Event()
    take_checkpoint = updates.take_checkpoint

    def held(*args: Any) -> Path:
        entered.set()
        assert release.wait(10)
        return take_checkpoint(*args)

    monkeypatch.setattr(updates, "take_checkpoint", held)
    failures: list[BaseException] = []

    def first() -> None:
        try:
            host.update_installed(package(tmp_path, "0.2.0", UPDATE))
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=first)
    worker.start()
    try:
        assert entered.wait(10)
        for attempt in (
            lambda: host.update_installed(package(tmp_path, "0.3.0", UPDATE)),
            lambda: host.install(package(tmp_path, "0.4.0")),
            lambda: host.rollback(ID),
        ):
            with pytest.raises(UpdateError, match="under way"):
                attempt()
    finally:
        release.set()
        worker.join(10)
    assert failures == [] and version_of(host) == "0.2.0"
    # Free again: the next transaction runs (back to the version the update replaced).
    monkeypatch.setattr(updates, "take_checkpoint", take_checkpoint)
    assert host.rollback(ID).version == "0.1.0"


def test_a_transaction_prepared_against_another_install_record_is_refused(
    host: Host, tmp_path: Path
) -> None:
    """What a transaction read before it took the lock must still be what is installed."""
    installed_running(host, tmp_path)
    with updates.exclusive(host, ID), pytest.raises(UpdateError, match="changed it"):
        updates.still_current(host, ID, None)


def test_a_reversible_migration_is_run_down_instead_of_restoring_the_checkpoint(
    host: Host, tmp_path: Path, notes: Notes
) -> None:
    installed_running(host, tmp_path)
    host.update_installed(package(tmp_path, "0.2.0", 'migrate = "remember"\nreversible = true'))
    host.extension(ID).call("remember", "kept")  # type: ignore[union-attr]
    host.rollback(ID)
    assert notes.notes[ID] == [
        {"from": "0.1.0", "to": "0.2.0", "direction": "up"},
        "kept",
        {"from": "0.2.0", "to": "0.1.0", "direction": "down"},
    ]


def test_a_failed_update_restores_the_checkpoint_and_keeps_the_old_version_running(
    host: Host, tmp_path: Path, notes: Notes
) -> None:
    old = installed_running(host, tmp_path)
    old.call("remember", "v1 state")
    trees = sorted(p.name for p in (host.require_state().packages_dir / ID).iterdir())
    notes.healthy = False  # the new version's health command fails, after its migration ran
    with pytest.raises(UpdateError, match=r"update of .* to 0.2.0 failed, 0.1.0 kept"):
        host.update_installed(package(tmp_path, "0.2.0", UPDATE))
    assert notes.notes[ID] == ["v1 state"]  # the migration's write is undone
    assert host.extension(ID) is old and old.lifecycle.state.value == "running"
    notes.healthy = True
    assert old.call("lookup") == "healthy"
    assert version_of(host) == "0.1.0"
    assert sorted(p.name for p in (host.require_state().packages_dir / ID).iterdir()) == trees
    assert not list((host.require_state().checkpoints_dir / ID).iterdir())


def test_a_refused_update_changes_nothing(host: Host, tmp_path: Path) -> None:
    old = installed_running(host, tmp_path)
    with pytest.raises(AdmissionError, match="must be verified as 'acme.example'"):
        host.update_installed(package(tmp_path, "0.3.0", key=OTHER), trust=trust_of(OTHER))
    with pytest.raises(PackageError, match="would downgrade"):
        host.update_installed(package(tmp_path, "0.0.9"))
    assert host.extension(ID) is old and old.call("lookup") == "healthy"


# -- the command line -------------------------------------------------------------------------


PLAIN = "org.example.plain"
PLAIN_MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.example.plain"
version = "{version}"
publisher = "acme.example"
abi = "1.0"
module = "plain.wasm"

[commands]
run = {{}}
"""


def plain_package(tmp: Path, version: str) -> Path:
    """A signed package of a plugin that needs no capability, for the command line's host."""
    hello = {"id": PLAIN, "version": version, "abi": "1.0", "features": []}
    files = {
        "extension.toml": PLAIN_MANIFEST.format(version=version).encode(),
        "plain.wasm": build(guest_wat(hello=hello)),
    }
    path = tmp / f"plain-{version}.whpkg"
    path.write_bytes(signed_archive(files, KEY))
    return path


def test_install_update_and_rollback_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trust = tmp_path / "trust"
    trust.write_text(KEY.public_line())
    flags = ["--state-dir", str(tmp_path / "state"), "--trust", str(trust)]

    assert main(["install", str(plain_package(tmp_path, "0.1.0")), *flags]) == 0
    assert "installed org.example.plain 0.1.0" in capsys.readouterr().out
    assert main(["update", str(plain_package(tmp_path, "0.2.0")), *flags]) == 0
    out = capsys.readouterr().out
    assert "updated org.example.plain 0.1.0 -> 0.2.0, signed by acme.example" in out
    assert main(["run", PLAIN, "run", *flags]) == 0
    assert capsys.readouterr().out.strip() == "null"
    assert main(["rollback", PLAIN, *flags]) == 0
    assert "rolled back org.example.plain 0.2.0 -> 0.1.0" in capsys.readouterr().out
    # Without the trust file, the installed signed package is not verified again: refused.
    assert main(["run", PLAIN, "run", "--state-dir", str(tmp_path / "state")]) == 1
    err = capsys.readouterr().err
    assert "no longer verifies as installed" in err and "Traceback" not in err
    assert main(["rollback", PLAIN, *flags]) == 1
    assert "nothing to roll back to" in capsys.readouterr().err

    # Publishing a revocation with --state-dir disables the installed extension durably.
    assert main(["keygen", "--publisher", "ops.example", "--out", str(tmp_path / "ops")]) == 0
    listfile = tmp_path / "revocations"
    revoke = ["revoke", str(listfile), "--key", str(tmp_path / "ops.key")]
    assert main([*revoke, "--extension", PLAIN, "0.1.0", "--state-dir", flags[1]]) == 0
    out = capsys.readouterr().out
    assert f"disabled installed {PLAIN}: extension {PLAIN} 0.1.0 is revoked" in out
    assert main(["run", PLAIN, "run", *flags]) == 1
    assert "revoked" in capsys.readouterr().err
