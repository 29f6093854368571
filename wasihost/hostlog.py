"""The old path of ``wasihost.core.hostlog``, kept for one release."""

from typing import Any

from wasihost.core import hostlog as _home
from wasihost.core.hostlog import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
