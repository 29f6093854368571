"""The old path of ``wasihost.supervisor.eviction``, kept for one release."""

from typing import Any

from wasihost.supervisor import eviction as _home
from wasihost.supervisor.eviction import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
