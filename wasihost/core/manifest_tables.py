"""The optional ``[events]`` and ``[jobs]`` tables of a manifest, as parsed.

Here, not in :mod:`wasihost.core.manifest`, so that a manifest without them (a plain run) does not
define their classes at start-up (issue 12 section 4); ``wasihost.core.manifest`` still exports
both.
"""

from __future__ import annotations

import attrs

from .limits import DEFAULT_OVERFLOW, DEFAULT_QUEUE_DEPTH


@attrs.frozen
class EventsSpec:
    """The ``[events]`` table: which event classes the extension may subscribe to, the command
    the host calls to deliver one, and what a full subscription queue does."""

    classes: tuple[str, ...]
    command: str
    on_overflow: str = DEFAULT_OVERFLOW
    queue_depth: int = DEFAULT_QUEUE_DEPTH


@attrs.frozen
class JobsSpec:
    """The ``[jobs]`` table: the commands a job may run, how many jobs the extension may hold,
    and the budget of each run (at most the extension's own ``timeout_ms``, ``fuel_per_call``
    and ``max_memory_bytes``; ``max_network_bytes`` None: only the hourly http quota)."""

    commands: tuple[str, ...]
    max_jobs: int
    max_runtime_ms: int
    fuel: int
    max_memory_bytes: int
    max_network_bytes: int | None = None
