"""Hypothesis strategies shared by the tests: CBOR values and payloads, manifests as TOML."""

from __future__ import annotations

import math
import string
from typing import Any

from hypothesis import strategies as st

from wasihost.core.codec import Value, encode
from wasihost.core.limits import RESOURCE_BOUNDS

# Values stay far inside the default limits: depth 32, 4096 items, 64 KiB strings.
MAX_TEST_DEPTH = 32
INT_MIN = -(2**64)
INT_MAX = 2**64 - 1

# -- CBOR --------------------------------------------------------------------------------------

cbor_ints = st.one_of(
    st.integers(min_value=-30, max_value=30),
    st.sampled_from(
        [
            *(23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, INT_MAX),
            *(-24, -25, -256, -257, -65536, -65537, -(2**32), -(2**32) - 1, -(2**63), INT_MIN),
        ]
    ),
    st.integers(min_value=INT_MIN, max_value=INT_MAX),
)
cbor_keys: st.SearchStrategy[str | int] = st.one_of(st.text(max_size=12), cbor_ints)
cbor_scalars: st.SearchStrategy[Value] = st.one_of(
    st.none(),
    st.booleans(),
    cbor_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)


def depth_of(value: object) -> int:
    """Nesting depth as the codec counts it: arrays and maps only."""
    if isinstance(value, list | tuple):
        return 1 + max((depth_of(element) for element in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(element) for element in value.values()), default=0)
    return 0


def items_of(value: object) -> int:
    """Data items as the codec counts them: every container, element, key and value."""
    if isinstance(value, list | tuple):
        return 1 + sum(items_of(element) for element in value)
    if isinstance(value, dict):
        return 1 + sum(1 + items_of(element) for element in value.values())
    return 1


cbor_values: st.SearchStrategy[Value] = st.recursive(
    cbor_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(cbor_keys, children, max_size=6),
    ),
    max_leaves=40,
).filter(lambda value: depth_of(value) <= MAX_TEST_DEPTH)


@st.composite
def mutated_cbor(draw: st.DrawFn) -> bytes:
    """A well-formed payload damaged in a few places: the bytes a buggy or hostile guest sends."""
    data = bytearray(encode(draw(cbor_values)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        operation = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "append"]))
        position = draw(st.integers(min_value=0, max_value=len(data)))
        if operation == "flip" and position < len(data):
            data[position] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif operation == "set" and position < len(data):
            data[position] = draw(st.integers(min_value=0, max_value=255))
        elif operation == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=9))
        elif operation == "delete" and position < len(data):
            del data[position]
        elif operation == "truncate":
            del data[position:]
        elif operation == "append":
            data += draw(st.binary(min_size=1, max_size=9))
    return bytes(data)


# Heads that reach the interesting branches: long arguments, reserved and indefinite forms,
# tags, simple values, floats.
_interesting_heads = st.sampled_from(
    [bytes([major << 5 | info]) for major in range(8) for info in (0, 23, 24, 25, 26, 27, 28, 31)]
    + [b"\x9b\xff\xff\xff\xff\xff\xff\xff\xff", b"\x7b\x00\x00\x00\x01\x00\x00\x00\x00"]
)
cbor_like_bytes: st.SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=64),
    st.lists(st.one_of(_interesting_heads, st.binary(max_size=3)), max_size=16).map(b"".join),
    mutated_cbor(),
)


def same_value(left: object, right: object) -> bool:
    """Equality that also tells apart 1, 1.0 and True, -0.0 and 0.0, and finds NaN equal."""
    if type(left) is not type(right):
        return False
    if isinstance(left, float):
        assert isinstance(right, float)
        if math.isnan(left) or math.isnan(right):
            return math.isnan(left) and math.isnan(right)
        return left == right and math.copysign(1.0, left) == math.copysign(1.0, right)
    if isinstance(left, list):
        assert isinstance(right, list)
        return len(left) == len(right) and all(map(same_value, left, right))
    if isinstance(left, dict):
        assert isinstance(right, dict)
        if len(left) != len(right):
            return False
        right_keys = {(type(key), key): key for key in right}
        return all(
            (type(key), key) in right_keys
            and same_value(value, right[right_keys[(type(key), key)]])
            for key, value in left.items()
        )
    return left == right


# -- manifests -----------------------------------------------------------------------------------

KNOWN_CAPABILITIES = frozenset({"log", "clock", "random"})

_labels = st.from_regex(r"[a-z0-9-]{1,8}", fullmatch=True)
extension_ids = st.builds(
    lambda first, rest: ".".join([first, *rest]),
    st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
    st.lists(_labels, min_size=1, max_size=4),
)
_numbers = st.one_of(st.just("0"), st.integers(min_value=1, max_value=10**6).map(str))
_pre_ids = st.one_of(_numbers, st.from_regex(r"[0-9]*[A-Za-z-][0-9A-Za-z-]{0,5}", fullmatch=True))
_build_ids = st.from_regex(r"[0-9A-Za-z-]{1,6}", fullmatch=True)
semver_versions = st.builds(
    lambda core, pre, build: (
        ".".join(core)
        + (f"-{'.'.join(pre)}" if pre else "")
        + (f"+{'.'.join(build)}" if build else "")
    ),
    st.tuples(_numbers, _numbers, _numbers),
    st.lists(_pre_ids, max_size=3),
    st.lists(_build_ids, max_size=3),
)
_segments = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,10}", fullmatch=True).filter(
    lambda segment: segment not in (".", "..")
)
module_paths = st.builds(
    lambda directories, stem: "/".join([*directories, stem + ".wasm"]),
    st.lists(_segments, max_size=3),
    st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
)
command_names = st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True)


