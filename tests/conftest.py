"""Fixtures shared by every test; the helpers they use live in tests/support/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.common import ALL_CAPS, FakeClock
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

# Trap paths of wasmtime are much slower with Rust backtraces on; tests trap a lot.
os.environ["RUST_BACKTRACE"] = "0"

settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="also run the soak tests (marked soak: the fixtures' rebuild, the chaos run), a "
        "minute and more each; CI runs them (.ci/run), the README's command leaves them out",
    )
    parser.addoption(
        "--runtime",
        choices=("in-process", "process"),
        default="in-process",
        help="where extensions run by default: in this process, or each instance in a walled "
        "child (WASIHOST_RUNTIME=process-only); tests marked in_process stay in-process",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The environment, not a fixture: the CLI and helper scripts a test starts inherit it.
    if config.getoption("--runtime") == "process":
        os.environ["WASIHOST_RUNTIME"] = "process-only"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --soak, the soak tests are deselected (and counted so), not skipped: they are
    not missing anything here, only long."""
    if config.getoption("--soak"):
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("--soak"):
        return None
    return "soak tests deselected: run them with --soak (CI does)"


@pytest.fixture(autouse=True)
def _pinned_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``in_process`` checks the in-process engine's own mechanics (the GIL,
    the epoch ticker, Store callbacks): it runs in-process whatever --runtime says."""
    if request.node.get_closest_marker("in_process") is not None:
        monkeypatch.setenv("WASIHOST_RUNTIME", "in-process")


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h:
        yield h


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compiled-module cache for the whole run, shared by pytest-xdist's workers (their
    base temporary directories have one parent): each fixture is compiled once per engine
    configuration, not once per test module. The cache is built for concurrent users
    (engine/cache.py: entries are written whole and renamed into place)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / "compiled-shared"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@pytest.fixture
def clock() -> FakeClock:
    """The injected clock of budget, supervision and broker tests (support.common.FakeClock)."""
    return FakeClock()
