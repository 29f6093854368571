"""The bounded CBOR codec of the ABI (``abi/README.md`` section 9).

Pure: no I/O, no engine. Every byte string handed to :func:`decode` comes from an untrusted
guest, so the decoder checks each length against the limits and against the bytes actually left
*before* it slices or allocates anything, and it fails only with :class:`CodecError`.

Counting rules shared with the guest SDK (and pinned by ``abi/vectors/cbor.json``):

- *depth* counts nested arrays and maps: ``[0]`` has depth 1, a bare ``0`` depth 0;
- *items* counts every data item: each array or map itself, each element, each map key and each
  map value, so ``[0, 0]`` is three items and ``{"a": 0}`` three as well.

Speed (``benchmarks/bench_codec.py``): a payload that is one scalar (a string, a small integer,
null, a boolean) is handled by :func:`decode` and :func:`encode` themselves; a small array or map
of scalars by one loop of :mod:`wasihost.core.codec_fast` (``flat``, ``flat_encode``); any other
payload is first checked against every bound there (a scan of its heads, or a walk of the value)
and then built by cbor2's C code. Whatever those paths do not vouch for, and so
every error, goes to the exact decoder and encoder below, the codec as it always was:
``tests/core/test_codec_differential.py`` proves the whole gives the same value, bytes or error as
that codec alone (kept as ``tests/support/reference_codec.py``).
"""

from __future__ import annotations

import struct
from typing import Any, Final, TypeAlias, cast

import attrs

from wasihost.core import codec_fast
from wasihost.core.errors import CodecError, ConfigError

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_STRING_BYTES",
    "HARD_MAX_DEPTH",
    "CodecLimits",
    "Value",
    "decode",
    "decode_counted",
    "encode",
]

# A decoded CBOR value of the profile; the quoted names are how the alias refers to itself.
Value: TypeAlias = (
    bool | int | float | str | bytes | list["Value"] | dict[str | int, "Value"] | None
)

# 1 MiB: far above every ABI entry's own request limit, low enough that one payload cannot
# pressure host memory.
DEFAULT_MAX_BYTES: Final = 1024 * 1024
# The ABI's nesting limit (section 9): deep enough for any real document.
DEFAULT_MAX_DEPTH: Final = 32
# The ABI's data item limit (section 9): bounds the Python objects one payload can create.
DEFAULT_MAX_ITEMS: Final = 4096
# The ABI's string limit (section 9): 64 KiB per text or byte string.
DEFAULT_MAX_STRING_BYTES: Final = 65536
# The codec recurses once per nesting level; this keeps it far from Python's recursion limit.
HARD_MAX_DEPTH: Final = 256

# The largest argument a CBOR head can carry (additional information 27, eight bytes).
_UINT64_MAX: Final = (1 << 64) - 1
# A message quotes at most this many characters of a guest's key, so errors stay short.
_QUOTE_CHARS: Final = 32

_FLOAT16: Final = struct.Struct(">e")
_FLOAT32: Final = struct.Struct(">f")
_FLOAT64: Final = struct.Struct(">d")

_MAJOR_NAMES: Final = (
    "unsigned integer",
    "negative integer",
    "byte string",
    "text string",
    "array",
    "map",
    "tag",
    "simple value or float",
)


