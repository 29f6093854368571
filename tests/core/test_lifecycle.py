"""The lifecycle table, and a stateful model test of lifecycle + grants on a real guest."""

from __future__ import annotations

import re
from pathlib import Path

import cbor2
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.common import ROOT, bare
from tests.support.guests import build, escape, guest_wat, host_import
from wasihost.core.grants import GrantTable
from wasihost.core.lifecycle import (
    COMMAND_STATES,
    TRANSITIONS,
    Event,
    ExtensionRevoked,
    ExtensionUnavailable,
    Lifecycle,
    LifecycleError,
    State,
    mermaid,
)
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host


def test_there_is_no_shortcut_into_running() -> None:
    into_running = {(s, e) for (s, e), t in TRANSITIONS.items() if t is State.RUNNING}
    assert into_running == {
        (State.STARTING, Event.READY),
        (State.PAUSED, Event.RESUME),
        (State.THROTTLED, Event.RESUME),
    }
    assert all(
        s is not State.PROVISIONING for (s, _), t in TRANSITIONS.items() if t is State.RUNNING
    )
    assert {State.RUNNING} == COMMAND_STATES


def test_illegal_transition_names_state_and_event() -> None:
    lc = Lifecycle("org.x")
    with pytest.raises(LifecycleError, match=r"org.x: no transition from provisioning on ready"):
        lc.fire(Event.READY)
    assert lc.state is State.PROVISIONING


def test_revoked_leaves_only_by_close_and_closed_is_final() -> None:
    assert [e for (s, e) in TRANSITIONS if s is State.REVOKED] == [Event.CLOSE]
    assert not [e for (s, e) in TRANSITIONS if s is State.CLOSED]
    for state in State:
        if state not in (State.REVOKED, State.CLOSED):
            assert TRANSITIONS[(state, Event.REVOKE)] is State.REVOKED
        if state is not State.CLOSED:
            assert TRANSITIONS[(state, Event.CLOSE)] is State.CLOSED


def test_docs_diagram_is_generated_from_the_table() -> None:
    doc = (ROOT / "docs" / "lifecycle.md").read_text()
    block = re.search(r"```mermaid\n(.*?)```", doc, re.S)
    assert block is not None
    assert block.group(1).strip() == mermaid().strip()


# -- a guest whose command calls `log` once and returns the status it got --------------------

REQ = cbor2.dumps([2, "hello"])
STATUS_GUEST = build(
    guest_wat(
        f"""
        (local.set $r (call $log (i32.const 8192) (i32.const {len(REQ)}) (i32.const 12288) (i32.const 16)))
        (i32.store (i32.const 12800) (i32.const 0))
        (i32.store8 (i32.const 12804)
          (select (local.get $r) (i32.add (i32.const 0x20) (i32.sub (i32.const -1) (local.get $r)))
                  (i32.ge_s (local.get $r) (i32.const 0))))
        (call $packed (i32.const 12800) (i32.const 5))""",
        imports=host_import("log"),
        extra=f'(data (i32.const 8192) "{escape(REQ)}")',
    ).replace("(result i64)\n    ;; free", "(result i64) (local $r i32)\n    ;; free")
)


class LifecycleAndGrants(RuleBasedStateMachine):
    """Operators grant, revoke, pause and resume while commands run; the model says what may
    happen, the real host must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.host = Host(Policy(allow={"log", "clock", "random"}), cache_dir=None)
        self.ext = self.host.admit(bare(STATUS_GUEST), grants=["log"])
        self.granted = {"log"}
        self.revoked = False
        self.paused = False
        self.old_epochs: list[int] = []

    def teardown(self) -> None:
        self.host.close()

    @rule()
    def call(self) -> None:
        before = len(self.ext.logs())
        try:
            status = self.ext.call("run")
        except ExtensionRevoked:
            assert self.revoked
            return
        except ExtensionUnavailable:
            assert self.paused and not self.revoked
            return
        # a command ran: only possible in Running, never while paused or revoked
        assert not self.revoked and not self.paused
        assert self.ext.lifecycle.state in COMMAND_STATES
        if "log" in self.granted:
            assert status == 1 and len(self.ext.logs()) == before + 1
        else:
            assert status == -1 and len(self.ext.logs()) == before  # DENIED, nothing committed
        self.ext.log.drain()

    @rule()
    def revoke_log(self) -> None:
        if "log" in self.granted and not self.revoked:
            self.old_epochs.append(self.host.grants.epoch(self.ext.id))
            self.host.revoke(self.ext.id, "log")
            self.granted.discard("log")

    @rule()
    def grant_log(self) -> None:
        if not self.revoked:
            old = self.host.grants.epoch(self.ext.id)
            if self.host.grant(self.ext.id, "log") != old:
                self.old_epochs.append(old)
            self.granted.add("log")

    @precondition(lambda self: not self.revoked)
    @rule(reason=st.sampled_from(["operator", "incident"]))
    def revoke_everything(self, reason: str) -> None:
        self.old_epochs.append(self.host.grants.epoch(self.ext.id))
        self.host.revoke(self.ext.id, None, reason)
        self.revoked = True

    @rule()
    def pause(self) -> None:
        if self.ext.lifecycle.state is State.RUNNING:
            self.ext.pause("maintenance")
            self.paused = True

    @rule()
    def resume(self) -> None:
        if self.ext.lifecycle.state is State.PAUSED:
            self.ext.resume()
            self.paused = False

    @invariant()
    def no_old_epoch_commits(self) -> None:
        table = self.host.grants
        for epoch in self.old_epochs:
            ok, _ = table.commit(self.ext.id, epoch, "log", lambda: True)
            assert not ok

    @invariant()
    def revoked_state_is_sticky(self) -> None:
        if self.revoked:
            assert self.host.grants.state(self.ext.id).revoked is not None


LifecycleAndGrants.TestCase.settings = settings(max_examples=40, stateful_step_count=25)
test_lifecycle_and_grants = LifecycleAndGrants.TestCase


def test_status_guest_reports_statuses() -> None:
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.admit(bare(STATUS_GUEST), grants=["log"])
        assert ext.call("run") == 1
        host.revoke(ext.id, "log")
        assert ext.call("run") == -1
        assert ext.starts == 1  # the downgrade applied without a restart


def test_grant_table_commit_is_refused_after_revoke() -> None:
    table = GrantTable()
    epoch = table.grant("x", "log")
    assert table.commit("x", epoch, "log", lambda: "done") == (True, "done")
    table.revoke("x", "log")
    assert table.commit("x", epoch, "log", lambda: "late") == (False, None)
    new = table.grant("x", "log")
    assert new > epoch
    assert table.commit("x", epoch, "log", lambda: "late") == (False, None)


def test_unused_model_paths_are_reachable(tmp_path: Path) -> None:
    """Quarantine and stop move the lifecycle and refuse commands with a clear error."""
    with Host(Policy(allow={"log"}), cache_dir=None) as host:
        ext = host.admit(bare(STATUS_GUEST), grants=["log"])
        ext.call("run")
        ext.quarantine("crashed 5 times in a minute")
        with pytest.raises(ExtensionUnavailable, match="quarantined: crashed 5 times"):
            ext.call("run")
        ext.lifecycle.fire(Event.RELEASE)
        assert ext.call("run") == 1  # restarted from Stopped
        assert ext.starts == 2
        ext.stop()
        assert ext.lifecycle.state is State.STOPPED
