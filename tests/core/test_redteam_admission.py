"""Red-team review of admission and the versioned registry, as a hostile module sees them (the
Compile phase: unknown or ungranted imports refuse the module before any guest code runs).
Hostile markers, imports, exports and header shapes go through the real host. Each test of a
break failed on the code before the fix it names (see the branch's history); the others pin
attacks that held and that no other test covered."""

from __future__ import annotations

import time

import pytest
import wasmtime

from tests.support.common import bare
from tests.support.guests import build, guest_wat, host_import
from wasihost.core.errors import AdmissionError
from wasihost.core.wasmbin import WasmFormatError, read_header
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

HOST_POLICY = Policy(allow=frozenset({"log", "random"}))
# CPU seconds a refusal may take: the scans below cost milliseconds once bounded; the holes
# took seconds (a loaded machine slows wall time, not the process time measured here).
REFUSAL_CPU_S = 1.0


def _leb(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _section(section_id: int, body: bytes) -> bytes:
    return bytes([section_id]) + _leb(len(body)) + body


def _name(text: bytes) -> bytes:
    return _leb(len(text)) + text


MODULE_HEAD = b"\x00asm\x01\x00\x00\x00" + _section(0, _name(b"wasihost_abi") + b"1.0")
ONE_TYPE = _section(1, b"\x01\x60\x00\x00")  # one type: () -> ()


def _func_type(params: int, results: int = 0) -> bytes:
    return b"\x60" + _leb(params) + b"\x7f" * params + _leb(results) + b"\x7f" * results


def _refused(wasm: bytes) -> tuple[AdmissionError, float]:
    """Admit ``wasm`` on a fresh host; the refusal and the CPU seconds it took."""
    with Host(HOST_POLICY, cache_dir=None) as host:
        started = time.process_time()
        with pytest.raises(AdmissionError) as refused:
            host.admit(bare(wasm), grants=["log"])
        return refused.value, time.process_time() - started


# --- header shapes -------------------------------------------------------------------------

WASMTIME_REFUSES = {
    # Each was vouched for by the scanner, then refused by wasmtime (wasmparser's limits).
    "a type of 1,001 params": _section(1, b"\x01" + _func_type(1001)),
    "a type of 1,001 results": _section(1, b"\x01" + _func_type(0, 1001)),
    "an import name of 100,001 bytes": ONE_TYPE
    + _section(2, b"\x01" + _name(b"wasihost_v1") + _name(b"a" * 100_001) + b"\x00\x00"),
    "a custom section name of 100,001 bytes": _section(0, _name(b"a" * 100_001)),
}


@pytest.mark.parametrize("case", sorted(WASMTIME_REFUSES))
def test_the_scanner_refuses_the_types_and_names_wasmtime_refuses(case: str) -> None:
    """Break (red-team 2026-12-01): the scanner read function types of any arity and names of
    any length (up to the module's 64 MiB) that wasmtime refuses (over 1,000 params or
    results, names over 100,000 bytes), so it vouched for headers the engine would not parse
    and did unbounded work on them first. Fix: wasmparser's limits in the scanner."""
    wasm = MODULE_HEAD + WASMTIME_REFUSES[case]
    with pytest.raises(wasmtime.WasmtimeError):
        wasmtime.Module.validate(wasmtime.Engine(), wasm)
    with pytest.raises(WasmFormatError):
        read_header(wasm)
    refusal, _ = _refused(wasm)
    assert refusal.problems[0].startswith("not a valid module: ")


def test_a_type_section_of_millions_of_value_types_is_refused_in_milliseconds() -> None:
    """Break (red-team 2026-12-01): every value type of the type section became a tuple
    element, read a byte at a time: 640 types of 100,000 params (61 MiB) took 7 s of CPU and
    600 MiB before wasmtime saw the module; capping a type at wasmparser's 1,000 params alone
    still leaves 64,000 types of 1,000. Fix: a bound on the value types of the whole section
    (MAX_TYPE_VALUES), far above any real module's (the WASI testsuite's largest has 132)."""
    types = _leb(32_000) + _func_type(1000) * 32_000  # 32 MiB, each type within wasmparser's
    wasm = MODULE_HEAD + _section(1, types)
    refusal, cpu = _refused(wasm)
    assert cpu < REFUSAL_CPU_S  # was 3.6 s
    assert "value types" in refusal.problems[0], refusal.problems


# --- the refusal itself ---------------------------------------------------------------------


def _unknown_imports(count: int, name_bytes: int) -> bytes:
    entries = b"".join(
        _name(b"m" * name_bytes) + _name(str(i).encode().rjust(name_bytes, b"x")) + b"\x00\x00"
        for i in range(count)
    )
    return MODULE_HEAD + ONE_TYPE + _section(2, _leb(count) + entries)


def test_a_refusal_of_many_bad_imports_is_bounded_and_says_how_many() -> None:
    """Break (red-team 2026-12-01): admission listed every offending import, each with its
    module and name in full, twice: 100,000 unknown imports with 300-byte names (58 MiB) made
    an AdmissionError of 100,004 problems and a 99-million-character message, carried into
    logs and reports. Fix: a refusal lists its first MAX_REPORTED_PROBLEMS problems and how
    many more, and quotes a module's names at most MAX_QUOTED_NAME characters long."""
    refusal, _ = _refused(_unknown_imports(5_000, 300))
    assert len(refusal.problems) <= 33
    assert refusal.problems[-1].endswith("more problems not listed")
    assert any(
        p.startswith("import mmmm") and "unknown import module" in p for p in refusal.problems
    )
    assert len(str(refusal)) < 16_384  # was 4.9 million characters


def test_a_long_import_name_is_quoted_short() -> None:
    """Break (red-team 2026-12-01), with the one above: a single import named with 100,000
    bytes (as long as wasmtime allows) was quoted whole, twice, in its refusal."""
    refusal, _ = _refused(_unknown_imports(1, 100_000))
    (problem,) = [p for p in refusal.problems if p.startswith("import ")]
    assert len(problem) < 1_000, len(problem)  # was 200,000 characters
    assert "(100000 bytes)" in problem


def test_unknown_imports_cost_no_more_with_many_embedder_functions() -> None:
    """Break (red-team 2026-12-01): each unknown import was looked up by scanning every entry
    of every embedder namespace (and the view's modules were rebuilt for each): imports x
    entries of work, so 50,000 one-byte-named imports (a 300 KB module) against a host of
    4,000 embedder functions took 4 s of CPU, under the GIL, before any compile. Fix: the
    namespace modules' entries are indexed once per admission."""
    module = _unknown_imports(50_000, 1)
    with Host(HOST_POLICY, cache_dir=None) as host:
        for i in range(4_000):
            host.add_function(
                f"app{i % 40}.f{i}",
                lambda ctx, request: request,
                capability=f"app{i % 40}",
                max_request_bytes=16,
                max_response_bytes=16,
                fuel_base=500,
                fuel_per_byte=2,
            )
        started = time.process_time()
        with pytest.raises(AdmissionError) as refused:
            host.admit(bare(module))
        cpu = time.process_time() - started
    assert refused.value.problems[-1] == "... and 49973 more problems not listed"
    assert cpu < REFUSAL_CPU_S, cpu  # was 4 s


NATIVE = {"convention": "native", "fuel_base": 100, "capability": "myapp", "since": "1.0"}


def test_a_required_export_must_be_the_guests_own_function() -> None:
    """Gap (red-team 2026-12-01): section 4 of the ABI asks the guest for its own
    ``wasihost_alloc`` and ``wasihost_call``, but admission checked only their types, so a
    module could re-export an import of matching type in their place: the host then called
    an embedder's function (or WASI's ``fd_close``) itself, outside any guest frame, with the
    handshake's pointers as arguments, as if it were the guest's command handler. Fix: a
    required export that is an imported function refuses the module, naming both."""
    calls: list[tuple[int, ...]] = []
    section = '(@custom "wasihost_abi.myapp" "1.0")'
    with Host(Policy(allow=frozenset({"myapp"})), cache_dir=None) as host:
        host.add_function(
            "myapp.alloc",
            lambda ctx, n: calls.append((n,)) or 0,
            params=("i32",),
            results=("i32",),
            **NATIVE,
        )
        host.add_function(
            "myapp.run",
            lambda ctx, p, c, i: calls.append((p, c, i)) or 0,
            params=("i32", "i32", "i32"),
            results=("i64",),
            **NATIVE,
        )
        alloc = guest_wat(
            imports='(import "myapp_v1" "alloc" (func $a (param i32) (result i32)))' + section,
            alloc='(export "wasihost_alloc" (func $a))',
        )
        run = guest_wat(
            imports='(import "myapp_v1" "run" (func $r (param i32 i32 i32) (result i64)))' + section
        ).replace('(func (export "wasihost_call")', '(export "wasihost_call" (func $r)) (func')
        for wat, export, imported in (
            (alloc, "wasihost_alloc", "myapp_v1.alloc"),
            (run, "wasihost_call", "myapp_v1.run"),
        ):
            with pytest.raises(AdmissionError) as refused:
                host.admit(bare(build(wat), export), grants=["myapp"]).start()
            assert refused.value.problems == (
                f"export {export!r} is the imported function {imported}; the ABI needs the "
                "guest's own",
            )
    assert calls == []  # the host never called its own function as the guest's


def test_a_plain_command_requiring_a_feature_flag_is_refused() -> None:
    """Break (red-team 2026-12-01): a module's ``wasihost_features`` section (flags it cannot
    run without, ABI section 1) was read only for modules with an ABI marker: a plain WASI
    command requiring ``bytes-commands`` was admitted and run under the WASI profile, whose
    view offers no flag. Fix: a command's required flags are checked against its view too."""
    wat = """(module (@custom "wasihost_features" "bytes-commands")
      (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
      (memory (export "memory") 1) (func (export "_start")))"""
    refusal, _ = _refused(build(wat))
    assert refusal.problems == (
        "module requires feature 'bytes-commands', which the wasi profile of this host does "
        "not offer (it offers: none)",
    )


def test_a_module_of_thousands_of_imports_is_refused_not_linked_at_every_start() -> None:
    """Break (red-team 2026-12-01): admission took any number of imports (up to the 100,000
    wasmtime allows), each a granted entry imported again and again (duplicates are legal, and
    AssemblyScript emits some). Each import costs the host ~30 us of Python at every
    instantiation (its dispatch closure and C callback), which no fuel pays: 20,000 imports of
    ``log`` (a 530 KB module) made every new instance cost 0.6 s of host CPU for 403 fuel, and
    a guest that traps gets a new instance at its next call. Fix: at most MAX_IMPORTS
    imports, far above any real module's (the WASI testsuite's largest has 46)."""
    imports = "".join(host_import("log", f"log{i}") for i in range(5_000))
    refusal, cpu = _refused(build(guest_wat(imports=imports)))
    assert refusal.problems == ("module has 5000 imports; at most 1000",)
    assert cpu < REFUSAL_CPU_S


# --- attacks that held ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "marker", ["+1.1", "1.+1", "-1.1", "1.1\\ff", "\\ef\\bc\\91.1", "1_0.1", "0x1.1", "1.1 ", "1,1"]
)
def test_a_marker_is_ascii_major_minor_and_nothing_else(marker: str) -> None:
    """Held: a sign, a byte that is not ASCII, a fullwidth digit (U+FF11), an underscore, a
    hex prefix, a trailing space or a comma is refused as malformed before anything else
    (``int()`` alone would read several of them as numbers)."""
    refusal, _ = _refused(build(guest_wat(marker=marker)))
    assert len(refusal.problems) == 1 and "is not MAJOR.MINOR" in refusal.problems[0]


