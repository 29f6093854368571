"""The old path of ``wasihost.core.budget_crossing``, kept for one release."""

from typing import Any

from wasihost.core import budget_crossing as _home
from wasihost.core.budget_crossing import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
