"""Static admission from the module bytes: every refusal names its offender."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.common import FIXTURES
from tests.support.guests import build, guest_wat, host_import
from wasihost.core.admission import admit, declared_version
from wasihost.core.errors import AdmissionError
from wasihost.core.grants import Grant
from wasihost.core.registry import AbiVersion
from wasihost.core.wasmbin import WasmFormatError, read_header
from wasihost.host.defaults import default_registry
from wasihost.host.planning import plan_package, resolve_runtime
from wasihost.host.policy import Policy
from wasihost.packaging.package import load_package

REGISTRY = default_registry()
MiB = 1024 * 1024


def _admit(wasm: bytes, caps: set[str] | None = None, **kw: object) -> object:
    limits = {"max_memory_bytes": 16 * MiB, "max_table_elements": 10_000} | kw
    return admit(
        read_header(wasm),
        REGISTRY,
        Grant(frozenset(caps or ())),
        **limits,  # type: ignore[arg-type]
    )


def _problems(wasm: bytes, caps: set[str] | None = None, **kw: object) -> str:
    with pytest.raises(AdmissionError) as info:
        _admit(wasm, caps, **kw)
    return "; ".join(info.value.problems)


def test_minimal_guest_is_admitted_with_its_imports_in_order() -> None:
    wasm = build(guest_wat(imports=host_import("log") + host_import("abort")))
    plan = _admit(wasm, {"log"})
    assert plan.version == AbiVersion(1, 0)  # type: ignore[attr-defined]
    assert [e.name for e in plan.imports] == ["log", "abort"]  # type: ignore[attr-defined]


def test_unknown_import_module_is_named() -> None:
    wasm = build(guest_wat(imports='(import "env" "system" (func (param i32) (result i32)))'))
    assert "import env.system: unknown import module 'env'" in _problems(wasm)


def test_unknown_entry_and_wrong_signature_and_ungranted_are_all_reported() -> None:
    imports = (
        '(import "wasihost_v1" "exec" (func (param i32 i32 i32 i32) (result i32)))'
        '(import "wasihost_v1" "log" (func (param i32) (result i32)))' + host_import("random_bytes")
    )
    text = _problems(build(guest_wat(imports=imports)))
    assert "wasihost_v1.exec: not an entry of ABI 1.0" in text
    assert "wasihost_v1.log: signature (i32) -> (i32) differs" in text
    assert "wasihost_v1.random_bytes: needs capability 'random', which is not granted" in text


def test_non_function_imports_are_refused() -> None:
    wasm = build(
        guest_wat(
            imports='(import "wasihost_v1" "mem" (memory 1))',
            memory="",
            extra='(export "memory" (memory 0))',
        )
    )
    text = _problems(wasm)
    assert "imports a memory" in text


def test_missing_marker_and_bad_markers() -> None:
    assert "no 'wasihost_abi' custom section" in _problems(build(guest_wat(marker=None)))
    assert "not MAJOR.MINOR" in _problems(build(guest_wat(marker="one")))
    for trailing in ("1.0\\n", "1.0\\0d", "1.0\\00", " 1.0"):
        assert "not MAJOR.MINOR" in _problems(build(guest_wat(marker=trailing)))
    assert "this host serves 1.1, 2.0" in _problems(build(guest_wat(marker="3.0")))
    assert "module declares ABI 2.5" in _problems(build(guest_wat(marker="2.5")))
    twice = guest_wat().replace(
        '(@custom "wasihost_abi" "1.0")', '(@custom "wasihost_abi" "1.0")' * 2
    )
    assert "2 'wasihost_abi' sections" in _problems(build(twice))


def test_plain_wasi_command_is_admitted_under_the_profile() -> None:
    wat = """(module (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
      (memory (export "memory") 1) (func (export "_start")))"""
    plan = _admit(build(wat))
    assert plan.is_command and plan.view.label == "the wasi profile"  # type: ignore[attr-defined]


def test_wasi_module_without_start_gets_a_hint() -> None:
    wat = """(module (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
      (memory (export "memory") 1) (func (export "main")))"""
    assert "not a plain WASI command" in _problems(build(wat))


def test_huge_declared_memory_and_table_are_refused_before_compile() -> None:
    big_memory = build(guest_wat(memory='(memory (export "memory") 60000)'))
    assert "memory 0 declares a minimum of 60000 pages" in _problems(big_memory)
    big_table = build(guest_wat(extra="(table 10000000 funcref)"))
    assert "table 0 declares a minimum of 10000000 elements" in _problems(big_table)


def test_missing_and_mistyped_exports() -> None:
    wat = guest_wat().replace('(export "wasihost_alloc")', "")
    assert "export 'wasihost_alloc' (func) is missing" in _problems(build(wat))
    wat = guest_wat(alloc='(func (export "wasihost_alloc") (param i64) (result i32) (i32.const 0))')
    assert "export 'wasihost_alloc' has signature (i64) -> (i32)" in _problems(build(wat))


def test_manifest_abi_must_match_marker() -> None:
    with pytest.raises(AdmissionError, match="manifest declares ABI 1.1"):
        _admit(build(guest_wat()), manifest_abi=AbiVersion(1, 1))


def test_declared_version_reads_marker() -> None:
    assert declared_version(read_header(build(guest_wat()))) == AbiVersion(1, 0)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0asm",
        b"not wasm at all",
        b"\0asm\x01\0\0\0\x01\xff\xff\xff\xff\x0f",
        b"\0asm\x0d\0\x01\0",
    ],
)
def test_garbage_is_a_format_error(data: bytes) -> None:
    with pytest.raises(WasmFormatError):
        read_header(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=8, max_value=400))
def test_header_reader_never_raises_anything_else(tail: bytes, cut: int) -> None:
    wasm = build(guest_wat(imports=host_import("log")))
    for data in (b"\0asm\x01\0\0\0" + tail, wasm[:cut] + tail):
        with contextlib.suppress(WasmFormatError):
            read_header(data)


def test_an_out_of_process_package_is_never_planned_in_process(tmp_path: Path) -> None:
    folder = tmp_path / "pkg"
    shutil.copytree(FIXTURES / "echo", folder, ignore=shutil.ignore_patterns("target", "src"))
    manifest = folder / "extension.toml"
    text = manifest.read_text().replace(
        'module = "echo.wasm"', 'module = "echo.wasm"\nruntime = "wasm-process"'
    )
    manifest.write_text(text)
    registry = default_registry()
    package = load_package(folder, registry.capabilities())
    assert package.manifest is not None and package.manifest.runtime == "wasm-process"
    plan_package(package, registry, Policy(allow={"log"}))  # admitted: the runtime exists
    policy = Policy(allow={"log"})
    assert resolve_runtime(package, None, policy) == "process-only"
    assert resolve_runtime(package, "prefer-process", policy) == "process-only"
    with pytest.raises(AdmissionError, match="would weaken its isolation"):
        resolve_runtime(package, "in-process", policy)
    with pytest.raises(AdmissionError, match="would weaken its isolation"):
        resolve_runtime(package, None, Policy(allow={"log"}, runtime="in-process"))
