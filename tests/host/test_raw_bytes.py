"""ABI 1.1 raw byte commands (``input``/``output = "bytes"``) through the real engine, and
payload limits that a value filling them fits (fixtures/rawecho, fixtures/echo)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.common import FIXTURES
from tests.support.strategies import KNOWN_CAPABILITIES
from wasihost.core import limits
from wasihost.core.errors import CallError, CodecError, ConfigError, FailureClass, ManifestError
from wasihost.core.manifest import CommandSpec, parse_manifest
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

MIB = 1024 * 1024
KIB = 1024
RAWECHO = FIXTURES / "rawecho"

MANIFEST = """\
[extension]
schema = "wasihost-manifest/1"
id = "org.example.blob"
version = "0.1.0"
abi = "{abi}"
module = "blob.wasm"

[commands]
{commands}
"""


def manifest(commands: str, abi: str = "1.1") -> str:
    return MANIFEST.format(abi=abi, commands=commands)


def rawecho_with(tmp_path: Path, resources: str = "", abi: str | None = None) -> Path:
    """A copy of fixtures/rawecho whose manifest has ``resources`` (and ``abi``) changed."""
    package = tmp_path / "rawecho"
    package.mkdir()
    shutil.copy(RAWECHO / "rawecho.wasm", package / "rawecho.wasm")
    text = (RAWECHO / "extension.toml").read_text()
    if resources:
        text = text.replace("[commands]", f"[resources]\n{resources}\n\n[commands]")
    if abi is not None:
        text = text.replace('abi = "1.1"', f'abi = "{abi}"')
    (package / "extension.toml").write_text(text)
    return package


@pytest.fixture
def host() -> Host:
    with Host(Policy(allow=frozenset()), cache_dir=None) as h:
        yield h


# -- the manifest --------------------------------------------------------------------------------


def test_manifest_declares_bytes_per_direction() -> None:
    parsed = parse_manifest(
        manifest('a = { input = "bytes", output = "bytes" }\nb = { output = "bytes" }\nc = {}'),
        KNOWN_CAPABILITIES,
    )
    assert parsed.commands == (
        CommandSpec("a", "", "bytes", "bytes"),
        CommandSpec("b", "", "cbor", "bytes"),
        CommandSpec("c", "", "cbor", "cbor"),
    )


@pytest.mark.parametrize(
    ("commands", "abi", "key"),
    [
        ('blob = { input = "bytes" }', "1.0", "commands.blob.input"),
        ('blob = { output = "bytes" }', "1.0", "commands.blob.output"),
        ('blob = { input = "raw" }', "1.1", "commands.blob.input"),
        ("blob = { output = 1 }", "1.1", "commands.blob.output"),
        ('blob = { input = "CBOR" }', "1.1", "commands.blob.input"),
    ],
)
def test_manifest_refuses_bad_payload_conventions(commands: str, abi: str, key: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(manifest(commands, abi), KNOWN_CAPABILITIES)
    assert caught.value.key == key


def test_a_1_0_package_declaring_bytes_is_refused_at_load(host: Host, tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as caught:
        host.load(rawecho_with(tmp_path, abi="1.0"), grants=[])
    assert caught.value.key == "commands.echo-bytes.input"
    assert "1.1" in str(caught.value)


# -- calls through the engine --------------------------------------------------------------------


def test_one_mib_echo_round_trips_within_the_default_fuel(host: Host, tmp_path: Path) -> None:
    ext = host.load(
        rawecho_with(tmp_path, f"max_input_bytes = {MIB}\nmax_output_bytes = {MIB}"), grants=[]
    )
    ext.start()
    data = bytes(range(256)) * (MIB // 256)
    out = ext.call("echo-bytes", data)
    assert type(out) is bytes and out == data
    # Priced: the host's copy in and copy out, a fuel a byte each, and the guest's own copies,
    # and still well inside the default budget (the CBOR form of this echo burnt 15M).
    assert ext.last_fuel_used > 2 * MIB * limits.COMMAND_FUEL_PER_BYTE
    assert ext.last_fuel_used < limits.DEFAULT_FUEL_PER_CALL // 2


def test_zero_bytes_round_trip(host: Host) -> None:
    ext = host.load(RAWECHO, grants=[])
    assert ext.call("echo-bytes", b"") == b""
    assert ext.call("double", b"ab") == b"abab"


def test_bytes_like_inputs_cross_as_their_bytes(host: Host) -> None:
    ext = host.load(RAWECHO, grants=[])
    assert ext.call("echo-bytes", bytearray(b"\x00\xffxy")) == b"\x00\xffxy"
    assert ext.call("echo-bytes", memoryview(b"abcdef")[1:4]) == b"bcd"
    words = memoryview(bytearray(b"\x01\x00\x00\x00\x02\x00\x00\x00")).cast("I")
    assert ext.call("echo-bytes", words) == b"\x01\x00\x00\x00\x02\x00\x00\x00"


@pytest.mark.parametrize("value", ["text", None, 7, [1, 2], {"a": b"x"}, memoryview(b"abcd")[::2]])
def test_a_bytes_command_refuses_other_values(host: Host, value: object) -> None:
    ext = host.load(RAWECHO, grants=[])
    with pytest.raises(ConfigError, match="takes bytes"):
        ext.call("echo-bytes", value)


def test_input_at_the_limit_passes_and_one_over_is_refused_before_the_guest(
    host: Host, tmp_path: Path
) -> None:
    ext = host.load(
        rawecho_with(tmp_path, "max_input_bytes = 4096\nmax_output_bytes = 4096"), grants=[]
    )
    assert ext.call("echo-bytes", b"i" * 4096) == b"i" * 4096
    starts = ext.starts
    with pytest.raises(CodecError, match="input of 4097 bytes exceeds max_input_bytes 4096"):
        ext.call("echo-bytes", b"i" * 4097)
    assert ext.call("echo-bytes", b"ok") == b"ok"
    assert ext.starts == starts  # the refusal cost the instance nothing


def test_output_over_the_limit_is_output_too_large(host: Host, tmp_path: Path) -> None:
    ext = host.load(
        rawecho_with(tmp_path, "max_input_bytes = 4096\nmax_output_bytes = 4096"), grants=[]
    )
    assert ext.call("double", b"d" * 2048) == b"d" * 4096  # exactly at the limit
    starts = ext.starts
    with pytest.raises(CallError) as caught:
        ext.call("double", b"d" * 2049)
    assert caught.value.failure is FailureClass.OUTPUT_TOO_LARGE
    assert caught.value.message == (
        "the command's output of 4098 bytes is over its limit (max_output_bytes 4096)"
    )
    assert caught.value.hint is not None
    assert "raise [resources] max_output_bytes in the extension's extension.toml" in (
        caught.value.hint
    )
    assert ext.call("echo-bytes", b"again") == b"again"  # on a fresh instance
    assert ext.starts == starts + 1


def test_a_raw_command_error_is_the_guest_error_map(host: Host) -> None:
    ext = host.load(RAWECHO, grants=[])
    with pytest.raises(CallError) as caught:
        ext.call("fail-bytes", b"x")
    assert caught.value.failure is FailureClass.GUEST_ERROR
    assert caught.value.guest_class == "invalid_input"


def test_input_the_budget_cannot_copy_is_out_of_fuel_before_the_guest(host: Host) -> None:
    ext = host.load(RAWECHO, grants=[])
    ext.start()
    with pytest.raises(CallError) as caught:
        ext.call("echo-bytes", b"f" * 5000, fuel=4000)
    assert caught.value.failure is FailureClass.OUT_OF_FUEL
    assert ext.call("echo-bytes", b"f") == b"f"


def test_payload_bytes_are_priced_per_byte(host: Host) -> None:
    ext = host.load(RAWECHO, grants=[])
    ext.start()
    ext.call("echo-bytes", b"")
    empty = ext.last_fuel_used
    ext.call("echo-bytes", b"p" * 10_000)
    # In and out by the host (a fuel a byte each), and the guest's two copies (a fuel a byte
    # each: wasmtime prices memory.copy by the byte).
    assert ext.last_fuel_used - empty >= 2 * 10_000 * limits.COMMAND_FUEL_PER_BYTE


# -- CBOR commands: the limits are the payload's, not a 64 KiB string cap ------------------------


def test_a_64_kib_cbor_echo_fits_the_default_limits(host: Host) -> None:
    ext = host.load(FIXTURES / "echo", grants=[])
    assert limits.DEFAULT_MAX_OUTPUT_BYTES == 64 * KIB
    data = b"e" * (64 * KIB)
    assert ext.call("echo", data) == data
    with pytest.raises(CodecError):
        ext.call("echo", b"e" * (limits.DEFAULT_MAX_INPUT_BYTES + 1))


def test_a_cbor_string_may_fill_the_raised_limits(host: Host, tmp_path: Path) -> None:
    ext = host.load(
        rawecho_with(tmp_path, f"max_input_bytes = {MIB}\nmax_output_bytes = {MIB}"), grants=[]
    )
    data = b"c" * MIB
    assert ext.call("echo", data) == data
    text = "t" * MIB
    assert ext.call("echo", text) == text
    with pytest.raises(CodecError):
        ext.call("echo", b"c" * (MIB + 1))
    # Depth and item bounds are the ABI's still.
    with pytest.raises(CodecError):
        ext.call("echo", list(range(5000)))


def test_cbor_output_over_the_limit_is_refused(host: Host, tmp_path: Path) -> None:
    ext = host.load(
        rawecho_with(tmp_path, "max_input_bytes = 8192\nmax_output_bytes = 4096"), grants=[]
    )
    assert ext.call("echo", b"o" * 4096) == b"o" * 4096
    with pytest.raises(CallError) as caught:
        ext.call("echo", b"o" * 4097)
    # Within the engine's bound (the limit and a CBOR head), a byte string over the limit is
    # refused by the output's decoder: malformed as the protocol goes.
    assert caught.value.failure is FailureClass.PROTOCOL


def test_the_policy_ceiling_caps_a_raw_command_payload(tmp_path: Path) -> None:
    ceilings = {"max_input_bytes": 2048, "max_output_bytes": 1024}
    with Host(Policy(allow=frozenset(), ceilings=ceilings), cache_dir=None) as h:
        ext = h.load(
            rawecho_with(tmp_path, f"max_input_bytes = {MIB}\nmax_output_bytes = {MIB}"),
            grants=[],
        )
        assert ext.call("echo-bytes", b"a" * 1024) == b"a" * 1024
        with pytest.raises(CodecError, match="exceeds max_input_bytes 2048"):
            ext.call("echo-bytes", b"a" * 2049)
        with pytest.raises(CallError) as caught:
            ext.call("echo-bytes", b"a" * 1025)
        assert caught.value.failure is FailureClass.OUTPUT_TOO_LARGE
