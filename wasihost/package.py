"""The old path of ``wasihost.packaging.package``, kept for one release."""

from typing import Any

from wasihost.packaging import package as _home
from wasihost.packaging.package import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
