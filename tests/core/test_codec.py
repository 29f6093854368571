"""The bounded CBOR codec: shared vectors, unit cases, round trips and fuzzing."""

from __future__ import annotations

import enum
import json
import math
import re
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.strategies import (
    cbor_like_bytes,
    cbor_values,
    depth_of,
    items_of,
    mutated_cbor,
    same_value,
)
from wasihost.core.codec import (
    DEFAULT_LIMITS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_STRING_BYTES,
    HARD_MAX_DEPTH,
    CodecLimits,
    Value,
    decode,
    encode,
)
from wasihost.core.errors import CodecError, ConfigError

VECTORS_PATH = Path(__file__).resolve().parents[2] / "abi" / "vectors" / "cbor.json"
VECTORS_DOC: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
VECTORS: list[dict[str, Any]] = VECTORS_DOC["vectors"]

# What the codec's message says for each reason of the vector file, so a vector refused for the
# wrong reason fails too.
REASON_MESSAGES = {
    "empty": r"^empty payload$",
    "trailing": r"^trailing bytes after the item",
    "truncated": r"^truncated",
    "depth": r"^nesting deeper than 32$",
    "items": r"^more than 4096 data items$",
    "string_length": r"^(text|byte) string of \d+ bytes exceeds 65536$",
    "indefinite": r"^indefinite-length ",
    "malformed": r"^(reserved additional information|unexpected break code)",
    "tag": r"^tag \d+ not allowed$",
    "undefined": r"^undefined not allowed$",
    "simple": r"^simple value \d+ not allowed$",
    "utf8": r"^text string is not valid UTF-8",
    "key_type": r"^map key of type .* not allowed",
    "duplicate_key": r"^duplicate map key ",
}


def from_json(value: Any) -> Value:
    """A vector's JSON value as the Python value the codec must produce."""
    if isinstance(value, dict):
        if value.keys() == {"$bytes"}:
            return bytes.fromhex(value["$bytes"])
        if value.keys() == {"$float"}:
            return float(value["$float"])
        return {key: from_json(element) for key, element in value.items()}
    if isinstance(value, list):
        return [from_json(element) for element in value]
    assert value is None or isinstance(value, bool | int | float | str)
    return value


# -- the shared vectors --------------------------------------------------------------------------


def test_vector_file_is_well_formed() -> None:
    assert VECTORS_DOC["limits"] == {
        "max_bytes": DEFAULT_MAX_BYTES,
        "max_depth": DEFAULT_MAX_DEPTH,
        "max_items": DEFAULT_MAX_ITEMS,
        "max_string_bytes": DEFAULT_MAX_STRING_BYTES,
    }
    assert len(VECTORS) >= 40
    names = [vector["name"] for vector in VECTORS]
    assert len(names) == len(set(names))
    for vector in VECTORS:
        assert re.fullmatch(r"(?:[0-9a-f]{2})*", vector["hex"]), vector["name"]
        if vector["valid"]:
            assert set(vector) == {"name", "hex", "valid", "value"}
        else:
            assert set(vector) == {"name", "hex", "valid", "reason"}
            assert vector["reason"] in REASON_MESSAGES
    documented = set(VECTORS_DOC["reasons"])
    assert documented == set(REASON_MESSAGES) | {"int_range"}


@pytest.mark.parametrize("vector", [v for v in VECTORS if v["valid"]], ids=lambda v: str(v["name"]))
def test_valid_vector(vector: dict[str, Any]) -> None:
    expected = from_json(vector["value"])
    decoded = decode(bytes.fromhex(vector["hex"]))
    assert same_value(decoded, expected)
    assert same_value(decode(encode(decoded)), expected)


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if not v["valid"]], ids=lambda v: str(v["name"])
)
def test_invalid_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(CodecError) as caught:
        decode(bytes.fromhex(vector["hex"]))
    assert re.search(REASON_MESSAGES[vector["reason"]], caught.value.message)


# -- limits --------------------------------------------------------------------------------------


def test_default_limits() -> None:
    assert (
        CodecLimits(max_bytes=1024 * 1024, max_depth=32, max_items=4096, max_string_bytes=65536)
        == DEFAULT_LIMITS
    )


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "8", None])
@pytest.mark.parametrize("field", ["max_bytes", "max_depth", "max_items", "max_string_bytes"])
def test_limits_refuse_non_positive_ints(field: str, bad: object) -> None:
    arguments: dict[str, Any] = {"max_bytes": 100, field: bad}
    with pytest.raises(ConfigError, match=field):
        CodecLimits(**arguments)


def test_limits_cap_depth() -> None:
    assert CodecLimits(max_bytes=1, max_depth=HARD_MAX_DEPTH).max_depth == HARD_MAX_DEPTH
    with pytest.raises(ConfigError, match="max_depth"):
        CodecLimits(max_bytes=1, max_depth=HARD_MAX_DEPTH + 1)


