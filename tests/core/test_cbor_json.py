"""The JSON form of CBOR values (CLI ``--input`` and output): valid JSON, one text per value,
read back to the same value."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.common import FIXTURES
from tests.support.guests import build, escape, guest_wat
from tests.support.strategies import cbor_values
from wasihost.cli import main
from wasihost.core import cbor_json
from wasihost.core.cbor_json import JsonFormError, from_json, to_json


def _refuse_constant(name: str) -> Any:
    raise AssertionError(f"bare {name} in the output")


def strict_json(text: str) -> Any:
    """Python's json.loads, but failing on the NaN/Infinity literals it accepts by default."""
    return json.loads(text, parse_constant=_refuse_constant)


def same(a: Any, b: Any) -> bool:
    """Equality of CBOR values that tells 1, 1.0 and True apart, 0.0 from -0.0, and in which
    NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        keys_a = {(type(k), k) for k in a}
        return keys_a == {(type(k), k) for k in b} and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def text_of(value: Any) -> str:
    return cbor_json.dumps(to_json(value))


@given(cbor_values)
def test_every_value_prints_valid_json_that_reads_back_to_it(value: Any) -> None:
    text = text_of(value)
    strict_json(text)
    assert same(from_json(cbor_json.loads(text)), value)


# Values drawn from a few look-alikes, so that pairs which the old form confused (1 and "1"
# as keys, a map {"$bytes": "31"} and the bytes "1", NaN and a string) come up often.
_LOOKALIKE_KEYS = st.sampled_from([0, 1, "0", "1", "$bytes", "$float", "$map", "NaN"])
_lookalikes: st.SearchStrategy[Any] = st.recursive(
    st.sampled_from(
        [
            0,
            1,
            0.0,
            -0.0,
            1.0,
            True,
            False,
            None,
            "1",
            "31",
            "",
            b"",
            b"1",
            "NaN",
            "Infinity",
            math.nan,
            math.inf,
            -math.inf,
        ]
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(_LOOKALIKE_KEYS, inner, max_size=2)
    ),
    max_leaves=4,
)


@given(_lookalikes, _lookalikes)
def test_distinct_values_print_distinct_text(a: Any, b: Any) -> None:
    # (Equal maps may print differently: the text keeps the guest's key order.)
    if not same(a, b):
        assert text_of(a) != text_of(b)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (math.nan, '{"$float": "NaN"}'),
        (-math.inf, '{"$float": "-Infinity"}'),
        (b"\xff", '{"$bytes": "ff"}'),
        ({"$bytes": "ff"}, '{"$map": [["$bytes", "ff"]]}'),
        ({1: "int", "1": "text"}, '{"$map": [[1, "int"], ["1", "text"]]}'),
        ({"a": [1, 1.0, True]}, '{"a": [1, 1.0, true]}'),
        (2**64 - 1, "18446744073709551615"),
    ],
)
def test_the_forms_the_issue_found_ambiguous(value: Any, text: str) -> None:
    assert text_of(value) == text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("NaN", "NaN"),
        ("[Infinity]", "Infinity"),
        ("1e400", "out of the float range"),
        ('{"a": 1, "a": 2}', "repeats the key 'a'"),
        ('{"$bytes": "FF"}', "lowercase hex"),
        ('{"$bytes": "f f"}', "lowercase hex"),
        ('{"$float": "nan"}', '"$float" takes'),
        ('{"$bytes": "ff", "x": 1}', "no other key"),
        ('{"$set": []}', "unknown tagged form"),
        ('{"$map": [[1, 2], [1, 3]]}', "repeats the key 1"),
        ('{"$map": [[[1], 2]]}', "keys are text or integers"),
        ('{"$map": [[true, 2]]}', "keys are text or integers"),
        pytest.param("[" * 100_000, "not valid JSON", id="deep"),
        pytest.param("9" * 5000, "not valid JSON", id="long-int"),
    ],
)
def test_json_that_is_no_cbor_value_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(JsonFormError) as info:
        from_json(cbor_json.loads(text))
    assert fragment in str(info.value)


# -- through the CLI -------------------------------------------------------------------------


def _answering_guest(tmp_path: Path, value: Any) -> str:
    """A module whose every command answers ``value`` (CBOR the SDK could not produce)."""
    blob = b"\x00\x00\x00\x00" + cbor2.dumps(value)
    wasm = build(
        guest_wat(
            f"(call $packed (i32.const 9000) (i32.const {len(blob)}))",
            extra=f'(data (i32.const 9000) "{escape(blob)}")',
        )
    )
    path = tmp_path / "answer.wasm"
    path.write_bytes(wasm)
    return str(path)


@pytest.mark.parametrize("envelope", [False, True])
def test_cli_output_is_strict_and_unambiguous(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, envelope: bool
) -> None:
    value = {
        "nan": math.nan,
        "keys": {1: "int", "1": "text"},
        "map": {"$bytes": "ff"},
        "b": b"\xff",
    }
    argv = ["run", _answering_guest(tmp_path, value), "run", "--no-cache"]
    assert main([*argv, "--json"] if envelope else argv) == 0
    doc = strict_json(capsys.readouterr().out)
    out = doc["output"] if envelope else doc
    assert out == {
        "nan": {"$float": "NaN"},
        "keys": {"$map": [[1, "int"], ["1", "text"]]},
        "map": {"$map": [["$bytes", "ff"]]},
        "b": {"$bytes": "ff"},
    }


def _input_echoing_guest(tmp_path: Path) -> str:
    """A module that answers the CBOR bytes of its input as a byte string (inputs under 256
    bytes): what the guest received, exactly, with no decoder of ours in between."""
    body = """
    (i32.store (i32.const 9000) (i32.const 0))
    (i32.store8 (i32.const 9004) (i32.const 0x58))
    (i32.store8 (i32.const 9005) (local.get $in_len))
    (memory.copy (i32.const 9006) (i32.add (local.get $ptr) (local.get $cmd_len))
                 (local.get $in_len))
    (call $packed (i32.const 9000) (i32.add (local.get $in_len) (i32.const 6)))"""
    path = tmp_path / "input.wasm"
    path.write_bytes(build(guest_wat(body)))
    return str(path)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"$bytes": "00ff"}', b"\x00\xff"),
        ('{"$map": [[1, "int"], ["1", "text"]]}', {1: "int", "1": "text"}),
        ('{"$map": [["$bytes", "ff"]]}', {"$bytes": "ff"}),
        ('[1, 1.0, -0.0, {"$float": "-Infinity"}]', [1, 1.0, -0.0, -math.inf]),
    ],
)
def test_cli_input_reads_the_same_form(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, value: Any
) -> None:
    argv = ["run", _input_echoing_guest(tmp_path), "run", "--input", text, "--no-cache"]
    assert main(argv) == 0
    received = cbor2.loads(bytes.fromhex(strict_json(capsys.readouterr().out)["$bytes"]))
    assert same(received, value)


def test_cli_input_and_output_agree(capsys: pytest.CaptureFixture[str]) -> None:
    text = '{"a": [{"$bytes": "00ff"}, {"$map": [[1, "int"], ["1", "text"]]}, 1.5]}'
    assert main(["run", str(FIXTURES / "echo"), "echo", "--input", text, "--no-cache"]) == 0
    assert capsys.readouterr().out == text + "\n"


@pytest.mark.parametrize("text", ["NaN", '{"a": 1, "a": 2}', '{"$bytes": "xyz"}'])
def test_cli_refuses_input_that_is_not_a_value(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    assert main(["run", str(FIXTURES / "echo"), "echo", "--input", text, "--no-cache"]) == 2
    assert capsys.readouterr().err.startswith("error: usage: --input: ")
