from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from wasihost.package import Package
from wasihost.policy import Policy
from wasihost.runtime import Host

# Trap paths of wasmtime are much slower with Rust backtraces on; tests trap a lot.
os.environ["RUST_BACKTRACE"] = "0"

settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
ALL_CAPS = frozenset({"log", "clock", "random"})


@pytest.fixture
def host() -> Iterator[Host]:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h:
        yield h


def bare(wasm: bytes, name: str = "guest.wasm") -> Package:
    return Package(name, None, wasm, hashlib.sha256(wasm).hexdigest())


def toolchain_present() -> bool:
    """Debian's Rust with the wasm32 standard library (the fixture and SDK toolchain)."""
    if not (Path("/usr/bin/cargo").exists() and shutil.which("bash")):
        return False
    probe = subprocess.run(
        ["/usr/bin/rustc", "--print", "target-libdir", "--target", "wasm32-unknown-unknown"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.returncode == 0 and Path(probe.stdout.strip()).is_dir()
