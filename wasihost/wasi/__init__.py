"""The restricted WASI preview1 profile, implemented in Python behind the registry.

Every ``wasi_snapshot_preview1`` function is a registry entry with a capability, denied unless
granted (ungranted imports still link and answer their documented errno). Typical use::

    config = WasiOptions(argv=["tool", "-v"], mounts=[Mount(Path("/srv/data"), "/data")])
    profile, factory = wasi_profile(config)
    host = Host(Policy(allow=capabilities_for(config)), profiles=[(profile, factory)])
    ext = host.load("tool.wasm", grants=capabilities_for(config))
    exit_code = ext.run_command()

See docs/wasi.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "CAPABILITIES",
    "FUNCTIONS",
    "MODULE",
    "PROFILE",
    "ClockProfile",
    "Errno",
    "Mount",
    "OutputSink",
    "WasiBinding",
    "WasiOptions",
    "capabilities_for",
    "wasi_profile",
]

# Loaded on first use, as ``wasihost``'s own names are: importing any ``wasihost.wasi.*`` module
# (the CLI's ``wasi`` parser, the registry entries) runs this file, and the handlers behind
# ``WasiBinding`` are needed only when a WASI guest is bound.
_LAZY = {
    "CAPABILITIES": "registry",
    "FUNCTIONS": "registry",
    "MODULE": "registry",
    "PROFILE": "registry",
    "ClockProfile": "config",
    "Errno": "errno",
    "Mount": "config",
    "OutputSink": "config",
    "WasiBinding": "binding",
    "WasiOptions": "config",
    "capabilities_for": "config",
    "wasi_profile": "binding",
}

if TYPE_CHECKING:
    from .binding import WasiBinding, wasi_profile
    from .config import ClockProfile, Mount, OutputSink, WasiOptions, capabilities_for
    from .errno import Errno
    from .registry import CAPABILITIES, FUNCTIONS, MODULE, PROFILE


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wasihost.wasi' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
