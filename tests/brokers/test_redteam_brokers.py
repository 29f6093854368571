"""Red-team review of the storage, files, secrets and events brokers: hostile guests that follow
the ABI, and the orderings a pooled extension's concurrent calls can produce, run through the
real engine. Each test here failed on the code before the fix it names.

(The files write quota's holes and made files are in tests/brokers/test_files_broker.py, the events
key check in tests/brokers/test_events.py: next to the promises they strengthen.)"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from tests.host.test_pool import pooled
from tests.support.common import FIXTURES, run_in_thread
from wasihost.brokers import files as files_module
from wasihost.brokers import storage as storage_module
from wasihost.brokers.files import FilesBroker
from wasihost.core.errors import CallError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.store.kvstore import KVStore
from wasihost.store.kvtypes import Namespace

# Generous: only a broken fix waits it out. The held call starts its instance under a trace
# function, and on a loaded 2-core machine that took over 5 s once.
WAIT_S = 30.0


class StaleParse:
    """Holds one thread's parse of a grant scope in a broker's per-extension cache at the two
    points where another call can slip in: inside the parse (while the grant changes and a
    call of the new epoch fills the cache), and at the first line of ``code`` after the parse
    returned (where the old code had stored half of what it parsed).

    ``parse`` replaces the broker's ``parse_scope``; :meth:`run` runs a call with the trace
    that finds the second point."""

    def __init__(self, real: Callable[[Any], Any], code: CodeType) -> None:
        self.real = real
        self.code = code
        self.thread: threading.Thread | None = None
        self.parsing = threading.Event()  # the held thread is inside the parse
        self.parse_go = threading.Event()
        self.parsed = False
        self.stored = threading.Event()  # the held thread is past the parse, stopped
        self.store_go = threading.Event()

    def parse(self, scope: Any) -> Any:
        if threading.current_thread() is not self.thread or self.parsing.is_set():
            return self.real(scope)
        self.parsing.set()
        assert self.parse_go.wait(WAIT_S)
        result = self.real(scope)
        self.parsed = True
        return result

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and self.parsed and not self.stored.is_set():
            self.stored.set()
            assert self.store_go.wait(WAIT_S)
        return self._line

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._line if frame.f_code is self.code else None

    def run(self, call: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
        def traced() -> None:
            # Named here, not after start() returns: the call can reach the parse before the
            # starting thread runs again, and a parse by an unnamed thread is not held.
            self.thread = threading.current_thread()
            sys.settrace(self._trace)
            try:
                call()
            finally:
                sys.settrace(None)

        return run_in_thread(traced)

    def release(self) -> None:
        self.parse_go.set()
        self.store_go.set()


@pytest.fixture
def storage_host(cache: Path) -> Iterator[Host]:
    with Host(Policy(allow={"storage", "log"}), cache_dir=cache) as h:
        yield h


def test_a_retenanted_call_never_uses_the_tenant_a_stale_call_parsed(
    storage_host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Break (red-team 2026-12-01): ExtensionStorage cached the parsed scope and the grant entry
    # it came from in two attributes, stored one after the other. A call of the old grant that
    # parsed the old tenant stored it over the new one's parse, and a call of the new grant
    # that ran before it stored the entry saw the new entry with the old tenant: its put
    # landed in the tenant the operator had moved the extension away from, and committed
    # (its epoch was current).
    host = storage_host
    ext = pooled(host, FIXTURES / "storage", 2)
    host.grant(ext.id, "storage", {"tenant": "old"})
    held = StaleParse(storage_module.parse_scope, storage_module.ExtensionStorage.where.__code__)
    monkeypatch.setattr(storage_module, "parse_scope", held.parse)
    worker, outcome = held.run(lambda: ext.call("get", {"key": "a"}))
    try:
        assert held.parsing.wait(WAIT_S)  # the stale call is parsing {"tenant": "old"}
        host.grant(ext.id, "storage", {"tenant": "new"})
        assert ext.call("put", {"key": "c", "value": b"c"}) is None  # the new grant's parse
        held.parse_go.set()
        assert held.stored.wait(WAIT_S)
        assert ext.call("put", {"key": "d", "value": b"d"}) is None
    finally:
        held.release()
        worker.join(WAIT_S)
    assert not worker.is_alive() and not outcome
    store = host.broker("storage").store  # type: ignore[attr-defined]
    assert isinstance(store, KVStore)
    new, old = Namespace(ext.id, "new"), Namespace(ext.id, "old")
    assert store.get(new, b"c") == b"c"
    assert store.get(old, b"d") is None, "a write of the new grant landed in the old tenant"
    assert store.get(new, b"d") == b"d"


def test_a_rescoped_call_never_uses_the_mounts_a_stale_call_parsed(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Break (red-team 2026-12-01): the files broker cached the parsed scope and its epoch in two
    # attributes, stored one after the other: a call of the old grant stored its parse (the
    # mount the operator withdrew) while the epoch still said the new grant's, and a call of
    # the new grant in between created a file under the withdrawn mount, and its commit passed
    # (its epoch was current).
    data, ro = tmp_path / "data", tmp_path / "ro"
    data.mkdir()
    ro.mkdir()
    broker = FilesBroker(temp_dir=tmp_path)
    with Host(Policy(allow={"files", "log"}), cache_dir=cache, brokers=[broker]) as host:
        ext = pooled(host, FIXTURES / "files", 2)
        mounts = {"data": {"host": str(data), "mode": "rw"}, "ro": {"host": str(ro)}}
        host.grant(ext.id, "files", {"mounts": mounts})
        held = StaleParse(files_module.parse_scope, FilesBroker._scope.__code__)
        monkeypatch.setattr(files_module, "parse_scope", held.parse)
        worker, outcome = held.run(
            lambda: ext.call("write", {"mount": "data", "path": "stale", "data": b"s"})
        )
        try:
            assert held.parsing.wait(WAIT_S)  # the stale call is parsing the scope with data
            host.grant(ext.id, "files", {"mounts": {"ro": mounts["ro"]}})
            with pytest.raises(CallError) as info:  # the new grant's parse: no data mount
                ext.call("write", {"mount": "data", "path": "c", "data": b"c"})
            assert info.value.guest_class == "denied"
            held.parse_go.set()
            assert held.stored.wait(WAIT_S)
            with pytest.raises(CallError) as info:
                ext.call("write", {"mount": "data", "path": "d", "data": b"d"})
            assert info.value.guest_class == "denied"
        finally:
            held.release()
            worker.join(WAIT_S)
        assert not worker.is_alive()
        assert sorted(p.name for p in data.iterdir()) == [], "a file landed in a withdrawn mount"
        # The stale call itself was refused at its commit (its epoch had moved on).
        assert len(outcome) == 1 and isinstance(outcome[0], CallError)
