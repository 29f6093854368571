"""Instances, extensions and hosts are freed, whether closed or just dropped.

Soak: thousands of instantiate-call-close cycles, and of instantiate-call-drop cycles where the
instance is held in a reference cycle by its own host functions (as an Extension holds its
instance), keep the process's address space (VmSize), memory maps and RSS flat. Hosts dropped
without close() stop their watchdog threads and free their extensions.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.common import FIXTURES
from tests.support.guests import build, guest_wat, host_import
from wasihost.core.registry import AbiVersion, HostFunction
from wasihost.core.settings import EngineSettings
from wasihost.engine import BoundImport, Budget, Instance, StoreLimits, WasmEngine
from wasihost.host.defaults import default_registry
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

CYCLES = 2000
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
# What the cycles may leave behind, all told: less than one Store's address-space
# reservation, a few maps (allocator arenas), a few MiB of RSS (allocator high-water marks).
MAX_VM_GROWTH = 1 * GiB
MAX_MAP_GROWTH = 40
MAX_RSS_GROWTH = 24 * MiB
# Peak open maps while instances are being dropped: the engine collects dropped cycles once
# the open Stores double (GC_NUDGE_STORES), so a few hundred at most; a leak is thousands.
MAX_PEAK_MAP_GROWTH = 1500

LOGGING = build(
    guest_wat(
        "(drop (call $log (i32.const 9000) (i32.const 1) (i32.const 9100) (i32.const 8))) "
        "(call $ok_null)",
        imports=host_import("log"),
        extra='(data (i32.const 9000) "\\f6")',
    )
)
LOG_ENTRY: HostFunction = default_registry().view(AbiVersion(1, 0)).entries[("wasihost_v1", "log")]
LIMITS = StoreLimits(max_memory_bytes=4 * MiB, max_table_elements=100, fuel=10**6, timeout_ms=5000)


def usage() -> dict[str, int]:
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmSize", "VmRSS"):
            status[key] = int(value.split()[0]) * KiB
    status["maps"] = len(Path("/proc/self/maps").read_text().splitlines())
    status["threads"] = threading.active_count()
    return status


class Owner:
    """Holds an instance whose gate and log handler call back into it, as an Extension does."""

    def __init__(self, engine: WasmEngine, module: Any) -> None:
        self.logged = 0
        self.instance: Instance = engine.new_instance(
            module, [BoundImport(LOG_ENTRY, self.log)], self.gate, LIMITS
        )
        self.instance.instantiate(Budget(LIMITS.fuel, LIMITS.timeout_ms))

    def gate(self, entry: HostFunction) -> bool:
        return True

    def log(self, call: Any, request: Any) -> None:
        self.logged += 1

    def call(self) -> None:
        with self.instance.lock:
            result = self.instance.call(b"run", b"\xf6", 1024)
        assert result.status == 0
        assert self.logged == 1


@pytest.fixture
def engine() -> Iterator[WasmEngine]:
    engine = WasmEngine(EngineSettings(), cache_dir=None)
    yield engine
    engine.close()


def soak(engine: WasmEngine, *, close: bool) -> tuple[dict[str, int], dict[str, int], int]:
    module = engine.compile(LOGGING)
    for _ in range(200):  # warm up allocators and caches
        Owner(engine, module).call()
    gc.collect()
    before = usage()
    peak_maps = before["maps"]
    for i in range(CYCLES):
        owner = Owner(engine, module)
        owner.call()
        if close:
            owner.instance.close()
        del owner
        if i % 50 == 0:
            peak_maps = max(peak_maps, usage()["maps"])
    gc.collect()
    return before, usage(), peak_maps


@pytest.mark.parametrize("close", [True, False], ids=["closed", "dropped"])
def test_instance_cycles_keep_the_process_flat(engine: WasmEngine, close: bool) -> None:
    before, after, peak_maps = soak(engine, close=close)
    assert after["VmSize"] - before["VmSize"] < MAX_VM_GROWTH, (before, after)
    assert after["maps"] - before["maps"] < MAX_MAP_GROWTH, (before, after)
    assert after["VmRSS"] - before["VmRSS"] < MAX_RSS_GROWTH, (before, after)
    assert peak_maps - before["maps"] < MAX_PEAK_MAP_GROWTH, (before, peak_maps)
    assert after["threads"] <= before["threads"]


def test_dropped_hosts_stop_their_watchdogs_and_free_their_extensions(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    gc.collect()
    threads = threading.active_count()
    extensions = []
    for _ in range(20):
        host = Host(Policy(allow={"log", "clock", "random"}), cache_dir=cache)
        ext = host.load(FIXTURES / "echo")
        assert ext.call("echo", b"x") == b"x"
        extensions.append(weakref.ref(ext))
        del host, ext
    gc.collect()
    assert [ref for ref in extensions if ref() is not None] == []
    deadline = time.monotonic() + 2.0  # a watchdog notices its stop within one tick
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= threads
