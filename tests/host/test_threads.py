"""Threads on the call path, through the real engine: guest code of a call not known to be
short runs with the GIL released and under no host-wide lock (short calls: test_short_calls.py),
and an ``await acall`` loop keeps to one warm call thread."""

from __future__ import annotations

import asyncio
import threading
import time

import attrs

from tests.support.common import ALL_CAPS, FIXTURES
from wasihost.core.call_ticket import CallTicket
from wasihost.core.errors import CallError, FailureClass
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package

ECHO = FIXTURES / "echo"
SPIN = FIXTURES / "spin"
# Long enough that only the test's cancellation ends the spinning call.
LONG_MS = 30_000
SPIN_FUEL = 10**11
# How long the test waits for the spinning call to be in its guest, or to end once cancelled:
# a few epoch ticks, with room for a loaded machine.
WAIT_S = 5.0
CALLS = 200


def spin(host: Host) -> Extension:
    package = load_package(SPIN, host.registry.capabilities())
    assert package.manifest is not None
    resources = attrs.evolve(
        package.manifest.resources, fuel_per_call=SPIN_FUEL, timeout_ms=LONG_MS
    )
    manifest = attrs.evolve(package.manifest, resources=resources)
    return host.admit(attrs.evolve(package, manifest=manifest))


def test_calls_of_another_extension_run_while_a_guest_spins() -> None:
    """Guest code holds neither the GIL nor any host lock: a second thread's calls complete
    while the first thread's guest spins (a lock or the GIL held across guest code would keep
    them waiting until that call ends, which only the cancellation below does)."""
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        spinning = spin(host)
        echo = host.load(ECHO)
        echo.call("noop")
        spinning.start()
        ticket = CallTicket(spinning)
        failures: list[BaseException] = []

        def hog() -> None:
            try:
                spinning.call_cancellable(ticket, "run")
            except BaseException as exc:  # the test inspects it
                failures.append(exc)

        thread = threading.Thread(target=hog)
        thread.start()
        give_up = time.monotonic() + WAIT_S
        while ticket.instance is None:
            assert time.monotonic() < give_up
            time.sleep(0.01)
        for i in range(CALLS):
            assert echo.call("echo", i) == i
        assert thread.is_alive(), "the spinning call ended before the other calls did"
        ticket.cancel()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert len(failures) == 1 and isinstance(failures[0], CallError)
        assert failures[0].failure is FailureClass.CANCELLED


def test_an_await_acall_loop_keeps_to_one_call_thread() -> None:
    """Each outcome is handed back after its thread is idle again, so the next call finds it
    rather than starting another thread (which then wait, cold, taking turns)."""
    with Host(Policy(allow=ALL_CAPS), cache_dir=None, async_workers=8) as host:
        echo = host.load(ECHO)

        async def main() -> None:
            for i in range(CALLS):
                assert await echo.acall("echo", i) == i

        asyncio.run(main())
        assert len(host.call_workers()._threads) == 1