@st.composite
def manifest_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid manifest as the dict ``tomllib`` would return for it."""
    extension: dict[str, Any] = {
        "schema": "wasihost-manifest/1",
        "id": draw(extension_ids),
        "version": draw(semver_versions),
        "abi": f"{draw(st.integers(0, 9))}.{draw(st.integers(0, 30))}",
        "module": draw(module_paths),
    }
    if draw(st.booleans()):
        extension["publisher"] = draw(
            st.text(st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=30)
        )
    if draw(st.booleans()):
        extension["sha256"] = draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
    if draw(st.booleans()):
        extension["runtime"] = draw(st.sampled_from(["wasm", "wasm-process"]))
    document: dict[str, Any] = {"extension": extension}
    if draw(st.booleans()):
        capabilities = draw(st.permutations(sorted(KNOWN_CAPABILITIES)))
        split = draw(st.integers(0, len(capabilities)))
        stop = draw(st.integers(split, len(capabilities)))
        document["capabilities"] = {
            "required": list(capabilities[:split]),
            "optional": list(capabilities[split:stop]),
        }
    if draw(st.booleans()):
        chosen = draw(st.lists(st.sampled_from(sorted(RESOURCE_BOUNDS)), unique=True))
        document["resources"] = {
            name: draw(st.integers(RESOURCE_BOUNDS[name].minimum, RESOURCE_BOUNDS[name].maximum))
            for name in chosen
        }
    names = draw(st.lists(command_names, min_size=1, max_size=4, unique=True))
    document["commands"] = {
        name: (
            {"description": draw(st.text(string.printable.strip(), max_size=40))}
            if draw(st.booleans())
            else {}
        )
        for name in names
    }
    return document


toml_scalars: st.SearchStrategy[Any] = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 1, 2**31, 2**40, 10**11 + 1, 1_073_741_825, 16_777_217]),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["", ".", "..", "log", "wasm", "1.0", "org.x", "a.wasm", "/a.wasm", "A"]),
)
toml_values: st.SearchStrategy[Any] = st.recursive(
    toml_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=8), children, max_size=3),
    ),
    max_leaves=6,
)


@st.composite
def near_valid_manifests(draw: st.DrawFn) -> str:
    """A valid manifest with a few fields deleted, replaced or added, written as TOML."""
    document = draw(manifest_documents())
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        paths: list[tuple[str, ...]] = [(table,) for table in document]
        paths += [
            (table, key)
            for table, body in document.items()
            if isinstance(body, dict)
            for key in body
        ]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        operation = draw(st.sampled_from(["delete", "replace", "add"]))
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        if operation == "delete":
            del parent[path[-1]]
        elif operation == "replace":
            parent[path[-1]] = draw(toml_values)
        elif isinstance(parent.get(path[-1]), dict):
            parent[path[-1]][draw(st.text(min_size=1, max_size=10))] = draw(toml_values)
        else:
            parent[draw(st.text(min_size=1, max_size=10))] = draw(toml_values)
    return to_toml(document)


def _toml_key(key: str) -> str:
    if key and all(ch in string.ascii_letters + string.digits + "_-" for ch in key):
        return key
    return toml_string(key)


def toml_string(text: str) -> str:
    """A TOML basic string; characters TOML cannot hold raw are escaped."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """``value`` as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(element) for element in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def to_toml(document: dict[str, Any]) -> str:
    """A document whose top-level tables become ``[table]`` sections; other values inline."""
    lines: list[str] = []
    for key, value in document.items():
        if not isinstance(value, dict):
            lines.insert(0, f"{_toml_key(key)} = {toml_value(value)}")
    for key, value in document.items():
        if isinstance(value, dict):
            lines.append(f"[{_toml_key(key)}]")
            lines.extend(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items())
    return "\n".join(lines) + "\n"


# -- resource budgets (tests/supervisor/test_budgets.py) ---------------------------------------------------

# Clock steps that land inside a bucket, on bucket and window edges, and past whole windows.
BUDGET_TICKS = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 59.0, 60.0, 61.0, 3599.0, 3600.0, 7200.0]),
    st.floats(0.0, 4000.0, allow_nan=False),
)


@st.composite
def budget_steps(draw: st.DrawFn, most: int = 10**6) -> list[tuple[Any, ...]]:
    """What an extension does over time, as the host sees it: ``("tick", seconds)``,
    ``("call", fuel)`` (admitted, then burns ``fuel``), ``("exchange", sent, received)`` (a
    request's bytes charged before it goes, its answer's as they come), ``("received", n)``
    (bytes counted with no request before them: more chunks of an answer)."""
    amounts = st.integers(0, most)
    step = st.one_of(
        st.tuples(st.just("tick"), BUDGET_TICKS),
        st.tuples(st.just("call"), amounts),
        st.tuples(st.just("exchange"), amounts, amounts),
        st.tuples(st.just("received"), amounts),
    )
    return draw(st.lists(step, max_size=60))


# Clock steps around a level's cool-off: exactly on its end, just before and after, and beyond.
LEVEL_TICKS = st.one_of(
    st.sampled_from([0.0, 5.0, 9.999, 10.0, 10.001, 20.0]),
    st.floats(0.0, 25.0, allow_nan=False),
)


@st.composite
def level_steps(draw: st.DrawFn, levels: tuple[Any, ...]) -> list[tuple[str, Any]]:
    """What the host sees of an extension's levels over time (tests/supervisor/test_budgets_levels.py):
    ``("cross", level)`` (a static limit refused something), ``("tick", seconds)``,
    ``("call", None)`` (a call asks to be admitted)."""
    step = st.one_of(
        st.tuples(st.just("cross"), st.sampled_from(levels)),
        st.tuples(st.just("tick"), LEVEL_TICKS),
        st.tuples(st.just("call"), st.none()),
    )
    return draw(st.lists(step, max_size=40))
