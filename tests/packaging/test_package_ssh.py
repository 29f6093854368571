"""OpenSSH signatures of a .whpkg: made by the real ssh-keygen, verified by wasihost's own
SSHSIG reader against an allowed_signers file; every wrong signature, key, principal or
namespace is refused with a specific SignatureError, and nothing else leaves the reader."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import ALL_CAPS
from tests.support.packages import PUBLISHER, hello_files
from wasihost.cli import main
from wasihost.core.errors import (
    AdmissionError,
    ConfigError,
    InvalidSignatureError,
    PackageError,
    PublisherMismatchError,
    UntrustedKeyError,
)
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging import sshsig
from wasihost.packaging.allowed_signers import AllowedSigners
from wasihost.packaging.archive import write_archive

SSH_KEYGEN = "/usr/bin/ssh-keygen"
GREET = {"name": "ada"}
# 2026-01-01T00:00:00Z, the injected "now" of the validity-window tests.
JAN_2026 = 1767225600.0

pytestmark = pytest.mark.skipif(not Path(SSH_KEYGEN).exists(), reason="needs ssh-keygen")


def keygen(path: Path, kind: str = "ed25519") -> Path:
    extra = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", kind, *extra, "-N", "", "-C", "test", "-f", str(path)],
        check=True,
    )
    return path


def ssh_sign(key: Path, file: Path, namespace: str = "wasihost") -> bytes:
    """What an operator types: ssh-keygen -Y sign -f KEY -n wasihost FILE."""
    sig = Path(f"{file}.sig")
    sig.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-Y", "sign", "-f", str(key), "-n", namespace, str(file)],
        check=True,
        capture_output=True,
    )
    return sig.read_bytes()


def public(key: Path) -> str:
    """``KEYTYPE BASE64`` of a key's .pub file."""
    kind, blob, *_ = Path(f"{key}.pub").read_text().split()
    return f"{kind} {blob}"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ssh")


@pytest.fixture(scope="module")
def key(work: Path) -> Path:
    return keygen(work / "id_ed25519")


@pytest.fixture(scope="module")
def package(work: Path) -> Path:
    path = work / "hello.whpkg"
    path.write_bytes(write_archive(hello_files(work)))
    return path


@pytest.fixture(scope="module")
def signature(key: Path, package: Path) -> bytes:
    return ssh_sign(key, package)


@pytest.fixture(scope="module")
def allowed(key: Path) -> AllowedSigners:
    return AllowedSigners.parse(f"{PUBLISHER} {public(key)} ops@example\n")


def verify(allowed: AllowedSigners, package: Path, signature: bytes, now: float = 0.0) -> None:
    allowed.verify(package.read_bytes(), signature, PUBLISHER, lambda: now)


def test_a_real_ssh_keygen_signature_verifies_and_runs(
    key: Path, package: Path, signature: bytes, allowed: AllowedSigners
) -> None:
    assert allowed.verify(package.read_bytes(), signature, PUBLISHER).line == 1
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = host.load(package, allowed_signers=allowed, ssh_signature=signature)
        assert ext.package.signer == PUBLISHER
        assert ext.call("greet", GREET) == {"greeting": "hello, ada"}


