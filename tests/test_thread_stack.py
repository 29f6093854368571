"""A guest call on a thread whose stack is too small for the engine's ``max_wasm_stack`` is
refused with a clear error instead of crashing the process when the guest recurses without
bound; on a thread just big enough, runaway recursion (even one calling the host at every
level) ends as ``stack_overflow``.

The calls run in a child process, so a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

from conftest import run_child

from wasihost.engine.stack import STACK_MARGIN
from wasihost.settings import DEFAULT_MAX_WASM_STACK

KiB = 1024
JUST_ENOUGH = DEFAULT_MAX_WASM_STACK + STACK_MARGIN

CHILD = """
import json, sys, threading
from pathlib import Path
sys.path.insert(0, "tests")
from conftest import bare, native_entry
from guests import build, guest_wat
from wasihost.errors import CallError, ConfigError
from wasihost.policy import Policy
from wasihost.registry import Profile
from wasihost.runtime import Host

MODULE = "ping_preview1"
PROFILE = Profile(name="ping", module=MODULE,
                  functions=(native_entry(MODULE, "ping", ("i32",), ("i32",), "ping"),))

class Ping:
    def __init__(self, ext): pass
    def handler(self, e): return lambda mem, n: n + 1
    def close(self): pass

# Recurses without bound, calling the host at every level (so also at the deepest one).
DEEP_PINGS = build(guest_wat(
    "(drop (call $down (i32.const 0))) (call $ok_null)",
    imports=f'(import "{MODULE}" "ping" (func $ping (param i32) (result i32)))',
    extra='''(func $down (param $n i32) (result i32)
      (i32.add (call $down (call $ping (local.get $n))) (local.get $n)))''',
))

host = Host(Policy(allow={"ping"}), cache_dir=None, profiles=[(PROFILE, Ping)])
recurse = host.load(Path("fixtures/recurse"))
pings = host.admit(bare(DEEP_PINGS, "pings.wasm"), grants=["ping"])
results = {}

def run(key, ext):
    try:
        ext.call("run")
        results[key] = "ok"
    except ConfigError as exc:
        results[key] = "refused: " + exc.message
    except CallError as exc:
        results[key] = exc.failure.value

for size in map(int, sys.argv[1:]):
    for name, ext in (("recurse", recurse), ("pings", pings)):
        threading.stack_size(size)
        thread = threading.Thread(target=run, args=(f"{name}@{size}", ext))
        thread.start()
        thread.join()
print(json.dumps(results))
"""


def test_a_thread_too_small_for_the_guest_stack_is_refused_not_crashed() -> None:
    sizes = [256 * KiB, 512 * KiB, JUST_ENOUGH, 2048 * KiB]
    results, _ = run_child(CHILD, *map(str, sizes))
    for size in sizes[:2]:
        for name in ("recurse", "pings"):
            verdict = results[f"{name}@{size}"]
            assert verdict.startswith("refused: "), verdict
            assert f"stack is {size // KiB} KiB" in verdict
            assert "threading.stack_size" in verdict
    for size in sizes[2:]:
        for name in ("recurse", "pings"):
            assert results[f"{name}@{size}"] == "stack_overflow", (name, size, results)
