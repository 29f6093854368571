"""Host-call error counts for operators: how often guests' host calls were refused, and why.

Pure: the engine's host-call path tells a :class:`HostCallTally` two kinds of event, and the
host reads a snapshot of both:

- a **status** answered to the guest instead of a response (``denied``, ``quota_exceeded``,
  ``invalid_argument``, ...: the :class:`~wasihost.core.status.Status` names, lowercase); the guest
  carries on;
- a **failure** that ended the guest's call inside a host call (``host_error``, ``protocol``,
  ``out_of_fuel``, ``denied``, ``deadline``: the :class:`~wasihost.core.errors.FailureClass`
  values).

Counts only, by class: nothing of a request, a response, an extension's data or a message is
kept. The guest's own ``abort`` (a panic it asked for) and a caller's cancellation or Ctrl-C
are not host-call errors and are not counted.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..core.errors import FailureClass
from ..core.status import Status

if TYPE_CHECKING:
    from .reports import HostCallErrors


def __getattr__(name: str) -> Any:
    # The snapshot is made when an operator asks (Host.metrics): defined in
    # wasihost.supervisor.reports.
    if name == "HostCallErrors":
        from .reports import HostCallErrors

        return HostCallErrors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Ended by the guest's own request or by its caller, not by a host call going wrong.
_NOT_HOST_CALL_ERRORS = frozenset(
    {FailureClass.PANIC, FailureClass.CANCELLED, FailureClass.INTERRUPTED}
)
_STATUS_NAMES: Mapping[int, str] = MappingProxyType({s.value: s.name.lower() for s in Status})


class HostCallTally:
    """Counts shared by every instance of a host. The engine calls :meth:`status` and
    :meth:`failure` on error paths only, never for a host call that succeeded."""

    def __init__(self) -> None:
        # Instances run on many threads at once, and ``+=`` on a shared int is not atomic.
        self._lock = threading.Lock()
        self._statuses: dict[str, int] = {}
        self._failures: dict[str, int] = {}

    def status(self, code: int) -> None:
        """A host call answered the status ``code`` (positive, or the negated i32 the cbor
        convention writes)."""
        name = _STATUS_NAMES.get(abs(code))
        if name is None or name == "ok":
            return
        with self._lock:
            self._statuses[name] = self._statuses.get(name, 0) + 1

    def failure(self, failure: FailureClass) -> None:
        """A host call ended the guest's call with ``failure``."""
        if failure in _NOT_HOST_CALL_ERRORS:
            return
        with self._lock:
            self._failures[failure.value] = self._failures.get(failure.value, 0) + 1

    def snapshot(self) -> HostCallErrors:
        from .reports import HostCallErrors

        with self._lock:
            return HostCallErrors(
                MappingProxyType(dict(sorted(self._statuses.items()))),
                MappingProxyType(dict(sorted(self._failures.items()))),
            )
