"""The old path of ``wasihost.core.errors``, kept for one release."""

from typing import Any

from wasihost.core import errors as _home
from wasihost.core.errors import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
