"""The codec's fast path: bounded checks in Python, then cbor2's C code builds.

Pure: no I/O, no engine. :mod:`wasihost.core.codec` calls these first and keeps its own exact
decoder
and encoder for everything they do not vouch for, so every error still comes from there.

- :func:`scan` reads a payload's heads without building anything and says whether it is one
  well-formed item of the profile within the limits: definite lengths only, no tags, no simple
  values but false, true and null, map keys only text or integers, every string, the nesting
  and the item count within the limits, and the item filling the buffer exactly. Only two rules
  are left to cbor2, which refuses them itself: UTF-8 validity, and duplicate map keys (asked
  for with ``allow_duplicate_keys=False``). So cbor2 is handed only bytes whose every length and
  count is already bounded.
- :func:`walk` checks a host value before cbor2 encodes it: exact types of the profile only (a
  subclass goes to the exact encoder), integers in range, finite floats (cbor2 writes NaN and
  infinities as float16, the profile as float64), every string within the limit, nesting and
  items within the limits, and the string bytes within ``max_bytes``: so cbor2 builds at most
  ``max_bytes + 9 * max_items`` bytes before the caller checks the length. One rule is left to
  cbor2, which refuses it itself: a text with no UTF-8 form (a lone surrogate), so that the
  walk need not encode a short text, nor ask whether it is ASCII, to know its size is within
  the limit (four bytes a character at most).

- :func:`flat` and :func:`flat_encode` take the commonest small shape, an array or map of fewer
  than 24 scalars, without cbor2 at all: built or written in one Python loop whose bounds hold
  by construction (depth 1, a counted number of items, strings checked as they are read).

All are conservative: when unsure they say no, and the exact codec decides. The step tables say,
per initial byte, how long an item is when the byte alone tells, or how to read it.
"""

from __future__ import annotations

import functools
import struct
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

__all__ = [
    "UNSURE",
    "Backend",
    "backend",
    "decode_counted",
    "encode",
    "flat",
    "flat_encode",
    "scan",
    "walk",
]

# Integers the profile's majors 0 and 1 can carry.
_INT_MIN: Final = -(1 << 64)
_INT_MAX: Final = (1 << 64) - 1
_INF: Final = float("inf")
_FLOAT64: Final = struct.Struct(">d").unpack_from
_PACK_FLOAT64: Final = struct.Struct(">d").pack
# A head is at most nine bytes: the walk's bound on what one item adds beyond its string bytes.
MAX_HEAD_BYTES: Final = 9


# The length from which the scan checks an array for a run of same-sized scalars in C: below
# it the slice costs about what the Python loop would.
_RUN_MIN: Final = 16

# The walk sums the texts of a map or list of at most this many entries (a record, its list of
# tags) and tests the sum once; a bigger one tests each text, so that a sum past the limit
# never walks a long list twice.
_RECORD_MAX: Final = 64

# What decode() answers when the exact decoder must decide (None is a value).
UNSURE: Final = object()


if TYPE_CHECKING:
    # The scan's functions: (buf, pos, depth, left) for an item, (buf, pos, count, depth,
    # left) for a container's children; each answers the offset after and the budget left.
    _ItemScan = Callable[[bytes, int, int, int], tuple[int, int]]
    _ContainerScan = Callable[[bytes, int, int, int, int], tuple[int, int]]
    # The quick walk's: (value, depth, left), answering a bound of the string bytes and the
    # budget left; and the exact UTF-8 size of a long text.
    _ItemWalk = Callable[[Any, int, int], tuple[int, int]]
    _ListWalk = Callable[[list[Any] | tuple[Any, ...], int, int], tuple[int, int]]
    _MapWalk = Callable[[dict[Any, Any], int, int], tuple[int, int]]
    _TextSize = Callable[[str], int]


class _Unsure(Exception):
    """Raised inside a scan or walk: the exact codec must decide."""


# -- the C backend ---------------------------------------------------------------------------------


class Backend:
    """cbor2's C ``loads`` and ``dumps``, with the options the fast path relies on."""

    __slots__ = ("dumps", "loads")

    def __init__(self, loads: Callable[[bytes], Any], dumps: Callable[[Any], bytes]) -> None:
        self.loads = loads
        self.dumps = dumps


@functools.cache
def backend() -> Backend | None:
    """cbor2's C functions, or None when this cbor2 cannot serve (no C extension, or no
    ``allow_duplicate_keys``: then the exact codec does everything). Imported on first use, so
    that a process that never passes a structured value does not pay for the import."""
    try:
        import cbor2
    except ImportError:  # pragma: no cover - a dependency; checked for robustness only
        return None
    loads, dumps = cbor2.loads, cbor2.dumps
    if not isinstance(loads, types.BuiltinFunctionType) or not isinstance(
        dumps, types.BuiltinFunctionType
    ):
        return None  # the pure-Python cbor2 is slower than the exact codec
    try:
        loads(b"\xa2\x00\x00\x00\x00", allow_duplicate_keys=False)
    except TypeError:
        return None  # cbor2 before 6: duplicate keys would pass silently
    except cbor2.CBORDecodeError:
        pass
    else:  # pragma: no cover - an option that does not refuse is no use
        return None
    if dumps(1.5) != b"\xfb\x3f\xf8\x00\x00\x00\x00\x00\x00":  # pragma: no cover
        return None
    try:
        dumps("\ud800")
    except UnicodeEncodeError:
        pass
    else:  # pragma: no cover - the walk leaves texts without a UTF-8 form to cbor2 to refuse
        return None

    return Backend(functools.partial(loads, allow_duplicate_keys=False), dumps)


