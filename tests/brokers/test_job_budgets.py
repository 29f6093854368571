"""A background job run's own memory and network budget ([jobs] max_memory_bytes and
max_network_bytes), through the real engine: the `jobbudget` Rust fixture's job commands
reserve heap (`hog`) and fetch a URL (`fetch`) from a server on 127.0.0.1. The same commands
called directly have only the extension's own budget. Time is a ManualClock: nothing sleeps."""

from __future__ import annotations

import http.server
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES
from wasihost.brokers.http import HttpBroker
from wasihost.brokers.jobs import MIN_PERIOD_MS, JobsBroker, ManualClock
from wasihost.core.errors import CallError, ManifestError
from wasihost.core.extlog import LogRecord
from wasihost.core.manifest import MAX_HTTP_BYTES_PER_HOUR, parse_manifest
from wasihost.host.defaults import default_registry
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

JOBBUDGET = FIXTURES / "jobbudget"
WAIT_S = 10.0
MiB = 1024 * 1024
# The fixture's [jobs] table: a run may grow memory to 4 MiB and move 4 KiB over http; the
# extension itself has 16 MiB of memory and the hourly quota's default.
RUN_MEMORY = 4 * MiB
RUN_NETWORK = 4096
SMALL_BODY = 100
BIG_BODY = 8000  # over the run's 4 KiB, far under the hourly quota


class Server:
    """Answers GET /small and /big with that many bytes; counts the requests that reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.paths.append(self.path)
                body = b"b" * (BIG_BODY if self.path == "/big" else SMALL_BODY)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that stopped reading (the host withholding a response)

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://api.test:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(WAIT_S)


def resolve(name: str, port: int) -> list[str]:
    if name != "api.test":
        raise socket.gaierror(socket.EAI_NONAME, "unknown name")
    return ["127.0.0.1"]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def messages() -> list[str]:
    return []


@pytest.fixture
def host(cache: Path, clock: ManualClock, messages: list[str]) -> Iterator[Host]:
    def sink(extension: str, record: LogRecord) -> None:
        messages.append(record.message)

    brokers = [JobsBroker(clock=clock), HttpBroker(resolver=resolve)]
    policy = Policy(allow={"jobs", "http", "log"})
    with Host(policy, cache_dir=cache, brokers=brokers, log_sink=sink) as h:
        yield h


def package(tmp_path: Path, server: Server, jobs_extra: str = "") -> Path:
    """fixtures/jobbudget with its manifest naming the server's origin (its port varies)."""
    target = tmp_path / "jobbudget"
    shutil.copytree(JOBBUDGET, target, ignore=shutil.ignore_patterns("src", "Cargo.toml"))
    manifest = (target / "extension.toml").read_text()
    manifest = manifest.replace(
        'allowed_origins = ["http://api.test:8080"]',
        f'allowed_origins = ["http://api.test:{server.port}"]',
    )
    if jobs_extra:
        manifest = manifest.replace("max_network_bytes = 4096", jobs_extra)
    (target / "extension.toml").write_text(manifest)
    return target


def load(host: Host, tmp_path: Path, server: Server, jobs_extra: str = "") -> Extension:
    ext = host.load(package(tmp_path, server, jobs_extra))
    host.grant(ext.id, "http", {"allow_local_network": True})
    return ext


def jobs_of(host: Host) -> JobsBroker:
    broker = host.broker("jobs")
    assert isinstance(broker, JobsBroker)
    return broker


def run_once(host: Host, clock: ManualClock, ext: Extension, command: str, value: Any) -> str:
    """Run ``command`` once as a job with ``value`` and answer how it ended: ``ok`` or its
    failure. The job is periodic only so that its stats outlive the run (a one-shot's go with
    it); the clock never moves, so it never runs again."""
    request = {"command": command, "delay_ms": 0, "every_ms": MIN_PERIOD_MS, "input": value}
    job = ext.call("schedule", request)
    assert isinstance(job, int)
    assert jobs_of(host).tick() == 1
    assert jobs_of(host).drain(WAIT_S)
    stats = jobs_of(host).stats(ext.id)[job]
    assert stats.runs + stats.failed == 1
    if stats.failed:
        assert stats.last_failure is not None
        return stats.last_failure
    return "ok"


def direct(ext: Extension, command: str, value: Any) -> Any:
    return ext.call(command, {"input": value})


# -- memory -----------------------------------------------------------------------------------


