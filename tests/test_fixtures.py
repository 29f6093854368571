"""Every fixture through the real host: good ones answer, hostile ones fail with their class,
and the host carries on afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import (
    ALL_CAPS,
    FIXTURES,
    ROOT,
    fixture_toolchain_missing,
    rust_toolchain_gap,
    rust_toolchain_missing,
)
from wasihost.core.admission import declared_version
from wasihost.core.errors import AdmissionError, CallError, ConfigError, FailureClass
from wasihost.core.registry import CBOR_PARAMS, CBOR_RESULTS
from wasihost.core.wasmbin import read_header
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Extension, Host
from wasihost.packaging.package import load_package

# The Wasm fixtures; the native plugins (fixtures/*-native, runtime = "native-process") are
# executables, run by tests/host/test_native_runtime.py.
NATIVE_FIXTURE_NAMES = sorted(p.parent.name for p in FIXTURES.glob("*-native/extension.toml"))
FIXTURE_NAMES = sorted(
    p.parent.name
    for p in FIXTURES.glob("*/extension.toml")
    if p.parent.name not in NATIVE_FIXTURE_NAMES
)


@pytest.fixture(scope="module")
def host() -> Any:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as h:
        yield h


def load(host: Host, name: str, **kw: Any) -> Extension:
    """A fresh extension of fixture ``name`` (a host admits an id once: the last one goes)."""
    package = load_package(FIXTURES / name, host.registry.capabilities())
    previous = host.extension(package.name)
    if previous is not None:
        previous.close()
    return host.admit(package, **kw)


def fails(ext: Extension, value: Any = None, command: str = "run") -> CallError:
    with pytest.raises(CallError) as info:
        ext.call(command, value)
    return info.value


def test_every_fixture_folder_is_complete() -> None:
    assert len(FIXTURE_NAMES) >= 14
    for name in FIXTURE_NAMES:
        assert (FIXTURES / name / f"{name}.wasm").is_file(), name
    assert NATIVE_FIXTURE_NAMES == ["hello-native", "hostile-native", "storage-native"]
    for name in NATIVE_FIXTURE_NAMES:
        executable = FIXTURES / name / name
        assert executable.is_file() and executable.read_bytes()[:4] == b"\x7fELF", name
        assert 'runtime = "native-process"' in (FIXTURES / name / "extension.toml").read_text()


# The application functions of the native convention a fixture imports, as the tests'
# applications register them (tests/host/test_native_functions.py); the others are cbor.
NATIVE_APP_FUNCTIONS = {
    ("nativefns", "add"): (("i64", "i64"), ("i64",)),
    ("nativefns", "tally"): (("i64",), ("i64",)),
}


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_imports_conform_to_the_registry(name: str) -> None:
    """Every import of every fixture is an entry of its ABI's registry, same signature; an
    import of an application's own namespace (appfns, nativefns) has the cbor convention's
    signature or the native one its application registers, and a declared namespace version."""
    header = read_header((FIXTURES / name / f"{name}.wasm").read_bytes())
    view = default_registry().view(declared_version(header))
    for imp in header.imports:
        assert imp.func_type is not None
        signature = (imp.func_type.params, imp.func_type.results)
        entry = view.lookup(imp.module, imp.name)
        if entry is None and imp.module == "myapp_v1":
            assert header.custom("wasihost_abi.myapp") == [b"1.0"], name
            expected = NATIVE_APP_FUNCTIONS.get((name, imp.name), (CBOR_PARAMS, CBOR_RESULTS))
            assert signature == expected, f"{name}: {imp.name}"
            continue
        assert entry is not None, f"{name}: {imp.module}.{imp.name}"
        assert signature == (entry.params, entry.results)


def test_hello(host: Host) -> None:
    ext = load(host, "hello", grants=["clock"])
    assert ext.call("greet", {"name": "ada"}) == {"greeting": "hello, ada"}
    assert ext.handshake is not None and ext.handshake.readiness == "ready"
    err = fails(ext, {"name": 7}, "greet")
    assert err.failure is FailureClass.GUEST_ERROR and err.message.startswith("invalid_input")


def test_hello_without_optional_clock_is_degraded_but_works() -> None:
    with Host(Policy(allow={"log"}), cache_dir=None) as strict:
        ext = load(strict, "hello")
        assert ext.call("greet", {"name": "bo"}) == {"greeting": "hello, bo"}
        assert ext.handshake is not None and ext.handshake.readiness == "degraded"
        assert ext.handshake.granted == ("log",)


def test_echo(host: Host) -> None:
    ext = load(host, "echo")
    value = {"a": [1, -2, "three", b"\x04", None, True, 1.5], "b": {}}
    assert ext.call("echo", value) == value
    assert ext.call("noop", value) is None


def test_compute_fuel_scales_with_work(host: Host) -> None:
    ext = load(host, "compute")
    ext.call("run", {"n": 1000})
    small = ext.last_fuel_used
    ext.call("run", {"n": 100_000})
    assert ext.last_fuel_used > small * 20
    err = fails(ext, {"n": 10**9})
    assert err.failure is FailureClass.OUT_OF_FUEL


def test_logger_is_bounded(host: Host) -> None:
    ext = load(host, "logger")
    out = ext.call("run", {"lines": 1000})
    assert out["logged"] + out["dropped"] == 1000
    assert 0 < out["logged"] < 1000
    assert len(ext.logs()) == out["logged"]
    assert sum(len(r.message) + 32 for r in ext.logs()) <= 4096


def test_clock_random(host: Host) -> None:
    ext = load(host, "clock-random")
    out = ext.call("run")
    assert out["realtime"] % 1_000_000 == 0  # coarsened to the default 1 ms
    assert out["monotonic"] > 0
    assert isinstance(out["random"], bytes) and len(out["random"]) == 16


def test_seeded_random_is_reproducible() -> None:
    seed = b"s" * 32
    outs = []
    for _ in range(2):
        with Host(Policy(allow=ALL_CAPS, random_seed=seed), cache_dir=None) as h:
            outs.append(h.load(FIXTURES / "clock-random").call("run")["random"])
    assert outs[0] == outs[1]


def test_panics(host: Host) -> None:
    ext = load(host, "panics")
    err = fails(ext)
    assert err.failure is FailureClass.PANIC
    assert "deliberate panic" in err.message
    assert any("deliberate panic" in r.message for r in ext.logs())


@pytest.mark.parametrize(
    ("kind", "failure"),
    [
        ("unreachable", FailureClass.PANIC),
        ("div_zero", FailureClass.TRAP),
        ("oob_load", FailureClass.TRAP),
    ],
)
def test_traps(host: Host, kind: str, failure: FailureClass) -> None:
    err = fails(load(host, "traps"), {"kind": kind})
    assert err.failure is failure


def test_spin_runs_out_of_fuel_or_deadline(host: Host) -> None:
    assert fails(load(host, "spin")).failure is FailureClass.OUT_OF_FUEL
    ext = load(host, "spin", fuel=10_000_000_000, timeout_ms=50)
    assert fails(ext).failure is FailureClass.DEADLINE


def test_memhog_is_refused_more_memory(host: Host) -> None:
    out = load(host, "memhog").call("run")
    assert out["pages"] * 65536 <= 8 * 1024 * 1024


def test_recurse_overflows_the_stack(host: Host) -> None:
    assert fails(load(host, "recurse")).failure is FailureClass.STACK_OVERFLOW


def test_hostflood_pays_for_host_calls(host: Host) -> None:
    # The fuel runs out after some 16,000 calls; a generous deadline keeps a loaded machine
    # (each call slower) from ending it first.
    ext = load(host, "hostflood", timeout_ms=60_000)
    assert ext.call("run", {"calls": 100}) == {"calls": 100}
    assert fails(ext, {"calls": 1_000_000}).failure is FailureClass.OUT_OF_FUEL


@pytest.mark.parametrize(("mode", "status"), [("request", -3), ("response", -4)])
def test_oversize_payloads_get_status_codes(host: Host, mode: str, status: int) -> None:
    assert load(host, "oversize").call("run", {"mode": mode}) == {"status": status}


def test_oversize_output_is_output_too_large(host: Host) -> None:
    err = fails(load(host, "oversize"), {"mode": "output"})
    assert err.failure is FailureClass.OUTPUT_TOO_LARGE
    assert "is over its limit (max_output_bytes 65536)" in err.message


def test_ungranted_is_refused_before_running(host: Host) -> None:
    with pytest.raises(AdmissionError) as info:
        load(host, "ungranted")
    # Its manifest does not request random: the refusal says so, not "not granted".
    assert (
        "random_bytes: needs capability 'random', which its manifest does not request"
        in str(info.value)
    )
    assert info.value.unrequested == ("random",)


@pytest.mark.parametrize("mode", ["out_of_range", "overflow", "resp_out_of_range"])
def test_badptr_is_a_protocol_violation(host: Host, mode: str) -> None:
    err = fails(load(host, "badptr"), {"mode": mode})
    assert err.failure is FailureClass.PROTOCOL


def test_host_keeps_serving_after_every_hostile_fixture(host: Host) -> None:
    ext = load(host, "echo")
    assert ext.call("echo", "still here") == "still here"


@pytest.mark.soak
@pytest.mark.toolchain
@pytest.mark.skipif(
    fixture_toolchain_missing() is not None, reason=str(fixture_toolchain_missing())
)
def test_committed_wasm_matches_a_fresh_build() -> None:
    """fixtures/build --check rebuilds every fixture (SDK guests, native plugins, WASI
    commands)."""
    proc = subprocess.run(
        [str(FIXTURES / "build"), "--check"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.toolchain
@pytest.mark.skipif(rust_toolchain_missing() is not None, reason=str(rust_toolchain_missing()))
@pytest.mark.parametrize(
    ("crate", "features"),
    [("guest-sdk", ""), ("guest-sdk", "native"), ("guest-sdk/v2", "")],
)
def test_guest_sdk_unit_tests_and_vectors_pass(crate: str, features: str) -> None:
    """The SDK's own tests: its CBOR against abi/vectors, its constants against the registry
    (the v2 crate's against abi/v2/registry.json); and again with the native runtime (the
    `native` feature), whose wrappers answer UNSUPPORTED off a command as the stand-ins do."""
    proc = subprocess.run(
        ["/usr/bin/cargo", "test", "--offline", *(["--features", features] if features else [])],
        cwd=ROOT / crate,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.skipif(not Path("/usr/bin/cargo").exists(), reason="cargo is not installed")
def test_a_machine_with_cargo_but_not_the_sdk_crates_is_told_what_to_install(
    tmp_path: Path,
) -> None:
    """Debian's cargo with an empty crate registry, as on a Rust user's machine without
    librust-ciborium-ll-dev: the Rust tests skip, naming the crate and the apt-get line,
    instead of failing with cargo's resolution error."""
    sdk = tmp_path / "guest-sdk"
    sdk.mkdir()
    for name in ("Cargo.toml", "Cargo.lock", "src"):
        source = ROOT / "guest-sdk" / name
        if source.is_dir():
            shutil.copytree(source, sdk / name)
        else:
            shutil.copy(source, sdk / name)
    (tmp_path / "registry").mkdir()
    (tmp_path / ".cargo").mkdir()
    config = (ROOT / ".cargo" / "config.toml").read_text()
    assert "/usr/share/cargo/registry" in config
    (tmp_path / ".cargo" / "config.toml").write_text(
        config.replace("/usr/share/cargo/registry", str(tmp_path / "registry"))
    )
    gap = rust_toolchain_gap(tmp_path)
    assert gap is not None
    if "standard library" in gap or "not installed" in gap:
        pytest.skip(f"this machine lacks more than the crates: {gap}")
    assert "ciborium" in gap, gap
    assert "do not resolve offline" in gap
    assert gap.endswith(
        "apt-get install -y rustc cargo libstd-rust-dev-wasm32 lld librust-ciborium-ll-dev"
    )


