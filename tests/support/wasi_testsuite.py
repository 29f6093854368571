"""The official WASI preview1 test suite (WebAssembly/wasi-testsuite, prebuilt, in
``<repo>/../shared/wasi-testsuite``): finding its tests, reading their specs, preparing a fresh
copy of a test's root, and running a test through wasihost's profile on one shared Host.

Used by tests/wasi/test_wasi_conformance.py and benchmarks/bench_wasi_suite.py. The suite's folder is
read-only to us (CI mounts a copy of ``shared/`` beside the clone): every run works on a copy of
its root under a temporary directory.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from wasihost.core.serving import ProfileBinding
from wasihost.host.extension import Extension
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.packaging.package import Package
from wasihost.wasi import WasiBinding, WasiOptions
from wasihost.wasi.config import Mount
from wasihost.wasi.registry import CAPABILITIES, PROFILE

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT.parent / "shared" / "wasi-testsuite" / "tests"
# Each language's prebuilt tests live here, under SUITE (the suite's layout).
TEST_DIRS = ("assemblyscript", "c", "rust")
TEST_SUBDIR = Path("testsuite") / "wasm32-wasip1"
# The guest path a test's root is preopened at, as the upstream runner does.
ROOT_GUEST_PATH = "/"
# Generous: the costliest test (rust/fd_readdir) burns about a million units; the budget only
# has to stop a runaway test, not to measure one.
FUEL = 10_000_000_000
TIMEOUT_MS = 30_000
# Without its directory, path_open_preopen scans every fd from 3 to 2**31 for the preopen it
# looks for: a deadline, not a failure, ends it. Half a second is enough to see it fail.
DENY_TIMEOUT_MS = 500


@attrs.frozen
class SuiteTest:
    """One test of the suite: its module and what its ``NAME.json`` asks for."""

    name: str  # "rust/fd_readdir"
    wasm: Path
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    root: Path | None
    exit_code: int
    stdout: str | None

    @property
    def needs_directory(self) -> bool:
        return self.root is not None


def _spec(wasm: Path) -> Mapping[str, Any]:
    path = wasm.with_suffix(".json")
    if not path.exists():
        return {}
    spec = json.loads(path.read_text("utf-8"))
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: not a JSON object")
    return spec


def discover(suite: Path = SUITE) -> list[SuiteTest]:
    """Every test of the suite, sorted by name; empty if the suite is absent."""
    tests = []
    for language in TEST_DIRS:
        folder = suite / language / TEST_SUBDIR
        for wasm in sorted(folder.glob("*.wasm")):
            spec = _spec(wasm)
            root = spec.get("root")
            tests.append(
                SuiteTest(
                    name=f"{language}/{wasm.stem}",
                    wasm=wasm,
                    args=tuple(spec.get("args", ())),
                    env=tuple(dict(spec.get("env", {})).items()),
                    root=(folder / root) if root is not None else None,
                    exit_code=int(spec.get("exit_code", 0)),
                    stdout=spec.get("stdout"),
                )
            )
    return tests


def copy_root(test: SuiteTest, dest: Path) -> Path:
    """A fresh, writable copy of the test's root at ``dest`` (the suite's files are read-only:
    a test that writes into its root needs its own copy, as upstream's runner makes)."""
    assert test.root is not None
    shutil.copytree(test.root, dest, symlinks=True)
    for directory, _, files in os.walk(dest):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)
    return dest


def snapshot(tree: Path) -> dict[str, tuple[Any, ...]]:
    """Everything a guest could have changed under ``tree``: each entry's type, mode, size,
    mtime, and its content (a file's digest, a link's target). ``tree`` itself included."""
    state: dict[str, tuple[Any, ...]] = {}
    for directory, dirs, files in os.walk(tree):
        for name in [".", *dirs, *files]:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                content: Any = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                content = None
            rel = os.path.normpath(os.path.relpath(path, tree))
            state[rel] = (stat.S_IFMT(st.st_mode), st.st_mode & 0o7777, st.st_size,
                          st.st_mtime_ns, content)  # fmt: skip
    return state


