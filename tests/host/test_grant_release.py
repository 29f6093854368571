"""A closed extension's grant record leaves the host's memory (issue 16, density), and grant
epochs stay ABA-safe across that: an id closed and admitted again never shows an epoch that
a view kept from before (an epoch, a committer, a gate) could match.

Epochs are drawn from one counter per grant table, above every epoch it gave out or its store
held (also those of a purged id): these tests revoke and regrant around a close and a
re-admission of the same id, in memory and with a state directory, and check that no stale
view commits and that no epoch ever names two grant states.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.common import FIXTURES, bare
from wasihost.core.errors import AdmissionError
from wasihost.core.grants import GrantTable
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package, load_package
from wasihost.store.state import StateStore

LOGGER = (FIXTURES / "logger" / "logger.wasm").read_bytes()
CAPS = frozenset({"log", "clock", "random"})
LOGGER_ID = "org.wasihost.fixtures.logger"
# Rounds of close and re-admission: each one must draw epochs above every earlier round's.
ROUNDS = 3


def logs_one(ext: Extension) -> bool:
    """Whether a call of ``ext`` could commit a log line (the log broker commits through the
    grant table under the call's epoch)."""
    before = len(ext.logs())
    ext.call("run", {"lines": 1})
    return len(ext.logs()) == before + 1


def test_an_in_memory_record_leaves_at_close_and_no_stale_view_matches_a_later_one() -> None:
    package = bare(LOGGER)
    seen: list[int] = []  # every epoch the id ever had, in order
    stale = []  # views kept from closed rounds: (epoch, committer, gate)
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        table = host.grants
        for _ in range(ROUNDS):
            ext = host.admit(package, grants=["log"])
            assert package.name in table.known()
            first = ext.grant.epoch
            assert logs_one(ext)
            committer = table.committer(package.name, "log")
            gate = table.authorizer(package.name)
            assert committer(first, lambda: "now")[0] and gate(first, "log")
            revoked = host.revoke(ext.id, "log")  # around the close: revoke, regrant
            regranted = host.grant(ext.id, "log")
            assert logs_one(ext)  # under the regranted epoch
            seen += [first, revoked, regranted]
            stale.append((first, committer, gate))
            ext.close()
            # Nothing the operator set (no scope, no revocation): the record is gone.
            assert package.name not in table.known()
            assert table.held() == 0
        again = host.admit(package, grants=["log"])
        assert logs_one(again)
        current = host.grants.epoch(again.id)
        assert current > max(seen)
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        for epoch, committer, gate in stale:
            assert committer(epoch, lambda: "stale") == (False, None)
            assert not gate(epoch, "log")
            assert table.commit(again.id, epoch, "log", lambda: "stale") == (False, None)


def test_a_revocation_or_a_scope_of_a_closed_id_is_kept_without_a_store() -> None:
    with Host(Policy(allow=CAPS), cache_dir=None) as host:
        scoped, revoked = bare(LOGGER), bare(LOGGER)
        ext = host.admit(scoped, grants=["log"])
        # The table itself: Host.grant refuses a scope for log, whose broker reads none.
        host.grants.grant(ext.id, "log", {"note": "operator's"})
        ext.close()
        ext = host.admit(revoked, grants=["log"])
        host.revoke(ext.id, None, "incident")
        ext.close()
        assert {scoped.name, revoked.name} <= set(host.grants.known())
        back = host.admit(scoped, grants=["log"])
        assert back.grant_scopes() == {"log": {"note": "operator's"}}
        assert logs_one(back)
        with pytest.raises(ExtensionRevoked, match="incident"):
            host.admit(revoked, grants=["log"]).call("run", {"lines": 1})


def test_a_durable_record_leaves_at_close_and_comes_back_from_the_store(tmp_path: Path) -> None:
    state = tmp_path / "state"
    package = load_package(FIXTURES / "logger", CAPS, None, None)
    seen: list[int] = []
    stale = []
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
        table = host.grants
        seen.append(host.grant(LOGGER_ID, "log"))
        assert LOGGER_ID not in table.known()  # no extension of it open: only in the store
        for _ in range(ROUNDS):
            ext = host.admit(package)
            assert ext.grant.epoch == seen[-1]  # what the store holds
            assert logs_one(ext)
            stale.append((ext.grant.epoch, table.committer(LOGGER_ID, "log")))
            seen.append(host.revoke(LOGGER_ID, "log"))
            ext.close()
            assert LOGGER_ID not in table.known()
            seen.append(host.grant(LOGGER_ID, "log"))  # regranted while closed
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        again = host.admit(package)
        assert logs_one(again)
        for epoch, committer in stale:
            assert committer(epoch, lambda: "stale") == (False, None)
        again.close()
    # A host started later on the same directory draws above all of them too.
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
        assert host.grants.epoch(LOGGER_ID) == seen[-1]
        assert host.grant("org.example.other", "log") > max(seen)


def test_a_purged_id_never_gets_its_old_epochs_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=state) as host:
        host.install(FIXTURES / "logger")
        first = host.grant(LOGGER_ID, "log")
        ext = host.load_installed(LOGGER_ID)
        assert logs_one(ext)
        committer = host.grants.committer(LOGGER_ID, "log")
        ext.close()
        last = host.revoke(LOGGER_ID, "log")
        host.require_state().remove(LOGGER_ID, purge=True)
        # Installed again: a new grant of the id is drawn above what the purge deleted.
        host.install(FIXTURES / "logger")
        again = host.grant(LOGGER_ID, "log")
        assert again > last > first
        assert committer(first, lambda: "stale") == (False, None)
    # So is one made by another host (process) that opens the directory after the purge.
    store = StateStore(state)
    try:
        assert store.highest_grant_epoch() >= again
        store.remove(LOGGER_ID, purge=True)
        assert store.load_grants(LOGGER_ID) is None
        assert GrantTable(store).grant(LOGGER_ID, "log") > again
    finally:
        store.close()


