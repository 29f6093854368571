"""The old path of ``wasihost.core.status``, kept for one release."""

from typing import Any

from wasihost.core import status as _home
from wasihost.core.status import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
