"""The old path of ``wasihost.host.policy``, kept for one release."""

from typing import Any

from wasihost.host import policy as _home
from wasihost.host.policy import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