def test_ssh_keygen_agrees_with_our_verdict(
    work: Path, key: Path, package: Path, signature: bytes
) -> None:
    """The reference verifier accepts what we accept, so both read one format."""
    signers = work / "ref_allowed"
    signers.write_text(f"{PUBLISHER} {public(key)}\n")
    done = subprocess.run(
        [
            SSH_KEYGEN,
            "-Y",
            "verify",
            "-f",
            str(signers),
            "-I",
            PUBLISHER,
            "-n",
            "wasihost",
            "-s",
            f"{package}.sig",
        ],
        input=package.read_bytes(),
        check=False,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr


def package_bytes(where: Path, version: str = "0.1.0") -> bytes:
    return write_archive(hello_files(where, version=version))


def test_a_signature_for_another_namespace_is_refused(
    work: Path, key: Path, allowed: AllowedSigners
) -> None:
    other = work / "ns.whpkg"
    other.write_bytes(package_bytes(work / "ns"))
    git_sig = ssh_sign(key, other, namespace="git")
    with pytest.raises(InvalidSignatureError, match="namespace 'git', not 'wasihost'"):
        verify(allowed, other, git_sig)


def test_a_key_allowed_for_another_principal_is_refused(
    key: Path, package: Path, signature: bytes
) -> None:
    other = AllowedSigners.parse(f"someone.else,ops@example {public(key)}\n")
    with pytest.raises(PublisherMismatchError, match="may sign as ops@example, someone.else"):
        verify(other, package, signature)


def test_a_wildcard_principal_matches_the_publisher(
    key: Path, package: Path, signature: bytes
) -> None:
    verify(AllowedSigners.parse(f"*.example {public(key)}\n"), package, signature)
    with pytest.raises(PublisherMismatchError):
        verify(AllowedSigners.parse(f"*.example.org {public(key)}\n"), package, signature)


def test_a_signature_of_another_package_is_refused(
    work: Path, package: Path, signature: bytes, allowed: AllowedSigners
) -> None:
    """Every byte is signed: a package of other contents never takes this signature."""
    other = work / "other.whpkg"
    other.write_bytes(package_bytes(work / "other", "9.9.9"))
    with pytest.raises(InvalidSignatureError, match="does not match this file"):
        verify(allowed, other, signature)
    tampered = bytearray(package.read_bytes())
    tampered[-30] ^= 1
    with pytest.raises(InvalidSignatureError, match="does not match this file"):
        allowed.verify(bytes(tampered), signature, PUBLISHER)


def test_a_key_not_in_allowed_signers_is_refused(
    work: Path, package: Path, signature: bytes
) -> None:
    stranger = keygen(work / "stranger")
    with pytest.raises(UntrustedKeyError, match="is not in allowed_signers"):
        verify(AllowedSigners.parse(f"{PUBLISHER} {public(stranger)}\n"), package, signature)


def test_an_rsa_signature_is_refused_by_name(work: Path, package: Path) -> None:
    rsa = keygen(work / "id_rsa", "rsa")
    rsa_sig = ssh_sign(rsa, package)
    allowed = AllowedSigners.parse(f"{PUBLISHER} {public(rsa)}\n")  # RSA lines are read
    with pytest.raises(InvalidSignatureError, match="'ssh-rsa' key: only ssh-ed25519"):
        verify(allowed, package, rsa_sig)


@pytest.mark.parametrize(
    ("options", "now", "fragment"),
    [
        ('namespaces="git,file"', 0.0, "allows namespaces git,file"),
        ('valid-before="20251231Z"', JAN_2026, "has expired"),
        ('valid-after="20260102"', JAN_2026, "not valid yet"),
    ],
)
def test_line_options_restrict_the_key(
    key: Path, package: Path, signature: bytes, options: str, now: float, fragment: str
) -> None:
    allowed = AllowedSigners.parse(f"{PUBLISHER} {options} {public(key)}\n")
    with pytest.raises(UntrustedKeyError, match=fragment):
        verify(allowed, package, signature, now)


def test_line_options_that_admit_the_key(key: Path, package: Path, signature: bytes) -> None:
    line = f'{PUBLISHER} namespaces="git,wasihost",valid-after="20251231Z",valid-before="202601020000Z"'
    verify(AllowedSigners.parse(f"{line} {public(key)}\n"), package, signature, JAN_2026)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{p} cert-authority {k}", "cert-authority lines are not supported"),
        ('{p} valid-after="2026" {k}', "is not YYYYMMDD"),
        ("{p} restrict {k}", "unknown option 'restrict'"),
        ("{p} ssh-ed25519 AAAA", "truncated"),
        ("{p} ssh-ed25519 !!!!", "not base64"),
        ("{p}", "expected 'PRINCIPALS"),
    ],
)
def test_allowed_signers_errors_name_the_line(key: Path, line: str, fragment: str) -> None:
    text = "# team keys\n\n" + line.format(p=PUBLISHER, k=public(key)) + "\n"
    with pytest.raises(ConfigError, match="line 3") as info:
        AllowedSigners.parse(text)
    assert fragment in str(info.value)


def armor(blob: bytes) -> bytes:
    body = base64.b64encode(blob).decode()
    return f"-----BEGIN SSH SIGNATURE-----\n{body}\n-----END SSH SIGNATURE-----\n".encode()


