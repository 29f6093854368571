"""Red-team pass of issue 28 (packages): items 3, 4, 5, 6, 8 and 9.

Each test is a hole that was found open, and is closed now:

- after ``remove`` without ``--purge``, another publisher's package with the same id inherited
  the grants and data kept for it (the publisher pin lived only in the install record);
- ``wasihost revoke LIST --state-dir D`` wrote the list, then stopped at the first installed
  extension it could not load (one requesting an application's capability, a damaged archive):
  the revoked extensions after it stayed enabled;
- a key past its expiry still endorsed a new key, which was then trusted;
- SemVer build metadata defeated "same version, other content": an older signed build of the
  installed release (``1.0.0+build.1`` over ``1.0.0+build.2``) installed without
  ``--allow-downgrade``, and a list revoking ``1.0.0`` did not revoke ``1.0.0+build.1``;
- the zip-bomb ratio trusted each entry's declared compressed size: padded past a tiny deflate
  stream, or spanning the next entries' bytes, it passed while the bytes read were a few KiB;
- ``namespaces="wasihost,!wasihost"`` in allowed_signers allowed wasihost: its patterns were
  read as literals (and a negated principal was refused), not as OpenSSH's pattern lists.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import ALL_CAPS
from tests.support.packages import (
    PUBLISHER,
    hello_dir,
    hello_files,
    recorded_zip,
    signed_archive,
    trust_of,
)
from wasihost.cli import main
from wasihost.core.errors import (
    AdmissionError,
    ArchiveError,
    ExpiredKeyError,
    PackageError,
    SignatureError,
)
from wasihost.host import updates
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.allowed_signers import AllowedSigners
from wasihost.packaging.archive import MAX_COMPRESSION_RATIO, read_archive, write_archive
from wasihost.packaging.files import write_key_pair
from wasihost.packaging.package import load_package
from wasihost.packaging.revocation import RevocationList
from wasihost.packaging.trust import SigningKey, TrustStore

CAPS = default_registry().capabilities()
HELLO = "org.wasihost.fixtures.hello"
OTHER = "other.example"
SSH_KEYGEN = "/usr/bin/ssh-keygen"


def test_a_removed_ids_grants_and_data_stay_with_its_publisher(tmp_path: Path) -> None:
    ours, theirs = SigningKey.generate(PUBLISHER), SigningKey.generate(OTHER)
    first = tmp_path / "ours.whpkg"
    first.write_bytes(signed_archive(hello_files(tmp_path / "a"), ours))
    other = tmp_path / "theirs.whpkg"
    other.write_bytes(signed_archive(hello_files(tmp_path / "b", publisher=OTHER), theirs))
    policy = Policy(allow=ALL_CAPS, trusted_publishers=trust_of(ours, theirs))
    with Host(policy, cache_dir=None, state_dir=tmp_path / "state") as host:
        store = host.require_state()
        host.install(first)
        host.grants.grant(HELLO, "clock")
        store.data_dir(HELLO).mkdir(parents=True)
        (store.data_dir(HELLO) / "secret").write_text("ours")
        updates.remove(host, HELLO, purge=False)
        # Before: the pin went with the install record, and this installed, holding "clock"
        # and the data directory.
        with pytest.raises(
            AdmissionError,
            match=f"belong to publisher '{PUBLISHER}'; this package is published by '{OTHER}'",
        ):
            host.install(other)
        with pytest.raises(AdmissionError, match="this package is not verified"):
            host.install(hello_dir(tmp_path / "c", publisher=OTHER))
        assert store.package(HELLO) is None
        # The same publisher's package takes back what was kept.
        assert host.install(first).signer == PUBLISHER
        updates.remove(host, HELLO, purge=False)
        # The operator hands it over explicitly; the pin moves to the adopter.
        assert host.install(other, adopt_data=True).signer == OTHER
        assert store.publisher_pin(HELLO) == OTHER
        assert "clock" in host.grants.state(HELLO).entries
        updates.remove(host, HELLO, purge=True)
        assert store.publisher_pin(HELLO) is None
        assert host.install(first).signer == PUBLISHER  # a purge leaves nothing to inherit


def _with_id(files: dict[str, bytes], extension: str) -> dict[str, bytes]:
    text = files["extension.toml"].decode().replace(HELLO, extension)
    return {**files, "extension.toml": text.encode()}


def _damage(tree: Path) -> None:
    """Overwrite the installed archive with bytes that are no archive (the tree is read-only)."""
    tree.chmod(0o755)
    archive = tree / updates.ARCHIVE_NAME
    archive.chmod(0o644)
    archive.write_bytes(b"not a zip any more")


def test_revoke_with_a_state_dir_disables_every_revoked_extension_it_can_and_reports_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, ops = SigningKey.generate(PUBLISHER), SigningKey.generate("ops.example")
    ops_key = str(write_key_pair(str(tmp_path / "ops"), ops)[0])
    state = tmp_path / "state"
    limits: dict[str, Any] = {
        "max_request_bytes": 64,
        "max_response_bytes": 64,
        "fuel_base": 500,
        "fuel_per_byte": 2,
    }
    policy = Policy(allow=ALL_CAPS | {"myapp.read"}, trusted_publishers=trust_of(key))
    with Host(policy, cache_dir=None, state_dir=state) as host:
        host.add_function("myapp.lookup", lambda ctx, req: req, capability="myapp.read", **limits)
        # Installed first (ids in order): a package requesting the application's capability,
        # which the CLI's registry does not know...
        app = hello_dir(tmp_path / "app")
        manifest = app / "extension.toml"
        manifest.write_text(
            manifest.read_text()
            .replace(HELLO, "org.aaa.app")
            .replace('optional = ["clock"]', 'optional = ["clock", "myapp.read"]')
        )
        host.install(app)
        # ... two whose archives are damaged since: one the list revokes by its record (id and
        # version), one it does not...
        trees = {}
        for name in ("org.bbb.revoked", "org.ccc.unreadable"):
            path = tmp_path / f"{name}.whpkg"
            path.write_bytes(signed_archive(_with_id(hello_files(tmp_path / name), name), key))
            trees[name] = host.install(path).path
        # ... and, last, the one the list revokes by its package digest.
        hello = tmp_path / "hello.whpkg"
        hello.write_bytes(signed_archive(hello_files(tmp_path / "hello"), key))
        host.install(hello)
    for tree in trees.values():
        _damage(tree)
    argv = ["revoke", str(tmp_path / "list"), "--key", ops_key, "--package", str(hello)]
    argv += ["--extension", "org.bbb.revoked", "0.1.0", "--state-dir", str(state)]
    # Before: "error: manifest: ... unknown capability 'myapp.read'", exit 1, nothing disabled.
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "disabled installed org.bbb.revoked: extension org.bbb.revoked 0.1.0 is revoked" in out
    assert f"disabled installed {HELLO}: package digest" in out
    assert "org.aaa.app" not in out + err
    assert "error: installed org.ccc.unreadable was not checked against the list" in err
    assert "wasihost grants revoke org.ccc.unreadable --state-dir" in err
    with Host(policy, cache_dir=None, state_dir=state) as host:
        for revoked in ("org.bbb.revoked", HELLO):
            assert host.grants.state(revoked).revoked is not None
        for kept in ("org.aaa.app", "org.ccc.unreadable"):
            assert host.grants.state(kept).revoked is None


JAN_2027, JUL_2027 = 1798761600.0, 1814400000.0  # 2027-01-01, 2027-07-01 (UTC)


def test_an_endorsement_counts_only_while_its_endorsing_key_is_unexpired(tmp_path: Path) -> None:
    """The rule chosen: an endorsement carries no date, so "the endorsing key was valid when it
    signed" is known only as "it is unexpired now"; the endorsed key is trusted while one of its
    endorsers is (its own line's expiry bounds it too), unless the operator lists it plainly."""
    old, new, newer = (SigningKey.generate(PUBLISHER) for _ in range(3))
    path = tmp_path / "hello.whpkg"
    path.write_bytes(signed_archive(hello_files(tmp_path), new))
    old_line = old.public_line().rstrip("\n") + " expires=2027-01-01\n"
    lines = old_line + old.endorse(new.public_bytes)
    # Before: the old key, expired since 2027-01-01, still made new a trusted key in July.
    late = TrustStore.parse(lines, clock=lambda: JUL_2027)
    with pytest.raises(ExpiredKeyError, match="expiry of the keys that endorsed it"):
        load_package(path, CAPS, late)
    # Before its endorser's expiry the endorsed key verifies; a chain (old -> new -> newer)
    # ends with its first link.
    early = TrustStore.parse(lines, clock=lambda: JAN_2027 - 60)
    assert load_package(path, CAPS, early).signer == PUBLISHER
    chained = TrustStore.parse(lines + new.endorse(newer.public_bytes), clock=lambda: JUL_2027)
    assert chained.expired(newer.public_bytes) == JAN_2027
    # Any one endorsement that still counts is enough, and an operator's own line of the key
    # (no endorsed-by) keeps it past its endorser, as the rotation advice says.
    other = SigningKey.generate(PUBLISHER)
    both = other.public_line() + lines + other.endorse(new.public_bytes)
    assert load_package(path, CAPS, TrustStore.parse(both, clock=lambda: JUL_2027)).signer
    vouched = lines + new.public_line()
    assert load_package(path, CAPS, TrustStore.parse(vouched, clock=lambda: JUL_2027)).signer
    # Revoking the old key still reaches the key it endorsed.
    assert TrustStore.parse(vouched).lineage(new.public_bytes)[1:] == (old.public_bytes,)


def test_an_other_build_of_the_installed_release_is_a_conflict_and_revoked_with_it(
    tmp_path: Path,
) -> None:
    key = SigningKey.generate(PUBLISHER)
    builds = {}
    for build in ("1.0.0+build.1", "1.0.0+build.2", "1.0.1+build.1"):
        builds[build] = tmp_path / f"{build}.whpkg"
        files = hello_files(tmp_path / build, version=build)
        builds[build].write_bytes(signed_archive(files, key))
    policy = Policy(allow=ALL_CAPS, trusted_publishers=trust_of(key))
    with Host(policy, cache_dir=None, state_dir=tmp_path / "state") as host:
        host.install(builds["1.0.0+build.2"])
        # Before: build.1 orders equal to build.2, so it was no downgrade, and its version
        # string differs, so it was not "the same version with other content": it installed.
        for replace in (host.install, host.update_installed):
            with pytest.raises(PackageError, match="same release to the version order"):
                replace(builds["1.0.0+build.1"])
        assert host.require_state().package(HELLO).version == "1.0.0+build.2"  # type: ignore[union-attr]
        # Forced, it is taken; the same build again is a reinstall, not a conflict.
        assert (
            host.install(builds["1.0.0+build.1"], allow_downgrade=True).version == "1.0.0+build.1"
        )
        assert host.install(builds["1.0.0+build.1"]).version == "1.0.0+build.1"
        # A higher release with any build metadata is an ordinary update.
        assert host.install(builds["1.0.1+build.1"]).version == "1.0.1+build.1"
    # The list names releases: "1.0.0" revokes each of its builds; a build names itself only.
    packages = {b: load_package(p, CAPS, trust_of(key)) for b, p in builds.items()}
    release = RevocationList(2, 2e9, extensions=frozenset({(HELLO, "1.0.0")}))
    assert "1.0.0, every build of it, is revoked" in (
        release.revocation_of(packages["1.0.0+build.1"]) or ""
    )
    assert release.revocation_of(packages["1.0.0+build.2"]) is not None
    assert release.revocation_of(packages["1.0.1+build.1"]) is None
    one_build = RevocationList(2, 2e9, extensions=frozenset({(HELLO, "1.0.0+build.1")}))
    assert one_build.revocation_of(packages["1.0.0+build.1"]) is not None
    assert one_build.revocation_of(packages["1.0.0+build.2"]) is None


def _declare_compressed_size(data: bytes, name: str, size: int) -> bytes:
    """``data`` with entry ``name``'s compressed size set to ``size`` in its central-directory
    record and its local header (nothing else moves: the bytes it now spans are whatever
    follows its deflate stream)."""
    out = bytearray(data)
    at = struct.unpack_from("<L", data, len(data) - 6)[0]  # the end record's directory offset
    while True:
        name_len, extra_len, comment_len = struct.unpack_from("<3H", data, at + 28)
        if data[at + 46 : at + 46 + name_len] == name.encode():
            break
        at += 46 + name_len + extra_len + comment_len
    local = struct.unpack_from("<L", data, at + 42)[0]
    struct.pack_into("<L", out, at + 20, size)
    struct.pack_into("<L", out, local + 18, size)
    return bytes(out)


def test_the_zip_bomb_ratio_is_bounded_by_the_bytes_actually_read() -> None:
    """Sixteen 4 MiB entries of zeros deflate to about 4 KiB each. Each declares a compressed
    size of 1/90 of its 4 MiB, spanning the next entries and a filler: each declared ratio is
    under 100, while the archive of about 130 KiB inflated to 64 MiB (a ratio near 500)."""
    small = {"extension.toml": b"x = 1\n", "m.wasm": b"\0asm\1\0\0\0"}
    zeros = {f"bomb{i:02}.bin": bytes(4 * 1024 * 1024) for i in range(16)}
    filler = {"zz-filler": os.urandom(64 * 1024)}  # bytes for the last entries to span
    data = recorded_zip({**small, **zeros, **filler})
    declared = 4 * 1024 * 1024 // (MAX_COMPRESSION_RATIO - 10)
    for name in zeros:
        data = _declare_compressed_size(data, name, declared)
    assert len(data) < 160 * 1024
    # Before: read_archive returned all 16 entries, 64 MiB, ratio checked against the claim.
    with pytest.raises(ArchiveError, match="overlaps another entry"):
        read_archive(data)
    # One entry alone, padded past its stream (the last before the directory: its padding is
    # nobody else's bytes), is refused by the length of the stream actually read.
    alone = recorded_zip({**small, "zz-bomb.bin": bytes(4 * 1024 * 1024)})
    stream = _compressed_size(alone, "zz-bomb.bin")
    padded = _pad_last_entry(alone, "zz-bomb.bin", declared - stream)
    with pytest.raises(ArchiveError, match=f"deflate stream is {stream} bytes, its header says"):
        read_archive(padded)


def _compressed_size(data: bytes, name: str) -> int:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return zf.getinfo(name).compress_size


def _pad_last_entry(data: bytes, name: str, padding: int) -> bytes:
    """``padding`` zero bytes after the last entry's deflate stream, counted in its compressed
    size; the central directory moves up by as much."""
    cd_offset = struct.unpack_from("<L", data, len(data) - 6)[0]
    grown = bytearray(data[:cd_offset] + bytes(padding) + data[cd_offset:])
    struct.pack_into("<L", grown, len(grown) - 6, cd_offset + padding)
    return _declare_compressed_size(bytes(grown), name, _compressed_size(data, name) + padding)


# (principals, options, whether ssh-keygen -Y verify -I acme.example -n wasihost accepts)
PATTERN_LISTS = [
    ("acme.example", "", True),
    ("*.example", "", True),
    ("acme.exampl?", "", True),
    ("!acme.example,*.example", "", False),
    ("*.example,!acme.example", "", False),
    ("!other.example,*.example", "", True),
    ("!acme.example", "", False),
    ("!*.example,acme.example", "", False),
    ("acme.example", 'namespaces="wasihost"', True),
    ("acme.example", 'namespaces="wasihost,!wasihost"', False),
    ("acme.example", 'namespaces="!wasihost,*"', False),
    ("acme.example", 'namespaces="wasi*"', True),
    ("acme.example", 'namespaces="!git,*"', True),
    ("acme.example", 'namespaces="git,file"', False),
    ("acme.example", 'namespaces="!git"', False),
    ("acme.example", 'namespaces="wasih?st,!file"', True),
]


@pytest.mark.skipif(not Path(SSH_KEYGEN).exists(), reason="needs ssh-keygen")
def test_allowed_signers_pattern_lists_match_as_ssh_keygen_matches_them(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    data = tmp_path / "hello.whpkg"
    data.write_bytes(write_archive(hello_files(tmp_path / "ssh")))
    subprocess.run(
        [SSH_KEYGEN, "-Y", "sign", "-f", str(key), "-n", "wasihost", str(data)],
        check=True,
        capture_output=True,
    )
    signature = Path(f"{data}.sig").read_bytes()
    kind, blob = Path(f"{key}.pub").read_text().split()[:2]
    allowed_file = tmp_path / "allowed_signers"
    for principals, options, accepted in PATTERN_LISTS:
        line = " ".join(f for f in (principals, options, kind, blob) if f) + "\n"
        allowed_file.write_text(line)
        verify = [SSH_KEYGEN, "-Y", "verify", "-f", str(allowed_file), "-I", PUBLISHER]
        with data.open("rb") as message:
            theirs = subprocess.run(
                [*verify, "-n", "wasihost", "-s", f"{data}.sig"],
                stdin=message,
                capture_output=True,
                check=False,
            )
        assert (theirs.returncode == 0) == accepted, (line, theirs.stderr)
        # Before: "wasihost,!wasihost" allowed wasihost, and a negated principal was refused
        # as a configuration error.
        try:
            AllowedSigners.parse(line).verify(data.read_bytes(), signature, PUBLISHER)
        except SignatureError:
            ours = False
        else:
            ours = True
        assert ours == accepted, line
