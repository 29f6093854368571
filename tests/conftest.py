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


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compiled-module cache per test module: its hosts compile each fixture once."""
    return tmp_path_factory.mktemp("compiled")


@pytest.fixture
def clock() -> FakeClock:
    """The injected clock of budget, supervision and broker tests (support.common.FakeClock)."""
    return FakeClock()
