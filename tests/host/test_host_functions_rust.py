"""An application's own host functions called from a Rust plugin built on the guest SDK
(fixtures/appfns, `wasihost_guest::import!`), through the real engine."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.common import FIXTURES
from wasihost.core.errors import AdmissionError, CallError, FailureClass
from wasihost.core.lifecycle import ExtensionRevoked
from wasihost.core.serving import CallContext
from wasihost.core.status import HostStatus, Status
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

APPFNS = FIXTURES / "appfns"
LOOKUP_FUEL = 50_000


def app_host(allow: set[str]) -> Host:
    """The application of docs/host-functions.md: a catalogue to look things up in, and a
    notebook the plugin may write to."""
    host = Host(Policy(allow=allow), cache_dir=None)
    catalogue = {"sku-1": {"name": "lamp", "price": 30}}
    host.notebook = []  # type: ignore[attr-defined]
    host.entered = threading.Event()  # type: ignore[attr-defined]

    @host.function(
        "myapp.lookup",
        capability="myapp.read",
        max_request_bytes=64,
        max_response_bytes=1024,
        fuel_base=LOOKUP_FUEL,
        fuel_per_byte=2,
    )
    def lookup(ctx: CallContext, request: Any) -> Any:
        if request == "boom":
            raise KeyError("internal table /srv/catalogue.db is corrupt")
        if request not in catalogue:
            raise HostStatus(Status.NOT_FOUND)
        return catalogue[request]

    @host.function(
        "myapp.remember",
        capability="myapp.write",
        max_request_bytes=256,
        max_response_bytes=16,
        fuel_base=1000,
        fuel_per_byte=2,
        commits=True,
    )
    async def remember(ctx: CallContext, request: Any) -> Any:
        if request == "slowly":
            host.entered.set()  # type: ignore[attr-defined]
            await asyncio.Event().wait()  # until the host interrupts the call
        await asyncio.sleep(0)
        ctx.commit(lambda: host.notebook.append((ctx.extension, request)))  # type: ignore[attr-defined]
        return len(host.notebook)  # type: ignore[attr-defined]

    return host


@pytest.fixture
def app() -> Iterator[Host]:
    with app_host({"myapp.read", "myapp.write"}) as host:
        yield host


def test_a_rust_plugin_calls_the_applications_functions(app: Host) -> None:
    ext = app.load(APPFNS)
    assert ext.call("lookup", "sku-1") == {"name": "lamp", "price": 30}
    assert ext.last_fuel_used > LOOKUP_FUEL  # the entry's price is charged to the plugin
    assert ext.call("remember", {"note": "x"}) == 1
    assert app.notebook == [(ext.id, {"note": "x"})]  # type: ignore[attr-defined]


def test_statuses_limits_and_failures_reach_the_plugin_as_the_abi_says(
    app: Host, caplog: pytest.LogCaptureFixture
) -> None:
    ext = app.load(APPFNS)
    with pytest.raises(CallError) as info:
        ext.call("lookup", "sku-2")
    assert info.value.failure is FailureClass.GUEST_ERROR
    assert info.value.guest_class == "not_found"
    with pytest.raises(CallError) as info:
        ext.call("lookup", "k" * 100)  # over max_request_bytes=64
    assert info.value.guest_class == "payload_too_large"
    with caplog.at_level(logging.ERROR, logger="wasihost"), pytest.raises(CallError) as info:
        ext.call("lookup", "boom")
    assert info.value.failure is FailureClass.HOST_ERROR
    assert "/srv" not in str(info.value) and "corrupt" not in str(info.value)
    assert any("corrupt" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)
    # The instance was discarded after host_error; the next call starts a fresh one.
    assert ext.call("lookup", "sku-1")["name"] == "lamp"


def test_an_ungranted_function_refuses_the_plugin_by_name() -> None:
    with app_host({"myapp.read"}) as host, pytest.raises(AdmissionError) as info:
        host.load(APPFNS)
    assert any(
        p.startswith("import myapp_v1.remember: needs capability 'myapp.write'")
        for p in info.value.problems
    ), info.value.problems


def test_a_disable_interrupts_an_async_function_the_plugin_waits_on(app: Host) -> None:
    ext = app.load(APPFNS)
    ext.start()
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            ext.call("remember", "slowly")
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    started = time.monotonic()
    caller.start()
    assert app.entered.wait(5)  # type: ignore[attr-defined]
    app.disable(ext.id, "operator")
    caller.join(5)
    assert not caller.is_alive()
    assert isinstance(outcome[0], ExtensionRevoked), outcome
    assert time.monotonic() - started < 1.0  # well before the 1 s call deadline
    assert app.notebook == []  # type: ignore[attr-defined]
