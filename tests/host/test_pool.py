"""The instance pool: with max_concurrency N, up to N calls of one extension run at once, each
on its own instance, through the real engine."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.support.common import ALL_CAPS, APPFNS_LOOKUP, APPFNS_REMEMBER, FIXTURES, run_in_thread
from wasihost.core.errors import CallError, ConfigError, FailureClass, ManifestError
from wasihost.core.lifecycle import ExtensionRevoked, ExtensionUnavailable, State
from wasihost.core.limits import MAX_MAX_CONCURRENCY
from wasihost.core.manifest import Resources, parse_manifest
from wasihost.core.serving import CallContext
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package

APPFNS = FIXTURES / "appfns"
SPIN = FIXTURES / "spin"
# How long a test waits for something that takes a few ms: room for a loaded CI machine.
WAIT_S = 5.0
# What "promptly" means for an interrupt: a few epoch ticks, with room for load.
PROMPT_S = 0.5


def pooled(host: Host, fixture: Path, n: int, **resources: int) -> Extension:
    """``fixture`` admitted with max_concurrency ``n`` (and other resources) in its manifest."""
    package = load_package(fixture, host.registry.capabilities())
    assert package.manifest is not None
    wanted = attrs.evolve(package.manifest.resources, max_concurrency=n, **resources)
    manifest = attrs.evolve(package.manifest, resources=wanted)
    return host.admit(attrs.evolve(package, manifest=manifest))


class App:
    """fixtures/appfns' host: ``myapp.lookup`` records the epochs its caller sees and can hold
    a call inside the host function until the test releases it."""

    def __init__(self, allow: set[str] | None = None) -> None:
        self.host = Host(
            Policy(allow=allow or {"myapp.read", "myapp.write", *ALL_CAPS}), cache_dir=None
        )
        self.ext: Extension | None = None
        self.inside = threading.Semaphore(0)
        self.release = threading.Event()
        self.seen: dict[str, tuple[int, int]] = {}
        self.barrier = threading.Barrier(2, timeout=WAIT_S)

        @self.host.function("myapp.lookup", **APPFNS_LOOKUP)
        def lookup(ctx: CallContext, request: Any) -> Any:
            if request == "boom":
                raise KeyError("boom")
            if request == "together":
                self.barrier.wait()  # both calls inside the host function at once, or broken
            if isinstance(request, str) and request.startswith("hold"):
                self.inside.release()
                assert self.release.wait(WAIT_S)
            assert self.ext is not None
            self.seen[str(request)] = (ctx.epoch, self.ext.call_epoch)
            return {"ok": request}

        @self.host.function("myapp.remember", **APPFNS_REMEMBER)
        def remember(ctx: CallContext, request: Any) -> Any:
            return None

    def load(self, n: int) -> Extension:
        self.ext = pooled(self.host, APPFNS, n)
        return self.ext


@pytest.fixture
def app() -> Any:
    application = App()
    yield application
    application.release.set()
    application.host.close()


def test_max_concurrency_is_a_resource_with_default_bound_and_ceiling() -> None:
    assert Resources().max_concurrency == 1
    text = (APPFNS / "extension.toml").read_text()
    caps = frozenset({"myapp.read", "myapp.write"})
    manifest = parse_manifest(text.replace("timeout_ms = 1000", "max_concurrency = 4"), caps)
    assert manifest.resources.max_concurrency == 4
    with pytest.raises(ManifestError, match="resources.max_concurrency"):
        parse_manifest(text.replace("timeout_ms = 1000", f"max_concurrency = {10**6}"), caps)
    with pytest.raises(ConfigError, match="max_concurrency"):
        Resources(max_concurrency=MAX_MAX_CONCURRENCY + 1)
    capped = Policy(ceilings={"max_concurrency": 2}).cap(Resources(max_concurrency=8))
    assert capped.max_concurrency == 2


def test_two_calls_run_at_once_on_one_extension(app: App) -> None:
    ext = app.load(2)
    results: list[Any] = []
    worker, errors = run_in_thread(lambda: results.append(ext.call("lookup", "together")))
    # The barrier needs both calls inside myapp.lookup at the same time: serialised calls
    # would break it (and fail host_error) after WAIT_S.
    assert ext.call("lookup", "together") == {"ok": "together"}
    worker.join(WAIT_S)
    assert not errors and results == [{"ok": "together"}]
    assert ext.starts == 2 and len(ext._instances()) == 2
    # Serial calls reuse idle instances: no more starts.
    for _ in range(5):
        ext.call("lookup", "x")
    assert ext.starts == 2


def test_one_instance_serialises_and_a_call_waits_at_most_its_deadline(app: App) -> None:
    ext = app.load(1)
    worker, errors = run_in_thread(lambda: ext.call("lookup", "hold"))
    assert app.inside.acquire(timeout=WAIT_S)
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        ext.call("lookup", "x", timeout_ms=200)
    waited = time.monotonic() - started
    assert info.value.failure is FailureClass.DEADLINE
    assert "no free instance" in info.value.message
    assert 0.15 <= waited < 0.2 + PROMPT_S
    app.release.set()
    worker.join(WAIT_S)
    assert not errors
    # Waiting was not a crash: the extension is running, its one instance kept.
    assert ext.lifecycle.state is State.RUNNING and ext.starts == 1
    assert ext.call("lookup", "x") == {"ok": "x"}


def test_a_waiting_call_gets_the_instance_when_it_comes_back(app: App) -> None:
    ext = app.load(1)
    worker, errors = run_in_thread(lambda: ext.call("lookup", "hold"))
    assert app.inside.acquire(timeout=WAIT_S)
    threading.Timer(0.1, app.release.set).start()
    assert ext.call("lookup", "after") == {"ok": "after"}
    worker.join(WAIT_S)
    assert not errors and ext.starts == 1


def test_each_concurrent_call_sees_its_own_grant_epoch(app: App) -> None:
    ext = app.load(2)
    worker, errors = run_in_thread(lambda: ext.call("lookup", "hold-old"))
    assert app.inside.acquire(timeout=WAIT_S)
    old = app.host.grants.epoch(ext.id)
    app.host.revoke(ext.id, "myapp.write")  # a downgrade: applied before the next call
    new = app.host.grants.epoch(ext.id)
    assert new > old
    assert ext.call("lookup", "new") == {"ok": "new"}
    app.release.set()
    worker.join(WAIT_S)
    assert not errors
    # The held call was authorised under the old epoch and still sees it, after another
    # call started under the new one (a shared epoch would have moved under it).
    assert app.seen["hold-old"] == (old, old)
    assert app.seen["new"] == (new, new)


def test_a_crash_leaves_the_other_call_running_and_is_replaced(app: App) -> None:
    ext = app.load(2)
    ext.call("lookup", "x")
    worker, errors = run_in_thread(lambda: ext.call("lookup", "hold"))
    assert app.inside.acquire(timeout=WAIT_S)
    (held,) = ext._instances()
    with pytest.raises(CallError) as info:
        ext.call("lookup", "boom")  # a host function's bug: host_error discards its instance
    assert info.value.failure is FailureClass.HOST_ERROR
    assert ext.lifecycle.state is State.FAILED
    assert ext._instances() == (held,)  # the crashed instance is gone, the held one runs on
    app.release.set()
    worker.join(WAIT_S)
    assert not errors  # the other call finished normally
    assert held.closed  # retired as it came back: the extension restarts as a whole
    starts = ext.starts
    assert ext.call("lookup", "y") == {"ok": "y"}
    assert ext.starts == starts + 1 and ext.lifecycle.state is State.RUNNING
    (replacement,) = ext._instances()
    assert replacement is not held


def test_disable_interrupts_every_call_in_flight() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = pooled(host, SPIN, 2, fuel_per_call=10**10, timeout_ms=30_000)
        calls = [run_in_thread(lambda: ext.call("run")) for _ in range(2)]
        give_up = time.monotonic() + WAIT_S
        while len(ext._instances()) < 2 or ext.lifecycle.state is not State.RUNNING:
            assert time.monotonic() < give_up
            time.sleep(0.01)
        time.sleep(0.1)  # both are spinning in the guest now
        disabled = time.monotonic()
        host.disable(ext.id, "incident 7")
        for worker, outcome in calls:
            worker.join(WAIT_S)
            assert not worker.is_alive()
            assert isinstance(outcome[0], ExtensionRevoked), outcome
        assert time.monotonic() - disabled < PROMPT_S
        assert ext._instances() == ()


def test_close_interrupts_every_call_and_frees_every_instance() -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        ext = pooled(host, SPIN, 3, fuel_per_call=10**10, timeout_ms=30_000)
        calls = [run_in_thread(lambda: ext.call("run")) for _ in range(3)]
        give_up = time.monotonic() + WAIT_S
        while len(ext._instances()) < 3 or ext.lifecycle.state is not State.RUNNING:
            assert time.monotonic() < give_up
            time.sleep(0.01)
        instances = ext._instances()
        time.sleep(0.1)
        started = time.monotonic()
        ext.close()
        assert time.monotonic() - started < PROMPT_S
        for worker, outcome in calls:
            worker.join(WAIT_S)
            assert isinstance(outcome[0], ExtensionUnavailable), outcome
        assert all(i.closed for i in instances) and ext._instances() == ()


def test_an_upgrade_restarts_every_instance(app: App) -> None:
    ext = app.load(2)
    app.host.revoke(ext.id, "myapp.write")
    worker, errors = run_in_thread(lambda: ext.call("lookup", "hold"))
    assert app.inside.acquire(timeout=WAIT_S)
    ext.call("lookup", "x")
    old = set(ext._instances())
    assert len(old) == 2
    app.host.grant(ext.id, "myapp.write")  # an upgrade: re-admitted, every instance restarts
    assert ext.call("lookup", "y") == {"ok": "y"}
    assert ext.handshake is not None and "myapp.write" in ext.handshake.granted
    app.release.set()
    worker.join(WAIT_S)
    assert not errors
    assert not old & set(ext._instances())  # the held one was retired as it came back
    assert all(i.closed for i in old)


def test_fuel_used_is_per_calling_thread(app: App) -> None:
    ext = app.load(2)
    ext.call("lookup", "x")
    small = ext.last_fuel_used
    worker, errors = run_in_thread(lambda: ext.call("lookup", "y" * 60))
    worker.join(WAIT_S)
    assert not errors
    assert ext.last_fuel_used == small  # this thread's last call, not the other thread's


@pytest.mark.in_process
def test_once_two_calls_overlapped_no_call_of_the_extension_keeps_the_gil(app: App) -> None:
    """Threads sharing an extension share its pool lock: one keeping the GIL across guest
    code would make the other wait a switch interval whenever it blocked on that lock. Short
    calls keep the GIL while they come one at a time, and never again once two overlapped."""
    ext = app.load(2)
    for _ in range(3):
        ext.call("lookup", "x")
    (instance,) = ext._instances()
    assert instance.keeps_gil(b"lookup") and instance.kept_gil
    worker, errors = run_in_thread(lambda: ext.call("lookup", "hold"))
    assert app.inside.acquire(timeout=WAIT_S)
    ext.call("lookup", "x")  # overlaps the held call: a second instance
    app.release.set()
    worker.join(WAIT_S)
    assert not errors
    for _ in range(3):
        ext.call("lookup", "x")
    assert len(ext._instances()) == 2
    assert all(i.keeps_gil(b"lookup") and not i.kept_gil for i in ext._instances())