def _positive_int(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    # bool is an int in Python, but ``max_depth=True`` is a bug, not a limit of 1.
    if type(value) is not int or value < 1:
        raise ConfigError(f"CodecLimits.{attribute.name} must be a positive int, got {value!r}")


def _depth_in_range(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    _positive_int(instance, attribute, value)
    if value > HARD_MAX_DEPTH:
        raise ConfigError(f"CodecLimits.max_depth must be at most {HARD_MAX_DEPTH}, got {value}")


@attrs.frozen
class CodecLimits:
    """The bounds one payload must stay within; all are inclusive."""

    max_bytes: int = attrs.field(validator=_positive_int)
    max_depth: int = attrs.field(default=DEFAULT_MAX_DEPTH, validator=_depth_in_range)
    max_items: int = attrs.field(default=DEFAULT_MAX_ITEMS, validator=_positive_int)
    max_string_bytes: int = attrs.field(default=DEFAULT_MAX_STRING_BYTES, validator=_positive_int)


DEFAULT_LIMITS: Final = CodecLimits(max_bytes=DEFAULT_MAX_BYTES)


def _quote(key: str | int) -> str:
    text = repr(key)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


# -- decoding ------------------------------------------------------------------------------------


class _Decoder:
    """One pass over one payload; ``pos`` only moves forward."""

    __slots__ = ("buf", "end", "items_left", "limits", "max_depth", "max_string", "pos")

    def __init__(self, buf: bytes, limits: CodecLimits) -> None:
        self.buf = buf
        self.end = len(buf)
        self.pos = 0
        # Every item but the top one is a child of some container, and a container charges all
        # its children when its head is read: so the budget is spent before anything is built.
        self.items_left = limits.max_items - 1
        self.limits = limits
        self.max_depth = limits.max_depth
        self.max_string = limits.max_string_bytes

    def item(self, depth: int) -> Value:
        # The hot path: attributes copied into locals, and the cases ordered by how often
        # payloads use them (text, unsigned, map, array, then the rest).
        buf = self.buf
        pos = self.pos
        end = self.end
        if pos >= end:
            raise CodecError(f"truncated: item expected at offset {pos}")
        initial = buf[pos]
        major = initial >> 5
        info = initial & 0x1F
        pos += 1
        if info < 24:
            arg = info
        elif info < 28:
            size = 1 << (info - 24)
            if size > end - pos:
                raise CodecError(f"truncated: {size}-byte argument at offset {pos}")
            if major == 7:
                self.pos = pos + size
                number: float
                if info == 27:
                    (number,) = _FLOAT64.unpack_from(buf, pos)
                elif info == 26:
                    (number,) = _FLOAT32.unpack_from(buf, pos)
                elif info == 25:
                    (number,) = _FLOAT16.unpack_from(buf, pos)
                else:
                    raise CodecError(f"simple value {buf[pos]} not allowed")
                return number
            arg = int.from_bytes(buf[pos : pos + size], "big")
            pos += size
        else:
            raise _bad_info(major, info)

        if major == 3:
            if arg > self.max_string:
                raise CodecError(f"text string of {arg} bytes exceeds {self.max_string}")
            if arg > end - pos:
                raise CodecError(f"truncated: text string of {arg} bytes at offset {pos}")
            self.pos = pos + arg
            try:
                return buf[pos : pos + arg].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _bad_utf8(exc) from None
        self.pos = pos
        if major == 0:
            return arg
        if major == 5:
            return self._map(self._enter(depth, arg, 2 * arg), arg)
        if major == 4:
            depth = self._enter(depth, arg, arg)
            result: list[Value] = []
            append = result.append
            item = self.item
            for _ in range(arg):
                append(item(depth))
            return result
        if major == 7:
            return _simple(info)
        if major == 1:
            return -1 - arg
        if major == 2:
            if arg > self.max_string:
                raise CodecError(f"byte string of {arg} bytes exceeds {self.max_string}")
            if arg > end - pos:
                raise CodecError(f"truncated: byte string of {arg} bytes at offset {pos}")
            self.pos = pos + arg
            return buf[pos : pos + arg]
        raise CodecError(f"tag {arg} not allowed")

    def _enter(self, depth: int, count: int, children: int) -> int:
        depth += 1
        if depth > self.max_depth:
            raise CodecError(f"nesting deeper than {self.max_depth}")
        self.items_left -= children
        if self.items_left < 0:
            raise CodecError(f"more than {self.limits.max_items} data items")
        # Every child takes at least one byte: a count beyond the bytes left is a lie, and the
        # list or dict must not be built for it.
        if children > self.end - self.pos:
            raise CodecError(f"truncated: container of {count} entries at offset {self.pos}")
        return depth

    def _map(self, depth: int, count: int) -> dict[str | int, Value]:
        result: dict[str | int, Value] = {}
        buf = self.buf
        end = self.end
        item = self.item
        key: str | int
        for _ in range(count):
            pos = self.pos
            if pos >= end:
                raise CodecError(f"truncated: map key expected at offset {pos}")
            initial = buf[pos]
            if 0x60 <= initial <= 0x77:
                # Keys are nearly always short text: decoding them here rather than through
                # item() saves a call per key, about a sixth of a typical map's decoding time.
                stop = pos + 1 + (initial - 0x60)
                if stop > end:
                    raise CodecError(f"truncated: text string at offset {pos + 1}")
                self.pos = stop
                try:
                    key = buf[pos + 1 : stop].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _bad_utf8(exc) from None
            elif initial >> 5 in (0, 1, 3):
                key = cast("str | int", item(depth))
            else:
                # Refused on the head, so a container key is never built.
                raise CodecError(
                    f"map key of type {_MAJOR_NAMES[initial >> 5]} not allowed"
                    " (text or integer only)"
                )
            if key in result:
                raise CodecError(f"duplicate map key {_quote(key)}")
            result[key] = item(depth)
        return result


def _bad_utf8(exc: UnicodeDecodeError) -> CodecError:
    return CodecError(f"text string is not valid UTF-8 (byte {exc.start})")


def _simple(info: int) -> Value:
    if info == 20:
        return False
    if info == 21:
        return True
    if info == 22:
        return None
    if info == 23:
        raise CodecError("undefined not allowed")
    raise CodecError(f"simple value {info} not allowed")


def _bad_info(major: int, info: int) -> CodecError:
    if info == 31:
        if major in (2, 3, 4, 5):
            return CodecError(f"indefinite-length {_MAJOR_NAMES[major]} not allowed")
        if major == 7:
            return CodecError("unexpected break code")
    return CodecError(f"reserved additional information {info} for {_MAJOR_NAMES[major]}")


def decode(data: bytes | bytearray | memoryview, limits: CodecLimits = DEFAULT_LIMITS) -> Value:
    """Decode exactly one CBOR item that fills ``data``.

    Raises :class:`CodecError`, and nothing else, for any content of ``data``. An empty buffer is
    an error too: callers for which "no request" is legal check for it before calling.
    """
    if isinstance(data, bytes):
        buf = data
        size = len(buf)
        if size == 0:
            raise CodecError("empty payload")
        if size > limits.max_bytes:
            raise CodecError(f"payload of {size} bytes exceeds {limits.max_bytes}")
    else:
        buf = _as_bytes(data, limits)
        size = len(buf)

    # One scalar filling the payload, whole and within the limits, is answered here.
    initial = buf[0]
    if 0x40 <= initial <= 0x79:
        # A byte or text string with a head of one, two or three bytes.
        length = initial & 0x1F
        start = 1
        if length == 24 and size > 1:
            start = 2
            length = buf[1]
        elif length == 25 and size > 2:
            start = 3
            length = buf[1] << 8 | buf[2]
        if (length < 24 or start > 1) and (
            start + length == size and length <= limits.max_string_bytes
        ):
            if initial < 0x60:
                return buf[start:]
            try:
                return buf[start:].decode()  # UTF-8, strict; no argument is the quicker call
            except UnicodeDecodeError as exc:
                raise _bad_utf8(exc) from None
    elif size == 1:
        if initial < 0x18:
            return initial
        if initial == 0xF6:
            return None
        if 0x20 <= initial < 0x38:
            return 0x1F - initial
        if initial == 0xF5:
            return True
        if initial == 0xF4:
            return False
        if initial == 0x80:
            return []
        if initial == 0xA0:
            return {}

    elif 0x80 <= initial < 0x98 or 0xA0 <= initial < 0xB8:
        # A small array or map of scalars (most host-call requests) is built in one loop.
        value = codec_fast.flat(buf, limits.max_items, limits.max_string_bytes)
        if value is not codec_fast.UNSURE:
            built: Value = value
            return built
    return _decode_any(buf, size, limits)[0]


def decode_counted(
    data: bytes | bytearray | memoryview, limits: CodecLimits = DEFAULT_LIMITS
) -> tuple[Value, int]:
    """:func:`decode`, with the number of data items the value holds (the work its decoding
    took grows with them: the engine prices a host call's request by them, after its own
    one-loop path for a flat request). A refusal's :class:`CodecError` carries ``items``, what
    was read before it."""
    buf = data if isinstance(data, bytes) else _as_bytes(data, limits)
    size = len(buf)
    if size == 0:
        raise CodecError("empty payload")
    if size > limits.max_bytes:
        raise CodecError(f"payload of {size} bytes exceeds {limits.max_bytes}")
    return _decode_any(buf, size, limits)


def _as_bytes(data: bytearray | memoryview, limits: CodecLimits) -> bytes:
    """A bytearray's or a view's bytes, copied only once known to be in bounds."""
    if not isinstance(data, bytearray | memoryview):
        raise TypeError(f"decode() takes bytes, bytearray or memoryview, not {type(data).__name__}")
    try:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
    except ValueError:  # a released memoryview
        raise CodecError("payload buffer was released") from None
    if size == 0:
        raise CodecError("empty payload")
    # Size first: a view of guest memory is copied only once it is known to be in bounds.
    if size > limits.max_bytes:
        raise CodecError(f"payload of {size} bytes exceeds {limits.max_bytes}")
    return bytes(data)


def _decode_any(buf: bytes, size: int, limits: CodecLimits) -> tuple[Value, int]:
    """Any payload, and its data items: what the scan vouches for is built by cbor2's C code.
    cbor2 still refuses invalid UTF-8 and duplicate keys; for those, as for all the scan does
    not vouch for, the exact decoder says what is wrong."""
    counted = codec_fast.decode_counted(
        buf, limits.max_depth, limits.max_items, limits.max_string_bytes
    )
    # The items the scan went through when cbor2 refused what it vouched for (the work done
    # before the exact decoder's, which a refusal's price must cover too).
    scanned = 0
    if counted is not codec_fast.UNSURE:
        if counted[0] is not codec_fast.UNSURE:
            built_fast: tuple[Value, int] = counted
            return built_fast
        scanned = counted[1]

    decoder = _Decoder(buf, limits)
    try:
        value = decoder.item(0)
        if decoder.pos != size:
            raise CodecError(f"trailing bytes after the item ({size - decoder.pos})")
    except RecursionError:
        # Only reachable when the caller is itself deep in the stack: max_depth is capped.
        error = CodecError("nesting too deep for the host stack")
        error.items = max(_items_read(decoder), scanned)
        raise error from None
    except CodecError as exc:
        exc.items = max(_items_read(decoder), scanned)
        raise
    # The budget was max_items - 1 for every item but the top one.
    return value, limits.max_items - decoder.items_left


def _items_read(decoder: _Decoder) -> int:
    """The items a refused decode had read, at most: those charged to its budget (a container
    charges its children when its head is read, so a count that lies is charged whole), but no
    more than the budget, nor than the bytes it reached (every item takes one)."""
    return min(decoder.limits.max_items - decoder.items_left, decoder.limits.max_items, decoder.pos)


# -- encoding ------------------------------------------------------------------------------------


# Whole heads of the strings and small integers the scalar path of encode() writes.
_BYTES_HEADS: Final = tuple(bytes((0x40 | n,) if n < 24 else (0x58, n)) for n in range(256))
_TEXT_HEADS: Final = tuple(bytes((0x60 | n,) if n < 24 else (0x78, n)) for n in range(256))
_SMALL_UINTS: Final = tuple(bytes((n,)) for n in range(24))


class _Encoder:
    """Writes shortest heads and float64 floats into one growing buffer."""

    __slots__ = ("items_left", "limits", "max_bytes", "max_depth", "max_string", "out")

    def __init__(self, limits: CodecLimits) -> None:
        self.out = bytearray()
        self.items_left = limits.max_items
        self.limits = limits
        self.max_bytes = limits.max_bytes
        self.max_depth = limits.max_depth
        self.max_string = limits.max_string_bytes

    def head(self, major: int, arg: int) -> None:
        out = self.out
        initial = major << 5
        if arg < 24:
            out.append(initial | arg)
        elif arg <= 0xFF:
            out.append(initial | 24)
            out.append(arg)
        elif arg <= 0xFFFF:
            out.append(initial | 25)
            out += arg.to_bytes(2, "big")
        elif arg <= 0xFFFF_FFFF:
            out.append(initial | 26)
            out += arg.to_bytes(4, "big")
        else:
            out.append(initial | 27)
            out += arg.to_bytes(8, "big")

    def item(self, value: Any, depth: int) -> None:
        # The hot path: exact types tested with ``is`` in order of frequency and the shortest
        # forms written inline; subclasses take the slow path at the end. ``value`` is Any so
        # that no cast() call is paid per item.
        self.items_left -= 1
        if self.items_left < 0:
            raise CodecError(f"more than {self.limits.max_items} data items")
        kind = type(value)
        out = self.out
        if kind is str:
            size = len(value)
            if size < 24 and size <= self.max_string and value.isascii():
                out.append(0x60 | size)
                out += value.encode("ascii")
            else:
                self.text(value)
        elif kind is int:
            if 0 <= value < 24:
                out.append(value)
            else:
                self.integer(value)
        elif value is None:
            out.append(0xF6)
        elif value is True:
            out.append(0xF5)
        elif value is False:
            out.append(0xF4)
        elif kind is dict:
            self.mapping(value, depth)
        elif kind is list or kind is tuple:
            self.sequence(value, depth)
        elif kind is float:
            out.append(0xFB)
            out += _FLOAT64.pack(value)
        elif kind is bytes or kind is bytearray:
            self.string(2, value, "byte string")
        else:
            self.subclass(value, depth)

    def text(self, value: str) -> None:
        # Longer in characters than the limit means longer in UTF-8 bytes: refuse before encoding.
        if len(value) > self.max_string:
            raise CodecError(
                f"text string of {len(value)} characters exceeds {self.max_string} bytes"
            )
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CodecError(f"text has no UTF-8 form (character {exc.start})") from None
        self.string(3, data, "text string")

    def string(self, major: int, data: bytes | bytearray, kind: str) -> None:
        if len(data) > self.max_string:
            raise CodecError(f"{kind} of {len(data)} bytes exceeds {self.max_string}")
        self.head(major, len(data))
        self.out += data
        # Checked as strings land (the only big pieces), so an oversized payload is never
        # built in full.
        if len(self.out) > self.max_bytes:
            raise CodecError(f"payload exceeds {self.max_bytes} bytes")

    def integer(self, value: int) -> None:
        if value >= 0:
            if value > _UINT64_MAX:
                raise CodecError(f"integer {value} above 2**64-1")
            self.head(0, value)
        else:
            arg = -1 - value
            if arg > _UINT64_MAX:
                raise CodecError(f"integer {value} below -2**64")
            self.head(1, arg)

    def enter(self, depth: int, children: int) -> int:
        depth += 1
        if depth > self.max_depth:
            raise CodecError(f"nesting deeper than {self.max_depth}")
        if children > self.items_left:
            raise CodecError(f"more than {self.limits.max_items} data items")
        return depth

    def sequence(self, value: list[Any] | tuple[Any, ...], depth: int) -> None:
        depth = self.enter(depth, len(value))
        self.head(4, len(value))
        item = self.item
        for element in value:
            item(element, depth)

    def mapping(self, value: dict[Any, Any], depth: int) -> None:
        depth = self.enter(depth, 2 * len(value))
        self.head(5, len(value))
        item = self.item
        for key, element in value.items():
            kind = type(key)
            if kind is not str and kind is not int and not _is_key_subclass(key):
                raise CodecError(
                    f"map key of type {kind.__name__} not allowed (text or integer only)"
                )
            item(key, depth)
            item(element, depth)

    def subclass(self, value: object, depth: int) -> None:
        # item() already charged this value; the base-type encoding below charges it again.
        self.items_left += 1
        base: object
        if isinstance(value, bool):  # unreachable (bool is final) but keeps int honest
            base = bool(value)
        elif isinstance(value, str):
            base = str.__str__(value)
        elif isinstance(value, int):
            base = int.__int__(value)
        elif isinstance(value, float):
            base = float.__float__(value)
        elif isinstance(value, bytes | bytearray):
            base = bytes(value)
        elif isinstance(value, list | tuple):
            base = list(value)
        elif isinstance(value, dict):
            base = dict(value)
        else:
            raise CodecError(f"cannot encode a value of type {type(value).__name__}")
        self.item(base, depth)


def _is_key_subclass(key: object) -> bool:
    return isinstance(key, str | int) and not isinstance(key, bool)


def encode(value: object, limits: CodecLimits = DEFAULT_LIMITS) -> bytes:
    """Encode ``value`` as one CBOR item within ``limits``.

    Accepts None, bool, int, float, str, bytes, bytearray, list, tuple and dict with str or int
    keys (and subclasses of these, encoded as the base type). Integers must lie in
    ``[-2**64, 2**64 - 1]``; floats are written as float64. Raises :class:`CodecError` otherwise.
    """
    item: Any = value  # tested with ``is`` on its exact type, as _Encoder.item() does
    kind = type(item)
    # One scalar within the limits is encoded here (max_bytes and max_items are at least 1).
    if kind is bytes:
        size = len(item)
        if size < 256:
            if size <= limits.max_string_bytes and size + 2 <= limits.max_bytes:
                whole: bytes = _BYTES_HEADS[size] + item
                return whole
        elif size < 0x10000 and size <= limits.max_string_bytes and size + 3 <= limits.max_bytes:
            # A two-byte length (a 4 KiB payload): the head made here, the bytes copied once.
            headed: bytes = b"\x59" + size.to_bytes(2, "big") + item
            return headed
    elif kind is str:
        size = len(item)
        if size < 256 and size <= limits.max_string_bytes and item.isascii():
            data: bytes = _TEXT_HEADS[size] + item.encode("ascii")
            # Longer than the limit: the exact encoder's message says how it was measured.
            if len(data) <= limits.max_bytes:
                return data
    elif item is None:
        return b"\xf6"
    elif kind is int:
        if 0 <= item < 24:
            small: bytes = _SMALL_UINTS[item]
            return small
    elif item is True:
        return b"\xf5"
    elif item is False:
        return b"\xf4"
    else:
        if (kind is dict or kind is list or kind is tuple) and len(item) < 24:
            # A small array or map of scalars (most answers) is written in one loop.
            written = codec_fast.flat_encode(
                item, limits.max_bytes, limits.max_items, limits.max_string_bytes
            )
            if written is not None:
                return written
        # A value the walk vouches for is encoded by cbor2's C code, which writes the same bytes
        # (shortest heads, float64); one too long for max_bytes goes to the exact encoder for
        # its error, having cost at most max_bytes + 9 * max_items bytes.
        fast = codec_fast.encode(
            item, limits.max_bytes, limits.max_depth, limits.max_items, limits.max_string_bytes
        )
        if fast is not None:
            return fast

    encoder = _Encoder(limits)
    try:
        encoder.item(value, 0)
    except RecursionError:
        raise CodecError("nesting too deep for the host stack") from None
    out = encoder.out
    if len(out) > limits.max_bytes:
        raise CodecError(f"payload of {len(out)} bytes exceeds {limits.max_bytes}")
    return bytes(out)