def test_size_limit_for_every_buffer_type() -> None:
    payload = encode("x" * 30)  # two-byte head, 32 bytes
    limits = CodecLimits(max_bytes=32)
    for buffer in (payload, bytearray(payload), memoryview(payload)):
        assert decode(buffer, limits) == "x" * 30
    tight = CodecLimits(max_bytes=31)
    for buffer in (payload, bytearray(payload), memoryview(payload)):
        with pytest.raises(CodecError, match="^payload of 32 bytes exceeds 31$"):
            decode(buffer, tight)


def test_memoryview_size_counts_bytes_not_elements() -> None:
    view = memoryview(bytes(8)).cast("Q")  # one element of eight bytes
    with pytest.raises(CodecError, match="^payload of 8 bytes exceeds 4$"):
        decode(view, CodecLimits(max_bytes=4))


def test_released_memoryview() -> None:
    view = memoryview(b"\x00")
    view.release()
    with pytest.raises(CodecError, match="released"):
        decode(view)


def test_wrong_argument_type_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        decode("00")  # type: ignore[arg-type]


def test_empty_payload() -> None:
    for empty in (b"", bytearray(), memoryview(b"")):
        with pytest.raises(CodecError, match="^empty payload$"):
            decode(empty)


def test_messages_name_the_limit() -> None:
    with pytest.raises(CodecError, match="^text string of 70000 bytes exceeds 65536$"):
        decode(b"\x7a" + (70000).to_bytes(4, "big") + b"a" * 70000)
    with pytest.raises(CodecError, match="^nesting deeper than 32$"):
        decode(b"\x81" * 40 + b"\x00")


def test_custom_limits() -> None:
    limits = CodecLimits(max_bytes=64, max_depth=2, max_items=5, max_string_bytes=3)
    assert decode(encode([[1, 2, 3]]), limits) == [[1, 2, 3]]
    with pytest.raises(CodecError, match="^nesting deeper than 2$"):
        decode(encode([[[]]]), limits)
    assert decode(encode([1, 2, 3, 4]), limits) == [1, 2, 3, 4]
    with pytest.raises(CodecError, match="^more than 5 data items$"):
        decode(encode([1, 2, 3, 4, 5]), limits)
    with pytest.raises(CodecError, match="^more than 5 data items$"):
        decode(encode({"a": 1, "b": 2, "c": 3}), limits)
    assert decode(encode(["abc", b"xyz"]), limits) == ["abc", b"xyz"]
    with pytest.raises(CodecError, match="^text string of 4 bytes exceeds 3$"):
        decode(encode("abcd"), limits)
    with pytest.raises(CodecError, match="^byte string of 4 bytes exceeds 3$"):
        decode(encode(b"abcd"), limits)


def test_items_limit_is_checked_before_building() -> None:
    # A head that claims 2**64-1 elements fails on the head, with no list allocated for it.
    with pytest.raises(CodecError, match="data items"):
        decode(b"\x9b" + b"\xff" * 8)
    with pytest.raises(CodecError, match="data items"):
        decode(b"\xbb" + b"\xff" * 8)


def test_string_length_is_checked_before_slicing() -> None:
    with pytest.raises(CodecError, match="^byte string of 18446744073709551615 bytes exceeds"):
        decode(b"\x5b" + b"\xff" * 8)
    with pytest.raises(CodecError, match="^truncated: text string of 65536 bytes"):
        decode(b"\x7a\x00\x01\x00\x00abc")


# -- decoding details ----------------------------------------------------------------------------


def test_integer_keys_and_text_keys_are_distinct() -> None:
    assert decode(bytes.fromhex("a201020304")) == {1: 2, 3: 4}
    decoded = decode(bytes.fromhex("a2016161616101"))
    assert decoded == {1: "a", "a": 1}


def test_integer_extremes_as_keys() -> None:
    value = {2**64 - 1: 0, -(2**64): 1}
    assert decode(encode(value)) == value


def test_nested_values_keep_their_types() -> None:
    decoded = decode(bytes.fromhex("8501f93c00f5f6a0"))
    assert same_value(decoded, [1, 1.0, True, None, {}])


def test_decoding_does_not_recurse_past_the_depth_limit() -> None:
    # A payload nested far beyond the limit fails on the limit, not on Python's stack.
    with pytest.raises(CodecError, match="nesting deeper than 32"):
        decode(b"\x81" * 100_000 + b"\x00")


# -- encoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "hex_form"),
    [
        (0, "00"),
        (23, "17"),
        (24, "1818"),
        (255, "18ff"),
        (256, "190100"),
        (65535, "19ffff"),
        (65536, "1a00010000"),
        (2**32 - 1, "1affffffff"),
        (2**32, "1b0000000100000000"),
        (2**64 - 1, "1bffffffffffffffff"),
        (-1, "20"),
        (-24, "37"),
        (-25, "3818"),
        (-(2**64), "3bffffffffffffffff"),
        (1.0, "fb3ff0000000000000"),
        (-0.0, "fb8000000000000000"),
        (False, "f4"),
        (True, "f5"),
        (None, "f6"),
        ("", "60"),
        ("IETF", "6449455446"),
        ("a" * 24, "7818" + "61" * 24),
        ("\u00fc", "62c3bc"),
        (b"", "40"),
        (b"\x01\x02", "420102"),
        (bytearray(b"\x01"), "4101"),
        ([], "80"),
        ((1, 2), "820102"),
        ({"a": 1, 2: [3]}, "a261610102 8103".replace(" ", "")),
    ],
)
def test_encode_shortest_heads(value: object, hex_form: str) -> None:
    assert encode(value).hex() == hex_form


