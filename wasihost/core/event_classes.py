"""Event class names and the selectors that name sets of them: one grammar for the manifest's
``[events]`` table, the operator's ``events`` grant scope, a guest's subscribe request and an
embedder's publish. Pure: no engine, no I/O.

A **class** is ``[a-z][a-z0-9_.-]{0,127}`` (``orders.created``). A **selector** is a class
(exactly that class) or a prefix pattern ``P.*`` (every class that begins with ``P.``), at
most 128 characters in all; ``*`` appears nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

# Class names travel in every delivery and are matched on every publish: 128 characters is far
# more than a dotted name needs, and keeps a subscribe request inside the entry's 140 bytes.
MAX_CLASS_CHARS: Final = 128
# A manifest or a grant scope lists a handful of selectors; 64 bounds the matching work a
# subscribe request costs (each is compared with each).
MAX_SELECTORS: Final = 64

WILDCARD_SUFFIX: Final = ".*"

_CLASS = re.compile(r"[a-z][a-z0-9_.-]{0,127}")
_PATTERN_PREFIX = re.compile(r"[a-z][a-z0-9_.-]{0,125}")


def is_class(value: object) -> bool:
    """``value`` is a well-formed event class name (what an embedder publishes)."""
    return isinstance(value, str) and _CLASS.fullmatch(value) is not None


def is_selector(value: object) -> bool:
    """``value`` is a class or a ``P.*`` prefix pattern (what a guest subscribes to)."""
    if not isinstance(value, str) or len(value) > MAX_CLASS_CHARS:
        return False
    if value.endswith(WILDCARD_SUFFIX):
        return _PATTERN_PREFIX.fullmatch(value[: -len(WILDCARD_SUFFIX)]) is not None
    return _CLASS.fullmatch(value) is not None


def _prefix(selector: str) -> str | None:
    """``"orders."`` for ``"orders.*"``; None for an exact class."""
    return selector[:-1] if selector.endswith(WILDCARD_SUFFIX) else None


def matches(selector: str, event_class: str) -> bool:
    """The event class ``event_class`` is one ``selector`` names."""
    prefix = _prefix(selector)
    return event_class == selector if prefix is None else event_class.startswith(prefix)


def covers(allowed: str, selector: str) -> bool:
    """Every class ``selector`` names is one ``allowed`` names (a subscription inside a grant)."""
    if allowed == selector:
        return True
    prefix = _prefix(allowed)
    if prefix is None:
        return False
    inner = _prefix(selector)
    return (inner if inner is not None else selector).startswith(prefix)


def covered(allowed: Iterable[str], selector: str) -> bool:
    """Some selector of ``allowed`` covers ``selector``."""
    return any(covers(a, selector) for a in allowed)
