"""The official WASI preview1 suite (wasi-testsuite, 72 prebuilt tests: Rust, C,
AssemblyScript) through wasihost's WASI profile, as upstream's runner runs it: a fresh copy of
the test's root preopened as ``/``, its args and env, clocks and random granted; the exit code
and stdout must be the expected ones. Every test passes; none is refused by design.

Deny mode runs the same suite with the directory configured but not granted (with everything
else granted, and with nothing granted), on a canary copy: no host file may be created, changed
or removed, and no test that needs the directory passes.

The suite lives beside the repository (``<repo>/../shared/wasi-testsuite``); without it these
tests are skipped. One Host (one engine, one module cache kept in pytest's cache directory)
serves every case, so only the first run on a machine compiles the 72 modules.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.wasi_testsuite import (
    DENY_TIMEOUT_MS,
    NO_DIRECTORY,
    SUITE,
    SuiteRunner,
    SuiteTest,
    copy_root,
    discover,
    snapshot,
)

TESTS = discover()
# Tests the profile refuses by design, with the reason: none.
REFUSED_BY_DESIGN: dict[str, str] = {}
ABSENT = f"the WASI test suite is not at {SUITE} (a copy of shared/ beside the repository)"
# The suite as published holds 72 tests; a different count means a different suite.
SUITE_SIZE = 72


def _params() -> list[object]:
    if not TESTS:
        return [pytest.param(None, id="wasi-testsuite", marks=pytest.mark.skip(reason=ABSENT))]
    return [
        pytest.param(
            t,
            id=t.name,
            marks=[pytest.mark.skip(reason=REFUSED_BY_DESIGN[t.name])]
            if t.name in REFUSED_BY_DESIGN
            else [],
        )
        for t in TESTS
    ]


class Timings:
    """The conformance run's times, reported in pytest's terminal summary (registered as a
    plugin: output written at fixture teardown would be captured and lost)."""

    def __init__(self) -> None:
        self.runs: dict[str, float] = {}

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.runs:
            slowest = max(self.runs, key=self.runs.__getitem__)
            terminalreporter.write_line(
                f"wasi-testsuite: {len(self.runs)} tests in {sum(self.runs.values()):.2f} s "
                f"(slowest {slowest}: {self.runs[slowest]:.2f} s)"
            )


@pytest.fixture(scope="module")
def runner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SuiteRunner]:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    # A folder the module cache creates itself (0700): it refuses one others could write.
    cache_dir = (
        cache.mkdir("wasihost-wasi-testsuite") / "modules"
        if cache is not None
        else tmp_path_factory.mktemp("wasi-testsuite") / "modules"
    )
    suite = SuiteRunner(cache_dir)
    yield suite
    suite.close()


@pytest.fixture(scope="module")
def timings(request: pytest.FixtureRequest) -> Timings:
    t = Timings()
    request.config.pluginmanager.register(t, "wasihost-wasi-testsuite-timings")
    return t


def test_the_whole_suite_is_there() -> None:
    if not TESTS:
        pytest.skip(ABSENT)
    assert len(TESTS) == SUITE_SIZE
    assert {t.name.split("/")[0] for t in TESTS} == {"assemblyscript", "c", "rust"}


@pytest.mark.parametrize("test", _params())
def test_conformance(
    test: SuiteTest, runner: SuiteRunner, timings: Timings, tmp_path: Path
) -> None:
    start = time.perf_counter()
    root = copy_root(test, tmp_path / "root") if test.needs_directory else None
    outcome = runner.run(test, root)
    timings.runs[test.name] = time.perf_counter() - start
    assert outcome.passes(test), outcome.describe(test)


@pytest.mark.parametrize("grants", [NO_DIRECTORY, frozenset()], ids=["no-dir", "nothing"])
@pytest.mark.parametrize("test", _params())
def test_with_no_directory_granted_no_host_file_is_touched(
    test: SuiteTest, grants: frozenset[str], runner: SuiteRunner, tmp_path: Path
) -> None:
    """The directory is in the configuration but not granted (everything else is, or nothing
    is): the test runs against a canary copy of its root, which must come out identical (every
    entry's type, mode, size, mtime and content; the folder around it too), and a test that
    needs the directory must fail."""
    canary = tmp_path / "canary"
    if test.needs_directory:
        copy_root(test, canary)
    else:
        canary.mkdir()
        (canary / "canary.txt").write_text("must stay as it is\n")
    before = snapshot(tmp_path)
    outcome = runner.run(test, canary, grants=grants, timeout_ms=DENY_TIMEOUT_MS)
    assert snapshot(tmp_path) == before
    if test.needs_directory:
        assert not outcome.passes(test), f"{test.name} passed without its directory"