# -- decoding: the scan --------------------------------------------------------------------------


# Codes below zero in a step table: items the loops handle inline without a call, by their head.
_STRING_1: Final = -1  # a byte or text string with a one-byte length
_STRING_2: Final = -2  # ... with a two-byte length
_ARRAY: Final = -3  # an array of fewer than 24 elements
_MAP: Final = -4  # a map of fewer than 24 entries


@functools.cache
def _steps(max_string: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The step tables for values and for map keys under ``max_string``: per initial byte, the
    whole size of an item the byte alone tells, a code below zero, or 0 (look further in
    _Scanner.item(), which refuses what it does not know)."""
    value = [0] * 256
    for initial in range(0x18):
        value[initial] = value[0x20 | initial] = 1  # integers in the head
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        value[info] = value[0x20 | info] = 1 + width  # integers with an argument
    for length in range(min(23, max_string) + 1):
        value[0x40 | length] = value[0x60 | length] = 1 + length  # short strings
    value[0x58] = value[0x78] = _STRING_1
    value[0x59] = value[0x79] = _STRING_2
    for count in range(24):
        value[0x80 | count] = _ARRAY
        value[0xA0 | count] = _MAP
    value[0xF4] = value[0xF5] = value[0xF6] = 1  # false, true, null
    value[0xFB] = 9  # float64: cbor2 and the exact decoder give the same bits, NaNs included
    key = [0] * 256
    for initial in (*range(0x00, 0x40), *range(0x60, 0x80)):
        key[initial] = value[initial]
    return tuple(value), tuple(key)


class _Scanner:
    """The scan under one pair of limits: functions closing over the tables and limits (no
    attribute loads per item), one loop for arrays and one for maps (no test per child of which
    it is), the common children taken inline by their head; ``left``, the item budget, is
    threaded through the calls. A small map in an array (a record) and a small array in a map
    (a record's list of tags) are scanned inside their parent's loop, with the same checks as
    on their own: an array of records costs no call per record.

    A buffer cut short needs no check of its own: a length read past the end puts ``pos``
    past it for good, so the next head read raises IndexError or the final offset is not the
    end; and a count is compared with the bytes left before any loop runs."""

    __slots__ = ("item", "values")

    def __init__(self, max_depth: int, max_string: int) -> None:
        steps, keys = _steps(max_string)

        def item(buf: bytes, pos: int, depth: int, left: int) -> tuple[int, int]:
            """An item the loops do not take inline: the offset after it and the budget left."""
            initial = buf[pos]
            info = initial & 0x1F
            pos += 1
            if info < 24:
                arg = info
            elif info < 28:
                width = 1 << (info - 24)
                arg = int.from_bytes(buf[pos : pos + width], "big")
                pos += width
            else:
                raise _Unsure  # reserved, indefinite or break
            major = initial >> 5
            if major == 2 or major == 3:  # noqa: PLR1714 (a tuple costs more here)
                if arg > max_string:
                    raise _Unsure
                return pos + arg, left
            if major == 4:
                return array(buf, pos, arg, depth, left)
            if major == 5:
                return mapping(buf, pos, arg, depth, left)
            if major <= 1:
                return pos, left
            # float16 and float32 (the others are in the tables or refused): an infinity or a
            # NaN goes to the exact decoder, whose float16 NaNs lose their payload where
            # cbor2's keep it.
            if initial == 0xF9 and arg & 0x7C00 != 0x7C00:
                return pos, left
            if initial == 0xFA and arg & 0x7F80_0000 != 0x7F80_0000:
                return pos, left
            raise _Unsure  # a tag, undefined, another simple value, a float for the exact path

        # The loops over a container, each made by a factory of its own over the same limits
        # and tables; item() reads them from this frame's cells, bound before any scan runs.
        mapping = _scan_mapping(max_depth, max_string, steps, keys, item)
        array = _scan_array(max_depth, max_string, steps, keys, item)

        self.values = steps
        self.item = item


def _scan_array(
    max_depth: int,
    max_string: int,
    steps: tuple[int, ...],
    keys: tuple[int, ...],
    item: _ItemScan,
) -> _ContainerScan:
    """_Scanner's loop over the elements of an array, closing over the limits, the tables
    and item() as _Scanner's own functions do (no attribute loads per item)."""

    def array(buf: bytes, pos: int, count: int, depth: int, left: int) -> tuple[int, int]:
        """The elements of an array whose head ends at ``pos``, charged to the budget."""
        depth += 1
        left -= count
        # Every child takes at least one byte, as in the exact decoder.
        if depth > max_depth or left < 0 or count > len(buf) - pos:
            raise _Unsure
        if count >= _RUN_MIN:
            # A long run of same-sized scalars (ids, names of one width, numbers): when
            # every element's head, taken at the first one's stride, is the same byte,
            # each element is that whole item. One slice and one count, in C.
            step = steps[buf[pos]]
            if step > 0:
                stop = pos + step * count
                heads = buf[pos:stop:step]
                if stop <= len(buf) and heads.count(heads[0]) == count:
                    return stop, left
        for _ in range(count):
            step = steps[buf[pos]]
            if step > 0:
                pos += step
            elif step == -1:  # _STRING_1
                length = buf[pos + 1]
                if length > max_string:
                    raise _Unsure
                pos += 2 + length
            elif step == -2:  # _STRING_2
                length = buf[pos + 1] << 8 | buf[pos + 2]
                if length > max_string:
                    raise _Unsure
                pos += 3 + length
            elif step == -4:  # _MAP, a record: its entries here, as mapping() does them
                count_in = buf[pos] - 0xA0
                left -= 2 * count_in
                if depth >= max_depth or left < 0 or 2 * count_in >= len(buf) - pos:
                    raise _Unsure
                pos += 1
                inner = depth + 1
                for _ in range(count_in):
                    step = keys[buf[pos]]
                    if step > 0:
                        pos += step
                    elif 0x60 <= buf[pos] < 0x80:
                        pos, left = item(buf, pos, inner, left)
                    else:
                        raise _Unsure
                    step = steps[buf[pos]]
                    if step > 0:
                        pos += step
                    elif step == -2:  # _STRING_2
                        length = buf[pos + 1] << 8 | buf[pos + 2]
                        if length > max_string:
                            raise _Unsure
                        pos += 3 + length
                    elif step == -1:  # _STRING_1
                        length = buf[pos + 1]
                        if length > max_string:
                            raise _Unsure
                        pos += 2 + length
                    elif step == -3:  # _ARRAY, a record's list: here too
                        count_in = buf[pos] - 0x80
                        left -= count_in
                        if inner >= max_depth or left < 0 or count_in >= len(buf) - pos:
                            raise _Unsure
                        pos += 1
                        for _ in range(count_in):
                            step = steps[buf[pos]]
                            if step > 0:
                                pos += step
                            else:
                                pos, left = item(buf, pos, inner + 1, left)
                    else:
                        pos, left = item(buf, pos, inner, left)
            elif step == -3:  # _ARRAY
                pos, left = array(buf, pos + 1, buf[pos] - 0x80, depth, left)
            else:
                pos, left = item(buf, pos, depth, left)
        return pos, left

    return array


def _scan_mapping(
    max_depth: int,
    max_string: int,
    steps: tuple[int, ...],
    keys: tuple[int, ...],
    item: _ItemScan,
) -> _ContainerScan:
    """_Scanner's loop over the entries of a map, closing over the limits, the tables and
    item() as _Scanner's own functions do (no attribute loads per item)."""

    def mapping(buf: bytes, pos: int, count: int, depth: int, left: int) -> tuple[int, int]:
        """The entries of a map whose head ends at ``pos``, charged to the budget."""
        depth += 1
        left -= 2 * count
        if depth > max_depth or left < 0 or 2 * count > len(buf) - pos:
            raise _Unsure
        for _ in range(count):
            # The key first, on its own table: text or an integer only.
            step = keys[buf[pos]]
            if step > 0:
                pos += step
            elif 0x60 <= buf[pos] < 0x80:  # text with a longer head (or refused)
                pos, left = item(buf, pos, depth, left)
            else:
                raise _Unsure
            step = steps[buf[pos]]
            if step > 0:
                pos += step
            elif step == -2:  # _STRING_2
                length = buf[pos + 1] << 8 | buf[pos + 2]
                if length > max_string:
                    raise _Unsure
                pos += 3 + length
            elif step == -1:  # _STRING_1
                length = buf[pos + 1]
                if length > max_string:
                    raise _Unsure
                pos += 2 + length
            elif step == -3:  # _ARRAY, its elements here: one level deeper
                count_in = buf[pos] - 0x80
                left -= count_in
                if depth >= max_depth or left < 0 or count_in >= len(buf) - pos:
                    raise _Unsure
                pos += 1
                for _ in range(count_in):
                    step = steps[buf[pos]]
                    if step > 0:
                        pos += step
                    else:
                        pos, left = item(buf, pos, depth + 1, left)
            elif step == -4:  # _MAP
                pos, left = mapping(buf, pos + 1, buf[pos] - 0xA0, depth, left)
            else:
                pos, left = item(buf, pos, depth, left)
        return pos, left

    return mapping


# Scanners by (max_depth, max_string), built once: nearly every payload has the default limits.
# Bounded all the same, should an embedder vary its limits endlessly.
_SCANNERS: dict[tuple[int, int], _Scanner] = {}
_MAX_SCANNERS: Final = 64


def _scanner(max_depth: int, max_string: int) -> _Scanner:
    key = (max_depth, max_string)
    scanner = _SCANNERS.get(key)
    if scanner is None:
        if len(_SCANNERS) >= _MAX_SCANNERS:
            _SCANNERS.clear()
        scanner = _SCANNERS[key] = _Scanner(max_depth, max_string)
    return scanner


def scan(buf: bytes, max_depth: int, max_items: int, max_string: int) -> bool:
    """True when ``buf`` is one item of the profile within the limits, as far as the heads
    tell (UTF-8 and duplicate keys are cbor2's to refuse). Never raises."""
    return scan_items(buf, max_depth, max_items, max_string) > 0


def scan_items(buf: bytes, max_depth: int, max_items: int, max_string: int) -> int:
    """The data items of ``buf`` when :func:`scan` vouches for it, else 0. Never raises."""
    scanner = _scanner(max_depth, max_string)
    try:
        step = scanner.values[buf[0]]
        if step > 0:
            stop, left = step, max_items - 1
        else:
            stop, left = scanner.item(buf, 0, 0, max_items - 1)
    except (_Unsure, IndexError, RecursionError):
        return 0
    return max_items - left if stop == len(buf) else 0


# -- encoding: the walk --------------------------------------------------------------------------


class _Walker:
    """The limits of one walk and what it has counted so far."""

    __slots__ = ("left", "max_depth", "max_string", "string_bytes")

    def __init__(self, max_depth: int, max_items: int, max_string: int) -> None:
        self.left = max_items - 1  # the top item
        self.max_depth = max_depth
        self.max_string = max_string
        self.string_bytes = 0

    def text(self, value: str) -> int:
        """The UTF-8 size of a string the caller could not vouch for by its length alone."""
        if len(value) > self.max_string:
            raise _Unsure
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise _Unsure from None
        if size > self.max_string:
            raise _Unsure
        return size

    def item(self, value: Any, depth: int) -> None:
        """Check one value of any kind (the loops below take the common ones inline)."""
        kind = type(value)
        if kind is list or kind is tuple:
            self.sequence(value, depth)
        elif kind is dict:
            self.mapping(value, depth)
        elif kind is str:
            size = len(value)
            self.string_bytes += (
                size if size <= self.max_string and value.isascii() else self.text(value)
            )
        elif kind is bytes or kind is bytearray:
            if len(value) > self.max_string:
                raise _Unsure
            self.string_bytes += len(value)
        elif kind is int:
            if not _INT_MIN <= value <= _INT_MAX:
                raise _Unsure
        elif kind is float:
            if not -_INF < value < _INF:
                raise _Unsure
        elif value is not None and kind is not bool:
            raise _Unsure  # a subclass, or a type outside the profile

    def sequence(self, value: list[Any] | tuple[Any, ...], depth: int) -> None:
        depth += 1
        self.left -= len(value)
        if depth > self.max_depth or self.left < 0:
            raise _Unsure
        max_string = self.max_string
        total = 0
        for element in value:
            kind = type(element)
            if kind is str:
                size = len(element)
                total += size if size <= max_string and element.isascii() else self.text(element)
            elif kind is int:
                if not _INT_MIN <= element <= _INT_MAX:
                    raise _Unsure
            elif element is None or kind is bool:
                pass
            elif kind is float:
                if not -_INF < element < _INF:
                    raise _Unsure
            elif kind is dict:
                self.mapping(element, depth)
            else:
                self.item(element, depth)
        self.string_bytes += total

    def mapping(self, value: dict[Any, Any], depth: int) -> None:
        depth += 1
        self.left -= 2 * len(value)
        if depth > self.max_depth or self.left < 0:
            raise _Unsure
        max_string = self.max_string
        total = 0
        for key, element in value.items():
            kind = type(key)
            if kind is str:
                size = len(key)
                total += size if size <= max_string and key.isascii() else self.text(key)
            elif kind is int:
                if not _INT_MIN <= key <= _INT_MAX:
                    raise _Unsure
            else:
                raise _Unsure  # refused by the profile, or a subclass: the exact encoder says
            kind = type(element)
            if kind is str:
                size = len(element)
                total += size if size <= max_string and element.isascii() else self.text(element)
            elif kind is int:
                if not _INT_MIN <= element <= _INT_MAX:
                    raise _Unsure
            elif element is None or kind is bool:
                pass
            elif kind is float:
                if not -_INF < element < _INF:
                    raise _Unsure
            elif kind is bytes:
                if len(element) > max_string:
                    raise _Unsure
                total += len(element)
            elif kind is list:
                self.sequence(element, depth)
            else:
                self.item(element, depth)
        self.string_bytes += total


class _QuickWalk:
    """The walk under one pair of limits, as functions closing over them (no attribute loads
    per item), for the common case: every string short enough that it is within the string
    limit whatever its characters (a character is at most four UTF-8 bytes), so no string is
    encoded or even asked whether it is ASCII. Each function answers an upper bound of the
    string bytes under it (four per character of text, the exact size of byte strings and of a
    long text, which it encodes) and the item budget left. When that bound passes
    ``max_bytes`` the caller asks :class:`_Walker` for the exact count."""

    __slots__ = ("item",)

    def __init__(self, max_depth: int, max_string: int) -> None:
        # A text of at most this many characters is within max_string, whatever they are.
        short = max_string // 4

        def text(value: str) -> int:
            """The UTF-8 size of a text too long to vouch for by its length."""
            if len(value) > max_string:
                raise _Unsure
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise _Unsure from None
            if size > max_string:
                raise _Unsure
            return size

        def item(value: Any, depth: int, left: int) -> tuple[int, int]:
            kind = type(value)
            if kind is list or kind is tuple:
                return sequence(value, depth, left)
            if kind is dict:
                return mapping(value, depth, left)
            if kind is str:
                size = len(value)
                return (4 * size if size <= short else text(value)), left
            if kind is bytes or kind is bytearray:
                if len(value) > max_string:
                    raise _Unsure
                return len(value), left
            if kind is int:
                if not -0x1_0000_0000_0000_0000 <= value <= 0xFFFF_FFFF_FFFF_FFFF:
                    raise _Unsure
            elif kind is float:
                if value - value != 0.0:  # an infinity or a NaN
                    raise _Unsure
            elif value is not None and kind is not bool:
                raise _Unsure  # a subclass, or a type outside the profile
            return 0, left

        # The loops over a container, each made by a factory of its own over the same limits;
        # item() reads them from this frame's cells, bound before any walk runs.
        each = _quick_each(max_depth, max_string, short, text, item)
        mapping = _quick_mapping(max_depth, max_string, short, item, each)
        sequence = _quick_sequence(max_depth, max_string, short, text, item, each)

        self.item = item


def _quick_sequence(
    max_depth: int,
    max_string: int,
    short: int,
    text: _TextSize,
    item: _ItemWalk,
    each: _MapWalk,
) -> _ListWalk:
    """_QuickWalk's loop over a list or tuple, closing over the limits and its peers as
    _QuickWalk's own functions do (no attribute loads per item)."""

    def sequence(value: list[Any] | tuple[Any, ...], depth: int, left: int) -> tuple[int, int]:
        depth += 1
        left -= len(value)
        if depth > max_depth or left < 0:
            raise _Unsure
        chars = 0
        total = 0
        for element in value:
            kind = type(element)
            if kind is str:
                size = len(element)
                if size <= short:
                    chars += size
                else:
                    total += text(element)
            elif kind is int:
                if not -0x1_0000_0000_0000_0000 <= element <= 0xFFFF_FFFF_FFFF_FFFF:
                    raise _Unsure
            elif kind is dict:  # a record: its entries here, as mapping() does them
                before = left, total
                left -= 2 * len(element)
                if depth >= max_depth or left < 0:
                    raise _Unsure
                # The record's texts are summed without a test each: a sum within the
                # short length bounds every one of them. Keys first, then values; a long
                # list is walked on its own, so that it is never walked twice.
                texts = 0
                for key in element:
                    if type(key) is str:
                        texts += len(key)
                    elif type(key) is not int or not (
                        -0x1_0000_0000_0000_0000 <= key <= 0xFFFF_FFFF_FFFF_FFFF
                    ):
                        raise _Unsure
                for entry in element.values():
                    kind = type(entry)
                    if kind is str:
                        texts += len(entry)
                    elif kind is int:
                        if not -0x1_0000_0000_0000_0000 <= entry <= 0xFFFF_FFFF_FFFF_FFFF:
                            raise _Unsure
                    elif entry is None or kind is bool:
                        pass
                    elif kind is float:
                        if entry - entry != 0.0:
                            raise _Unsure
                    elif kind is bytes:
                        size = len(entry)
                        if size > max_string:
                            raise _Unsure
                        total += size
                    elif kind is list and len(entry) <= _RECORD_MAX:  # its short list
                        left -= len(entry)
                        if depth + 1 >= max_depth or left < 0:
                            raise _Unsure
                        for part in entry:
                            if type(part) is str:
                                texts += len(part)
                            else:
                                more, left = item(part, depth + 2, left)
                                total += more
                    else:
                        more, left = item(entry, depth + 1, left)
                        total += more
                if texts <= short:
                    chars += texts
                else:
                    # Some text may be past the limit: the record again, text by text.
                    left, total = before
                    more, left = each(element, depth, left)
                    total += more
            elif element is None or kind is bool:
                pass
            elif kind is float:
                if element - element != 0.0:
                    raise _Unsure
            else:
                more, left = item(element, depth, left)
                total += more
        return total + 4 * chars, left

    return sequence


def _quick_mapping(
    max_depth: int, max_string: int, short: int, item: _ItemWalk, each: _MapWalk
) -> _MapWalk:
    """_QuickWalk's loop over a map of at most _RECORD_MAX entries, its texts summed (a
    bigger one, or one whose sum is past the short length, goes to each())."""

    def mapping(value: dict[Any, Any], depth: int, left: int) -> tuple[int, int]:
        if len(value) > _RECORD_MAX:
            return each(value, depth, left)
        # As a record in sequence(): texts summed, then tested together.
        before = left
        depth += 1
        left -= 2 * len(value)
        if depth > max_depth or left < 0:
            raise _Unsure
        texts = 0
        total = 0
        for key in value:
            if type(key) is str:
                texts += len(key)
            elif type(key) is not int or not (
                -0x1_0000_0000_0000_0000 <= key <= 0xFFFF_FFFF_FFFF_FFFF
            ):
                raise _Unsure  # refused by the profile, or a subclass: the exact encoder says
        for element in value.values():
            kind = type(element)
            if kind is str:
                texts += len(element)
            elif kind is int:
                if not -0x1_0000_0000_0000_0000 <= element <= 0xFFFF_FFFF_FFFF_FFFF:
                    raise _Unsure
            elif element is None or kind is bool:
                pass
            elif kind is float:
                if element - element != 0.0:
                    raise _Unsure
            elif kind is bytes:
                size = len(element)
                if size > max_string:
                    raise _Unsure
                total += size
            elif kind is list and len(element) <= _RECORD_MAX:  # a short list, one level down
                left -= len(element)
                if depth >= max_depth or left < 0:
                    raise _Unsure
                for entry in element:
                    if type(entry) is str:
                        texts += len(entry)
                    else:
                        more, left = item(entry, depth + 1, left)
                        total += more
            else:
                more, left = item(element, depth, left)
                total += more
        if texts <= short:
            return total + 4 * texts, left
        return each(value, depth - 1, before)  # some text may be past the limit

    return mapping


def _quick_each(
    max_depth: int, max_string: int, short: int, text: _TextSize, item: _ItemWalk
) -> _MapWalk:
    """_QuickWalk's loop over a map whose texts are tested one by one."""

    def each(value: dict[Any, Any], depth: int, left: int) -> tuple[int, int]:
        """A map, its texts tested one by one."""
        depth += 1
        left -= 2 * len(value)
        if depth > max_depth or left < 0:
            raise _Unsure
        chars = 0
        total = 0
        for key, element in value.items():
            kind = type(key)
            if kind is str:
                size = len(key)
                if size <= short:
                    chars += size
                else:
                    total += text(key)
            elif kind is not int or not (-0x1_0000_0000_0000_0000 <= key <= 0xFFFF_FFFF_FFFF_FFFF):
                raise _Unsure  # refused by the profile, or a subclass: the exact encoder says
            kind = type(element)
            if kind is str:
                size = len(element)
                if size <= short:
                    chars += size
                else:
                    total += text(element)
            elif kind is int:
                if not -0x1_0000_0000_0000_0000 <= element <= 0xFFFF_FFFF_FFFF_FFFF:
                    raise _Unsure
            elif element is None or kind is bool:
                pass
            elif kind is float:
                if element - element != 0.0:
                    raise _Unsure
            elif kind is bytes:
                size = len(element)
                if size > max_string:
                    raise _Unsure
                total += size
            elif kind is list:  # a list as a value: its elements here, one level down
                left -= len(element)
                if depth >= max_depth or left < 0:
                    raise _Unsure
                for entry in element:
                    kind = type(entry)
                    if kind is str:
                        size = len(entry)
                        if size <= short:
                            chars += size
                        else:
                            total += text(entry)
                    else:
                        more, left = item(entry, depth + 1, left)
                        total += more
            else:
                more, left = item(element, depth, left)
                total += more
        return total + 4 * chars, left

    return each


# Quick walks by (max_depth, max_string), bounded as the scanners are.
_QUICK: dict[tuple[int, int], _QuickWalk] = {}


def _quick(max_depth: int, max_string: int) -> _QuickWalk:
    key = (max_depth, max_string)
    quick = _QUICK.get(key)
    if quick is None:
        if len(_QUICK) >= _MAX_SCANNERS:
            _QUICK.clear()
        quick = _QUICK[key] = _QuickWalk(max_depth, max_string)
    return quick


def walk(value: object, max_bytes: int, max_depth: int, max_items: int, max_string: int) -> bool:
    """True when the exact encoder would encode ``value`` within the limits (but for the total
    size, which the caller checks on cbor2's output) and cbor2 would write the same bytes, and
    when its string bytes fit in ``max_bytes``. Never raises.

    The quick walk's bound of the string bytes settles it when it fits; when it does not, the
    exact count does (a payload of text over a quarter of ``max_bytes`` walks twice)."""
    try:
        bound, _ = _quick(max_depth, max_string).item(value, 0, max_items - 1)
    except (_Unsure, RecursionError):
        return False
    if bound <= max_bytes:
        return True
    walker = _Walker(max_depth, max_items, max_string)
    try:
        walker.item(value, 0)
    except (_Unsure, RecursionError):  # pragma: no cover - the quick walk refused these already
        return False
    return walker.string_bytes <= max_bytes


# -- the entry points ------------------------------------------------------------------------------


def flat(buf: bytes, max_items: int, max_string: int) -> Any:
    """The value of ``buf`` when it is one array or map of fewer than 24 children, each an
    integer, a string, a float64, false, true or null (keys an integer or text), filling
    ``buf``; else UNSURE. Built here in one loop, with no scan and no cbor2: the common shape
    of a small host-call request (``[2, "text"]``, ``{"key": "sku-1"}``), for which the scan,
    the call into cbor2 and its decoder object cost about twice this loop. Never raises.

    The bounds hold by construction: depth 1, ``1 + children`` items (checked), every string
    within ``max_string`` (checked) and inside ``buf`` (a slice cut short leaves ``pos`` past
    the end, which the last check refuses)."""
    initial = buf[0]
    count = initial & 0x1F
    is_map = initial >= 0xA0
    left = 2 * count if is_map else count
    # A limit below the short strings' 23 bytes is rare enough to leave to the scan.
    if count > 23 or left >= max_items or max_string < 23:
        return UNSURE
    if is_map:
        # Nearly every map request has short text keys: its own loop, a key and a value a turn.
        built = _text_keyed(buf, count, max_string)
        if built is not None:
            return built
    end = len(buf)
    pos = 1
    out: Any = {} if is_map else []
    key: Any = None
    want_key = is_map
    try:
        # One child per turn, the commonest heads first; a map's child alternates key, value.
        while left:
            left -= 1
            head = buf[pos]
            pos += 1
            value: Any
            if head < 0x18:
                value = head
            elif 0x60 <= head < 0x78:  # text of fewer than 24 bytes
                stop = pos + head - 0x60
                value = buf[pos:stop].decode()
                pos = stop
            elif head == 0xFB and not want_key:  # float64, as the exact decoder reads it
                stop = pos + 8
                if stop > end:
                    return UNSURE
                (value,) = _FLOAT64(buf, pos)
                pos = stop
            else:
                major = head >> 5
                arg = head & 0x1F
                if arg >= 24:
                    if arg == 24:
                        arg = buf[pos]
                        pos += 1
                    elif arg == 25:
                        arg = buf[pos] << 8 | buf[pos + 1]
                        pos += 2
                    elif arg == 26 or arg == 27:  # noqa: PLR1714 (a tuple costs more here)
                        width = 4 if arg == 26 else 8
                        if pos + width > end:
                            return UNSURE
                        arg = int.from_bytes(buf[pos : pos + width], "big")
                        pos += width
                    else:
                        return UNSURE  # indefinite lengths and reserved values
                if major == 3 or major == 2:  # noqa: PLR1714
                    stop = pos + arg
                    if arg > max_string or stop > end or (major == 2 and want_key):
                        return UNSURE  # too long, cut short, or a byte string as a key
                    value = buf[pos:stop].decode() if major == 3 else buf[pos:stop]
                    pos = stop
                elif major == 0:
                    value = arg
                elif major == 1:
                    value = -1 - arg
                elif want_key:
                    return UNSURE  # a key that is neither an integer nor text
                elif head == 0xF6:
                    value = None
                elif head == 0xF5:
                    value = True
                elif head == 0xF4:
                    value = False
                else:
                    return UNSURE  # containers, floats, tags, other simple values: the scan's
            if not is_map:
                out.append(value)
            elif want_key:
                key = value
                want_key = False
            else:
                out[key] = value
                want_key = True
    except (IndexError, UnicodeDecodeError):
        return UNSURE  # cut short, or bad UTF-8: the exact decoder says which
    # Trailing bytes, a string cut short, or a duplicate key (fewer entries than the head's
    # count): the exact decoder names which.
    if pos != end or (is_map and len(out) != count):
        return UNSURE
    return out


def _text_keyed(buf: bytes, count: int, max_string: int) -> Any:
    """flat() for a map whose keys are all text of fewer than 24 bytes: its value, UNSURE when
    some part of ``buf`` is not of flat()'s shape, or None when a key is not short text (then
    flat()'s general loop decides). The same checks as that loop, one entry a turn."""
    end = len(buf)
    pos = 1
    out: dict[str, Any] = {}
    try:
        for _ in range(count):
            head = buf[pos]
            if not 0x60 <= head < 0x78:
                return None
            stop = pos + head - 0x5F
            key = buf[pos + 1 : stop].decode()
            head = buf[stop]
            pos = stop + 1
            value: Any
            if head < 0x18:
                value = head
            elif 0x60 <= head < 0x78:  # text of fewer than 24 bytes
                stop = pos + head - 0x60
                value = buf[pos:stop].decode()
                pos = stop
            elif head == 0xF6:
                value = None
            elif head == 0xF5:
                value = True
            elif head == 0xF4:
                value = False
            elif head == 0xFB:  # float64, as the exact decoder reads it
                stop = pos + 8
                if stop > end:
                    return UNSURE
                (value,) = _FLOAT64(buf, pos)
                pos = stop
            else:
                major = head >> 5
                arg = head & 0x1F
                if arg >= 24:
                    if arg == 24:
                        arg = buf[pos]
                        pos += 1
                    elif arg == 25:
                        arg = buf[pos] << 8 | buf[pos + 1]
                        pos += 2
                    elif arg == 26 or arg == 27:  # noqa: PLR1714 (a tuple costs more here)
                        width = 4 if arg == 26 else 8
                        if pos + width > end:
                            return UNSURE
                        arg = int.from_bytes(buf[pos : pos + width], "big")
                        pos += width
                    else:
                        return UNSURE  # indefinite lengths and reserved values
                if major == 3 or major == 2:  # noqa: PLR1714
                    stop = pos + arg
                    if arg > max_string or stop > end:
                        return UNSURE  # too long, or cut short
                    value = buf[pos:stop].decode() if major == 3 else buf[pos:stop]
                    pos = stop
                elif major == 0:
                    value = arg
                elif major == 1:
                    value = -1 - arg
                else:
                    return UNSURE  # containers, floats, tags, other simple values: the scan's
            out[key] = value
    except (IndexError, UnicodeDecodeError):
        return UNSURE  # cut short, or bad UTF-8: the exact decoder says which
    # Trailing bytes, a string cut short, or a duplicate key (fewer entries than the head's
    # count): the exact decoder names which.
    if pos != end or len(out) != count:
        return UNSURE
    return out


# Whole heads for flat_encode(): strings of up to 255 bytes, integers in [-256, 255], and the
# arrays and maps of fewer than 24 children it takes.
_FLAT_STRING_MAX: Final = 255
_TEXT_HEADS: Final = tuple(bytes((0x60 | n,) if n < 24 else (0x78, n)) for n in range(256))
_BYTES_HEADS: Final = tuple(bytes((0x40 | n,) if n < 24 else (0x58, n)) for n in range(256))
_UINTS: Final = tuple(bytes((n,) if n < 24 else (0x18, n)) for n in range(256))
_NEGATIVES: Final = tuple(bytes((0x20 | n,) if n < 24 else (0x38, n)) for n in range(256))
_ARRAY_HEADS: Final = tuple(bytes((0x80 | n,)) for n in range(24))
_MAP_HEADS: Final = tuple(bytes((0xA0 | n,)) for n in range(24))
# An array's children paired with no key, so that one loop writes arrays and maps (not None:
# None is a key the exact encoder refuses).
_NO_KEY: Final = object()
_NO_KEYS: Final = (_NO_KEY,) * 23


def flat_encode(value: Any, max_bytes: int, max_items: int, max_string: int) -> bytes | None:
    """The exact encoder's bytes for ``value``, a dict, list or tuple (exactly those types) of
    fewer than 24 children, when each child is None, a bool, an int in [-256, 255], a float,
    a str or a bytes of at most 255 bytes (a dict's keys str only); else None. Written here
    piece by piece with no walk and no cbor2: the common shape of a small answer, for which
    the walk, the call into cbor2 and their dispatch cost more than this loop. Never raises.

    The bounds hold by construction: depth 1, ``1 + children`` items (checked), every string
    at most 255 bytes (so within ``max_string``, checked once), the whole at most 23 children
    of 257 bytes at most, then checked against ``max_bytes``. Floats are written as float64
    whatever their value, as the exact encoder writes them."""
    count = len(value)
    is_map = type(value) is dict
    if count > 23 or (2 * count if is_map else count) >= max_items or max_string < _FLAT_STRING_MAX:
        return None
    parts = [_MAP_HEADS[count] if is_map else _ARRAY_HEADS[count]]
    append = parts.append
    keys = _KEYS
    # Pieces are appended, not concatenated: join() copies each once, a concatenation twice.
    try:
        for key, item in value.items() if is_map else zip(_NO_KEYS, value, strict=False):
            if key is not _NO_KEY:
                if type(key) is not str:
                    return None  # an int key or a subclass: the walk's
                # Keys are few and repeat from answer to answer: their encodings are kept.
                head = keys.get(key)
                if head is None:
                    data = key.encode()
                    if len(data) > _FLAT_STRING_MAX:
                        return None
                    head = _TEXT_HEADS[len(data)] + data
                    if len(keys) >= _MAX_KEYS:
                        keys.clear()
                    keys[key] = head
                append(head)
            kind = type(item)
            if kind is str:
                data = item.encode()  # a text with no UTF-8 form raises: the walk's
                if len(data) > _FLAT_STRING_MAX:
                    return None
                append(_TEXT_HEADS[len(data)])
                append(data)
            elif kind is int:
                if 0 <= item <= 0xFF:
                    append(_UINTS[item])
                elif -0x100 <= item < 0:
                    append(_NEGATIVES[-1 - item])
                else:
                    return None
            elif item is None:
                append(b"\xf6")
            elif item is True:
                append(b"\xf5")
            elif item is False:
                append(b"\xf4")
            elif kind is float:
                append(b"\xfb")
                append(_PACK_FLOAT64(item))
            elif kind is bytes:
                if len(item) > _FLAT_STRING_MAX:
                    return None
                append(_BYTES_HEADS[len(item)])
                append(item)
            else:
                return None  # containers, subclasses, other types: the walk's
    except (UnicodeEncodeError, RuntimeError):
        return None  # no UTF-8 form, or the dict changed size: the exact encoder says so
    out = b"".join(parts)
    return out if len(out) <= max_bytes else None


# flat_encode()'s keys: text -> its head and UTF-8 bytes. Bounded, should answers vary their
# keys endlessly; cleared whole when full (a key is re-encoded at its next use, nothing else).
_KEYS: dict[str, bytes] = {}
_MAX_KEYS: Final = 1024


def decode_counted(buf: bytes, max_depth: int, max_items: int, max_string: int) -> Any:
    """``(value, data items)`` of ``buf`` when the scan vouches for it and cbor2 builds it;
    ``(UNSURE, data items)`` when the scan vouched but cbor2 refused (the items say what the
    scan and cbor2 went through); else UNSURE."""
    fast = backend()
    items = scan_items(buf, max_depth, max_items, max_string) if fast is not None else 0
    if not items:
        return UNSURE
    assert fast is not None
    try:
        return fast.loads(buf), items
    except Exception:  # invalid UTF-8 or a duplicate key: the exact decoder names which
        return UNSURE, items


def encode(
    value: object, max_bytes: int, max_depth: int, max_items: int, max_string: int
) -> bytes | None:
    """The encoding of ``value`` when the walk vouches for it and cbor2's output fits in
    ``max_bytes``, else None."""
    fast = backend()
    if fast is None or not walk(value, max_bytes, max_depth, max_items, max_string):
        return None
    try:
        out = fast.dumps(value)
    except Exception:  # not expected after the walk; the exact encoder decides all the same
        return None
    return out if len(out) <= max_bytes else None
