"""Helpers shared by the tests: repository paths, bare modules, child runs, a fake clock."""

from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wasihost.core.registry import AbiVersion, HostFunction
from wasihost.packaging.package import Package

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
ALL_CAPS = frozenset({"log", "clock", "random"})


def run_child(source: str, *args: str) -> tuple[Any, str]:
    """Run ``source`` in a fresh interpreter from the repository root, so that a crash fails
    the test rather than killing pytest. It must exit 0; returns the JSON of its last line of
    output, and its stderr."""
    run = subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RUST_BACKTRACE": "0"},
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``fn`` on a new thread; the list receives what it raises, for the test to see."""
    outcome: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # the test inspects it
            outcome.append(exc)

    worker = threading.Thread(target=target)
    worker.start()
    return worker, outcome


class FakeClock:
    """Monotonic seconds that move only when a test sets ``now``: injected wherever a host
    part takes a clock, so no test sleeps to see time pass.

    :meth:`sleep` is the governor's wait for room (``Governor(sleep=clock.sleep)``): it moves
    the clock on by the wait at once, unless ``hold`` is set; then it returns only once the
    test has moved ``now`` past the wait's end or something woke it (``sleeping`` is set
    meanwhile, so that a test can act while a call waits)."""

    # A held sleep that nothing ends within this (real) time is a broken test, not a wait.
    HOLD_LIMIT_S = 10.0

    def __init__(self) -> None:
        self.now = 1000.0
        self.hold = False
        self.sleeps: list[float] = []
        self.sleeping = threading.Event()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        self.sleeps.append(seconds)
        if not self.hold:
            if not wake.is_set():
                self.now += seconds
            return
        end = self.now + seconds
        self.sleeping.set()
        try:
            for _ in range(int(self.HOLD_LIMIT_S / 0.002)):
                if self.now >= end or wake.wait(0.002):
                    return
            raise AssertionError("a held sleep was never ended")
        finally:
            self.sleeping.clear()


_BARE_IDS = itertools.count(1)


def bare(wasm: bytes, name: str | None = None) -> Package:
    """A bare module; each gets its own id (a host admits an id once) unless one is named."""
    name = name or f"guest-{next(_BARE_IDS)}.wasm"
    return Package(name, None, wasm, hashlib.sha256(wasm).hexdigest())


def native_entry(
    module: str,
    name: str,
    params: tuple[str, ...],
    results: tuple[str, ...],
    capability: str,
    *,
    denied: int | None = None,
    fuel_base: int = 100,
    fuel_per_byte: int = 1,
) -> HostFunction:
    """A native-convention entry of a test profile (the engine's path for WASI, without WASI)."""
    return HostFunction(
        module=module,
        name=name,
        capability=capability,
        since=AbiVersion(1, 0),
        params=params,
        results=results,
        max_request_bytes=0,
        max_response_bytes=0,
        fuel_base=fuel_base,
        fuel_per_byte=fuel_per_byte,
        blocking=False,
        convention="native",
        denied_result=denied,
    )


# What Debian packages a Rust guest build needs here: the compiler with the wasm32 standard
# libraries, the linker, and the crates the guest SDK depends on (crates.io is not used).
RUST_APT_LINE = "apt-get install -y rustc cargo libstd-rust-dev-wasm32 lld librust-ciborium-ll-dev"
FIXTURE_APT_LINE = "apt-get install -y clang wasi-libc libclang-rt-14-dev-wasm32"
# The Rust workspaces the tests build: the SDK (both ABI crates) and the fixtures.
RUST_CRATES = ("guest-sdk", "guest-sdk/v2", "fixtures")


def rust_toolchain_gap(root: Path = ROOT) -> str | None:
    """Why the Rust guest builds cannot run on this machine, with the line that installs what
    is missing; None when they can. A machine with ``cargo`` but without the packaged crates
    the SDK needs (librust-ciborium-ll-dev) is the common case: ``cargo metadata --offline``
    must resolve every workspace the tests build, not only find the compiler. Each resolves
    from its own directory under ``root``, so that the repository's .cargo/config.toml (the
    Debian registry) applies."""
    if not (Path("/usr/bin/cargo").exists() and shutil.which("bash")):
        return f"Debian's Rust is not installed: {RUST_APT_LINE}"
    for target in ("wasm32-unknown-unknown", "wasm32-wasi"):
        probe = subprocess.run(
            ["/usr/bin/rustc", "--print", "target-libdir", "--target", target],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode != 0 or not Path(probe.stdout.strip()).is_dir():
            return f"Rust's {target} standard library is not installed: {RUST_APT_LINE}"
    for crate in RUST_CRATES:
        resolve = subprocess.run(
            ["/usr/bin/cargo", "metadata", "--offline", "--format-version", "1"],
            cwd=root / crate,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if resolve.returncode != 0:
            first = next((line for line in resolve.stderr.splitlines() if line.strip()), "")
            return (
                f"the Rust crates {crate}/ depends on do not resolve offline ({first.strip()}): "
                f"{RUST_APT_LINE}"
            )
    return None


@functools.cache
def rust_toolchain_missing() -> str | None:
    """:func:`rust_toolchain_gap` for this machine, asked once per test run."""
    return rust_toolchain_gap()


def fixture_toolchain_missing() -> str | None:
    """Everything fixtures/build needs: Rust as above, and clang with wasi-libc."""
    rust = rust_toolchain_missing()
    if rust is not None:
        return rust
    if not (
        Path("/usr/bin/clang").exists()
        and Path("/usr/include/wasm32-wasi/stdio.h").exists()  # wasi-libc
        and glob.glob("/usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a")
    ):
        return f"clang for wasm32 with wasi-libc is not installed: {FIXTURE_APT_LINE}"
    return None


# fixtures/appfns' two embedder functions as the pool and density tests declare them (each
# test brings its own handlers).
APPFNS_LOOKUP: dict[str, Any] = {
    "capability": "myapp.read",
    "max_request_bytes": 64,
    "max_response_bytes": 1024,
    "fuel_base": 1000,
    "fuel_per_byte": 1,
}
APPFNS_REMEMBER: dict[str, Any] = {
    "capability": "myapp.write",
    "max_request_bytes": 64,
    "max_response_bytes": 16,
    "fuel_base": 1000,
    "fuel_per_byte": 1,
}


def proc_status_field(pid: int, name: str) -> str:
    """A field of ``/proc/PID/status`` (``NoNewPrivs``, ``Seccomp``, ``State``...); "" if absent.
    FileNotFoundError once the process is reaped."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return ""
