"""The old path of ``wasihost.core.budgets``, kept for one release."""

from typing import Any

from wasihost.core import budgets as _home
from wasihost.core.budgets import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