def test_encode_subclasses_as_their_base_type() -> None:
    class Level(enum.IntEnum):
        WARN = 3

    class Name(str):
        __slots__ = ()

    assert encode({Name("k"): [Level.WARN, Name("v")]}) == encode({"k": [3, "v"]})


@pytest.mark.parametrize(
    "value",
    [set(), frozenset(), object(), 1j, {1.5: 0}, {(1,): 0}, {None: 0}, {True: 0}, {b"k": 0}],
)
def test_encode_refuses_unsupported_types(value: object) -> None:
    with pytest.raises(CodecError):
        encode(value)


@pytest.mark.parametrize("value", [2**64, -(2**64) - 1, [2**70]])
def test_encode_refuses_integers_out_of_range(value: object) -> None:
    with pytest.raises(CodecError, match="integer"):
        encode(value)


def test_encode_refuses_lone_surrogates() -> None:
    with pytest.raises(CodecError, match="UTF-8"):
        encode("\ud800")


def test_encode_limits() -> None:
    limits = CodecLimits(max_bytes=16, max_depth=2, max_items=4, max_string_bytes=5)
    assert encode([[1]], limits) == b"\x81\x81\x01"
    with pytest.raises(CodecError, match="^nesting deeper than 2$"):
        encode([[[]]], limits)
    assert encode([1, 2, 3], limits) == b"\x83\x01\x02\x03"
    with pytest.raises(CodecError, match="^more than 4 data items$"):
        encode([1, 2, 3, 4], limits)
    with pytest.raises(CodecError, match="^more than 4 data items$"):
        encode({"a": 1, "b": 2}, limits)
    with pytest.raises(CodecError, match="^text string of 6 characters exceeds 5 bytes$"):
        encode("abcdef", limits)
    assert encode("abcde", limits) == b"\x65abcde"
    with pytest.raises(CodecError, match="exceeds 5$"):
        encode("\u00fc\u00fc\u00fc", limits)  # three characters, six bytes
    with pytest.raises(CodecError, match="^byte string of 6 bytes exceeds 5$"):
        encode(b"abcdef", limits)
    with pytest.raises(CodecError, match="payload"):
        encode(["abcde", "abcde", "abcde"], limits)
    with pytest.raises(CodecError, match="payload"):
        encode(2**64 - 1, CodecLimits(max_bytes=8))


def test_encode_refuses_cycles() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(CodecError, match="nesting deeper"):
        encode(cycle)


# -- properties ----------------------------------------------------------------------------------


@given(cbor_values)
def test_round_trip(value: Value) -> None:
    assert same_value(decode(encode(value)), value)


@given(cbor_values)
def test_agrees_with_cbor2(value: Value) -> None:
    assert same_value(cbor2.loads(encode(value)), value)
    assert same_value(decode(cbor2.dumps(value)), value)


@given(cbor_values)
def test_counts_match_the_documented_rules(value: Value) -> None:
    payload = encode(value)
    depth, items = depth_of(value), items_of(value)
    exact = CodecLimits(max_bytes=len(payload), max_depth=max(depth, 1), max_items=items)
    assert same_value(decode(payload, exact), value)
    if items > 1:
        with pytest.raises(CodecError, match="data items"):
            decode(payload, CodecLimits(max_bytes=len(payload), max_items=items - 1))
    if depth > 1:
        with pytest.raises(CodecError, match="nesting"):
            decode(payload, CodecLimits(max_bytes=len(payload), max_depth=depth - 1))


@settings(max_examples=1000)
@given(cbor_like_bytes)
def test_decode_returns_or_raises_codec_error(data: bytes) -> None:
    try:
        value = decode(data)
    except CodecError as exc:
        assert exc.message
        assert len(exc.message) < 200
    else:
        # Whatever was accepted is canonical enough to survive a round trip.
        assert same_value(decode(encode(value)), value)


@settings(max_examples=300)
@given(
    mutated_cbor(),
    st.builds(
        CodecLimits,
        max_bytes=st.integers(1, 200),
        max_depth=st.integers(1, 5),
        max_items=st.integers(1, 20),
        max_string_bytes=st.integers(1, 20),
    ),
)
def test_decode_under_small_limits_returns_or_raises_codec_error(
    data: bytes, limits: CodecLimits
) -> None:
    try:
        value = decode(data, limits)
    except CodecError:
        return
    assert depth_of(value) <= limits.max_depth
    assert items_of(value) <= limits.max_items
    assert len(data) <= limits.max_bytes


def test_float_widths() -> None:
    assert decode(bytes.fromhex("f93e00")) == 1.5
    assert decode(bytes.fromhex("fa3fc00000")) == 1.5
    assert decode(bytes.fromhex("fb3ff8000000000000")) == 1.5
    nan = decode(bytes.fromhex("f97e00"))
    assert isinstance(nan, float)
    assert math.isnan(nan)
