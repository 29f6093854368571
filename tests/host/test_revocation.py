"""Revocation: races with committing host calls, interrupting a running call, restarts."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.support.common import FIXTURES
from wasihost.core.errors import AdmissionError
from wasihost.core.lifecycle import ExtensionRevoked, State
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

CAPS = {"log", "clock", "random"}


def test_nothing_commits_after_revoke_returns() -> None:
    """A guest appends to its log in a tight loop while another thread revokes `log`."""
    rng = random.Random(1234)
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        for _round in range(30):
            ext = host.load(FIXTURES / "hostflood")
            host.grant(ext.id, "log")
            ext.call("run", {"calls": 1})
            ext.log.drain()
            counted: list[int] = []
            done = threading.Event()

            def flood(ext=ext, done=done) -> None:  # type: ignore[no-untyped-def]
                while not done.is_set():
                    ext.call("run", {"calls": 1000})
                    if ext.log.dropped:
                        break

            worker = threading.Thread(target=flood)
            worker.start()
            time.sleep(rng.uniform(0.0, 0.02))
            host.revoke(ext.id, "log")
            counted.append(len(ext.logs()))
            time.sleep(0.01)
            done.set()
            worker.join(timeout=10)
            assert not worker.is_alive()
            assert len(ext.logs()) == counted[0], "a log record committed after revoke returned"
            host.grant(ext.id, "log")
            ext.close()


def test_disable_interrupts_the_call_in_flight() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "spin", fuel=10_000_000_000, timeout_ms=30_000)
        ext.start()
        outcome: list[BaseException] = []

        def spin() -> None:
            try:
                ext.call("run")
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=spin)
        started = time.monotonic()
        worker.start()
        time.sleep(0.1)
        host.disable(ext.id, "incident 42")
        disabled = time.monotonic()
        worker.join(timeout=5)
        assert not worker.is_alive()
        # within a few epoch ticks, long before the fuel (~2 s of spinning) or the 30 s deadline
        assert time.monotonic() - disabled < 1.0
        assert time.monotonic() - started < 3
        assert isinstance(outcome[0], ExtensionRevoked)
        assert "incident 42" in str(outcome[0])
        with pytest.raises(ExtensionRevoked):
            ext.call("run")
        assert ext.lifecycle.state is State.REVOKED


def test_revocation_survives_a_host_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
        installed = host.install(FIXTURES / "hello")
        with pytest.raises(AdmissionError, match="required capability 'log' is not granted"):
            host.load_installed(installed.id)
        host.grant(installed.id, "log")
        ext = host.load_installed(installed.id)
        assert ext.call("greet", {"name": "ada"}) == {"greeting": "hello, ada"}
        host.revoke(installed.id, "log")
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
        with pytest.raises(AdmissionError, match="required capability 'log' is not granted"):
            host.load_installed(installed.id)
        host.grant(installed.id, "log")
        host.disable(installed.id, "compromised publisher key")
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
        host.install(FIXTURES / "echo")
        host.grant("org.wasihost.fixtures.echo", "log")
        restored = host.restore()
        assert isinstance(restored[installed.id], ExtensionRevoked)
        echo = restored["org.wasihost.fixtures.echo"]
        assert not isinstance(echo, Exception) and echo.call("echo", 5) == 5
        with pytest.raises(ExtensionRevoked, match="compromised publisher key"):
            host.load_installed(installed.id)
        assert host.grants.snapshot(installed.id).capabilities == frozenset()
        remaining = host.state.remaining_data(installed.id)  # type: ignore[union-attr]
        assert remaining["package"] is not None  # data is kept, never deleted automatically
        kinds = [e.kind for e in host.state.events(installed.id, 50)]  # type: ignore[union-attr]
        assert "revoke" in kinds and "installed" in kinds


def test_epochs_never_go_back_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    epochs = []
    for _ in range(3):
        with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
            host.grant("org.example.x", "log")
            host.revoke("org.example.x", "log")
            epochs.append(host.grants.epoch("org.example.x"))
    assert epochs == sorted(epochs) and len(set(epochs)) == 3


def test_upgrade_restarts_and_downgrade_does_not() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello")
        ext.call("greet", {"name": "a"})
        assert ext.handshake is not None and "clock" in ext.handshake.granted
        host.revoke(ext.id, "clock")
        ext.call("greet", {"name": "b"})
        assert ext.starts == 1  # downgrade in place
        host.grant(ext.id, "clock")
        ext.call("greet", {"name": "c"})
        assert ext.starts == 2  # upgrade: re-admitted and restarted
        assert ext.handshake is not None and "clock" in ext.handshake.granted


def test_a_policy_update_voids_old_epochs_and_caps_grants() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello")
        ext.call("greet", {"name": "a"})
        old = host.grants.epoch(ext.id)
        assert "clock" in ext.grant.capabilities
        host.update_policy(Policy(allow={"log"}))
        assert host.grants.commit(ext.id, old, "log", lambda: True) == (False, None)
        assert ext.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        assert ext.grant.capabilities == {"log"}
        assert ext.grant.epoch > old


def test_a_policy_update_lowers_resource_ceilings_with_a_restart() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "compute")
        ext.call("run", {"n": 10})
        host.update_policy(Policy(allow=CAPS, ceilings={"fuel_per_call": 100_000}))
        ext.call("run", {"n": 10})
        assert ext.resources.fuel_per_call == 100_000
        assert ext.starts == 2
