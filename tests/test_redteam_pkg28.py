"""Red-team pass of issue 28 (packages): items 3, 4, 5, 6, 8 and 9.

Each test is a hole that was found open, and is closed now:

- after ``remove`` without ``--purge``, another publisher's package with the same id inherited
  the grants and data kept for it (the publisher pin lived only in the install record);
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ALL_CAPS
from packages_support import PUBLISHER, hello_dir, hello_files, signed_archive, trust_of

from wasihost import updates
from wasihost.errors import AdmissionError
from wasihost.packaging.trust import SigningKey
from wasihost.policy import Policy
from wasihost.runtime import Host

HELLO = "org.wasihost.fixtures.hello"
OTHER = "other.example"


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
