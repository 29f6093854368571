"""The old path of ``wasihost.store.secrets``, kept for one release."""

from typing import Any

from wasihost.store import secrets as _home
from wasihost.store.secrets import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