@pytest.mark.parametrize(
    "section", ["Wasihost_abi", "wasihost_abi\\00", "wasihost_abi ", "wasihost_abi.", "wasihost"]
)
def test_a_marker_in_a_lookalike_section_is_no_marker(section: str) -> None:
    """Held: only a custom section named exactly ``wasihost_abi`` declares the ABI; a name
    that differs in case, by a NUL or a space is another section and the module has no
    marker."""
    wat = guest_wat(marker=None).replace("(module", f'(module (@custom "{section}" "1.0")', 1)
    refusal, _ = _refused(build(wat))
    assert refusal.problems == ("module has no 'wasihost_abi' custom section",)


def test_markers_count_wherever_they_are_placed() -> None:
    """Held: a marker after the code and data sections declares the version as one before
    them does, and a marker before and another after them are two markers, refused."""
    after = guest_wat(marker=None).replace(
        "(module", '(module (@custom "wasihost_abi" (after last) "1.0")', 1
    )
    with Host(HOST_POLICY, cache_dir=None) as host:
        host.admit(bare(build(after)), grants=[]).call("noop")
    both = guest_wat().replace("(module", '(module (@custom "wasihost_abi" (after last) "1.0")', 1)
    refusal, _ = _refused(build(both))
    assert refusal.problems == ("module has 2 'wasihost_abi' sections; need one",)


@pytest.mark.parametrize(
    "module",
    [
        "wasihost_v1 ",
        "wasihost_V1",
        "wasihost_v01",
        "wasihost_v1\\00",
        "wasi_snapshot_preview1\\00",
        "\uff57asihost_v1",  # a fullwidth w
    ],
)
def test_an_import_module_that_looks_like_the_hosts_is_unknown(module: str) -> None:
    """Held: import modules are compared byte for byte; a lookalike of ``wasihost_v1`` or
    WASI's module refuses the module, naming it, even for an entry the host has and grants."""
    imports = host_import("log").replace('"wasihost_v1"', f'"{module}"')
    refusal, _ = _refused(build(guest_wat(imports=imports)))
    assert len(refusal.problems) == 1
    assert "unknown import module" in refusal.problems[0]
