"""The old path of ``wasihost.supervisor.restart_policies``, kept for one release."""

from typing import Any

from wasihost.supervisor import restart_policies as _home
from wasihost.supervisor.restart_policies import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # The names ``import *`` does not bring (private ones, lazily made ones) are read there.
    return getattr(_home, name)
