"""A guest is entered only with ``max_wasm_stack`` plus ``STACK_MARGIN`` of the thread's stack
left below the caller: on a thread too small for any guest the call is refused with a clear
``ConfigError``; where the caller's own frames leave too little it fails ``stack_overflow``
before the guest runs; on a thread of the advised size, runaway recursion (even one calling the
host at every level) ends as ``stack_overflow`` trapped by the engine.

The calls run in a child process, so a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

from conftest import run_child

from wasihost.engine.stack import ENTRY_HEADROOM, STACK_MARGIN
from wasihost.settings import DEFAULT_MAX_WASM_STACK

KiB = 1024
NEEDED = DEFAULT_MAX_WASM_STACK + STACK_MARGIN
ADVISED = NEEDED + ENTRY_HEADROOM
# The refusal's words, and the engine's for a trap of the guest's own recursion.
REFUSED = "are left where the guest would be entered"
TRAPPED = "call stack exhausted"

# Prints {"<guest>@<thread size>@<C-level caller frames>": verdict}: "ok", "refused: <message>"
# for a ConfigError, or "<failure class>: <message>" for a CallError.
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
exts = {"recurse": host.load(Path("fixtures/recurse")),
        "pings": host.admit(bare(DEEP_PINGS, "pings.wasm"), grants=["ping"])}
results = {}

def call(key, ext):
    try:
        ext.call("run")
        results[key] = "ok"
    except ConfigError as exc:
        results[key] = "refused: " + exc.message
    except CallError as exc:
        results[key] = exc.failure.value + ": " + exc.message

def down(levels):
    # Each level re-enters the interpreter from C (map calls down), so each takes native
    # stack (about 0.6 KiB on CPython 3.11), as deep C-level recursion in an embedder would.
    if levels == 0:
        call(key, exts[name])
        return 0
    return list(map(down, [levels - 1]))[0]

for key in sys.argv[1:]:
    name, size, levels = key.split("@")
    threading.stack_size(int(size))
    thread = threading.Thread(target=down, args=(int(levels),))
    thread.start()
    thread.join()
print(json.dumps(results))
"""


def run_calls(*specs: tuple[str, int, int]) -> dict[str, str]:
    keys = [f"{name}@{size}@{levels}" for name, size, levels in specs]
    results, _ = run_child(CHILD, *keys)
    return {key: results[key] for key in keys}


def test_a_thread_too_small_for_the_guest_stack_is_refused_not_crashed() -> None:
    sizes = [256 * KiB, 512 * KiB]
    results = run_calls(*((name, size, 0) for size in sizes for name in ("recurse", "pings")))
    for key, verdict in results.items():
        size = int(key.split("@")[1])
        assert verdict.startswith("refused: "), (key, verdict)
        assert f"stack is {size // KiB} KiB" in verdict
        assert f"threading.stack_size({ADVISED})" in verdict


def test_on_a_thread_of_the_advised_size_runaway_recursion_traps_as_stack_overflow() -> None:
    # The guest runs to wasmtime's max_wasm_stack, also with host calls at its deepest point,
    # on the size the ConfigError advises and on a larger one.
    specs = [(name, size, 0) for size in (ADVISED, 2048 * KiB) for name in ("recurse", "pings")]
    for key, verdict in run_calls(*specs).items():
        assert verdict.startswith("stack_overflow: "), (key, verdict)
        assert TRAPPED in verdict, (key, verdict)


def test_a_deep_caller_gets_stack_overflow_not_a_sigsegv() -> None:
    # Break (red-team, issue 28 item 21): the check compared the thread's whole stack with the
    # guest's need, not what was left where the guest is entered. From a thread started with
    # threading.stack_size(786432), 450 or 600 C-level Python frames deep (about 270 and 365
    # KiB), the recurse fixture passed the check and overflowed the real stack: SIGSEGV, and the
    # child died. Now the stack pointer is compared with the thread's stack bounds at entry.
    results = run_calls(
        ("recurse", NEEDED, 450),
        ("recurse", NEEDED, 600),
        ("pings", NEEDED, 600),
        # with room below the caller, the same depth runs the guest to its own trap
        ("recurse", 2048 * KiB, 600),
        ("pings", 2048 * KiB, 600),
    )
    for key, verdict in results.items():
        assert verdict.startswith("stack_overflow: "), (key, verdict)
        refused = key.split("@")[1] == str(NEEDED)
        assert (REFUSED in verdict) is refused, (key, verdict)
        assert (TRAPPED in verdict) is not refused, (key, verdict)
    refusal = results[f"recurse@{NEEDED}@600"]
    assert f"of this thread's {NEEDED // KiB} KiB stack" in refusal
    assert "threading.stack_size(" in refusal
