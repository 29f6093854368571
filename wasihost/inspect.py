"""The old path of ``wasihost.host.inspect``, kept for one release."""

from typing import Any

from wasihost.host import inspect as _home
from wasihost.host.inspect import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
