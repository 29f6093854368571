"""What cbor2's C code is handed by the fast path: only what the bounded scan or walk vouched for.

The differential tests prove the results are the old codec's; these prove the bounds hold
*before* cbor2 runs (it has none of its own), and that the fast path is the one in use.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import cbor2
import pytest

from tests.support import reference_codec
from wasihost.core import codec, codec_fast
from wasihost.core.codec import CodecLimits
from wasihost.core.errors import CodecError


class Spy:
    """A backend that records what reaches cbor2, then calls it."""

    def __init__(self, real: codec_fast.Backend) -> None:
        self.decoded: list[bytes] = []
        self.encoded: list[Any] = []
        self.real = real

    def loads(self, data: bytes) -> Any:
        self.decoded.append(data)
        return self.real.loads(data)

    def dumps(self, value: Any) -> bytes:
        self.encoded.append(value)
        return self.real.dumps(value)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    real = codec_fast.backend()
    assert real is not None, "cbor2's C backend is not in use: the fast path is off"
    recorder = Spy(real)
    fake = codec_fast.Backend(recorder.loads, recorder.dumps)
    monkeypatch.setattr(codec_fast, "backend", lambda: fake)
    return recorder


def test_the_c_backend_is_in_use() -> None:
    backend = codec_fast.backend()
    assert backend is not None
    with pytest.raises(cbor2.CBORDecodeError):
        backend.loads(b"\xa2\x61a\x00\x61a\x01")  # duplicate keys: refused, not merged


def test_structured_values_are_built_by_cbor2(spy: Spy) -> None:
    value = {"rows": [{"id": i, "name": f"n{i}", "blob": bytes(30)} for i in range(20)]}
    payload = codec.encode(value)
    assert spy.encoded == [value]
    assert codec.decode(payload) == value
    assert spy.decoded == [payload]


HOSTILE = [
    b"\x9b" + b"\xff" * 8,  # an array of 2**64-1 elements
    b"\xbb" + b"\xff" * 8,  # a map of as many entries
    b"\x9a\x00\x01\x00\x00" + b"\x00" * 65536,  # 65,536 items, over the 4,096 limit
    b"\x81" * 40 + b"\x00",  # nesting deeper than 32
    b"\x81" * 100_000 + b"\x00",
    b"\x82\x5a\x00\x01\x00\x01" + b"\x00" * 65537 + b"\x00",  # a string over 64 KiB
    b"\x82\x7b" + b"\xff" * 8 + b"\x00",  # a text of 2**64-1 bytes, claimed
    b"\x82\xc2\x41\x01\x00",  # a tag (a bignum cbor2 would turn into an int)
    b"\x82\xd9\xd9\xf7\x00\x00",  # the self-describe tag cbor2 would drop silently
    b"\x82\x9f\x00\xff\x00",  # indefinite length
    b"\x82\xf7\x00",  # undefined
    b"\x82\xf8\x20\x00",  # a two-byte simple value
    b"\x82\xe0\x00",  # simple value 0
    b"\xa1\x41k\x00",  # a byte string key
    b"\xa1\x80\x00",  # an array key
    b"\x82\x00",  # truncated
    b"\x81\x00\x00",  # trailing
]


@pytest.mark.parametrize("payload", HOSTILE, ids=lambda p: p[:12].hex())
def test_cbor2_never_sees_what_the_scan_refuses(spy: Spy, payload: bytes) -> None:
    with pytest.raises(CodecError) as caught:
        codec.decode(payload)
    assert spy.decoded == []
    with pytest.raises(CodecError) as expected:
        reference_codec.decode(payload)
    assert caught.value.message == expected.value.message


@pytest.mark.parametrize(
    "payload",
    [
        b"\x82\xf9\x7e\x01\x00",  # a float16 NaN with a payload (cbor2 would keep it)
        b"\x82\xf9\xfc\x00\x00",  # float16 -infinity
        b"\x82\xfa\x7f\x80\x00\x01\x00",  # a float32 NaN
    ],
    ids=lambda p: p.hex(),
)
def test_valid_payloads_the_scan_leaves_to_the_exact_decoder(spy: Spy, payload: bytes) -> None:
    assert repr(codec.decode(payload)) == repr(reference_codec.decode(payload))
    assert spy.decoded == []


def test_cbor2_is_asked_only_about_utf8_and_duplicate_keys(spy: Spy) -> None:
    # The two rules the scan leaves to cbor2: it sees these payloads, refuses them, and the
    # exact decoder names the reason.
    for payload, message in (
        (b"\x82\x62\xff\xfe\x00", "text string is not valid UTF-8 (byte 0)"),
        (b"\xa2\x61a\x00\x61a\x01", "duplicate map key 'a'"),
        (b"\xa2\x01\x00\x18\x01\x01", "duplicate map key 1"),
    ):
        spy.decoded.clear()
        with pytest.raises(CodecError) as caught:
            codec.decode(payload)
        assert caught.value.message == message
        assert spy.decoded == [payload]


def test_small_limits_are_scanned_too(spy: Spy) -> None:
    limits = CodecLimits(max_bytes=64, max_depth=2, max_items=5, max_string_bytes=3)
    assert codec.decode(codec.encode([[1, 2, 3]]), limits) == [[1, 2, 3]]
    for value in ([[[]]], [1, 2, 3, 4, 5], ["abcd"], [b"abcd"], {"k": "abcd"}):
        spy.decoded.clear()
        with pytest.raises(CodecError):
            codec.decode(reference_codec.encode(value), limits)
        assert spy.decoded == []


def test_walk_keeps_cbor2_within_max_bytes(spy: Spy) -> None:
    # The walk counts string bytes before cbor2 builds anything: over max_bytes, cbor2 is never
    # asked, and the exact encoder stops as soon as the output passes the limit.
    limits = CodecLimits(max_bytes=1000)
    with pytest.raises(CodecError, match="^payload exceeds 1000 bytes$"):
        codec.encode(["x" * 600, "y" * 600], limits)
    with pytest.raises(CodecError, match="^payload exceeds 1000 bytes$"):
        codec.encode({"a": b"x" * 999, "b": [b"y" * 100]}, limits)
    assert spy.encoded == []
    # Under it, cbor2 builds; a result just over (heads count too) goes to the exact encoder.
    assert len(codec.encode(["x" * 400, "y" * 400], limits)) == 807
    with pytest.raises(CodecError, match="^payload exceeds 1000 bytes$"):
        codec.encode(["x" * 498, "y" * 500], limits)
    assert len(spy.encoded) == 2


NESTED_33: list[Any] = [1]
for _ in range(32):
    NESTED_33 = [NESTED_33]


@pytest.mark.parametrize(
    "value",
    [
        [float("nan")],
        [2**64],
        [{True: 1}],
        [{(1,): 1}],
        NESTED_33,
        list(range(5000)),
        [set()],
        ["x" * 70000],
    ],
    ids=["nan", "bigint", "boolkey", "tuplekey", "deep", "items", "set", "long"],
)
def test_walk_refuses_what_cbor2_would_encode_otherwise(spy: Spy, value: Any) -> None:
    # Each is encoded (the NaN) or refused by the exact encoder alone, as before.
    assert not codec_fast.walk(value, 1 << 20, 32, 4096, 65536)
    try:
        expected: object = reference_codec.encode([value])
    except CodecError as exc:
        expected = exc.message
    try:
        got: object = codec.encode([value])
    except CodecError as exc:
        got = exc.message
    assert got == expected
    assert spy.encoded == []


@pytest.mark.parametrize("value", [["\ud800"], {"k": "a\udfff"}, {"\ud800": 1}])
def test_a_text_without_utf8_form_is_refused_by_cbor2_then_the_exact_encoder(
    spy: Spy, value: Any
) -> None:
    # The one rule the quick walk leaves to cbor2 (so that no text is encoded or asked whether
    # it is ASCII twice): cbor2 refuses a lone surrogate itself, and the exact encoder names it.
    with pytest.raises(CodecError) as got:
        codec.encode(value)
    with pytest.raises(CodecError) as expected:
        reference_codec.encode(value)
    assert got.value.message == expected.value.message
    assert spy.encoded == [value]


def test_the_quick_walk_bound_hands_over_to_the_exact_count(spy: Spy) -> None:
    # Four bytes counted per character of text: over max_bytes by that bound, the exact count
    # decides, so text that fits still goes to cbor2 and text that does not never does.
    limits = CodecLimits(max_bytes=1000)
    assert codec_fast.walk(["\u00e9" * 200, "x" * 300], 1000, 32, 4096, 65536)
    assert not codec_fast.walk(["\u00e9" * 300, "x" * 401], 1000, 32, 4096, 65536)
    assert codec.decode(codec.encode(["\u00e9" * 200, "x" * 300], limits), limits)[1] == "x" * 300
    assert len(spy.encoded) == 1


def python_loads(data: bytes, **options: Any) -> Any:
    return cbor2.loads(data, **options)


def python_dumps(value: Any) -> bytes:
    return cbor2.dumps(value)


class FakeCbor2:
    """A stand-in for the cbor2 module, to see which versions the fast path accepts."""

    CBORDecodeError = cbor2.CBORDecodeError

    def __init__(self, loads: Any, dumps: Any) -> None:
        self.loads = loads
        self.dumps = dumps


@pytest.mark.parametrize(
    ("loads", "dumps", "usable"),
    [
        (cbor2.loads, cbor2.dumps, True),
        # No allow_duplicate_keys (cbor2 before it had one): duplicates would pass silently.
        (len, cbor2.dumps, False),
        # The pure-Python cbor2: slower than the exact codec.
        (python_loads, cbor2.dumps, False),
        (cbor2.loads, python_dumps, False),
    ],
    ids=["c-with-option", "no-option", "python-loads", "python-dumps"],
)
def test_backend_is_used_only_when_it_can_keep_the_bounds(
    monkeypatch: pytest.MonkeyPatch, loads: Any, dumps: Any, usable: bool
) -> None:
    monkeypatch.setitem(sys.modules, "cbor2", FakeCbor2(loads, dumps))
    found = codec_fast.backend.__wrapped__()
    assert (found is not None) == usable


FLAT = [
    [2, "x" * 60],  # a log request
    {"key": "x" * 57},  # the benchmark's lookup request
    [],
    {},
    [0, 23, 24, 255, 256, 65535, 65536, 2**32, 2**64 - 1, -1, -24, -25, -(2**64)],
    [True, False, None, b"", b"\x00" * 23, b"\x01" * 24, "", "é" * 11, "y" * 300],
    {1: "a", -3: None, "k": b"v", "t": True},
    list(range(23)),
    {"level": 2, "message": "disk 81% full on /var", "ok": True, "n": None, "t": 1.5},
    [0.1, -2.5e300, float("inf"), 5e-324],  # float64, as the exact decoder reads it
]


@pytest.mark.parametrize("value", FLAT, ids=lambda v: repr(v)[:24])
def test_small_flat_requests_are_built_without_scan_or_cbor2(spy: Spy, value: Any) -> None:
    payload = reference_codec.encode(value)
    built = codec_fast.flat(payload, 4096, 65536)
    assert built == value and type(built) is type(value)
    assert repr(codec.decode(payload)) == repr(reference_codec.decode(payload))
    assert spy.decoded == []


@pytest.mark.parametrize(
    "payload",
    [
        b"\x82\x62\xff\xfe\x00",  # bad UTF-8
        b"\xa2\x61a\x00\x61a\x01",  # a duplicate key
        b"\xa1\x41k\x00",  # a byte string key
        b"\xa1\xf6\x00",  # a null key
        b"\x82\x00",  # truncated
        b"\x82\x00\x78\x05ab",  # a string cut short
        b"\x81\x00\x00",  # trailing
        b"\x81\x81\x00",  # nested: the scan's
        b"\x81\xf9\x3c\x00",  # a float16: the scan's
        b"\x81\xfa\x3f\xc0\x00\x00",  # a float32: the scan's
        b"\xa1\xfb\x3f\xf8\x00\x00\x00\x00\x00\x00\x00",  # a float key
        b"\x81\xfb\x3f\xf8\x00\x00",  # a float64 cut short
        b"\x81\xc2\x41\x01",  # a tag
        b"\x81\xf8\x20",  # a two-byte simple value
        b"\x81\x5f\x41\x00\xff",  # an indefinite string
        b"\x81\x1c",  # a reserved head
        b"\x81\x7a\xff\xff\xff\xff",  # a text claiming 4 GiB
        b"\x97" + b"\x00" * 23,  # 24 items: over max_items=20 below
        b"\x81\x78\x19" + b"z" * 25,  # a text over max_string=24 below
    ],
    ids=lambda p: p[:8].hex(),
)
def test_the_flat_path_leaves_everything_else_to_the_checked_paths(payload: bytes) -> None:
    assert codec_fast.flat(payload, 20, 24) is codec_fast.UNSURE


@pytest.mark.parametrize(
    "payload",
    [
        b"\xa1\x62a",  # a key cut short
        b"\xa1\x61a",  # a value missing
        b"\xa1\x61\xff\x00",  # a key that is not UTF-8
        b"\xa1\x61a\x62\xff\xfe",  # a value that is not UTF-8
        b"\xa2\x61a\x00\x61a\x01",  # a duplicate key
        b"\xa1\x61a\x00\x00",  # trailing
        b"\xa1\x61a\x81\x00",  # a nested value: the scan's
        b"\xa1\x61a\x78\x19" + b"z" * 25,  # a text over max_string=24 below
        b"\xa1\x61a\x59\x00\x19" + b"z" * 25,  # a byte string over it, with a two-byte length
        b"\xa1\x61a\x78\x05ab",  # a value cut short
        b"\xa1\x61a\xfb\x3f\xf8",  # a float64 cut short
        b"\xa1\x61a\x1b\x00\x00",  # an integer argument cut short
        b"\xa1\x61a\xf7",  # undefined
        b"\xa1\x61a\xc2\x41\x01",  # a tag
        b"\xa1\x61a\x1f",  # a reserved head
        b"\xab" + b"\x61a\x00" * 11,  # 23 items: over max_items=20 below
    ],
    ids=lambda p: p[:8].hex(),
)
def test_the_text_keyed_map_path_refuses_what_the_exact_decoder_must_name(
    spy: Spy, payload: bytes
) -> None:
    # Maps whose keys are short text take their own loop in flat(): anything it cannot vouch
    # for is UNSURE, and decode() then gives the exact decoder's value or error.
    assert codec_fast.flat(payload, 20, 24) is codec_fast.UNSURE
    limits = CodecLimits(max_bytes=1024, max_items=20, max_string_bytes=24)
    assert repr(outcome(codec.decode, payload, limits)) == repr(
        outcome(reference_codec.decode, payload, limits)
    )


@pytest.mark.parametrize(
    ("payload", "value"),
    [
        (b"\xa1\x61a\x18\x05", {"a": 5}),  # a non-minimal head: read as the exact decoder does
        (b"\xa1\x61a\x19\x00\x05", {"a": 5}),
        (b"\xa1\x61a\x3b" + b"\xff" * 8, {"a": -(2**64)}),
        (b"\xa2\x61a\x00\x01\x00", {"a": 0, 1: 0}),  # an int key after a text key: the general loop
        (b"\xa2\x01\x00\x61a\x00", {1: 0, "a": 0}),
        (b"\xa1\x78\x01a\x00", {"a": 0}),  # a text key with a one-byte length: the general loop
    ],
    ids=lambda p: p.hex() if isinstance(p, bytes) else "",
)
def test_the_text_keyed_map_path_reads_what_the_exact_decoder_reads(
    spy: Spy, payload: bytes, value: Any
) -> None:
    built = codec_fast.flat(payload, 4096, 65536)
    assert built == value and list(built) == list(value)
    assert repr(codec.decode(payload)) == repr(reference_codec.decode(payload))
    assert spy.decoded == []


def outcome(function: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("value", function(*args))
    except CodecError as exc:
        return ("error", exc.message)


FLAT_ANSWERS = [
    {"level": 2, "message": "disk 81% full on /var", "ok": True, "n": None, "t": 1.5},
    [2, "x" * 60],
    [],
    {},
    (1, "a"),
    [0, 23, 24, 255, -1, -24, -25, -256],
    [b"", b"\x00" * 23, b"\x01" * 24, b"\x02" * 255, "", "y" * 23, "y" * 24, "y" * 255],
    ["\u00e9" * 11, "\u20ac" * 85],  # 255 bytes of UTF-8
    {"\u00e9t\u00e9": "\U0001f600", "k" * 255: b"v"},
    [0.0, -0.0, 1e300, float("inf"), float("-inf"), float("nan")],  # float64, as written
    list(range(23)),
    {f"k{i}": i for i in range(23)},
]


@pytest.mark.parametrize("value", FLAT_ANSWERS, ids=lambda v: repr(v)[:24])
def test_small_flat_answers_are_written_without_walk_or_cbor2(spy: Spy, value: Any) -> None:
    expected = reference_codec.encode(value)
    assert codec_fast.flat_encode(value, 1 << 20, 4096, 65536) == expected
    assert codec.encode(value) == expected
    assert spy.encoded == []


class Text(str):
    pass


DEFAULT = codec.DEFAULT_LIMITS


@pytest.mark.parametrize(
    ("value", "limits"),
    [
        ({1: "a"}, DEFAULT),  # an int key: the walk's (cbor2 writes it)
        ({Text("k"): 1}, DEFAULT),  # a subclass key: the exact encoder's
        ({"k": Text("v")}, DEFAULT),  # a subclass value
        ({True: 1}, DEFAULT),  # refused by the exact encoder
        ({None: 1}, DEFAULT),
        ([[1]], DEFAULT),  # nested
        ([256], DEFAULT),  # integers past the one-byte heads: the walk's
        ([-257], DEFAULT),
        ([2**64], DEFAULT),  # refused
        (["x" * 256], DEFAULT),  # longer strings: the walk's
        ([b"x" * 256], DEFAULT),
        (["\u00e9" * 128], DEFAULT),  # 256 bytes in UTF-8
        ({"k" * 256: 1}, DEFAULT),
        ([bytearray(b"x")], DEFAULT),
        (["\ud800"], DEFAULT),  # no UTF-8 form: refused
        ({"\ud800": 1}, DEFAULT),
        ([object()], DEFAULT),
        (list(range(24)), DEFAULT),  # 24 children: the walk's
        ([1, 2, 3, 4, 5], CodecLimits(max_bytes=64, max_items=5)),  # 6 items: over the limit
        ({"a": 1, "b": 2}, CodecLimits(max_bytes=64, max_items=4)),
        (["abc"], CodecLimits(max_bytes=64, max_string_bytes=254)),  # a lower string limit
        (["x" * 100], CodecLimits(max_bytes=100)),  # over max_bytes
        ({"k": b"x" * 200, "l": b"y" * 200}, CodecLimits(max_bytes=400)),
    ],
    # An object's repr holds its address, which differs between processes: pytest-xdist's
    # workers must collect the same ids.
    ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v))[:24],
)
def test_the_flat_writer_leaves_everything_else_to_the_checked_paths(
    value: Any, limits: CodecLimits
) -> None:
    assert (
        codec_fast.flat_encode(value, limits.max_bytes, limits.max_items, limits.max_string_bytes)
        is None
    )
    assert repr(outcome(codec.encode, value, limits)) == repr(
        outcome(reference_codec.encode, value, limits)
    )


def test_the_flat_writer_keeps_a_bounded_set_of_keys() -> None:
    codec_fast._KEYS.clear()
    for index in range(3 * codec_fast._MAX_KEYS):
        value = {f"key-{index}": index % 256, "k": None}
        assert codec.encode(value) == reference_codec.encode(value)
        assert len(codec_fast._KEYS) <= codec_fast._MAX_KEYS
    # A key seen before and a new one encode the same whether or not the cache holds them.
    assert codec.encode({"key-0": 1}) == reference_codec.encode({"key-0": 1})


RUNS = [
    b"\x98\x19" + b"\x61a" * 25,  # one-letter texts (24 elements and more: not flat()'s)
    b"\x98\x20" + b"\x18\x30" * 32,  # integers with a one-byte argument
    b"\x98\x18" + b"\xfb\x3f\xf8\x00\x00\x00\x00\x00\x00" * 24,  # float64s
    b"\x98\x18" + b"\xf6" * 24,  # nulls
    b"\x98\x18" + b"\x43abc" * 24,  # short byte strings
    b"\xa1\x61k\x90" + b"\x00" * 16,  # a run of 16 inside a map
]


@pytest.mark.parametrize("payload", RUNS, ids=lambda p: p[:4].hex())
def test_runs_of_same_sized_scalars_are_scanned_in_one_step(spy: Spy, payload: bytes) -> None:
    # A run's elements are vouched for by their heads at the first one's stride; any damage
    # to a head, a length or the end of the buffer must still give the exact decoder's answer.
    assert codec_fast.scan(payload, 32, 4096, 65536)
    assert repr(codec.decode(payload)) == repr(reference_codec.decode(payload))
    assert spy.decoded == [payload]
    limits = CodecLimits(max_bytes=1024, max_items=30, max_string_bytes=2)
    for damaged in (
        *(payload[:cut] for cut in range(len(payload))),
        payload + b"\x00",
        *(
            payload[:at] + bytes((byte,)) + payload[at + 1 :]
            for at in range(len(payload))
            for byte in (0x00, 0x18, 0x43, 0x61, 0x62, 0x78, 0x81, 0xC2, 0xF6, 0xF7, 0xFB, 0xFF)
        ),
    ):
        for bounds in (codec.DEFAULT_LIMITS, limits):
            assert repr(outcome(codec.decode, damaged, bounds)) == repr(
                outcome(reference_codec.decode, damaged, bounds)
            ), damaged.hex()


@pytest.mark.parametrize(
    ("value", "vouched"),
    [
        ([{"a": "x" * 10, "b": "y" * 10}], True),  # texts sum past 16 characters, each within
        ([{"a": "\u00e9" * 20}], True),  # 20 characters, 40 bytes: within 64
        ([{"a": "\u00e9" * 40}], False),  # 80 bytes: past the limit
        ([{"k": ["x" * 10, "y" * 10]}], True),  # the record's list counts with the record
        ([{"k": ["x" * 65]}], False),
        ([{"a": 1, 5: "z" * 20}], True),  # an int key
        ([{"a": 1}, {"b": "x" * 65}], False),
        ([{"\u00e9" * 33: 1}], False),  # a key past the limit
        ([{"k": ["x"] * 65}], True),  # a long list in a record: walked on its own
        ([{"k": ["x" * 65] * 65}], False),
        ({"a": "x" * 10, "b": "y" * 10}, True),  # a map on its own: the same
        ({"a": "\u00e9" * 40}, False),
        ({"k": ["x" * 10, "y" * 10]}, True),
        ({"k": ["x" * 10] * 65}, True),
        ({"k": ["x" * 10] * 64 + ["x" * 65]}, False),
        ({f"k{i}": "x" * 10 for i in range(65)}, True),  # a big map: text by text
        ({**{f"k{i}": 1 for i in range(64)}, "z": "x" * 65}, False),
    ],
    ids=lambda v: repr(v)[:24],
)
def test_a_records_texts_are_bounded_together_then_one_by_one(
    spy: Spy, value: Any, vouched: bool
) -> None:
    # The walk sums a record's text lengths without testing each: a sum within a quarter of
    # the string limit bounds them all; past it, the record is walked again text by text.
    limits = CodecLimits(max_bytes=4096, max_string_bytes=64)
    assert codec_fast.walk(value, 4096, 32, 4096, 64) is vouched
    assert repr(outcome(codec.encode, value, limits)) == repr(
        outcome(reference_codec.encode, value, limits)
    )
    assert len(spy.encoded) == int(vouched)