@attrs.define
class Outcome:
    code: int | None  # None: the run failed before an exit code (a trap, an error)
    stdout: bytes
    stderr: bytes
    error: str | None = None

    def passes(self, test: SuiteTest) -> bool:
        """The upstream runner's verdict: exit code, and stdout when the test gives one."""
        if self.code != test.exit_code:
            return False
        return test.stdout is None or self.stdout.decode("utf-8", "replace") == test.stdout

    def describe(self, test: SuiteTest) -> str:
        return (
            f"{test.name}: exit {self.code} (expected {test.exit_code})"
            + (f", error {self.error}" if self.error else "")
            + f"\nstdout: {self.stdout[-2000:]!r}\nstderr: {self.stderr[-2000:]!r}"
        )


# Everything the upstream runner grants: stdio, args, env, clocks, random, the directory.
ALL_GRANTS = frozenset(CAPABILITIES) - {"wasi.sockets"}
# Deny mode: the same, without the directory.
NO_DIRECTORY = ALL_GRANTS - {"wasi.fs.read", "wasi.fs.write"}


class SuiteRunner:
    """One Host for the whole suite: one engine and one compiled-module cache. Each test is
    admitted once per set of grants, and each run gives its extension that run's WASI options
    (looked up by extension id when the run's instance is made)."""

    def __init__(self, cache_dir: Path | None) -> None:
        self._configs: dict[str, WasiOptions] = {}
        self.host = Host(
            Policy(allow=ALL_GRANTS), cache_dir=cache_dir, profiles=[(PROFILE, self._binding)]
        )
        self._extensions: dict[tuple[str, frozenset[str], int], Extension] = {}
        self._ids = itertools.count(1)

    def _binding(self, ext: Extension) -> ProfileBinding:
        return WasiBinding.for_extension(self._configs[ext.id], ext)

    def admit(
        self, test: SuiteTest, grants: frozenset[str] = ALL_GRANTS, timeout_ms: int = TIMEOUT_MS
    ) -> Extension:
        """The test's extension under ``grants`` and ``timeout_ms``: admitted (compiled, or
        loaded from the cache) on first use."""
        key = (test.name, grants, timeout_ms)
        ext = self._extensions.get(key)
        if ext is None:
            wasm = test.wasm.read_bytes()
            # One extension id per key: an id names one admitted extension.
            source = f"{test.name.replace('/', '-')}-{next(self._ids)}"
            package = Package(source, None, wasm, hashlib.sha256(wasm).hexdigest())
            ext = self.host.admit(package, grants=grants, fuel=FUEL, timeout_ms=timeout_ms)
            self._extensions[key] = ext
        return ext

    def run(
        self,
        test: SuiteTest,
        root: Path | None,
        grants: frozenset[str] = ALL_GRANTS,
        timeout_ms: int = TIMEOUT_MS,
    ) -> Outcome:
        """Run ``test`` with ``root`` (a fresh copy) preopened as ``/``."""
        out = bytearray()
        err = bytearray()
        config = WasiOptions(
            argv=[test.wasm.name, *test.args],
            env=list(test.env),
            stdout=out.extend,
            stderr=err.extend,
            clock="standard",
            random=True,
            mounts=[Mount(root, ROOT_GUEST_PATH, writable=True)] if root is not None else [],
        )
        code: int | None = None
        error = None
        try:
            ext = self.admit(test, grants, timeout_ms)
            self._configs[ext.id] = config
            code = ext.run_command()
        except Exception as exc:  # the verdict is the exit code; keep the reason for the report
            error = f"{type(exc).__name__}: {exc}"
        return Outcome(code, bytes(out), bytes(err), error)

    def close(self) -> None:
        self.host.close()
