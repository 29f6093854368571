"""The old path of ``wasihost.supervisor.scheduling``, kept for one release."""

from typing import Any

from wasihost.supervisor import scheduling as _home
from wasihost.supervisor.scheduling import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
