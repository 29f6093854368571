"""The process runtime's channel protocol: frames and messages, pure (no I/O).

One protocol between the host and a walled child (``runtime = "wasm-process"``): each frame is
a 4-byte big-endian length, then that many bytes of CBOR on the project's own bounded codec.
The CBOR is always an array whose first item is the message kind (:class:`Kind`); the items
after it are scalars and byte strings only, never deeper than :data:`MAX_FRAME_DEPTH`, so a
frame decodes in one bounded step whatever a hostile child sends.

Trust runs one way (docs/process-runtime.md). The host treats every frame from a child as
hostile: :func:`decode_frame` bounds it, and :func:`expect` checks its kind and its items'
types before anything reads them. A frame that fails either is a :class:`ChannelError`, and the
host ends the child (fail closed). The child trusts the host: it runs with the host's code and
gets only what the host sends.

The conversation, in order (the kinds below):

1. the child applies its walls, then says ``HELLO`` with the protocol version, the per-child
   secret it was given at spawn, its pid and what each wall checked from inside;
2. the host sends ``LOAD`` (engine settings, the compiled module, the imports' registry entries,
   the Store limits); the child answers ``READY`` with the imports of the module it loaded,
   which must equal what the host admitted;
3. then ``START`` (instantiate), ``CALL`` or ``RUN`` (a WASI command), each answered by ``DONE``
   or ``FAIL``. In between, the child may send ``HOST``: a host call, served by the host's own
   registry and brokers (grants, quotas, secrets and state never enter the child). While the
   host serves it, the host may send ``MEM`` (read or write guest memory) and the child answers
   ``MEM_OK`` or ``MEM_FAULT``; the host call ends with ``HOST_OK``, ``HOST_STATUS`` or
   ``HOST_STOP``;
4. ``CAP_MEMORY`` and ``QUERY`` between calls, each answered by ``VALUE``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any, Final

import cbor2

from .codec import CodecLimits, decode
from .errors import CodecError

PROTOCOL_VERSION: Final = 1

HEADER: Final = struct.Struct(">I")
HEADER_BYTES: Final = HEADER.size

# A frame carries at most one payload (a call's input or output, a host call's request or
# response, a guest-memory read) and a few scalars. 64 MiB is above every payload limit a
# policy can set (resources cap inputs and outputs at 16 MiB) and low enough that a hostile
# length cannot make the host allocate without bound.
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
# Frames are flat: an array of scalars and byte strings, and the lists some messages carry
# (import names, walls), one level deeper; nothing nests further.
MAX_FRAME_DEPTH: Final = 3
# The most items of a frame: the longest is READY's list of import names (a module importing
# the whole registry has about 80) or LOAD's entries.
MAX_FRAME_ITEMS: Final = 8192

SECRET_BYTES: Final = 32
# In a DONE or FAIL's tally, each capability the child's gate refused the guest, after this
# prefix: the host records it as asked for (a front end's hint names it).
REFUSED_PREFIX: Final = "refused:"


class Kind(enum.IntEnum):
    """A message's kind: the first item of every frame."""

    HELLO = 1
    LOAD = 2
    READY = 3
    START = 4
    CALL = 5
    RUN = 6
    DONE = 7
    FAIL = 8
    HOST = 9
    HOST_OK = 10
    HOST_STATUS = 11
    HOST_STOP = 12
    MEM = 13
    MEM_OK = 14
    MEM_FAULT = 15
    CAP_MEMORY = 16
    QUERY = 17
    VALUE = 18


class ChannelError(Exception):
    """A frame that breaks the protocol: too long, not CBOR, not the message expected, or an
    item of the wrong type. The host ends the child that sent it."""


def frame_limits(max_frame_bytes: int = MAX_FRAME_BYTES) -> CodecLimits:
    """The codec bounds of one frame's body."""
    return CodecLimits(
        max_bytes=max_frame_bytes,
        max_depth=MAX_FRAME_DEPTH,
        max_items=MAX_FRAME_ITEMS,
        max_string_bytes=max_frame_bytes,
    )


DEFAULT_FRAME_LIMITS: Final = frame_limits()
# A value carried inside a frame (a host call's request or response, as CBOR bytes): any
# shape the codec allows, as large as a frame.
PAYLOAD_LIMITS: Final = CodecLimits(max_bytes=MAX_FRAME_BYTES, max_string_bytes=MAX_FRAME_BYTES)


