"""The fast codec against the codec it replaced: same value, same bytes, same error.

``reference_codec`` is ``wasihost/core/codec.py`` as it was before the fast paths (kept verbatim).
For every input, valid or hostile, under the default limits and under small random ones, both
must return identical results (types, float bits, key order included) or raise a CodecError with
the same message, which names the limit or rule hit. Any other exception must be the same too.
"""

from __future__ import annotations

import enum
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import reference_codec
from tests.support.strategies import cbor_like_bytes, cbor_values, mutated_cbor
from wasihost.core import codec
from wasihost.core.codec import DEFAULT_LIMITS, CodecLimits
from wasihost.core.errors import CodecError

VECTORS_PATH = Path(__file__).resolve().parents[2] / "abi" / "vectors" / "cbor.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["vectors"]

Outcome = tuple[str, Any]


def identical(left: object, right: object) -> bool:
    """Equal in type and value all the way down: float bits, map key order and key types."""
    if type(left) is not type(right):
        return False
    if isinstance(left, float):
        assert isinstance(right, float)
        return struct.pack(">d", left) == struct.pack(">d", right)
    if isinstance(left, list):
        assert isinstance(right, list)
        return len(left) == len(right) and all(map(identical, left, right))
    if isinstance(left, dict):
        assert isinstance(right, dict)
        return len(left) == len(right) and all(
            identical(lk, rk) and identical(lv, rv)
            for (lk, lv), (rk, rv) in zip(left.items(), right.items(), strict=True)
        )
    return left == right


def outcome(function: Any, *args: Any) -> Outcome:
    try:
        return ("value", function(*args))
    except CodecError as exc:
        return ("codec error", exc.message)
    except Exception as exc:  # compared, not hidden: a TypeError must match a TypeError
        return (type(exc).__name__, str(exc))


def assert_same(new: Outcome, old: Outcome) -> None:
    assert new[0] == old[0], (new, old)
    if new[0] == "value":
        assert identical(new[1], old[1]), (new, old)
    else:
        assert new[1] == old[1], (new, old)


