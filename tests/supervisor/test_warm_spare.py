"""The warm spare: after a crash, the instance that replaces the crashed one is started on a
call thread before the next call needs it, and it never serves under a grant it was not
started under."""

from __future__ import annotations

import pytest

from tests.support.common import FIXTURES
from wasihost.core.errors import CallError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked, State
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.supervisor.supervision import Never, Supervisor

CAPS = frozenset({"log", "clock", "random"})
# A spare is one instantiation and handshake on a call thread: milliseconds, even loaded.
SPARE_WAIT_S = 10.0


def crash(ext: object) -> None:
    """One call that runs out of fuel: the extension crashes and its instance is dropped."""
    with pytest.raises(CallError) as info:
        ext.call("greet", {"name": "x"}, fuel=1)  # type: ignore[attr-defined]
    assert info.value.failure is FailureClass.OUT_OF_FUEL


def test_no_spare_before_a_crash() -> None:
    """A well-behaved extension keeps one instance: no spare doubles its memory."""
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello", grants=["log"])
        ext.call("greet", {"name": "a"})
        assert not ext.wait_for_spare(0.0)
        assert ext.spare_starts == 0


def test_trapped_instance_is_replaced_by_the_warm_spare() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello", grants=["log"])
        ext.call("greet", {"name": "a"})
        first = ext.handshake
        assert first is not None
        crash(ext)
        assert ext.lifecycle.state is State.FAILED
        assert ext.wait_for_spare(SPARE_WAIT_S)
        starts = ext.starts
        assert ext.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        # The call restarted the extension on the spare: no instantiation on its path.
        assert ext.spare_starts == 1
        assert ext.starts == starts + 1
        assert ext.lifecycle.state is State.RUNNING
        assert ext.handshake is not None and ext.handshake.runtime_id != first.runtime_id
        assert any(detail.endswith("(warm spare)") for _, detail in ext.steps)
        # The next spare is made after the one used, so the next crash is covered too.
        assert ext.wait_for_spare(SPARE_WAIT_S)
        crash(ext)
        assert ext.call("greet", {"name": "c"}) == {"greeting": "hello, c"}
        assert ext.spare_starts == 2


def test_spare_started_under_an_old_grant_epoch_never_serves() -> None:
    """A grant change applied in place (a downgrade) keeps the pool but not the spare: its
    handshake told the guest the old grant and epoch."""
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello", grants=["log", "clock"])
        ext.call("greet", {"name": "a"})
        crash(ext)
        assert ext.wait_for_spare(SPARE_WAIT_S)
        epoch = host.revoke(ext.id, "clock")
        assert ext.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        assert ext.spare_starts == 0
        assert ext.handshake is not None
        assert ext.handshake.epoch == epoch
        assert ext.handshake.granted == ("log",)


def test_spare_of_a_regranted_extension_is_dropped() -> None:
    """An upgrade re-admits the extension: the spare goes with the old plan."""
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello", grants=["log", "clock"])
        host.revoke(ext.id, "clock")
        ext.call("greet", {"name": "a"})
        crash(ext)
        assert ext.wait_for_spare(SPARE_WAIT_S)
        spare = ext._spare
        assert spare is not None
        epoch = host.grant(ext.id, "clock")
        assert ext.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        assert ext.spare_starts == 0
        assert spare.slot.instance.closed
        assert ext.handshake is not None and ext.handshake.epoch == epoch
        assert ext.handshake.granted == ("clock", "log")


def test_revocation_drops_the_spare() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello", grants=["log"])
        ext.call("greet", {"name": "a"})
        crash(ext)
        assert ext.wait_for_spare(SPARE_WAIT_S)
        spare = ext._spare
        assert spare is not None
        host.revoke(ext.id)
        with pytest.raises(ExtensionRevoked):
            ext.call("greet", {"name": "b"})
        assert spare.slot.instance.closed
        assert ext._spare is None
        assert ext.spare_starts == 0


def test_close_drops_the_spare() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        ext = host.load(FIXTURES / "hello", grants=["log"])
        ext.call("greet", {"name": "a"})
        crash(ext)
        assert ext.wait_for_spare(SPARE_WAIT_S)
        spare = ext._spare
        assert spare is not None
        ext.close()
        assert spare.slot.instance.closed
        assert ext._spare is None


def test_quarantine_drops_the_spare() -> None:
    """A crash that exhausts the restart budget quarantines the extension and its spare goes:
    released, it starts afresh."""
    supervisor = Supervisor(Never())
    with Host(Policy(allow=CAPS), cache_dir=None, supervisor=supervisor) as host:
        ext = host.load(FIXTURES / "hello", grants=["log"])
        ext.call("greet", {"name": "a"})
        ext._want_spare = True  # as after an earlier crash: a spare is ready before this one
        ext._schedule_spare()
        assert ext.wait_for_spare(SPARE_WAIT_S)
        spare = ext._spare
        assert spare is not None
        crash(ext)
        assert ext.lifecycle.state is State.QUARANTINED
        assert spare.slot.instance.closed
        assert not ext.wait_for_spare(SPARE_WAIT_S)
        host.release(ext.id)
        assert ext.call("greet", {"name": "b"}) == {"greeting": "hello, b"}
        assert ext.spare_starts == 0


def test_close_while_a_spare_is_being_made_keeps_none() -> None:
    """close() waits for (and interrupts) a spare being made: none survives it, whichever
    comes first."""
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        for _ in range(5):
            ext = host.load(FIXTURES / "hello", grants=["log"])
            ext.call("greet", {"name": "a"})
            crash(ext)  # schedules a spare on a call thread
            ext.close()
            assert ext._spare is None
            assert not ext._spare_building
            assert not ext.wait_for_spare(SPARE_WAIT_S)
            assert ext._spare is None
