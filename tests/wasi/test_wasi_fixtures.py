"""The WASI command fixtures: present and made only of WASI profile imports. That they are
reproducible from their sources is checked with every fixture by
``tests/test_fixtures.py::test_committed_wasm_matches_a_fresh_build``."""

from __future__ import annotations

import pytest

from tests.support.wasi import FIXTURES
from wasihost.core.wasmbin import read_header
from wasihost.wasi import FUNCTIONS, MODULE

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