def test_a_run_cannot_grow_memory_past_its_budget_while_a_direct_call_can(
    host: Host, clock: ManualClock, tmp_path: Path, server: Server, messages: list[str]
) -> None:
    ext = load(host, tmp_path, server)
    assert run_once(host, clock, ext, "hog", MiB) == "ok"
    assert messages[-1] == f"hog {MiB}"
    failure = run_once(host, clock, ext, "hog", RUN_MEMORY)
    assert "out_of_memory" in failure
    # The cap was the run's alone: the same instance grows past it for a direct call.
    assert direct(ext, "hog", 2 * RUN_MEMORY) == 2 * RUN_MEMORY
    with pytest.raises(CallError) as info:
        direct(ext, "hog", 16 * MiB)  # the extension's own limit still holds
    assert info.value.guest_class == "out_of_memory"


def test_memory_an_earlier_direct_call_grew_stays_usable_to_a_run(
    host: Host, clock: ManualClock, tmp_path: Path, server: Server
) -> None:
    """docs/jobs.md: linear memory never shrinks; the budget bounds growth during a run."""
    ext = load(host, tmp_path, server)
    assert direct(ext, "hog", 2 * RUN_MEMORY) == 2 * RUN_MEMORY
    assert run_once(host, clock, ext, "hog", RUN_MEMORY) == "ok"
    assert "out_of_memory" in run_once(host, clock, ext, "hog", 4 * RUN_MEMORY)


# -- network bytes ----------------------------------------------------------------------------


def test_a_run_within_its_network_bytes_fetches(
    host: Host, clock: ManualClock, tmp_path: Path, server: Server, messages: list[str]
) -> None:
    ext = load(host, tmp_path, server)
    assert run_once(host, clock, ext, "fetch", server.url("/small")) == "ok"
    assert messages[-1] == f"fetched 200 {SMALL_BODY}"
    # Each run has its own allowance: a second run is not charged the first one's bytes.
    assert run_once(host, clock, ext, "fetch", server.url("/small")) == "ok"


def test_a_response_over_the_runs_network_bytes_is_withheld_and_a_direct_call_is_not_bound(
    host: Host, clock: ManualClock, tmp_path: Path, server: Server, messages: list[str]
) -> None:
    ext = load(host, tmp_path, server)
    failure = run_once(host, clock, ext, "fetch", server.url("/big"))
    assert "quota_exceeded" in failure
    assert not any(m.startswith("fetched") for m in messages)
    assert direct(ext, "fetch", server.url("/big")) == BIG_BODY


@pytest.mark.parametrize("allowance", [10, 0])
def test_a_request_over_the_runs_network_bytes_is_never_sent(
    host: Host, clock: ManualClock, tmp_path: Path, server: Server, allowance: int
) -> None:
    """10 bytes hold no request line; 0 forbids a run any http traffic."""
    ext = load(host, tmp_path, server, jobs_extra=f"max_network_bytes = {allowance}")
    sent = len(server.paths)
    assert "quota_exceeded" in run_once(host, clock, ext, "fetch", server.url("/small"))
    assert len(server.paths) == sent


# -- the manifest -----------------------------------------------------------------------------

MANIFEST = """[extension]
schema = "wasihost-manifest/1"
id = "org.test.jobs"
version = "0.1.0"
abi = "1.1"
module = "m.wasm"

[capabilities]
required = ["jobs"]

[resources]
max_memory_bytes = 8388608

[commands]
tick = {}

[jobs]
commands = ["tick"]
"""


def jobs_table(extra: str) -> Any:
    manifest = parse_manifest(MANIFEST + extra, default_registry().capabilities())
    assert manifest.jobs is not None
    return manifest.jobs


def test_the_run_budget_defaults_to_the_extensions_memory_and_no_own_network_limit() -> None:
    jobs = jobs_table("")
    assert (jobs.max_memory_bytes, jobs.max_network_bytes) == (8 * MiB, None)
    jobs = jobs_table("max_memory_bytes = 65536\nmax_network_bytes = 0\n")
    assert (jobs.max_memory_bytes, jobs.max_network_bytes) == (65536, 0)


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ("max_memory_bytes = 8388609", "jobs.max_memory_bytes", "1..8388608"),
        ("max_memory_bytes = 0", "jobs.max_memory_bytes", "outside"),
        ('max_memory_bytes = "4M"', "jobs.max_memory_bytes", "integer"),
        ("max_network_bytes = -1", "jobs.max_network_bytes", "outside"),
        (
            f"max_network_bytes = {MAX_HTTP_BYTES_PER_HOUR + 1}",
            "jobs.max_network_bytes",
            "outside",
        ),
        ("max_network_bytes = true", "jobs.max_network_bytes", "integer"),
    ],
)
def test_bad_run_budgets_are_refused(extra: str, key: str, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        jobs_table(extra + "\n")
    assert info.value.key == key and message in str(info.value)