@pytest.mark.parametrize(
    ("mangle", "fragment"),
    [
        (lambda b: b[:-10], "truncated"),
        (lambda b: b + b"\0", "1 bytes after the last field"),
        (lambda b: b"SSHSIH" + b[6:], "no SSHSIG magic"),
        (lambda b: b[:6] + b"\0\0\0\2" + b[10:], "version 2"),
        (lambda b: b[:10] + b"\xff\xff\xff\xff" + b[14:], "a field of 4294967295 bytes"),
        (lambda b: b[:10], "truncated"),
    ],
)
def test_a_garbled_signature_is_refused(
    signature: bytes, mangle: Callable[[bytes], bytes], fragment: str
) -> None:
    with pytest.raises(InvalidSignatureError, match="SSH signature") as info:
        sshsig.parse(armor(mangle(sshsig.dearmor(signature))))
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (b"", "armor"),
        (b"-----BEGIN SSH SIGNATURE-----\n@@@\n-----END SSH SIGNATURE-----\n", "not base64"),
        (b"\xff" * 10, "not ASCII"),
        (b"A" * (sshsig.MAX_SIGNATURE_FILE_BYTES + 1), "larger than"),
    ],
)
def test_a_signature_file_that_is_not_one_is_refused(text: bytes, fragment: str) -> None:
    with pytest.raises(InvalidSignatureError, match=fragment):
        sshsig.parse(text)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_only_invalid_signature_errors_leave_the_parser(
    signature: bytes, allowed: AllowedSigners, package: Path, data: st.DataObject
) -> None:
    blob = bytearray(sshsig.dearmor(signature))
    for _ in range(data.draw(st.integers(1, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    # A mangled blob is refused, or (a byte changed in the unsigned armor only) verifies;
    # nothing but a SignatureError ever leaves the reader.
    with contextlib.suppress(InvalidSignatureError, UntrustedKeyError, PublisherMismatchError):
        verify(allowed, package, armor(bytes(blob[:cut])))


def test_host_load_requires_the_ssh_signature_to_hold(
    work: Path, package: Path, key: Path, allowed: AllowedSigners
) -> None:
    copy = work / "copy.whpkg"
    copy.write_bytes(package.read_bytes())
    git_sig = ssh_sign(key, copy, namespace="git")
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        with pytest.raises(InvalidSignatureError):
            host.load(package, allowed_signers=allowed, ssh_signature=git_sig)
        with pytest.raises(ConfigError, match="together"):
            host.load(package, allowed_signers=allowed)
        with pytest.raises(PackageError, match="not a .whpkg"):
            host.load(work, allowed_signers=allowed, ssh_signature=git_sig)
        assert host.extension("org.wasihost.fixtures.hello") is None


def test_an_ssh_verified_publisher_is_kept_across_updates(
    work: Path, key: Path, package: Path, signature: bytes, allowed: AllowedSigners
) -> None:
    newer = work / "newer.whpkg"
    newer.write_bytes(package_bytes(work / "newer", "0.2.0"))
    name = "org.wasihost.fixtures.hello"
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        host.load(package, allowed_signers=allowed, ssh_signature=signature)
        with pytest.raises(AdmissionError, match=f"must be signed by '{PUBLISHER}'"):
            host.update(newer)
        old = host.extension(name)
        assert old is not None and old.call("greet", GREET) == {"greeting": "hello, ada"}
        new = host.update(newer, allowed_signers=allowed, ssh_signature=ssh_sign(key, newer))
        assert new.package.signer == PUBLISHER and new.package.manifest is not None
        assert new.package.manifest.version == "0.2.0"


def test_cli_verify_run_and_inspect_with_an_ssh_signature(
    work: Path, key: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = tmp_path / "hello.whpkg"
    package.write_bytes(package_bytes(tmp_path))
    signature = ssh_sign(key, package)  # writes hello.whpkg.sig, the default --ssh-sig
    signers = work / "allowed_signers"
    signers.write_text(f"{PUBLISHER} {public(key)}\n")
    sig = work / "cli.sig"
    sig.write_bytes(signature)
    flags = ["--allowed-signers", str(signers), "--ssh-sig", str(sig)]
    assert main(["verify", str(package), *flags]) == 0
    assert f"published by {PUBLISHER}" in capsys.readouterr().out
    assert main(["run", str(package), "greet", *flags, "--input", '{"name":"ada"}']) == 0
    assert "hello, ada" in capsys.readouterr().out
    assert main(["inspect", str(package), "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "OpenSSH ed25519 key" in report["signature"]["verified_by"]
    assert report["manifest"]["identity"] == "enforced"
    # The default --ssh-sig is the file ssh-keygen wrote next to the package.
    assert main(["verify", str(package), "--allowed-signers", str(signers)]) == 0
    capsys.readouterr()
    stranger = work / "stranger_allowed"
    stranger.write_text(f"{PUBLISHER} {public(keygen(work / 'other_key'))}\n")
    code = main(["verify", str(package), "--allowed-signers", str(stranger), "--ssh-sig", str(sig)])
    assert code == 1
    assert "error: signature: key ssh-ed25519" in capsys.readouterr().err
    assert main(["verify", str(package), "--ssh-sig", str(sig)]) == 2
    assert "--ssh-sig needs --allowed-signers" in capsys.readouterr().err


def test_a_pathological_principal_pattern_matches_in_linear_time(key: Path) -> None:
    """The manifest's publisher is attacker-chosen; a star-heavy pattern must not backtrack
    exponentially against it (a naive regex took more than 20 s here)."""
    pattern = "*a" * 40 + "*b"
    allowed = AllowedSigners.parse(f"{pattern} {public(key)}\n")
    started = time.monotonic()
    assert not allowed.signers[0].names("a" * 128)
    assert time.monotonic() - started < 1.0


def test_an_ssh_verified_package_meets_require_signed(
    key: Path, package: Path, signature: bytes, allowed: AllowedSigners
) -> None:
    from tests.support.packages import trust_of
    from wasihost.packaging.trust import SigningKey

    strict = Policy(
        allow=ALL_CAPS,
        trusted_publishers=trust_of(SigningKey.generate("unrelated.example")),
        require_signed=True,
    )
    with Host(strict, cache_dir=None) as host:
        ext = host.load(package, allowed_signers=allowed, ssh_signature=signature)
        assert ext.package.signer == PUBLISHER
        with pytest.raises(AdmissionError, match="must be signed by 'acme.example' too"):
            host.update(package)  # the same file, unverified: refused
        ext.close()
        with pytest.raises(AdmissionError, match="no signature verified by a trusted"):
            host.load(package)  # unverified (its key is not in the trust file): refused


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=' \t\n"=,!*?#abz.@-AZ019+/', max_size=200))
def test_only_config_errors_leave_the_allowed_signers_reader(text: str) -> None:
    with contextlib.suppress(ConfigError):
        AllowedSigners.parse(text)
