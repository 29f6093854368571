"""The WASI command fixtures: present, made only of WASI profile imports, and reproducible from
their sources (``fixtures/build-wasi --check``, whenever the toolchains are installed)."""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import pytest
from wasi_support import FIXTURES

from wasihost.wasi import FUNCTIONS, MODULE
from wasihost.wasmbin import read_header

WASI_FIXTURES = ["wasi-probe", "wasi-libc", "wasi-std", "wasi-bench"]
ENTRIES = {f.name: f for f in FUNCTIONS}


@pytest.mark.parametrize("name", WASI_FIXTURES)
def test_fixture_is_a_plain_wasi_command(name: str) -> None:
    wasm = FIXTURES / name / f"{name}.wasm"
    header = read_header(wasm.read_bytes())
    assert header.imports, name
    for imp in header.imports:
        assert imp.module == MODULE, f"{name}: {imp.module}.{imp.name}"
        entry = ENTRIES[imp.name]
        assert imp.func_type is not None
        assert (imp.func_type.params, imp.func_type.results) == (entry.params, entry.results)
    assert "_start" in {e.name for e in header.exports}
    assert not header.custom("wasihost_abi")


def _toolchains_present() -> bool:
    rustc = Path("/usr/bin/rustc")
    if not (rustc.exists() and Path("/usr/bin/clang").exists() and shutil.which("bash")):
        return False
    if not Path("/usr/include/wasm32-wasi/stdio.h").exists():
        return False  # wasi-libc
    if not glob.glob("/usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a"):
        return False  # libclang-rt-*-dev-wasm32
    probe = subprocess.run(
        [str(rustc), "--print", "target-libdir", "--target", "wasm32-wasi"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return probe.returncode == 0 and Path(probe.stdout.strip()).is_dir()


@pytest.mark.toolchain
@pytest.mark.skipif(not _toolchains_present(), reason="clang/wasi-libc/rustc wasm32-wasi absent")
def test_committed_wasi_fixtures_match_a_fresh_build() -> None:
    proc = subprocess.run(
        [str(FIXTURES / "build-wasi"), "--check"], capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
