"""The old path of ``wasihost.host.runtime``, kept for one release."""

from typing import Any

from wasihost.host import runtime as _home
from wasihost.host.runtime import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
