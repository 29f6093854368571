"""The restart policies other than the default :class:`~wasihost.supervisor.supervision.OnCrash`.

Here, not in :mod:`wasihost.supervisor.supervision`, so that a host that never sets one does not
define
them at start-up (issue 12 section 4); ``wasihost.supervisor.supervision`` still exports both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..core.errors import ConfigError
from ..core.limits import MAX_RESTARTS, MAX_WINDOW_S


@attrs.frozen
class Never:
    """Do not restart: the first crash quarantines the extension."""


def _positive(limit: float) -> Callable[[object, attrs.Attribute[Any], Any], None]:
    def check(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not 0 < value <= limit:
            raise ConfigError(f"{attribute.name}={value!r} must be in (0, {limit}]")

    return check


@attrs.frozen
class BoundedRetry:
    """At most ``max_restarts`` restarts within ``window_s`` seconds: the first at once (one
    bad input should not cost the next caller), the n-th after ``backoff_s * 2**(n-2)``
    seconds (at most ``max_backoff_s``)."""

    max_restarts: int = attrs.field(default=5, validator=_positive(MAX_RESTARTS))
    window_s: float = attrs.field(default=60.0, validator=_positive(MAX_WINDOW_S))
    backoff_s: float = attrs.field(default=0.05, validator=_positive(MAX_WINDOW_S))
    max_backoff_s: float = attrs.field(default=5.0, validator=_positive(MAX_WINDOW_S))

    def backoff(self, restarts_in_window: int) -> float:
        if restarts_in_window == 0:
            return 0.0
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (restarts_in_window - 1)))