def check_decode(data: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Outcome:
    old = outcome(reference_codec.decode, data, limits)
    for buffer in (data, bytearray(data), memoryview(data)):
        assert_same(outcome(codec.decode, buffer, limits), old)
        # The counting decoder (host-call requests, priced per item) takes its own path for
        # the payloads decode answers at once: it must agree with decode on every one.
        assert_same(outcome(lambda b, lim: codec.decode_counted(b, lim)[0], buffer, limits), old)
    return old


def check_encode(value: object, limits: CodecLimits = DEFAULT_LIMITS) -> Outcome:
    old = outcome(reference_codec.encode, value, limits)
    assert_same(outcome(codec.encode, value, limits), old)
    return old


small_limits = st.builds(
    CodecLimits,
    max_bytes=st.integers(1, 200),
    max_depth=st.integers(1, 5),
    max_items=st.integers(1, 20),
    max_string_bytes=st.integers(1, 30),
)
any_limits = st.one_of(st.just(DEFAULT_LIMITS), small_limits)

# Lengths at every boundary of a head and of the whole-payload shapes.
_EDGE_SIZES = [0, 1, 22, 23, 24, 25, 254, 255, 256, 257, 1000, 65535, 65536, 65537]


@st.composite
def edge_limits(draw: st.DrawFn, size: int) -> CodecLimits:
    """Limits at, just under and just over ``size`` (as a string length and a payload size)."""
    near = st.sampled_from([max(1, size + delta) for delta in (-4, -3, -2, -1, 0, 1, 2, 3, 4, 9)])
    return CodecLimits(
        max_bytes=draw(st.one_of(near, st.just(DEFAULT_LIMITS.max_bytes))),
        max_string_bytes=draw(st.one_of(near, st.just(DEFAULT_LIMITS.max_string_bytes))),
        max_items=draw(st.integers(1, 3)),
    )


def shortest_head(major: int, arg: int) -> bytes:
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if arg < 24:
            return bytes([major << 5 | arg])
        if arg < 1 << (8 * width):
            return bytes([major << 5 | info]) + arg.to_bytes(width, "big")
    raise AssertionError(arg)


@st.composite
def scalar_payloads(draw: st.DrawFn) -> tuple[bytes, CodecLimits]:
    """A lone string, integer or simple value, often damaged: what the whole-payload path sees."""
    size = draw(st.sampled_from(_EDGE_SIZES))
    major = draw(st.sampled_from([2, 3]))
    if major == 3 and draw(st.booleans()):
        # Cut at ``size`` bytes, which may split a character: invalid UTF-8 is wanted too.
        unit = draw(st.text(min_size=1, max_size=3)).encode("utf-8", "surrogatepass")
        body = (unit * size)[:size]
    else:
        body = bytes([draw(st.sampled_from([0x61, 0xC3, 0xBC, 0xFF, 0x00]))]) * size
    length = len(body)
    head = shortest_head(major, length)
    if draw(st.booleans()):
        # A longer head than needed (allowed by the profile), or a chosen one.
        info = draw(st.sampled_from([24, 25, 26, 27]))
        width = 1 << (info - 24)
        if length < 1 << (8 * width):
            head = bytes([major << 5 | info]) + length.to_bytes(width, "big")
    payload = head + body
    edit = draw(st.sampled_from(["none", "none", "truncate", "append", "single"]))
    if edit == "truncate":
        payload = payload[: draw(st.integers(0, max(0, len(payload) - 1)))]
    elif edit == "append":
        payload += draw(st.binary(min_size=1, max_size=3))
    elif edit == "single":
        payload = bytes([draw(st.integers(0, 255))]) + draw(st.binary(max_size=2))
    return payload, draw(edge_limits(len(payload)))


# Host-side values for encode(): the profile's types, their subclasses, and what is refused.
class Level(enum.IntEnum):
    WARN = 3


class Name(str):
    __slots__ = ()


class Blob(bytes):
    pass


class Items(list):  # type: ignore[type-arg]
    pass


class Fields(dict):  # type: ignore[type-arg]
    pass


_odd_scalars = st.one_of(
    st.sampled_from([Level.WARN, 1j, object(), {1, 2}, frozenset(), Ellipsis]),
    st.text(max_size=30).map(Name),
    st.binary(max_size=30).map(Blob),
    st.binary(max_size=30).map(bytearray),
    st.floats().map(type("Real", (float,), {})),
    st.integers(-(2**66), 2**66),
    st.sampled_from(["\ud800", "a\udfffb", "\u00fc" * 12, "x" * 23, "x" * 24, "\u20ac" * 8]),
)
_odd_keys = st.one_of(
    st.text(max_size=30),
    st.integers(-(2**65), 2**65),
    st.sampled_from([True, None, 1.5, b"k", (1,), Level.WARN, Name("n"), "\ud800"]),
)
host_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(cbor_values, _odd_scalars),
    lambda children: st.one_of(
        st.lists(children, max_size=8),
        st.lists(children, max_size=8).map(tuple),
        st.lists(children, max_size=8).map(Items),
        st.dictionaries(_odd_keys, children, max_size=6),
        st.dictionaries(st.text(max_size=6), children, max_size=6).map(Fields),
    ),
    max_leaves=30,
)


