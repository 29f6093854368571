"""Resource budgets over time (budgets.py, governor.py) through the real engine and real
guests: the CPU-fuel-per-minute and network-bytes-per-hour rates, their actions (warn,
throttle, pause, terminate), the usage snapshot and the operator counts. Time is a fake clock
that the tests move: nothing sleeps but the waits for a spinning call to be in flight."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import FIXTURES, FakeClock, bare, run_in_thread
from tests.support.strategies import BUDGET_TICKS, budget_steps
from wasihost.brokers.http import HttpBroker
from wasihost.brokers.jobs import JobsBroker, ManualClock
from wasihost.cli import main
from wasihost.core.budgets import (
    RATES,
    Account,
    BudgetPolicy,
    Crossing,
    ResourceBudget,
    budget_for,
)
from wasihost.core.errors import CallError, ConfigError, CrashClass, FailureClass
from wasihost.core.lifecycle import ExtensionUnavailable, State
from wasihost.core.limits import Action, Resource, ThrottleMode
from wasihost.core.manifest import parse_manifest
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import load_package
from wasihost.supervisor.governor import Governor, Throttled, Usage

COMPUTE = FIXTURES / "compute"
ECHO = FIXTURES / "echo"
SPIN = FIXTURES / "spin"
HTTPGET = FIXTURES / "httpget"
STORAGE = FIXTURES / "storage" / "storage.wasm"
# compute's "run" with this many rounds burns about 2.5M fuel (a few ms of a core).
HUNGRY_ROUNDS = 100_000
# A CPU budget that four hungry calls cross and a hundred polite ones never reach.
CPU_BUDGET = 9_000_000
# A polite echo costs about 3,000 fuel: this many stay under a sixth of CPU_BUDGET.
POLITE_CALLS = 500
# How long a test waits for a call to be in flight, or for an interrupt to land.
PROMPT_S = 5.0


def governed(
    cache: Path,
    clock: FakeClock,
    action: Action = Action.THROTTLE,
    *,
    cpu: int = CPU_BUDGET,
    network: int = 1024 * 1024 * 1024,
    network_action: Action = Action.THROTTLE,
    **kw: Any,
) -> Host:
    budgets = BudgetPolicy(
        cpu_fuel_per_minute=cpu,
        network_bytes_per_hour=network,
        actions={
            Resource.CPU_FUEL_PER_MINUTE: action,
            Resource.NETWORK_BYTES_PER_HOUR: network_action,
        },
    )
    allow = kw.pop("allow", {"log"})
    return Host(
        Policy(allow=allow, budgets=budgets),
        cache_dir=cache,
        governor=Governor(clock=clock),
        **kw,
    )


def hungry_until_refused(ext: Extension, most: int = 50) -> ExtensionUnavailable:
    """Hungry calls until the budget refuses one; the refusal."""
    for _ in range(most):
        try:
            ext.call("run", {"n": HUNGRY_ROUNDS})
        except ExtensionUnavailable as refused:
            return refused
    raise AssertionError(f"{most} hungry calls and no refusal")


def until_failed(call: Callable[[], Any], most: int = 10) -> CallError:
    """Repeat ``call`` until it fails; the failure."""
    for _ in range(most):
        try:
            call()
        except CallError as exc:
            return exc
    raise AssertionError(f"{most} calls and no failure")


# -- throttle: the CPU-hungry extension waits, the polite one beside it does not ---------------


def test_a_cpu_hungry_extension_is_throttled_while_a_polite_one_keeps_working(
    cache: Path, clock: FakeClock
) -> None:
    with governed(cache, clock) as host:
        hungry = host.load(COMPUTE)
        polite = host.load(ECHO)
        stop = threading.Event()
        refusals: list[ExtensionUnavailable] = []

        def burn() -> None:
            refusals.append(hungry_until_refused(hungry))
            stop.set()

        # The hungry extension burns on its own thread while the polite one is called here.
        worker, errors = run_in_thread(burn)
        answers = 0
        # Bounded, so the polite one's own account stays far under the budget however long
        # the hungry thread takes to reach it (a short call keeps the GIL, so this loop may
        # get most of it meanwhile).
        while (not stop.is_set() and answers < POLITE_CALLS) or answers < 20:
            assert polite.call("echo", {"i": answers}) == {"i": answers}
            answers += 1
        worker.join(PROMPT_S)
        assert not errors and len(refusals) == 1
        refused = refusals[0]
        assert isinstance(refused, Throttled) and refused.error_class == "throttled"
        assert refused.state is State.THROTTLED
        assert refused.resource is Resource.CPU_FUEL_PER_MINUTE
        assert 0 < refused.retry_after_s <= 60.0 + 1e-3
        assert hungry.lifecycle.state is State.THROTTLED
        # While the hungry one is refused, the polite one is neither refused nor queued: its
        # calls go straight through, and its account has never crossed anything.
        for i in range(20):
            assert polite.call("echo", i) == i
        with pytest.raises(Throttled):
            hungry.call("run", {"n": 1})
        mine = polite.usage()
        assert polite.lifecycle.state is State.RUNNING
        assert mine.refusals == 0 and mine.retry_after_s is None
        assert sum(mine.actions_fired.values()) == 0
        assert mine.cpu_fuel_last_minute < CPU_BUDGET
        theirs = hungry.usage()
        assert theirs.cpu_fuel_last_minute > CPU_BUDGET
        assert theirs.actions_fired["throttle"] == 1 and theirs.refusals == 2
        metrics = host.metrics()
        assert metrics.budget_actions["throttle"] == 1
        assert metrics.throttle_refusals == 2
        assert metrics.extensions_by_state["throttled"] == 1
        assert metrics.to_json()["budget_actions"] == dict(metrics.budget_actions)


def test_the_window_rolls_over_and_the_throttled_extension_resumes(
    cache: Path, clock: FakeClock
) -> None:
    with governed(cache, clock, cpu=3_000_000) as host:
        ext = host.load(COMPUTE)
        refused = hungry_until_refused(ext)
        assert refused.retry_after_s is not None
        first_wait = refused.retry_after_s
        clock.now += first_wait / 2  # half-way: still refused, with half the wait left
        with pytest.raises(Throttled) as again:
            ext.call("run", {"n": 1})
        assert again.value.retry_after_s == pytest.approx(first_wait / 2, abs=1.01)
        assert ext.usage().retry_after_s == again.value.retry_after_s
        clock.now += again.value.retry_after_s  # what the hint said
        assert "result" in ext.call("run", {"n": 1})
        assert ext.lifecycle.state is State.RUNNING
        assert ext.usage().retry_after_s is None
        # A new episode: crossing again throttles again, and counts again.
        hungry_until_refused(ext)
        assert ext.usage().actions_fired["throttle"] == 2


def test_a_closed_extensions_account_outlives_it_only_while_its_window_holds_usage(
    cache: Path, clock: FakeClock
) -> None:
    """A close and re-admission does not reset a budget: the throttled id is refused again at
    once. Once closed with its window empty, its account is dropped (docs/density.md)."""
    with governed(cache, clock, cpu=3_000_000) as host:
        package = load_package(COMPUTE, host.registry.capabilities())
        ext = host.admit(package)
        refused = hungry_until_refused(ext)
        assert refused.retry_after_s is not None
        ext.close()
        assert host.governor.prune() == 0  # its window still holds the last minute's fuel
        again = host.admit(package)
        with pytest.raises(Throttled):
            again.call("run", {"n": 1})
        assert again.usage().actions_fired["throttle"] == 1
        clock.now += refused.retry_after_s
        assert "result" in again.call("run", {"n": 1})
        again.close()
        assert host.governor.prune() == 0
        clock.now += 61.0  # past the minute: nothing of it is in the window any more
        assert host.governor.prune() == 1
        fresh = host.admit(package)
        usage = fresh.usage()
        assert usage.cpu_fuel_last_minute == 0 and usage.actions_fired["throttle"] == 0
        fresh.close()  # nothing used: the account goes at once
        assert host.governor.prune() == 0 and ext.id not in host.governor._accounts
        assert host.metrics().budget_actions["throttle"] == 1  # the host-wide count stays


def test_the_manifest_may_ask_for_less_cpu_than_the_policy_never_more(
    cache: Path, clock: FakeClock, tmp_path: Path
) -> None:
    with governed(cache, clock, cpu=CPU_BUDGET) as host:
        package = load_package(COMPUTE, host.registry.capabilities())
        assert package.manifest is not None
        asks_less = attrs.evolve(package.manifest.resources, cpu_fuel_per_minute=1_000)
        ext = host.admit(
            attrs.evolve(package, manifest=attrs.evolve(package.manifest, resources=asks_less))
        )
        assert ext.usage().budget.cpu_fuel_per_minute == 1_000
        ext.call("run", {"n": 10})  # one call crosses 1,000 fuel
        with pytest.raises(Throttled):
            ext.call("run", {"n": 10})
        ext.close()
        asks_more = attrs.evolve(package.manifest.resources, cpu_fuel_per_minute=10**12)
        ext = host.admit(
            attrs.evolve(package, manifest=attrs.evolve(package.manifest, resources=asks_more))
        )
        assert ext.usage().budget.cpu_fuel_per_minute == CPU_BUDGET
    # The manifest field parses and is bounded like every [resources] field.
    text = (COMPUTE / "extension.toml").read_text()
    parsed = parse_manifest(
        text.replace("[resources]", "[resources]\ncpu_fuel_per_minute = 5_000"), frozenset()
    )
    assert parsed.resources.cpu_fuel_per_minute == 5_000


# -- the other actions ---------------------------------------------------------------------------


def test_warn_journals_and_counts_and_refuses_nothing(
    cache: Path, clock: FakeClock, tmp_path: Path
) -> None:
    with governed(cache, clock, Action.WARN, cpu=3_000_000, state_dir=tmp_path / "s") as host:
        ext = host.load(COMPUTE)
        for _ in range(6):  # twice the budget and more: never refused
            ext.call("run", {"n": HUNGRY_ROUNDS})
        usage = ext.usage()
        assert usage.cpu_fuel_last_minute > 2 * 3_000_000
        assert usage.actions_fired["warn"] == 1  # once per crossing, not once per call
        assert usage.refusals == 0 and usage.retry_after_s is None
        assert ext.lifecycle.state is State.RUNNING
        assert host.metrics().budget_actions["warn"] == 1
        assert host.state is not None
        budget_lines = [e for e in host.state.events(ext.id, 100) if e.kind == "budget"]
        assert len(budget_lines) == 1
        assert "cpu_fuel_per_minute budget crossed" in budget_lines[0].detail
        assert "action warn" in budget_lines[0].detail


def test_pause_refuses_calls_until_the_operator_resumes(cache: Path, clock: FakeClock) -> None:
    with governed(cache, clock, Action.PAUSE, cpu=3_000_000) as host:
        ext = host.load(COMPUTE)
        refused = hungry_until_refused(ext)
        assert not isinstance(refused, Throttled)
        assert refused.state is State.PAUSED and refused.retry_after_s is None
        assert "cpu_fuel_per_minute budget crossed" in str(refused)
        clock.now += 3600  # the window has room again, and still the extension waits
        with pytest.raises(ExtensionUnavailable) as still:
            ext.call("run", {"n": 1})
        assert still.value.state is State.PAUSED
        ext.resume()
        assert "result" in ext.call("run", {"n": 1})
        assert host.metrics().budget_actions["pause"] == 1


def spin_pool(host: Host) -> Extension:
    """fixtures/spin with two instances, and fuel and time enough to spin for long."""
    package = load_package(SPIN, host.registry.capabilities())
    assert package.manifest is not None
    resources = attrs.evolve(
        package.manifest.resources,
        max_concurrency=2,
        fuel_per_call=10**10,
        timeout_ms=30_000,
    )
    return host.admit(
        attrs.evolve(package, manifest=attrs.evolve(package.manifest, resources=resources))
    )


def in_flight(ext: Extension, calls: int) -> None:
    give_up = time.monotonic() + PROMPT_S
    while ext.usage().calls_in_flight < calls or ext.lifecycle.state is not State.RUNNING:
        assert time.monotonic() < give_up, "the spinning call never started"
        time.sleep(0.01)


def test_terminate_stops_the_call_in_flight_and_crashes_the_extension(
    cache: Path, clock: FakeClock
) -> None:
    with governed(cache, clock, Action.TERMINATE, cpu=1_000_000) as host:
        ext = spin_pool(host)
        spinning: list[BaseException] = []

        def spin() -> None:
            try:
                ext.call("run")
            except BaseException as exc:
                spinning.append(exc)

        worker = threading.Thread(target=spin)
        worker.start()
        in_flight(ext, 1)
        started = time.monotonic()
        # A second call, on the second instance, burns past the budget (it runs out of its
        # own small fuel): the crossing stops the spinning call too.
        with pytest.raises(CallError) as mine:
            ext.call("run", fuel=2_000_000)
        assert mine.value.failure is FailureClass.OUT_OF_FUEL
        worker.join(PROMPT_S)
        assert not worker.is_alive() and time.monotonic() - started < PROMPT_S
        (stopped,) = spinning
        assert isinstance(stopped, CallError)
        assert stopped.failure is FailureClass.OUT_OF_FUEL
        assert "terminated: cpu_fuel_per_minute budget crossed" in stopped.message
        assert ext.lifecycle.state is State.FAILED
        assert {c.crash_class for c in host.supervisor.crashes(ext.id)} == {
            CrashClass.RESOURCE_LIMIT
        }
        # No restart while the window is over the budget; then it starts afresh.
        with pytest.raises(Throttled) as refused:
            ext.call("run", fuel=1000)
        assert refused.value.state is State.FAILED
        assert refused.value.retry_after_s is not None
        clock.now += refused.value.retry_after_s
        with pytest.raises(CallError) as fresh:
            ext.call("run", fuel=1000)  # started again: it spins out of its own fuel
        assert fresh.value.failure is FailureClass.OUT_OF_FUEL
        assert "terminated" not in fresh.value.message
        assert host.metrics().budget_actions["terminate"] == 1


def test_terminate_fails_the_call_that_crossed(cache: Path, clock: FakeClock) -> None:
    with governed(cache, clock, Action.TERMINATE, cpu=3_000_000) as host:
        ext = host.load(COMPUTE)
        ext.call("run", {"n": 10})
        ended = until_failed(lambda: ext.call("run", {"n": HUNGRY_ROUNDS}))
        assert ended.failure is FailureClass.OUT_OF_FUEL
        assert ended.message.startswith("terminated: cpu_fuel_per_minute")
        assert ext.lifecycle.state is State.FAILED
        (crash,) = host.supervisor.crashes(ext.id)
        assert crash.crash_class is CrashClass.RESOURCE_LIMIT


# -- network bytes per hour: the http broker ------------------------------------------------------


class Server:
    """An HTTP/1.1 server on 127.0.0.1 answering every GET with 100 bytes."""

    def __init__(self) -> None:
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.hits += 1
                body = b"b" * 100
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://api.test:{self.port}/hello"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(PROMPT_S)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def resolve(name: str, port: int) -> list[str]:
    if name != "api.test":
        raise socket.gaierror(socket.EAI_NONAME, "unknown name")
    return ["127.0.0.1"]


def http_extension(host: Host, tmp_path: Path, server: Server) -> Extension:
    target = tmp_path / "httpget"
    shutil.copytree(HTTPGET, target, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    manifest = (target / "extension.toml").read_text()
    manifest = manifest.replace(
        'allowed_origins = ["http://api.test:8080"]',
        f'allowed_origins = ["http://api.test:{server.port}"]',
    )
    (target / "extension.toml").write_text(manifest)
    ext = host.load(target)
    host.grant(ext.id, "http", {"allow_local_network": True})
    return ext


def fetch_status(ext: Extension, server: Server) -> str:
    try:
        return str(ext.call("fetch", {"url": server.url})["status"])
    except CallError as exc:
        if exc.failure is FailureClass.GUEST_ERROR:
            return str(exc.guest_class)
        raise


def network_host(cache: Path, clock: FakeClock, action: Action, budget: int = 1_000) -> Host:
    return governed(
        cache,
        clock,
        network=budget,
        network_action=action,
        allow={"http", "log"},
        brokers=[HttpBroker(resolver=resolve, clock=clock)],
    )


def test_network_bytes_per_hour_throttle_the_http_broker(
    cache: Path, clock: FakeClock, tmp_path: Path, server: Server
) -> None:
    with network_host(cache, clock, Action.THROTTLE) as host:
        ext = http_extension(host, tmp_path, server)
        # The manifest asks 1 MiB an hour; the host allows 1,000 bytes: the smaller applies.
        assert ext.usage().budget.network_bytes_per_hour == 1_000
        assert fetch_status(ext, server) == "200"
        exchange = ext.usage().network_bytes_last_hour  # one request and its answer
        statuses = [fetch_status(ext, server) for _ in range(8)]
        assert "quota_exceeded" in statuses
        sent = server.hits
        usage = ext.usage()
        # A request that would not fit is refused unsent and uncounted; an answer's bytes are
        # taken from the budget before each read, and the one that finds none left fires the
        # action and is withheld. So the account never passes the budget.
        assert exchange < usage.network_bytes_last_hour <= 1_000
        assert usage.actions_fired["throttle"] == 1
        assert statuses.count("200") < sent
        # The broker refuses; the extension itself keeps running and answering.
        assert ext.lifecycle.state is State.RUNNING
        assert fetch_status(ext, server) == "quota_exceeded"
        assert server.hits == sent
        assert host.metrics().throttle_refusals >= 1
        clock.now += 3600  # an hour on, the window is empty again
        assert fetch_status(ext, server) == "200"
        assert ext.usage().network_bytes_last_hour < 1_000


def test_network_terminate_interrupts_the_call_in_flight(
    cache: Path, clock: FakeClock, tmp_path: Path, server: Server
) -> None:
    with network_host(cache, clock, Action.TERMINATE) as host:
        ext = http_extension(host, tmp_path, server)
        assert fetch_status(ext, server) == "200"
        ended = until_failed(lambda: fetch_status(ext, server))
        assert ended.failure is FailureClass.OUT_OF_FUEL
        assert "terminated: network_bytes_per_hour budget crossed" in ended.message
        assert ext.lifecycle.state is State.FAILED
        assert host.supervisor.crashes(ext.id)[-1].crash_class is CrashClass.RESOURCE_LIMIT
        assert ext.usage().network_bytes_last_hour < 2_000
        assert host.metrics().budget_actions["terminate"] == 1


# -- the snapshot -----------------------------------------------------------------------------


def test_usage_is_a_frozen_snapshot_with_the_levels_brokers_report(
    cache: Path, clock: FakeClock
) -> None:
    with governed(cache, clock, allow={"storage", "log"}) as host:
        ext = host.admit(bare(STORAGE.read_bytes()), grants=["storage"])
        assert host.usage(ext.id).cpu_fuel_last_minute == 0
        ext.start()  # start-up alone burns fuel too, and it counts
        before = host.usage(ext.id)
        assert isinstance(before, Usage)
        assert before.cpu_fuel_last_minute > 0
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            before.cpu_fuel_last_minute = 0  # type: ignore[misc]
        ext.call("put", {"key": "k", "value": b"v" * 500})
        after = ext.usage()
        assert after.storage_bytes is not None and after.storage_bytes >= 500
        assert after.cpu_fuel_last_minute > before.cpu_fuel_last_minute
        assert after.fuel_last_call == ext.last_fuel_used
        assert after.calls_in_flight == 0
        assert after.open_handles is None  # never used the files broker
        assert after.budget.storage_bytes == ext.resources.storage_max_bytes
        as_json = json.loads(json.dumps(after.to_json()))
        assert as_json["budget"]["cpu_fuel_per_minute"] == CPU_BUDGET
        assert as_json["budget"]["actions"]["cpu_fuel_per_minute"] == "throttle"
        assert as_json["storage_bytes"] == after.storage_bytes
        with pytest.raises(ConfigError):
            host.usage("org.example.missing")


def test_budget_policies_refuse_what_they_cannot_mean() -> None:
    with pytest.raises(ConfigError):
        BudgetPolicy(cpu_fuel_per_minute=0)
    with pytest.raises(ConfigError):
        BudgetPolicy(network_bytes_per_hour=-1)
    with pytest.raises(ConfigError):
        BudgetPolicy(actions={"cpu_fuel_per_minute": "explode"})
    with pytest.raises(ConfigError):
        BudgetPolicy(actions={"disk_bytes": "throttle"})  # no such resource
    with pytest.raises(ConfigError):
        BudgetPolicy(actions={3: "throttle"})
    with pytest.raises(ConfigError):
        BudgetPolicy(throttle_mode="sometimes")
    named = BudgetPolicy(
        actions={"network_bytes_per_hour": "terminate", "memory_bytes": "pause"},
        throttle_mode="delay",
    )
    assert named.actions[Resource.NETWORK_BYTES_PER_HOUR] is Action.TERMINATE
    assert named.actions[Resource.CPU_FUEL_PER_MINUTE] is Action.THROTTLE
    assert named.actions[Resource.MEMORY_BYTES] is Action.PAUSE
    # The levels warn unless told otherwise: their static limits refuse as they always did.
    assert named.actions[Resource.STORAGE_BYTES] is Action.WARN
    assert named.throttle_mode is ThrottleMode.DELAY
    assert BudgetPolicy().throttle_mode is ThrottleMode.REFUSE


# -- the host's own work always wins ------------------------------------------------------------


def test_no_extension_call_holds_a_host_lock_while_guest_code_runs(
    cache: Path, clock: FakeClock
) -> None:
    with governed(cache, clock, cpu=10**12) as host:
        spinner = spin_pool(host)
        worker, errors = run_in_thread(lambda: spinner.call("run"))
        in_flight(spinner, 1)
        started = time.monotonic()
        # While a guest spins (for up to 30 s), everything the host does goes through.
        # A bare module: what it is granted is its request, so a grant changes its grant.
        other = host.load(ECHO / "echo.wasm", grants=[])
        assert other.call("echo", 1) == 1
        host.grant(other.id, "log")
        host.revoke(other.id, "log")
        assert host.metrics().extensions_by_state["running"] >= 1
        assert host.usage(spinner.id).calls_in_flight == 1
        spinner.pause("operator")  # the lifecycle moves under a running call
        spinner.resume()
        other.close()
        assert time.monotonic() - started < PROMPT_S
        assert worker.is_alive()  # it was spinning the whole time
        spinner.close()
        worker.join(PROMPT_S)
        assert not worker.is_alive() and errors


# -- the property: no usage over a hard quota without throttle or terminate having fired --------


def pure_budget(cpu: int, network: int, action: Action) -> ResourceBudget:
    policy = BudgetPolicy(
        cpu_fuel_per_minute=cpu,
        network_bytes_per_hour=network,
        actions=dict.fromkeys(RATES, action),
    )
    package = load_package(ECHO, frozenset())
    assert package.manifest is not None
    http = attrs.evolve(package.manifest.http, bytes_per_hour=min(network, 10**9))
    manifest = attrs.evolve(package.manifest, http=http)
    return budget_for(manifest.resources, manifest, policy, open_handles=16)


@settings(max_examples=300, deadline=None)
@given(
    cpu=st.integers(1, 10**6),
    network=st.integers(1, 10**6),
    action=st.sampled_from([Action.THROTTLE, Action.TERMINATE]),
    steps=budget_steps(),
)
def test_usage_never_exceeds_a_hard_quota_without_throttle_or_terminate_firing(
    cpu: int, network: int, action: Action, steps: list[tuple[Any, ...]]
) -> None:
    clock = FakeClock()
    budget = pure_budget(cpu, network, action)
    account = Account(budget, clock)
    # Whether the action fired since the usage was last seen within the budget.
    armed = dict.fromkeys(RATES, False)
    biggest = dict.fromkeys(RATES, 0)
    slack = 0

    def saw(crossing: Crossing | None) -> None:
        if crossing is not None:
            assert crossing.action is action
            if crossing.fired:
                armed[crossing.resource] = True

    for step in steps:
        if step[0] == "tick":
            clock.now += step[1]
        elif step[0] == "call":
            refusal = account.admit_call()
            saw(refusal)
            if refusal is None:
                biggest[Resource.CPU_FUEL_PER_MINUTE] = max(
                    biggest[Resource.CPU_FUEL_PER_MINUTE], step[1]
                )
                saw(account.charge(Resource.CPU_FUEL_PER_MINUTE, step[1]))
            else:
                assert refusal.refused and refusal.retry_after_s > 0
                assert armed[Resource.CPU_FUEL_PER_MINUTE]
        elif step[0] == "received":
            # Counted whatever the budget says (the bytes came): the bound below grows by it.
            slack += step[1]
            saw(account.charge(Resource.NETWORK_BYTES_PER_HOUR, step[1]))
        else:
            _, sent, received = step
            before = account.used(Resource.NETWORK_BYTES_PER_HOUR)
            request = account.charge(Resource.NETWORK_BYTES_PER_HOUR, sent, refusable=True)
            saw(request)
            if request is not None and request.refused:
                # Refused unsent: nothing was counted.
                assert account.used(Resource.NETWORK_BYTES_PER_HOUR) == before
            else:
                biggest[Resource.NETWORK_BYTES_PER_HOUR] = max(
                    biggest[Resource.NETWORK_BYTES_PER_HOUR], received
                )
                saw(account.charge(Resource.NETWORK_BYTES_PER_HOUR, received))
        for resource in RATES:
            limit = budget.limit(resource)
            assert limit is not None
            used = account.used(resource)
            if used <= limit:
                armed[resource] = False
                continue
            # Over the hard quota: only ever with the throttle (or terminate) fired...
            assert armed[resource], f"{resource.value} at {used} of {limit}, nothing fired"
            # ... and by no more than the one charge that could not be refused beforehand
            # (and the bytes counted with no request before them).
            extra = slack if resource is Resource.NETWORK_BYTES_PER_HOUR else 0
            assert used <= limit + biggest[resource] + extra
    assert sum(account.fired.values()) >= sum(1 for r in RATES if armed[r])


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("call"), st.integers(1, HUNGRY_ROUNDS)),
            st.tuples(st.just("tick"), BUDGET_TICKS),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_real_guest_never_exceeds_its_cpu_budget_unthrottled(
    cache: Path, steps: list[tuple[str, Any]]
) -> None:
    clock = FakeClock()
    budget = 3_000_000
    with governed(cache, clock, cpu=budget) as host:
        ext = host.load(COMPUTE)
        for kind, value in steps:
            if kind == "tick":
                clock.now += value
                continue
            before = ext.usage()
            if before.cpu_fuel_last_minute > budget:
                # Over the quota: the call is refused, with a hint, and burns nothing.
                with pytest.raises(Throttled) as refused:
                    ext.call("run", {"n": value})
                assert refused.value.retry_after_s == before.retry_after_s
                assert ext.usage().cpu_fuel_last_minute == before.cpu_fuel_last_minute
                assert ext.lifecycle.state is State.THROTTLED
                continue
            ext.call("run", {"n": value})
            after = ext.usage()
            # Every call is counted, to the fuel.
            assert after.cpu_fuel_last_minute == before.cpu_fuel_last_minute + ext.last_fuel_used
            fired = after.actions_fired["throttle"] - before.actions_fired["throttle"]
            if after.cpu_fuel_last_minute > budget:
                # The call that crossed fired the throttle: the extension says so.
                assert fired == 1 and ext.lifecycle.state is State.THROTTLED
                assert after.retry_after_s is not None and after.retry_after_s > 0
            else:
                assert fired == 0 and after.retry_after_s is None


# -- jobs: their level in the snapshot, their fuel in the budget, no run while throttled --------


def test_jobs_count_in_the_snapshot_and_the_budget_and_skip_while_throttled(
    cache: Path, clock: FakeClock
) -> None:
    jobs_clock = ManualClock()
    with governed(
        cache,
        clock,
        cpu=1_000_000_000,
        allow={"jobs", "log", "events"},
        brokers=[JobsBroker(clock=jobs_clock)],
    ) as host:
        ext = host.load(FIXTURES / "jobs")
        broker = host.broker("jobs")
        assert isinstance(broker, JobsBroker)
        job = ext.call("schedule", {"command": "tick", "every_ms": 1000})
        ext.call("schedule", {"command": "tick", "delay_ms": 10**6})
        usage = ext.usage()
        assert usage.background_jobs == 2 and usage.budget.background_jobs == 4
        burnt = usage.cpu_fuel_last_minute
        jobs_clock.advance(1.0)
        assert broker.tick() == 1 and broker.drain(PROMPT_S)
        # A job's run is a call of the extension: its fuel counts against the budget.
        assert ext.usage().cpu_fuel_last_minute > burnt
        # The operator lowers this extension's budget below what it has used: its next call
        # fires the throttle (before running, not after) and is refused.
        host.governor.set_policy(ext.id, BudgetPolicy(cpu_fuel_per_minute=1))
        with pytest.raises(Throttled):
            ext.call("cancel", 12345)
        assert ext.lifecycle.state is State.THROTTLED
        assert ext.usage().actions_fired["throttle"] == 1
        # Throttled, its jobs' runs are skipped, not run.
        runs = broker.stats(ext.id)[job].runs
        jobs_clock.advance(1.0)
        broker.tick()
        assert broker.drain(PROMPT_S)
        stats = broker.stats(ext.id)[job]
        assert stats.runs == runs and stats.skipped >= 1 and stats.failed == 0


def test_throttles_reach_the_operators_status_json(
    cache: Path, clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    with governed(cache, clock, state_dir=state) as host:
        hungry = host.load(COMPUTE)
        assert isinstance(hungry_until_refused(hungry), Throttled)
        with pytest.raises(Throttled):
            hungry.call("run", {"n": 1})
        assert host.publish_metrics()
        # Another process's view: the CLI opens the state directory on its own.
        assert main(["status", "--json", "--state-dir", str(state)]) == 0
        metrics = json.loads(capsys.readouterr().out)["metrics"]
        assert metrics["source"] == "live"
        assert metrics["throttles"] == 1 and metrics["budget_actions"]["throttle"] == 1
        assert metrics["throttle_refusals"] == 2
        assert metrics["extensions_by_state"] == {"throttled": 1}


def test_a_take_never_passes_the_network_budget_and_its_refund_lands_where_it_was_taken() -> None:
    """Account.take (the http broker's reads, issue 28's follow-up to item 14): as many bytes
    as are left, none past the budget, the crossing when none are; a refund goes back into
    the bucket its take went to, so the bytes kept leave the window when they would have."""
    clock = FakeClock()
    account = Account(pure_budget(10**6, 1_000, Action.THROTTLE), clock)
    network = Resource.NETWORK_BYTES_PER_HOUR
    granted, first, crossing = account.take(network, 800)
    assert (granted, crossing) == (800, None)
    clock.now += 60  # the next one-minute bucket
    granted, second, crossing = account.take(network, 800)
    assert (granted, crossing) == (200, None)
    assert second != first
    granted, _, crossing = account.take(network, 1)
    assert granted == 0 and crossing is not None and crossing.refused and crossing.fired
    account.refund_from(network, 300, first)  # 300 of the first take were not read
    assert account.used(network) == 700
    clock.now += 3600 - 60  # the first bucket leaves the window, the second stays
    assert account.used(network) == 200
