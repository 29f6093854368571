"""The signed revocation list: a revoked key, publisher, digest or version is refused at
admission and before an update activates; a stale, unverifiable, tampered or rolled-back
list refuses every package (fail closed), also across restarts. Time is injected."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.common import ALL_CAPS, FIXTURES
from tests.support.packages import PUBLISHER, hello_files, signed_archive
from wasihost.cli import main
from wasihost.core.errors import (
    CallError,
    ConfigError,
    RevocationListError,
    RevokedError,
    UntrustedKeyError,
)
from wasihost.core.lifecycle import ExtensionRevoked, State
from wasihost.host import runtime
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging import revocation
from wasihost.packaging.revocation import MemoryFloor, RevocationList, Revocations
from wasihost.packaging.trust import SigningKey, TrustStore

KEY = SigningKey.generate(PUBLISHER)
OPS = SigningKey.generate("ops.example")
HELLO = "org.wasihost.fixtures.hello"
# 2026-01-01T00:00:00Z: "now" for every test; the lists expire a day later.
NOW = 1767225600.0
DAY = 86400.0
TRUST_TEXT = KEY.public_line() + OPS.public_line().rstrip("\n") + " revocations\n"
TRUST = TrustStore.parse(TRUST_TEXT)
GREET = {"name": "ada"}


def signed_list(version: int = 1, expires: float = NOW + DAY, **entries: object) -> bytes:
    return RevocationList(version, expires, **entries).sign(OPS)  # type: ignore[arg-type]


@pytest.fixture
def pkgs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for version in ("0.1.0", "0.2.0"):
        path = tmp_path / f"hello-{version}.whpkg"
        path.write_bytes(signed_archive(hello_files(tmp_path, version=version), KEY))
        out[version] = path
    return out


@pytest.fixture
def listfile(tmp_path: Path) -> Path:
    path = tmp_path / "revocations"
    path.write_bytes(signed_list())
    return path


def host_for(listfile: Path, state_dir: Path | None = None, now: float = NOW) -> Host:
    revocations = Revocations(listfile, TRUST, clock=lambda: now)
    policy = Policy(allow=ALL_CAPS, trusted_publishers=TRUST, revocations=revocations)
    return Host(policy, cache_dir=None, state_dir=state_dir)


@pytest.fixture
def host(listfile: Path) -> Iterator[Host]:
    with host_for(listfile) as h:
        yield h


def test_a_current_list_admits_what_it_does_not_revoke(
    host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    listfile.write_bytes(signed_list(publishers=frozenset({"someone.else"})))
    ext = host.load(pkgs["0.1.0"])
    assert ext.call("greet", GREET) == {"greeting": "hello, ada"}


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ({"keys": frozenset({KEY.public_bytes})}, "its signing key .* is revoked"),
        ({"publishers": frozenset({PUBLISHER})}, f"publisher '{PUBLISHER}' is revoked"),
        ({"extensions": frozenset({(HELLO, "0.1.0")})}, f"extension {HELLO} 0.1.0 is revoked"),
    ],
)
def test_a_revoked_key_publisher_or_version_is_refused(
    host: Host, pkgs: dict[str, Path], listfile: Path, entries: dict[str, object], fragment: str
) -> None:
    listfile.write_bytes(signed_list(**entries))
    with pytest.raises(RevokedError, match=fragment):
        host.load(pkgs["0.1.0"])
    assert host.extension(HELLO) is None


def test_a_revoked_package_digest_is_refused(
    host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    from wasihost.packaging.archive import read_archive

    digest = read_archive(pkgs["0.1.0"].read_bytes()).digest
    listfile.write_bytes(signed_list(package_digests=frozenset({digest})))
    with pytest.raises(RevokedError, match=f"package digest {digest} is revoked"):
        host.load(pkgs["0.1.0"])
    # The other release, of other digest, is admitted under the same list.
    assert host.load(pkgs["0.2.0"]).package.signer == PUBLISHER


def test_a_revoked_module_digest_refuses_a_package_directory(host: Host, listfile: Path) -> None:
    module = hashlib.sha256((FIXTURES / "hello" / "hello.wasm").read_bytes()).hexdigest()
    listfile.write_bytes(signed_list(module_digests=frozenset({module})))
    with pytest.raises(RevokedError, match="module digest"):
        host.load(FIXTURES / "hello")


def test_an_update_to_a_revoked_version_is_refused_and_the_old_one_runs(
    host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    host.load(pkgs["0.1.0"])
    listfile.write_bytes(signed_list(2, extensions=frozenset({(HELLO, "0.2.0")})))
    with pytest.raises(RevokedError, match="0.2.0 is revoked"):
        host.update(pkgs["0.2.0"])
    ext = host.extension(HELLO)
    assert ext is not None and ext.call("greet", GREET) == {"greeting": "hello, ada"}


def test_an_expired_list_refuses_every_package(pkgs: dict[str, Path], listfile: Path) -> None:
    """A freeze attack: the last list served forever stops working when it expires."""
    with host_for(listfile, now=NOW + DAY) as host:
        for source in (pkgs["0.1.0"], FIXTURES / "hello"):
            with pytest.raises(RevocationListError, match="expired at 2026-01-02T00:00:00Z"):
                host.load(source)


def test_an_older_list_after_a_newer_one_is_refused(
    pkgs: dict[str, Path], listfile: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    listfile.write_bytes(signed_list(5))
    with host_for(listfile, state) as host:
        host.grant(HELLO, "log")  # a host with a state directory grants from its table
        host.load(pkgs["0.1.0"])
        listfile.write_bytes(signed_list(4))
        with pytest.raises(RevocationListError, match="version 4 is older than version 5"):
            host.update(pkgs["0.2.0"])
    # Across a restart too: the state directory remembers version 5.
    with host_for(listfile, state) as host:
        with pytest.raises(RevocationListError, match="a rollback"):
            host.load(pkgs["0.1.0"])
        listfile.write_bytes(signed_list(5))  # the same version again is fine
        host.load(pkgs["0.1.0"])


def test_a_list_signed_by_a_publisher_key_is_refused(
    host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    listfile.write_bytes(RevocationList(1, NOW + DAY).sign(KEY))
    with pytest.raises(RevocationListError, match="does not mark as a revocation key"):
        host.load(pkgs["0.1.0"])


def test_a_revocation_key_signs_no_package(tmp_path: Path, listfile: Path) -> None:
    """Separate roles: the revocation key is not a publisher key of its holder."""
    rogue = SigningKey("ops.example", OPS.private)
    path = tmp_path / "ops.whpkg"
    path.write_bytes(signed_archive(hello_files(tmp_path, publisher="ops.example"), rogue))
    with host_for(listfile) as host, pytest.raises(UntrustedKeyError, match="not in the trust"):
        host.load(path)


@pytest.mark.parametrize(
    ("mangle", "fragment"),
    [
        (lambda b: b.replace(b"version 1", b"version 9"), "does not match the list"),
        (lambda b: b.replace(b"publisher x.example", b"publisher y.example"), "does not match"),
        (lambda b: b[:-1], "ending in a signature line"),
        (lambda b: b"", "ending in a signature line"),
        (lambda b: b.rsplit(b"\nsignature", 1)[0] + b"\n", "is not 'signature"),
        (lambda b: b"\xff" + b, "not ASCII"),
    ],
)
def test_a_tampered_or_garbled_list_refuses_every_package(
    host: Host, pkgs: dict[str, Path], listfile: Path, mangle: object, fragment: str
) -> None:
    listfile.write_bytes(mangle(signed_list(publishers=frozenset({"x.example"}))))  # type: ignore[operator]
    with pytest.raises(RevocationListError, match=re.escape(fragment)):
        host.load(pkgs["0.1.0"])


def test_a_missing_list_refuses_every_package(
    host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    listfile.unlink()
    with pytest.raises(RevocationListError, match="cannot be read"):
        host.load(pkgs["0.1.0"])


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_only_revocation_list_errors_leave_the_reader(data: st.DataObject) -> None:
    blob = bytearray(
        signed_list(
            publishers=frozenset({"x.example"}),
            keys=frozenset({KEY.public_bytes}),
            extensions=frozenset({(HELLO, "1.0.0")}),
        )
    )
    for _ in range(data.draw(st.integers(1, 3))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(RevocationListError):
        revocation.parse(bytes(blob[: data.draw(st.integers(0, len(blob)))]), TRUST)


def test_cli_revocations_on_verify_inspect_and_run(
    pkgs: dict[str, Path], listfile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trust = tmp_path / "trust"
    trust.write_text(TRUST_TEXT)
    # The CLI's clock is the real one: a list valid for ten years.
    listfile.write_bytes(signed_list(expires=NOW + 3650 * DAY))
    flags = ["--trust", str(trust), "--revocations", str(listfile)]
    assert main(["verify", str(pkgs["0.1.0"]), *flags]) == 0
    assert main(["run", str(pkgs["0.1.0"]), "greet", *flags, "--input", '{"name":"a"}']) == 0
    capsys.readouterr()
    listfile.write_bytes(signed_list(2, NOW + 3650 * DAY, extensions=frozenset({(HELLO, "0.1.0")})))
    for cmd in (["verify"], ["inspect"], ["run"]):
        argv = [*cmd, str(pkgs["0.1.0"])] + (["greet"] if cmd == ["run"] else []) + flags
        assert main(argv) == 1
        assert "error: revocation: org.wasihost.fixtures.hello is refused" in (
            capsys.readouterr().err
        )
    assert main(["inspect", str(pkgs["0.1.0"]), "--revocations", str(listfile)]) == 2
    assert "--revocations needs --trust" in capsys.readouterr().err


def test_memory_floor_refuses_a_rollback_without_state() -> None:
    floor = MemoryFloor()
    floor.raise_to(3)
    floor.raise_to(2)
    assert floor.highest() == 3


def test_the_trust_file_marks_revocation_keys_apart() -> None:
    assert TRUST.revocation_keys_for("ops.example") == {OPS.public_bytes}
    assert TRUST.keys_for("ops.example") == frozenset()  # it verifies no package
    assert TRUST.revocation_keys_for(PUBLISHER) == frozenset()
    with pytest.raises(ConfigError, match="line 1: expected"):
        TrustStore.parse(OPS.public_line().rstrip("\n") + " admin\n")


def test_cli_revoke_writes_a_new_signed_version_each_time(
    pkgs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keygen", "--publisher", "ops.example", "--out", str(tmp_path / "ops")]) == 0
    trust = tmp_path / "trust"
    ops_line = (tmp_path / "ops.pub").read_text().rstrip("\n")
    trust.write_text(KEY.public_line() + ops_line + " revocations\n")
    lst, ops_key = tmp_path / "list", str(tmp_path / "ops.key")
    flags = ["--trust", str(trust), "--revocations", str(lst)]
    assert main(["revoke", str(lst), "--key", ops_key, "--extension", HELLO, "0.2.0"]) == 0
    assert "version 1" in capsys.readouterr().out
    assert main(["verify", str(pkgs["0.1.0"]), *flags]) == 0
    assert main(["revoke", str(lst), "--key", ops_key, "--package", str(pkgs["0.1.0"])]) == 0
    assert "version 2" in capsys.readouterr().out
    for version, why in (("0.1.0", "package digest"), ("0.2.0", "extension")):
        assert main(["verify", str(pkgs[version]), *flags]) == 1
        assert f"{why}" in capsys.readouterr().err
    # Only the key that signed the list extends it; a bad entry is refused before writing.
    other = tmp_path / "other"
    assert main(["keygen", "--publisher", "ops.example", "--out", str(other)]) == 0
    assert main(["revoke", str(lst), "--key", f"{other}.key", "--publisher", "x.example"]) == 1
    # A malformed entry is a usage error naming its flag (exit 2), refused before the key is read.
    assert main(["revoke", str(lst), "--key", ops_key, "--module-sha256", "XYZ"]) == 2
    assert "--module-sha256: 'XYZ' is not 64 lowercase hex" in capsys.readouterr().err
    assert revocation.parse(lst.read_bytes(), TrustStore.parse(trust.read_text())).version == 2


def test_cli_with_a_state_dir_refuses_a_rollback_across_commands(
    pkgs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trust, lst = tmp_path / "trust", tmp_path / "list"
    trust.write_text(TRUST_TEXT)
    flags = ["--trust", str(trust), "--revocations", str(lst), "--state-dir", str(tmp_path / "s")]
    lst.write_bytes(signed_list(3, NOW + 3650 * DAY))
    assert main(["verify", str(pkgs["0.1.0"]), *flags]) == 0
    lst.write_bytes(signed_list(2, NOW + 3650 * DAY))
    assert main(["inspect", str(pkgs["0.1.0"]), *flags]) == 1
    assert "version 2 is older than version 3" in capsys.readouterr().err
    # Without the state directory, each command starts from nothing.
    assert main(["verify", str(pkgs["0.1.0"]), *flags[:4]]) == 0


# -- what is already running ---------------------------------------------------------------------


def test_a_refreshed_list_disables_a_running_extension_it_revokes(
    host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    ext = host.load(pkgs["0.1.0"])
    assert ext.call("greet", GREET) == {"greeting": "hello, ada"}
    assert host.refresh_revocations() == {}
    listfile.write_bytes(signed_list(2, extensions=frozenset({(HELLO, "0.1.0")})))
    assert host.refresh_revocations() == {HELLO: f"extension {HELLO} 0.1.0 is revoked"}
    with pytest.raises(ExtensionRevoked):
        ext.call("greet", GREET)


def test_a_committing_host_call_reads_the_list_again(
    monkeypatch: pytest.MonkeyPatch, host: Host, pkgs: dict[str, Path], listfile: Path
) -> None:
    monkeypatch.setattr(runtime, "REVOCATION_RECHECK_S", 0.0)
    ext = host.load(pkgs["0.1.0"])
    assert ext.call("greet", GREET) == {"greeting": "hello, ada"}
    records = len(ext.log.records)
    listfile.write_bytes(signed_list(2, publishers=frozenset({PUBLISHER})))
    # greet's log record is the committing call: it reads the list, which disables the
    # extension (the guest is interrupted at its next epoch tick, if it has not returned by
    # then, and then the call itself reports the revocation); the record is not appended,
    # and the next call is refused.
    with contextlib.suppress(CallError, ExtensionRevoked):
        ext.call("greet", GREET)
    assert len(ext.log.records) == records
    assert ext.lifecycle.state is State.REVOKED
    with pytest.raises(ExtensionRevoked):
        ext.call("greet", GREET)


def test_a_list_gone_stale_refuses_committing_calls_until_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch, pkgs: dict[str, Path], listfile: Path
) -> None:
    monkeypatch.setattr(runtime, "REVOCATION_RECHECK_S", 0.0)
    now = [NOW]
    revocations = Revocations(listfile, TRUST, clock=lambda: now[0])
    policy = Policy(allow=ALL_CAPS, trusted_publishers=TRUST, revocations=revocations)
    with Host(policy, cache_dir=None) as host:
        ext = host.load(pkgs["0.1.0"])
        ext.call("greet", GREET)
        records = len(ext.log.records)
        now[0] = NOW + 2 * DAY  # the list expired: a freeze attack, or a feed that stopped
        assert ext.call("greet", GREET) == {"greeting": "hello, ada"}  # computing goes on...
        assert len(ext.log.records) == records  # ...but nothing commits
        with pytest.raises(RevocationListError, match="expired"):
            host.refresh_revocations()
        listfile.write_bytes(signed_list(2, expires=NOW + 3 * DAY))
        ext.call("greet", GREET)
        assert len(ext.log.records) == records + 1
