"""An extension id is admitted once; replacing it is an explicit update that closes the old
extension (issue: a second package claiming an admitted id took over its grants)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.support.common import ALL_CAPS, FIXTURES, run_in_thread
from wasihost.core.errors import AdmissionError, ConfigError
from wasihost.core.lifecycle import ExtensionRevoked, ExtensionUnavailable, State
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HELLO = "org.wasihost.fixtures.hello"


def impostor(tmp_path: Path, requires: str = "") -> Path:
    """A package claiming hello's id, with a different manifest (no clock, nothing optional)."""
    folder = tmp_path / "impostor"
    shutil.copytree(FIXTURES / "hello", folder, ignore=shutil.ignore_patterns("target", "src"))
    manifest = folder / "extension.toml"
    text = manifest.read_text().replace('optional = ["clock"]', "optional = []")
    manifest.write_text(text)
    return folder


def test_a_second_package_claiming_an_admitted_id_is_refused(tmp_path: Path) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        first = host.load(FIXTURES / "hello")
        first.call("greet", {"name": "a"})
        assert "clock" in first.grant.capabilities
        with pytest.raises(AdmissionError, match=r"already admitted.*Host\.update"):
            host.load(impostor(tmp_path), grants=[])
        # The first keeps its grant and its place: a call still uses the clock grant.
        assert first.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        assert "clock" in host.grants.state(HELLO).entries
        assert host.extension(HELLO) is first


def test_disable_reaches_the_admitted_extension_not_a_claimant(tmp_path: Path) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        spin = host.load(FIXTURES / "spin", fuel=10_000_000_000, timeout_ms=20_000)
        spin.start()
        with pytest.raises(AdmissionError):
            host.load(FIXTURES / "spin")
        worker, outcome = run_in_thread(lambda: spin.call("run"))
        time.sleep(0.2)
        host.disable(spin.id, "incident")
        disabled = time.monotonic()
        worker.join(timeout=5)
        assert time.monotonic() - disabled < 1.0
        assert isinstance(outcome[0], ExtensionRevoked)


def test_update_replaces_and_closes_the_old_extension(tmp_path: Path) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        old = host.load(FIXTURES / "hello")
        old.call("greet", {"name": "a"})
        new = host.update(impostor(tmp_path))
        assert host.extension(HELLO) is new
        assert new.manifest is not None and new.manifest.optional == frozenset()
        assert "clock" not in new.grant.capabilities
        assert new.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        assert old.lifecycle.state is State.CLOSED
        with pytest.raises(ExtensionUnavailable, match=r"closed.*replaced by 0\.1\.0"):
            old.call("greet", {"name": "c"})


def test_a_refused_update_leaves_the_old_extension_running(tmp_path: Path) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        old = host.load(FIXTURES / "hello")
        broken = impostor(tmp_path)
        (broken / "hello.wasm").write_bytes(b"\0asm\x01\0\0\0\x05\x03bad")
        with pytest.raises(Exception, match="sha256|module"):
            host.update(broken)
        assert host.extension(HELLO) is old
        assert old.call("greet", {"name": "a"}) == {"greeting": "hello, a"}


def test_update_of_an_id_not_admitted_is_refused() -> None:
    with (
        Host(Policy(allow=ALL_CAPS), cache_dir=None) as host,
        pytest.raises(ConfigError, match="not admitted"),
    ):
        host.update(FIXTURES / "hello")


def test_a_closed_extension_frees_its_id() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        first = host.load(FIXTURES / "echo")
        first.close()
        second = host.load(FIXTURES / "echo")
        assert second.call("echo", 1) == 1
        with pytest.raises(ExtensionUnavailable):
            first.call("echo", 1)

