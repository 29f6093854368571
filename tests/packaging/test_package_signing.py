"""Ed25519 package signatures and the trust file: verify() returns None or raises the
specific SignatureError; a signature holds only for the exact files and identity signed."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from tests.support.packages import (
    PUBLISHER,
    hello_files,
    signature_for,
    signed_archive,
    trust_of,
)
from wasihost.core.errors import (
    ArchiveError,
    ConfigError,
    ExpiredKeyError,
    InvalidSignatureError,
    PublisherMismatchError,
    SignatureError,
    UnsignedPackageError,
    UntrustedKeyError,
)
from wasihost.core.manifest import parse_manifest
from wasihost.host.defaults import default_registry
from wasihost.packaging import signing
from wasihost.packaging.archive import read_archive, write_archive
from wasihost.packaging.files import read_signing_key, write_key_pair
from wasihost.packaging.package import identity
from wasihost.packaging.trust import SigningKey, TrustStore, b64

KEY = SigningKey.generate(PUBLISHER)
CAPS = default_registry().capabilities()


def check(data: bytes, trust: TrustStore) -> None:
    """What the loader does with an archive: read it, then verify its signature."""
    got = read_archive(data)
    manifest = parse_manifest(got.files["extension.toml"].decode(), CAPS)
    module = hashlib.sha256(got.files[manifest.module]).hexdigest()
    signing.verify(got.signature, identity(manifest, module), got.digest, trust)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return hello_files(tmp_path_factory.mktemp("hello"))


def test_a_signed_package_verifies(files: dict[str, bytes]) -> None:
    assert check(signed_archive(files, KEY), trust_of(KEY)) is None  # type: ignore[func-returns-value]


def test_an_unsigned_package_does_not(files: dict[str, bytes]) -> None:
    with pytest.raises(UnsignedPackageError, match="not signed"):
        check(write_archive(files), trust_of(KEY))


def test_a_tampered_module_is_refused(files: dict[str, bytes]) -> None:
    """The attacker rewrites the content record too: only the signature can tell."""
    signature = signature_for(files, KEY)
    wasm = bytearray(files["hello.wasm"])
    wasm[-1] ^= 1
    with pytest.raises(InvalidSignatureError, match="does not match this package"):
        check(write_archive({**files, "hello.wasm": bytes(wasm)}, signature), trust_of(KEY))


def test_a_tampered_manifest_is_refused(files: dict[str, bytes]) -> None:
    signature = signature_for(files, KEY)
    manifest = files["extension.toml"].replace(b'version = "0.1.0"', b'version = "9.9.9"')
    assert manifest != files["extension.toml"]
    with pytest.raises(InvalidSignatureError):
        check(write_archive({**files, "extension.toml": manifest}, signature), trust_of(KEY))


def test_a_file_added_or_removed_is_refused(files: dict[str, bytes]) -> None:
    signature = signature_for(files, KEY)
    with pytest.raises(InvalidSignatureError):
        check(write_archive({**files, "extra.txt": b"x"}, signature), trust_of(KEY))
    fewer = {n: d for n, d in files.items() if n != "src/lib.rs"}
    with pytest.raises(InvalidSignatureError):
        check(write_archive(fewer, signature), trust_of(KEY))


def test_a_signature_by_an_untrusted_key_is_refused(files: dict[str, bytes]) -> None:
    impostor = SigningKey.generate(PUBLISHER)  # same publisher id, another key
    with pytest.raises(UntrustedKeyError, match="not one of publisher 'acme.example'"):
        check(signed_archive(files, impostor), trust_of(KEY))
    with pytest.raises(UntrustedKeyError, match="'acme.example' is not in the trust store"):
        check(signed_archive(files, KEY), trust_of(SigningKey.generate("someone.else")))


def test_a_valid_signature_over_another_package_is_refused(
    files: dict[str, bytes], tmp_path: Path
) -> None:
    other = hello_files(tmp_path, version="0.2.0")
    with pytest.raises(InvalidSignatureError):
        check(write_archive(files, signature_for(other, KEY)), trust_of(KEY))


def test_a_publisher_mismatch_is_refused(files: dict[str, bytes], tmp_path: Path) -> None:
    theirs = hello_files(tmp_path, publisher="victim.example")
    with pytest.raises(PublisherMismatchError) as mismatch:
        signature_for(theirs, KEY)  # wasihost sign refuses to make it
    assert 'publisher is "victim.example", and this key is "acme.example"\'s' in (
        mismatch.value.message
    )
    # No publisher at all: the key that was given names the line to add (issue 35 item 4; it
    # said "the manifest's publisher is None").
    with pytest.raises(PublisherMismatchError) as none:
        signature_for(hello_files(tmp_path / "none", publisher=None), KEY)
    assert none.value.message == (
        'extension.toml has no [extension] publisher; add publisher = "acme.example" to sign '
        "it with this key"
    )
    # A signature made anyway, by a trusted key, over the victim's identity:
    manifest = parse_manifest(theirs["extension.toml"].decode(), CAPS)
    who = identity(manifest, hashlib.sha256(theirs["hello.wasm"]).hexdigest())
    digest = read_archive(write_archive(theirs)).digest
    record = signing.SignatureRecord(
        PUBLISHER, KEY.public_bytes, KEY.private.sign(signing.message(who, digest))
    ).render()
    with pytest.raises(PublisherMismatchError, match="signed by 'acme.example'"):
        check(write_archive(theirs, record), trust_of(KEY))


@pytest.mark.parametrize(
    "record",
    [b"", b"garbage", "wasihost-signature/1\npublisher \u00e9\n".encode(), b"\xff" * 40],
)
def test_malformed_signature_records_are_invalid(files: dict[str, bytes], record: bytes) -> None:
    with pytest.raises(InvalidSignatureError):
        check(write_archive(files, record), trust_of(KEY))


def test_every_refusal_is_a_signature_error() -> None:
    for cls in (UnsignedPackageError, UntrustedKeyError, InvalidSignatureError):
        assert issubclass(cls, SignatureError)
    assert issubclass(PublisherMismatchError, SignatureError)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("acme ed25519\n", "line 1: expected 'ID ed25519 BASE64KEY'"),
        ("# c\n\nacme rsa AAAA\n", "line 3: unknown key type 'rsa'"),
        ("acme ed25519 !!!!\n", "not base64"),
        ("acme ed25519 AAAA\n", "the key is 3 bytes"),
        ("-bad ed25519 AAAA\n", "publisher id '-bad'"),
    ],
)
def test_trust_file_errors_name_the_line(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        TrustStore.parse(text)


def test_a_pub_line_is_a_trust_line_and_keys_rotate() -> None:
    new = SigningKey.generate(PUBLISHER)
    store = TrustStore.parse(f"# acme's keys\n{KEY.public_line()}{new.public_line()}")
    assert store.keys_for(PUBLISHER) == {KEY.public_bytes, new.public_bytes}
    assert store.publishers == {PUBLISHER}


def test_keygen_files(tmp_path: Path) -> None:
    prefix = str(tmp_path / "acme")
    private, public = write_key_pair(prefix, KEY)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert read_signing_key(private).public_bytes == KEY.public_bytes
    assert TrustStore.from_file(public).keys_for(PUBLISHER) == {KEY.public_bytes}
    with pytest.raises(ConfigError, match="never overwrites"):
        write_key_pair(prefix, SigningKey.generate(PUBLISHER))
    assert read_signing_key(private).public_bytes == KEY.public_bytes
    os.chmod(private, 0o644)
    with pytest.raises(ConfigError, match="readable by others") as info:
        read_signing_key(private)
    assert info.value.hint == f"chmod 600 {private}"


def test_pack_refuses_links(tmp_path: Path) -> None:
    from wasihost.packaging.files import pack_directory

    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "link").symlink_to("/etc/passwd")
    with pytest.raises(ArchiveError, match="link: a symbolic link"):
        pack_directory(tmp_path)


def test_an_expired_key_verifies_nothing(files: dict[str, bytes]) -> None:
    signed = signed_archive(files, KEY)
    line = KEY.public_line().rstrip("\n") + " expires=2027-01-01"
    june_2026, june_2027 = 1780272000.0, 1811808000.0
    assert check(signed, TrustStore.parse(line, clock=lambda: june_2026)) is None  # type: ignore[func-returns-value]
    with pytest.raises(
        ExpiredKeyError, match=f"publisher '{PUBLISHER}' expired at 2027-01-01T00:00:00Z"
    ):
        check(signed, TrustStore.parse(line, clock=lambda: june_2027))
    # A revocation-list key expires the same way; the role word comes first.
    both = TrustStore.parse(
        KEY.public_line().rstrip("\n") + " revocations expires=2027-01-01T12:00:00Z",
        clock=lambda: june_2027,
    )
    assert both.expired(KEY.public_bytes) == 1798804800.0
    assert issubclass(ExpiredKeyError, SignatureError)


@pytest.mark.parametrize("expiry", ["2027-13-01", "tomorrow", "2027-01-01T00:00:00", ""])
def test_a_malformed_expiry_names_the_line(expiry: str) -> None:
    with pytest.raises(ConfigError, match="line 1: expiry"):
        TrustStore.parse(KEY.public_line().rstrip("\n") + f" expires={expiry}")


def test_a_rotation_the_old_key_signed_is_trusted_and_nothing_else_is(
    files: dict[str, bytes],
) -> None:
    new = SigningKey.generate(PUBLISHER)
    endorsed = KEY.endorse(new.public_bytes)
    trust = TrustStore.parse(KEY.public_line() + endorsed)
    assert check(signed_archive(files, new), trust) is None  # type: ignore[func-returns-value]
    assert trust.lineage(new.public_bytes) == (new.public_bytes, KEY.public_bytes)
    # Without the old key's line, or in the wrong order, the endorsement proves nothing.
    with pytest.raises(ConfigError, match="not a key of publisher 'acme.example' on an earlier line"):
        TrustStore.parse(endorsed)
    with pytest.raises(ConfigError, match="earlier line"):
        TrustStore.parse(endorsed + KEY.public_line())
    # Another publisher's key, or a signature over another key, does not endorse.
    mallory = SigningKey.generate("mallory.example")
    forged = endorsed.replace(
        b64(new.public_bytes), b64(SigningKey.generate(PUBLISHER).public_bytes)
    )
    with pytest.raises(ConfigError, match="not a signature of this key by that old key"):
        TrustStore.parse(KEY.public_line() + forged)
    with pytest.raises(ConfigError, match="earlier line"):
        TrustStore.parse(mallory.public_line() + endorsed.replace(PUBLISHER, "mallory.example"))


def test_revoking_the_old_key_revokes_what_it_endorsed(tmp_path: Path) -> None:
    from wasihost.packaging.package import load_package
    from wasihost.packaging.revocation import RevocationList

    new = SigningKey.generate(PUBLISHER)
    trust = TrustStore.parse(KEY.public_line() + KEY.endorse(new.public_bytes))
    path = tmp_path / "hello.whpkg"
    path.write_bytes(signed_archive(hello_files(tmp_path), new))
    package = load_package(path, CAPS, trust)
    assert package.endorsed_by == (KEY.public_bytes,)
    revoked = RevocationList(2, 2e9, keys=frozenset({KEY.public_bytes}))
    assert "that endorsed its signing key is revoked" in (revoked.revocation_of(package) or "")


def test_the_endorse_command_prints_a_line_the_trust_file_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wasihost.cli import main

    assert main(["keygen", "--publisher", PUBLISHER, "--out", str(tmp_path / "old")]) == 0
    assert main(["keygen", "--publisher", PUBLISHER, "--out", str(tmp_path / "new")]) == 0
    capsys.readouterr()
    assert main(["endorse", str(tmp_path / "new.pub"), "--key", str(tmp_path / "old.key")]) == 0
    line = capsys.readouterr().out
    trust = TrustStore.parse((tmp_path / "old.pub").read_text() + line)
    assert len(trust.keys_for(PUBLISHER)) == 2
    assert main(["keygen", "--publisher", "other.example", "--out", str(tmp_path / "x")]) == 0
    capsys.readouterr()
    assert main(["endorse", str(tmp_path / "x.pub"), "--key", str(tmp_path / "old.key")]) == 2
    assert "endorses only its own publisher's next key" in capsys.readouterr().err
