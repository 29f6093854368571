"""The packaging API (``wasihost.packages``, issue 35 item 2): a release scripted in Python
with the functions the CLI runs, their refusals (clear errors, nothing written), and the CLI
commands going through them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.packages import PUBLISHER, hello_dir
from wasihost import packages
from wasihost.cli import main
from wasihost.core.errors import (
    ConfigError,
    PackageError,
    PublisherMismatchError,
    UnsignedPackageError,
    UpdateError,
)
from wasihost.host import packages as home
from wasihost.store.state import StateStore

HELLO = "org.wasihost.fixtures.hello"


def test_a_release_scripted_in_python(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    private, public = packages.keygen(PUBLISHER, tmp_path / "keys" / "acme")
    assert (private.name, public.name) == ("acme.key", "acme.pub")
    assert private.stat().st_mode & 0o777 == 0o600

    v1 = tmp_path / "hello-0.1.0.whpkg"
    packed = packages.pack(hello_dir(tmp_path), v1)
    assert (packed.id, packed.version, packed.path) == (HELLO, "0.1.0", v1)
    assert packed.files >= 2 and len(packed.package_sha256) == 64
    assert packed.not_checked_here == ()
    signed = packages.sign(v1, private)
    assert (signed.publisher, signed.package_sha256) == (PUBLISHER, packed.package_sha256)
    verified = packages.verify(v1, trust=public)
    assert (verified.id, verified.version, verified.publisher) == (HELLO, "0.1.0", PUBLISHER)

    state = tmp_path / "state"
    installed = packages.install(v1, state_dir=state, trust=public)
    assert (installed.id, installed.version, installed.signer) == (HELLO, "0.1.0", PUBLISHER)
    v2 = tmp_path / "hello-0.2.0.whpkg"
    packages.pack(hello_dir(tmp_path / "v2", version="0.2.0"), v2)
    packages.sign(v2, private)
    assert packages.install(v2, state_dir=state, trust=public).version == "0.2.0"
    with packages.state_host(state, trust=public) as host:
        host.grant(HELLO, "log")  # a rollback and an update start the version they run
    back = packages.rollback(HELLO, state_dir=state, trust=public)
    assert back.version == "0.1.0"
    # An update starts the new version: this fixture's guest says it is 0.1.0 in its
    # handshake, so the update is refused there, and what ran before keeps running.
    with pytest.raises(UpdateError, match="0.1.0 kept"):
        packages.update(v2, state_dir=state, trust=public)
    packages.remove(HELLO, state_dir=state, purge=True)
    store = StateStore(state)
    try:
        assert store.package(HELLO) is None
    finally:
        store.close()


def test_refusals_name_the_problem_and_write_nothing(tmp_path: Path) -> None:
    _, public = packages.keygen(PUBLISHER, tmp_path / "acme")
    with pytest.raises(ConfigError, match="is a directory: give a file prefix"):
        packages.keygen(PUBLISHER, tmp_path)
    with pytest.raises(ConfigError, match="prefix is empty"):
        packages.keygen(PUBLISHER, "")
    with pytest.raises(ConfigError, match=r"must end in \.whpkg"):
        packages.pack(tmp_path / "nothing", tmp_path / "hello.zip")
    assert not (tmp_path / "hello.zip").exists()
    unsigned = tmp_path / "hello.whpkg"
    packages.pack(hello_dir(tmp_path), unsigned)
    with pytest.raises(UnsignedPackageError, match="is not signed"):
        packages.verify(unsigned, trust=public)
    with pytest.raises(ConfigError, match="needs a trust file"):
        packages.verify(unsigned)
    # Another publisher's key signs nothing, and the archive is left as it was.
    other, _ = packages.keygen("other.example", tmp_path / "other")
    before = unsigned.read_bytes()
    with pytest.raises(PublisherMismatchError):
        packages.sign(unsigned, other)
    assert unsigned.read_bytes() == before
    with pytest.raises(PackageError):
        packages.install(tmp_path / "nowhere", state_dir=tmp_path / "state")
    with pytest.raises(ConfigError, match="purge is True or False"):
        packages.remove(HELLO, state_dir=tmp_path / "state", purge="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "function"),
    [
        (["keygen", "--publisher", PUBLISHER, "--out", "{tmp}/k"], "keygen"),
        (["pack", "{hello}", "-o", "{tmp}/h.whpkg"], "pack"),
    ],
)
def test_the_cli_runs_the_api(
    argv: list[str],
    function: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The commands call the same functions: a spy in their place sees each call."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(home, function)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(home, function, spy)
    hello = hello_dir(tmp_path)
    words = [w.format(tmp=tmp_path, hello=hello) for w in argv]
    assert main(words) == 0, capsys.readouterr().err
    assert len(calls) == 1


def test_sign_and_verify_commands_print_what_the_api_returns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = packages.keygen(PUBLISHER, tmp_path / "acme")
    archive = tmp_path / "h.whpkg"
    packed = packages.pack(hello_dir(tmp_path), archive)
    assert main(["sign", str(archive), "--key", str(private)]) == 0
    assert main(["verify", str(archive), "--trust", str(public)]) == 0
    out = capsys.readouterr().out
    assert f"signed {HELLO} 0.1.0 as {PUBLISHER} (package sha256 {packed.package_sha256})" in out
    assert f"verified: {HELLO} 0.1.0 published by {PUBLISHER}" in out