def test_no_epoch_names_two_grant_states_under_racing_closes_and_grants() -> None:
    """Threads hold, change and release one id's record at once (so it leaves memory and
    comes back many times): every epoch a thread sees belongs to exactly one grant state."""
    table = GrantTable()
    seen: dict[int, tuple[frozenset[str], str | None]] = {}
    clashes: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def churn(capability: str) -> None:
        start.wait()
        for i in range(300):
            table.hold("x")
            try:
                if i % 3 == 2:
                    table.revoke("x", None, "churn")
                    table.reinstate("x")
                else:
                    table.grant("x", capability)
                state = table.state("x")
            finally:
                table.release("x")
            view = (frozenset(state.entries), state.revoked)
            with lock:
                if seen.setdefault(state.epoch, view) != view:
                    clashes.append(state.epoch)

    threads = [threading.Thread(target=churn, args=(c,)) for c in ("log", "clock", "random", "log")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not clashes
    assert table.held() == 0 and table.known() == []


def test_a_failed_admission_lets_go_of_the_record(tmp_path: Path) -> None:
    with Host(Policy(allow=CAPS), cache_dir=None, state_dir=tmp_path / "state") as host:
        # The stored grant is read (the record loaded) before the admission refuses.
        with pytest.raises(AdmissionError, match="'log', which is not granted"):
            host.admit(Package("x.wasm", None, LOGGER, bare(LOGGER).sha256))
        assert host.grants.known() == [] and host.grants.held() == 0


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "state-dir"])
def test_looking_at_an_id_no_extension_holds_keeps_nothing(durable: bool, tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state") if durable else None
    try:
        table = GrantTable(store)
        assert table.state("a").epoch == 0 and table.snapshot("b").capabilities == frozenset()
        assert table.authorizes("c", 0, "core") and table.authorizer("d")(0, "core")
        assert table.commit("e", 0, "core", lambda: "done") == (True, "done")
        assert table.known() == [] and table._locks == {}
        epoch = table.grant("f", "log")  # an operator's change: kept without a store
        assert table.known() == ([] if durable else ["f"])
        assert table.epoch("f") == epoch
    finally:
        if store is not None:
            store.close()
