"""Red-team pass of 2026-12-01 (signed packages, rotations, revocation lists, installs).

Each test is a hole that was found open, and is closed now:

- a rotation line that endorses a key again (by itself, or round a loop of keys it endorsed)
  replaced the key's endorser, so revoking the old key no longer reached the new one;
- a revocation list that revokes the very key that signed it was taken, and applied;
- ``revoke_installed`` (``wasihost revoke --state-dir``) missed installed packages signed by a
  key the revoked key endorsed, and every package installed by an OpenSSH signature;
- a package directory's manifest was read twice at install, and the second read (written into
  the installed tree, never compared with what was checked) could be another manifest.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.common import ALL_CAPS
from tests.support.packages import PUBLISHER, hello_dir, hello_files, signed_archive
from wasihost.core.errors import ConfigError, PackageError, RevocationListError
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.host import updates
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging import revocation
from wasihost.packaging.allowed_signers import AllowedSigners
from wasihost.packaging.archive import write_archive
from wasihost.packaging.package import load_package
from wasihost.packaging.revocation import RevocationList
from wasihost.packaging.trust import SigningKey, TrustStore

CAPS = default_registry().capabilities()
HELLO = "org.wasihost.fixtures.hello"
SSH_KEYGEN = "/usr/bin/ssh-keygen"


def test_a_key_endorsed_again_round_a_loop_is_still_revoked_with_its_first_endorser(
    tmp_path: Path,
) -> None:
    old, mid, new = (SigningKey.generate(PUBLISHER) for _ in range(3))
    # new endorsed by old; mid by new; then new again by mid: a loop new <-> mid. The third
    # line replaced new's endorser (old) by mid, so lineage(new) went new, mid, new, mid, ...
    # (4097 keys, none of them old) and revoking old left new's packages admitted.
    lines = old.public_line() + old.endorse(new.public_bytes)
    lines += new.endorse(mid.public_bytes) + mid.endorse(new.public_bytes)
    trust = TrustStore.parse(lines)
    lineage = trust.lineage(new.public_bytes)
    assert old.public_bytes in lineage and len(lineage) == len(set(lineage)) == 3
    path = tmp_path / "hello.whpkg"
    path.write_bytes(signed_archive(hello_files(tmp_path), new))
    package = load_package(path, CAPS, trust)
    revoked = RevocationList(2, 2e9, keys=frozenset({old.public_bytes}))
    assert "that endorsed its signing key is revoked" in (revoked.revocation_of(package) or "")


def test_a_key_cannot_endorse_itself() -> None:
    old, new = SigningKey.generate(PUBLISHER), SigningKey.generate(PUBLISHER)
    lines = old.public_line() + old.endorse(new.public_bytes)
    with pytest.raises(ConfigError, match="line 3: a key cannot endorse itself"):
        TrustStore.parse(lines + new.endorse(new.public_bytes))


def test_a_list_that_revokes_the_key_that_signed_it_is_refused() -> None:
    ops = SigningKey.generate("ops.example")
    trust = TrustStore.parse(ops.public_line().rstrip("\n") + " revocations\n")
    data = RevocationList(3, 2e9, keys=frozenset({ops.public_bytes})).sign(ops)
    with pytest.raises(RevocationListError, match="revokes the key that signed it"):
        revocation.parse(data, trust)
    other = SigningKey.generate("other.example")
    assert revocation.parse(
        RevocationList(3, 2e9, keys=frozenset({other.public_bytes})).sign(ops), trust
    )


def test_revoke_installed_reaches_a_package_signed_by_a_key_the_revoked_key_endorsed(
    tmp_path: Path,
) -> None:
    old, new = SigningKey.generate(PUBLISHER), SigningKey.generate(PUBLISHER)
    trust = TrustStore.parse(old.public_line() + old.endorse(new.public_bytes))
    path = tmp_path / "hello.whpkg"
    path.write_bytes(signed_archive(hello_files(tmp_path), new))
    policy = Policy(allow=ALL_CAPS, trusted_publishers=trust)
    with Host(policy, cache_dir=None, state_dir=tmp_path / "state") as host:
        host.install(path)
        revoked = updates.revoke_installed(
            host, RevocationList(2, 2e9, keys=frozenset({old.public_bytes}))
        )
        assert "endorsed its signing key is revoked" in revoked.disabled.get(HELLO, "")
        with pytest.raises(ExtensionRevoked):
            host.load_installed(HELLO)


@pytest.mark.skipif(not Path(SSH_KEYGEN).exists(), reason="needs ssh-keygen")
def test_revoke_installed_reaches_a_package_installed_by_an_ssh_signature(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    path = tmp_path / "hello.whpkg"
    path.write_bytes(write_archive(hello_files(tmp_path)))
    subprocess.run(
        [SSH_KEYGEN, "-Y", "sign", "-f", str(key), "-n", "wasihost", str(path)],
        check=True,
        capture_output=True,
    )
    kind, blob = Path(f"{key}.pub").read_text().split()[:2]
    allowed = AllowedSigners.parse(f"{PUBLISHER} {kind} {blob}\n")
    policy = Policy(allow=ALL_CAPS, allowed_signers=allowed)
    with Host(policy, cache_dir=None, state_dir=tmp_path / "state") as host:
        host.install(path, allowed_signers=allowed, ssh_signature=Path(f"{path}.sig").read_bytes())
        raw = allowed.signers[0].key
        assert raw is not None
        revoked = updates.revoke_installed(host, RevocationList(2, 2e9, keys=frozenset({raw})))
        assert "its signing key" in revoked.disabled.get(HELLO, "")


def test_a_manifest_swapped_during_a_directory_install_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = hello_dir(tmp_path)
    manifest = root / "extension.toml"
    checked = manifest.read_text()
    read_again = updates.manifest_text

    def swap_then_read(where: Path) -> bytes:
        # The source changes between the check (candidate, plan) and the copy into the tree.
        manifest.write_text(
            checked.replace('optional = ["clock"]', 'optional = ["clock", "random"]')
        )
        return read_again(where)

    monkeypatch.setattr(updates, "manifest_text", swap_then_read)
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, state_dir=tmp_path / "state") as host:
        with pytest.raises(PackageError, match="changed while it was installed"):
            host.install(root)
        assert host.require_state().package(HELLO) is None
