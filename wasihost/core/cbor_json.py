"""CBOR values of the ABI's profile as JSON text, and back, without ambiguity.

JSON has no byte strings, no non-finite numbers and only text object keys, so those CBOR values
take a tagged form: a one-member object whose key starts with ``$``. The forms are those of
``abi/vectors/cbor.json``, plus ``$map`` for maps a JSON object cannot hold:

- ``{"$bytes": "<lowercase hex>"}``: a byte string;
- ``{"$float": "NaN" | "Infinity" | "-Infinity"}``: a non-finite float;
- ``{"$map": [[key, value], ...]}``: a map with an integer key, or with a text key starting
  with ``$`` (so a guest's own ``{"$bytes": "ff"}`` map never reads as a byte string).

Every other map is a JSON object; integers are JSON integers (exact, even past 2**53) and
finite floats are JSON numbers with a fraction or an exponent, so ``1`` and ``1.0`` differ.
Tags, ``undefined`` and other simple values are outside the profile (the codec refuses them),
so they never reach this module. Distinct values give distinct text (NaN is one value).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .codec import Value

TAG_PREFIX = "$"
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_HEX = re.compile(r"(?:[0-9a-f]{2})*")


class JsonFormError(ValueError):
    """JSON text that is not the JSON form of a CBOR value (or not JSON at all)."""


def to_json(value: Value) -> Any:
    """``value`` as a JSON-serialisable tree in the unambiguous form above."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {
            "$float": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        }
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith(TAG_PREFIX) for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"$map": [[to_json(k), to_json(v)] for k, v in value.items()]}
    raise TypeError(f"{type(value).__name__} is not a value of the ABI's CBOR profile")


def dumps(tree: Any, *, indent: int | None = None) -> str:
    """Strict JSON text: a non-finite float left in ``tree`` is a bug, never a bare NaN."""
    return json.dumps(tree, indent=indent, allow_nan=False)


def loads(text: str) -> Any:
    """Parse strict JSON: no ``NaN``/``Infinity`` literals, no number that overflows to one,
    no object with a repeated key (Python's json would keep the last one silently)."""
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_object,
        )
    except json.JSONDecodeError as exc:
        raise JsonFormError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except JsonFormError:
        raise
    except ValueError:  # an integer of more digits than Python converts
        # Its own text advises sys.set_int_max_str_digits(), no help to a CLI user; CBOR
        # carries 20 digits at most anyway.
        raise JsonFormError(
            "not valid JSON: an integer of thousands of digits (CBOR integers are -2**64 .. "
            "2**64-1)"
        ) from None
    except RecursionError:
        raise JsonFormError("not valid JSON: nested too deeply") from None


def from_json(tree: Any) -> Value:
    """A tree parsed by :func:`loads` as the CBOR value it stands for (tagged forms read)."""
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    if isinstance(tree, list):
        return [from_json(v) for v in tree]
    if not isinstance(tree, dict):
        raise JsonFormError(f"{type(tree).__name__} is not JSON")
    tagged = [k for k in tree if k.startswith(TAG_PREFIX)]
    if not tagged:
        return {k: from_json(v) for k, v in tree.items()}
    if len(tree) != 1:
        raise JsonFormError(
            f"an object with the key {tagged[0]!r} must have no other key "
            f'(a map with such keys is written {{"$map": [[key, value], ...]}})'
        )
    return _from_tagged(tagged[0], tree[tagged[0]])


def _from_tagged(tag: str, body: Any) -> Value:
    if tag == "$bytes":
        if not isinstance(body, str) or not _HEX.fullmatch(body):
            raise JsonFormError('"$bytes" takes lowercase hex of whole bytes')
        return bytes.fromhex(body)
    if tag == "$float":
        if not isinstance(body, str) or body not in _NON_FINITE:
            raise JsonFormError('"$float" takes "NaN", "Infinity" or "-Infinity"')
        return _NON_FINITE[body]
    if tag == "$map":
        return _map_from_pairs(body)
    raise JsonFormError(f"unknown tagged form {tag!r} (known: $bytes, $float, $map)")


def _map_from_pairs(body: Any) -> dict[str | int, Value]:
    if not isinstance(body, list) or not all(
        isinstance(pair, list) and len(pair) == 2 for pair in body
    ):
        raise JsonFormError('"$map" takes a list of [key, value] pairs')
    out: dict[str | int, Value] = {}
    for raw_key, raw_value in body:
        if isinstance(raw_key, bool) or not isinstance(raw_key, str | int):
            raise JsonFormError('"$map" keys are text or integers')
        if raw_key in out:
            raise JsonFormError(f'"$map" repeats the key {raw_key!r}')
        out[raw_key] = from_json(raw_value)
    return out


def _refuse_constant(name: str) -> Any:
    raise JsonFormError(f'not valid JSON: {name} (write {{"$float": "{name}"}})')


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise JsonFormError(f"number {text[:40]} is out of the float range")
    return number


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonFormError(f"object repeats the key {key!r}")
        out[key] = value
    return out
