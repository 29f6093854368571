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

from .binding import WasiBinding, wasi_profile
from .config import ClockProfile, Mount, OutputSink, WasiOptions, capabilities_for
from .errno import Errno
from .registry import CAPABILITIES, FUNCTIONS, MODULE, PROFILE

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
