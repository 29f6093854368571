"""Signed .whpkg packages through the real engine and the command line: a verified package
runs, every bad one is refused with a specific error, nothing is installed, and an admitted
extension keeps running when its update is refused."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from tests.support.packages import (
    PUBLISHER,
    hello_dir,
    hello_files,
    raw_zip,
    signature_for,
    signed_archive,
    trust_of,
)
from wasihost.cli import main
from wasihost.core.errors import (
    AdmissionError,
    ArchiveError,
    ConfigError,
    InvalidSignatureError,
    UntrustedKeyError,
)
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.archive import write_archive
from wasihost.packaging.trust import SigningKey

KEY = SigningKey.generate(PUBLISHER)
GREET = {"name": "ada"}


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    return write(tmp_path / "hello.whpkg", signed_archive(hello_files(tmp_path), KEY))


@pytest.fixture
def strict() -> Iterator[Host]:
    policy = Policy(allow=ALL_CAPS, trusted_publishers=trust_of(KEY), require_signed=True)
    with Host(policy, cache_dir=None) as h:
        yield h


def test_a_signed_package_runs_with_its_identity_enforced(signed: Path, strict: Host) -> None:
    ext = strict.load(signed)
    assert ext.call("greet", GREET) == {"greeting": "hello, ada"}
    assert ext.package.signer == PUBLISHER
    assert ext.package.package_digest is not None


def test_host_load_with_trust_requires_a_signature(tmp_path: Path) -> None:
    unsigned = write(tmp_path / "u.whpkg", write_archive(hello_files(tmp_path)))
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        with pytest.raises(AdmissionError, match="no signature verified by a trusted"):
            host.load(unsigned, trust=trust_of(KEY))
        # Without trust it loads, and stays declared only.
        assert host.load(unsigned).package.signer is None


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (FIXTURES / "hello", "is a package directory, not a signed .whpkg"),
        (FIXTURES / "hello" / "hello.wasm", "is a bare module, not a signed .whpkg"),
    ],
)
def test_require_signed_refuses_unsigned_sources(strict: Host, source: Path, fragment: str) -> None:
    with pytest.raises(AdmissionError, match=fragment):
        strict.load(source, grants=["log"] if source.suffix == ".wasm" else None)
    assert strict.extension("org.wasihost.fixtures.hello") is None


def test_require_signed_needs_a_trust_store() -> None:
    with pytest.raises(ConfigError, match="require_signed needs trusted_publishers"):
        Policy(require_signed=True)


def test_a_refused_update_leaves_the_old_version_running(
    tmp_path: Path, signed: Path, strict: Host
) -> None:
    old = strict.load(signed)
    # The guest's handshake reports its built-in version, so the update differs by a file.
    newer = {**hello_files(tmp_path / "v2"), "NOTES.txt": b"second release\n"}
    tampered = dict(newer, **{"hello.wasm": newer["hello.wasm"] + b"\0"})
    bad = write(tmp_path / "bad.whpkg", write_archive(tampered, signature_for(newer, KEY)))
    with pytest.raises(InvalidSignatureError):
        strict.update(bad)
    impostor = write(tmp_path / "imp.whpkg", signed_archive(newer, SigningKey.generate(PUBLISHER)))
    with pytest.raises(UntrustedKeyError):
        strict.update(impostor)
    assert strict.extension(old.id) is old
    assert old.call("greet", GREET) == {"greeting": "hello, ada"}
    good = write(tmp_path / "v2.whpkg", signed_archive(newer, KEY))
    new = strict.update(good)
    assert new.package.package_digest != old.package.package_digest
    assert new.call("greet", GREET) == {"greeting": "hello, ada"}


def test_a_verified_identity_is_replaced_only_by_its_publisher(
    tmp_path: Path, signed: Path
) -> None:
    policy = Policy(allow=ALL_CAPS, trusted_publishers=trust_of(KEY))
    with Host(policy, cache_dir=None) as host:
        old = host.load(signed)
        with pytest.raises(AdmissionError, match="must be signed by 'acme.example' too"):
            host.update(hello_dir(tmp_path / "v2", version="0.2.0"))
        assert old.call("greet", GREET) == {"greeting": "hello, ada"}
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        old = host.load(signed, trust=trust_of(KEY))
        with pytest.raises(AdmissionError, match="must be signed by 'acme.example' too"):
            host.update(signed)  # not verified: this host's policy trusts nobody
        assert host.update(signed, trust=trust_of(KEY)).package.signer == PUBLISHER


def test_a_hostile_archive_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    hostile = write(tmp_path / "h.whpkg", raw_zip([("../escaped.txt", b"x")]))
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=tmp_path / "state") as host:
        with pytest.raises(ArchiveError, match="'..' component"):
            host.load(hostile)
        with pytest.raises(ArchiveError, match="'..' component"):
            host.install(hostile)
        assert host.require_state().packages() == []
    assert not (tmp_path.parent / "escaped.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.whpkg", "state"]


# -- the command line -----------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_keygen_pack_sign_verify_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "acme"
    assert cli(capsys, "keygen", "--publisher", PUBLISHER, "--out", prefix)[0] == 0
    assert stat.S_IMODE((tmp_path / "acme.key").stat().st_mode) == 0o600
    pub = tmp_path / "acme.pub"
    assert pub.read_text().startswith(f"{PUBLISHER} ed25519 ")
    pkg = tmp_path / "hello.whpkg"
    code, out, _ = cli(capsys, "pack", hello_dir(tmp_path), "-o", pkg)
    assert code == 0 and "packed org.wasihost.fixtures.hello 0.1.0" in out
    code, _, err = cli(capsys, "verify", pkg, "--trust", pub)
    assert code == 1
    assert err.splitlines() == [
        f"error: signature: {pkg} is not signed",
        f"hint: sign it: wasihost sign {pkg} --key PREFIX.key",
    ]
    assert cli(capsys, "sign", pkg, "--key", tmp_path / "acme.key")[0] == 0
    code, out, _ = cli(capsys, "verify", pkg, "--trust", pub)
    assert (code, out.split(" (")[0]) == (
        0,
        f"verified: org.wasihost.fixtures.hello 0.1.0 published by {PUBLISHER}",
    )
    code, out, _ = cli(
        capsys, "run", pkg, "greet", "--input", json.dumps(GREET), "--trust", pub, "--no-cache"
    )
    assert (code, out) == (0, '{"greeting": "hello, ada"}\n')
    code, out, _ = cli(capsys, "inspect", pkg, "--trust", pub, "--json")
    report = json.loads(out)
    assert report["manifest"]["identity"] == "enforced"
    assert report["signature"]["publisher"] == PUBLISHER
    assert "publisher acme.example: verified" in report["enforced"][0]
    code, out, _ = cli(capsys, "inspect", pkg, "--json")
    assert json.loads(out)["manifest"]["identity"] == "declared"


def test_verify_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = hello_files(tmp_path)
    other = SigningKey.generate("other.example")
    trust = write(tmp_path / "trust", other.public_line().encode())
    pkg = write(tmp_path / "p.whpkg", signed_archive(files, KEY))
    code, _, err = cli(capsys, "verify", pkg, "--trust", trust)
    assert code == 1
    assert err.splitlines() == [
        "error: signature: publisher 'acme.example' is not in the trust store",
        f"hint: if you trust this publisher, append its PREFIX.pub line to {trust}",
    ]
    tampered = dict(files, **{"hello.wasm": files["hello.wasm"] + b"\0"})
    write(pkg, write_archive(tampered, signature_for(files, KEY)))
    write(trust, KEY.public_line().encode())
    code, _, err = cli(capsys, "verify", pkg, "--trust", trust)
    assert code == 1 and err.startswith("error: signature: the signature by 'acme.example'")
    write(pkg, write_archive(files, signature_for(files, KEY))[:-30])
    code, _, err = cli(capsys, "verify", pkg, "--trust", trust)
    assert code == 1 and err.startswith("error: package: no zip end record")


def test_cli_usage_errors(tmp_path: Path, signed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "run", signed, "greet")
    assert code == 2 and "runs only verified: give --trust TRUSTFILE" in err
    code, _, err = cli(capsys, "run", FIXTURES / "hello", "greet", "--require-signed")
    assert code == 2 and "--require-signed needs --trust" in err
    code, _, err = cli(capsys, "pack", FIXTURES / "hello", "-o", tmp_path / "x.zip")
    assert code == 2 and "must end in .whpkg" in err
    write(tmp_path / "k.pub", KEY.public_line().encode())
    code, _, err = cli(
        capsys,
        "run",
        FIXTURES / "hello",
        "greet",
        "--trust",
        tmp_path / "k.pub",
        "--require-signed",
        "--no-cache",
    )
    assert code == 1 and "error: admission: " in err and "not a signed .whpkg" in err
    (tmp_path / "acme.key").write_text("x")
    code, _, err = cli(capsys, "keygen", "--publisher", PUBLISHER, "--out", tmp_path / "acme")
    assert code == 1 and "never overwrites" in err


def test_a_policy_that_now_requires_signatures_stops_an_unsigned_extension(
    tmp_path: Path, signed: Path
) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        unsigned = host.load(FIXTURES / "echo")
        assert unsigned.call("echo", 1) == 1
        signed_ext = host.load(signed, trust=trust_of(KEY))
        strict = Policy(allow=ALL_CAPS, trusted_publishers=trust_of(KEY), require_signed=True)
        # A narrower grant would apply in place; the signature rule applies all the same.
        host.update_policy(strict)
        with pytest.raises(AdmissionError, match="not a signed .whpkg"):
            unsigned.call("echo", 1)
        assert unsigned._instances() == ()
        assert signed_ext.call("greet", GREET) == {"greeting": "hello, ada"}