def encode_frame(message: Sequence[Any]) -> bytes:
    """One frame: the header and the CBOR of ``message`` (an array, its kind first).

    Made with cbor2's C encoder: whoever sends holds the values (its own, or what it already
    bounded), and what a child sends is bounded where the host reads it (:func:`decode_frame`).
    The project's encoder walks a nested value in Python, a third of a small call's host
    time."""
    body = cbor2.dumps(list(message))
    if len(body) > MAX_FRAME_BYTES:
        raise ChannelError(f"a frame of {len(body)} bytes over {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> int:
    """The body length a header announces, refused past ``max_frame_bytes`` before anything
    is read or allocated for it."""
    (length,) = HEADER.unpack(header)
    if length == 0 or length > max_frame_bytes:
        raise ChannelError(f"a frame of {length} bytes (at most {max_frame_bytes}, never 0)")
    return int(length)


class FrameBuffer:
    """Bytes read from a channel, cut into frame bodies: one read often holds a whole frame
    (or several), so a frame costs one system call, not one for its header and one for its
    body. A header announcing more than ``max_frame_bytes`` is refused before its body is
    awaited."""

    __slots__ = ("_buf", "_max")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def next_body(self) -> bytes | None:
        """The next whole frame's body, or None until more bytes arrive."""
        buf = self._buf
        if len(buf) < HEADER_BYTES:
            return None
        length = frame_length(bytes(buf[:HEADER_BYTES]), self._max)
        end = HEADER_BYTES + length
        if len(buf) < end:
            return None
        body = bytes(buf[HEADER_BYTES:end])
        del buf[:end]
        return body


def decode_frame(body: bytes, limits: CodecLimits = DEFAULT_FRAME_LIMITS) -> list[Any]:
    """The message of one frame's body: an array whose first item is a known :class:`Kind`."""
    try:
        message = decode(body, limits)
    except CodecError as exc:
        raise ChannelError(f"a frame that is not bounded CBOR: {exc}") from None
    if not isinstance(message, list) or not message:
        raise ChannelError("a frame that is not a non-empty array")
    kind = message[0]
    if type(kind) is not int or kind not in _KINDS:
        raise ChannelError(f"a frame of unknown kind {kind!r}")
    return message


_KINDS: Final = frozenset(int(k) for k in Kind)

# The item types of each message, after its kind: what the host checks before it reads any.
# "int" excludes bool; "opt-int" is an int or None; "value" is any scalar the codec gives.
_SHAPES: Final[dict[Kind, tuple[str, ...]]] = {
    Kind.HELLO: ("int", "bytes", "int", "list"),
    Kind.READY: ("list",),
    Kind.DONE: ("int", "bytes", "int", "opt-int", "bool", "opt-list"),
    Kind.FAIL: ("str", "str", "int", "opt-int", "bool", "opt-list"),
    Kind.MEM_OK: ("value", "int"),
    Kind.MEM_FAULT: ("str", "str"),
    Kind.VALUE: ("value",),
}


def _fits(item: object, shape: str) -> bool:
    if shape == "int":
        return type(item) is int
    if shape == "opt-int":
        return item is None or type(item) is int
    if shape == "bytes":
        return type(item) is bytes
    if shape == "str":
        return type(item) is str
    if shape == "list":
        return type(item) is list
    if shape == "opt-list":
        return item is None or type(item) is list
    if shape == "bool":
        return type(item) is bool
    return item is None or type(item) in (int, float, bool, bytes, str, list)


def host_call_args(message: list[Any]) -> tuple[int, list[Any]]:
    """A HOST message's import index and its arguments (checked by the host against the
    import's own convention)."""
    if len(message) < 2 or type(message[1]) is not int:
        raise ChannelError("HOST without an import index")
    return message[1], message[2:]


def expect(message: list[Any], *kinds: Kind) -> Kind:
    """Check that a child's ``message`` is one of ``kinds`` with its items' types; its kind."""
    kind = message[0]
    if kind not in kinds:
        names = " or ".join(k.name for k in kinds)
        raise ChannelError(f"{_name(kind)} where {names} was expected")
    shape = _SHAPES[Kind(kind)]
    if len(message) != len(shape) + 1:
        raise ChannelError(f"{_name(kind)} with {len(message) - 1} items, not {len(shape)}")
    for i, (item, want) in enumerate(zip(message[1:], shape, strict=True), start=1):
        if not _fits(item, want):
            raise ChannelError(f"{_name(kind)} item {i} is {type(item).__name__}, not {want}")
    return Kind(kind)


def _name(kind: object) -> str:
    return Kind(kind).name if type(kind) is int and kind in _KINDS else repr(kind)
