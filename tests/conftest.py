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