# -- decoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: str(v["name"]))
def test_differential_decode_vectors(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    result = check_decode(data)
    assert (result[0] == "value") == vector["valid"]
    # Every cut of a short payload; of a long one, those near either end.
    cuts = range(len(data)) if len(data) < 64 else [*range(16), *range(len(data) - 16, len(data))]
    for cut in cuts:
        check_decode(data[:cut])
    check_decode(data + b"\x00")


@settings(max_examples=150)
@given(cbor_like_bytes, any_limits)
def test_differential_decode_hostile_bytes(data: bytes, limits: CodecLimits) -> None:
    check_decode(data, limits)


@settings(max_examples=150)
@given(mutated_cbor(), any_limits)
def test_differential_decode_damaged_payloads(data: bytes, limits: CodecLimits) -> None:
    check_decode(data, limits)


@settings(max_examples=150)
@given(cbor_values, any_limits)
def test_differential_decode_valid_payloads(value: Any, limits: CodecLimits) -> None:
    data = reference_codec.encode(value)
    assert check_decode(data)[0] == "value"
    check_decode(data, limits)


@settings(max_examples=200)
@given(scalar_payloads())
def test_differential_decode_scalar_payloads(case: tuple[bytes, CodecLimits]) -> None:
    check_decode(*case)


def test_differential_decode_limits_at_their_edges() -> None:
    # Each limit hit exactly and missed by one, on containers and strings built by hand.
    for count in (1, 5, 23, 24, 100):
        for payload in (
            reference_codec.encode(list(range(count))),
            reference_codec.encode({f"k{i}": [i, "v"] for i in range(count)}),
            reference_codec.encode([[b"x" * count]] * 3),
            b"\x9b" + count.to_bytes(8, "big") + b"\x00" * count,
            b"\x81" * count + b"\xf6",
            b"\xa1\x61a" * count + b"\xf6",
        ):
            for items in (count - 1, count, count + 1, 2 * count, 3 * count + 4):
                for depth in (1, count - 1, count, min(count + 1, 256)):
                    limits = CodecLimits(
                        max_bytes=max(1, len(payload) - 1 + (items & 1)),
                        max_items=max(1, items),
                        max_depth=max(1, depth),
                        max_string_bytes=max(1, count - 1 + (depth & 1)),
                    )
                    check_decode(payload, limits)
                    check_decode(payload, DEFAULT_LIMITS)


def test_differential_decode_floats_and_simple_values() -> None:
    for head, width in ((0xF9, 2), (0xFA, 4), (0xFB, 8)):
        for pattern in (b"\x00", b"\x7f", b"\x80", b"\xff", b"\x7c", b"\x7e", b"\xfc"):
            body = (pattern * width)[:width]
            check_decode(bytes([head]) + body)
            check_decode(bytes([0x82, head]) + body + b"\xf6")
            check_decode(bytes([0xA1, 0x61, 0x66, head]) + body)
    for initial in range(0xE0, 0x100):
        for tail in (b"", b"\x00", b"\x20", b"\xff" * 8):
            check_decode(bytes([initial]) + tail)
            check_decode(bytes([0x81, initial]) + tail)
            check_decode(bytes([0xA1, 0x00, initial]) + tail)
    assert math.isnan(codec.decode(b"\xf9\x7e\x00"))  # type: ignore[arg-type]


def test_differential_decode_every_two_byte_payload() -> None:
    # Every head byte alone, after an array head and as a map key or value.
    for first in range(256):
        for second in (0x00, 0x17, 0x18, 0x40, 0x5F, 0x60, 0x61, 0x77, 0x80, 0xA0, 0xC0, 0xFF):
            check_decode(bytes([first, second]))
            check_decode(bytes([0x82, first, second]))
            check_decode(bytes([0xA1, first, second]))
            check_decode(bytes([0xA1, 0x61, 0x6B, first, second]))


def test_differential_decode_argument_type_errors() -> None:
    for bad in ("00", 0, None, [0]):
        assert_same(outcome(codec.decode, bad), outcome(reference_codec.decode, bad))
    released = memoryview(b"\x00")
    released.release()
    assert_same(outcome(codec.decode, released), outcome(reference_codec.decode, released))


# -- encoding ------------------------------------------------------------------------------------


@settings(max_examples=150)
@given(host_values, any_limits)
def test_differential_encode(value: Any, limits: CodecLimits) -> None:
    check_encode(value, limits)
    check_encode(value)


@settings(max_examples=150)
@given(st.sampled_from(_EDGE_SIZES), st.sampled_from(["b", "t", "u", "s"]), st.data())
def test_differential_encode_strings_at_their_edges(
    size: int, kind: str, data: st.DataObject
) -> None:
    value: Any = {
        "b": bytes(size),
        "t": "a" * size,
        "u": "\u00fc" * (size // 2) + "a" * (size % 2),
        "s": "a" * max(0, size - 1) + "\udc80",
    }[kind]
    limits = data.draw(edge_limits(size + 3))
    for shape in (value, [value], [value, value], {"k": value}, {"k": [value, value]}):
        check_encode(shape, limits)
        check_encode(shape)


def test_differential_encode_a_byte_string_at_every_edge_of_its_head_and_limits() -> None:
    # encode()'s own paths for one byte string (a one-byte length, and a two-byte one: a 4 KiB
    # command payload) against the reference, at each head width's edges and each limit's.
    for size in (*_EDGE_SIZES, 4096):
        value = bytes(range(256)) * (size // 256) + bytes(size % 256)
        for delta in (-4, -3, -2, -1, 0, 1, 2, 3, 4):
            edge = max(1, size + delta)
            for limits in (
                CodecLimits(max_bytes=edge),
                CodecLimits(max_bytes=DEFAULT_LIMITS.max_bytes, max_string_bytes=edge),
                CodecLimits(max_bytes=edge, max_string_bytes=edge),
            ):
                check_encode(value, limits)


def test_differential_encode_integers_at_their_edges() -> None:
    edges = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, 2**64]
    for number in [*edges, *(-1 - edge for edge in edges), -1 - 2**64]:
        for shape in (number, [number], {number: number}, Level.WARN):
            check_encode(shape)
            check_encode(shape, CodecLimits(max_bytes=8))


def test_differential_encode_floats_everywhere() -> None:
    # cbor2 writes NaN and the infinities as float16; the profile as float64.
    nan = float("nan")
    negative_nan = struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0]
    for number in (nan, negative_nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1.7e308, 1.5):
        for shape in (
            number,
            [number],
            (1, number),
            {"k": number},
            {1: [number]},
            [{"a": (number,)}],
            [[1, 2], number],
        ):
            check_encode(shape)
            check_encode(shape, CodecLimits(max_bytes=12, max_items=3))


def test_differential_encode_cycles_and_depth() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    mapping: dict[str, Any] = {}
    mapping["self"] = mapping
    for value in (cycle, mapping, [[[[]]]], {"a": {"b": {"c": {}}}}):
        for depth in (1, 2, 3, 4, 32, 256):
            check_encode(value, CodecLimits(max_bytes=1 << 20, max_depth=depth))


# Shapes the fast paths take inside their parent's loop (a map in an array, an array in a map,
# an array in a map in an array: records and their lists), with every kind of child in each,
# nested below a varying number of lists, so that each depth and item limit falls on each level.
_RECORD_CHILDREN: list[Any] = [
    0,
    -30,
    2**40,
    "t",
    "x" * 30,
    "y" * 300,
    "\u00e9" * 7,
    b"b" * 30,
    b"c" * 300,
    None,
    True,
    1.5,
    [],
    [0, "tag", b"z"],
    ["x" * 30, [1], {"k": 0}],
    {"inner": [0]},
    {},
]


def _records(child: Any) -> list[Any]:
    return [
        [{"k": child}],
        [{"a": 0, 7: [child, child]}],
        [{"a": [child]}, {"b": [1, child]}],
        [{"a": child, "b": [child], "c": {"d": [child]}}],
    ]


def _depth_and_items(value: Any) -> tuple[int, int]:
    """The depth and the data items of ``value``, counted as the ABI counts them."""
    if isinstance(value, list):
        below = [_depth_and_items(element) for element in value]
        return 1 + max((d for d, _ in below), default=0), 1 + sum(n for _, n in below)
    if isinstance(value, dict):
        below = [_depth_and_items(element) for element in value.values()]
        return 1 + max((d for d, _ in below), default=0), 1 + len(value) + sum(n for _, n in below)
    return 0, 1


def test_differential_records_at_every_limit() -> None:
    # Each limit at every value from 1 to one past what the value needs, so that it runs out
    # at each position of each level; the string limit around each string's size.
    for child in _RECORD_CHILDREN:
        for record in _records(child):
            for wraps in range(3):
                value: Any = record
                for _ in range(wraps):
                    value = [value]
                payload = reference_codec.encode(value)
                depth, items = _depth_and_items(value)
                every = [CodecLimits(max_bytes=1 << 20, max_depth=d) for d in range(1, depth + 2)]
                every += [CodecLimits(max_bytes=1 << 20, max_items=n) for n in range(1, items + 2)]
                every += [
                    CodecLimits(max_bytes=1 << 20, max_string_bytes=size)
                    for size in (20, 29, 30, 299, 300, 400)
                ]
                for limits in every:
                    check_decode(payload, limits)
                    check_encode(value, limits)
                check_decode(payload)
                check_encode(value)