@pytest.mark.toolchain
@pytest.mark.skipif(rust_toolchain_missing() is not None, reason=str(rust_toolchain_missing()))
def test_the_sdk_readme_release_profile_keeps_the_names_traps_show(tmp_path: Path) -> None:
    """guest-sdk/README.md's Cargo.toml template, on a real guest: the built module keeps its
    `name` section, so a trap's backtrace names functions (issue 35 item 5: the template said
    strip = true, which removes it)."""
    import re

    from wasihost.core.wasmbin import read_header

    readme = (ROOT / "guest-sdk" / "README.md").read_text()
    profile = re.search(r"\[profile\.release\]\n(?:[a-z-]+ = .*\n)+", readme)
    assert profile is not None
    shutil.copytree(ROOT / "guest-sdk", tmp_path / "sdk", ignore=shutil.ignore_patterns("target"))
    shutil.copytree(FIXTURES / "hello", tmp_path / "hello", ignore=shutil.ignore_patterns("*.wasm"))
    shutil.copytree(ROOT / ".cargo", tmp_path / ".cargo")
    shutil.copy(FIXTURES / "Cargo.lock", tmp_path / "hello" / "Cargo.lock")
    manifest = tmp_path / "hello" / "Cargo.toml"
    text = manifest.read_text().replace('path = "../../guest-sdk"', 'path = "../sdk"')
    manifest.write_text(text + "\n" + profile.group(0))
    proc = subprocess.run(
        ["/usr/bin/cargo", "build", "--release", "--offline", "--target", "wasm32-unknown-unknown"],
        cwd=tmp_path / "hello",
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = tmp_path / "hello" / "target" / "wasm32-unknown-unknown" / "release" / "hello.wasm"
    assert read_header(built.read_bytes()).custom("name"), "the template strips the names"


def test_strict_policy_caps_resources_to_its_ceilings() -> None:
    with Host(Policy.strict(allow={"log"}), cache_dir=None) as strict:
        ext = load(strict, "logger")
        r = ext.resources
        assert (r.max_memory_bytes, r.max_output_bytes, r.max_log_bytes) == (
            10 * 1024 * 1024,
            20 * 1024,
            1024,
        )
        out = ext.call("run", {"lines": 100})
        assert out["dropped"] > 0  # 1 KiB of log holds far fewer than 100 lines
        assert any("policy ceilings" in detail for _, detail in ext.steps)
        # a caller cannot ask past a ceiling either
        assert load(strict, "compute", fuel=50_000_000).resources.fuel_per_call == 11_000_000


def test_malformed_ceilings_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown resource ceilings: fuel"):
        Policy(ceilings={"fuel": 5})
    with pytest.raises(ConfigError, match="max_log_bytes=-1 outside"):
        Policy(ceilings={"max_log_bytes": -1})
