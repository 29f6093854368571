"""A guest is entered only with ``max_wasm_stack`` plus ``STACK_MARGIN`` of the thread's stack
left below the caller: on a thread too small for any guest the call is refused with a clear
``ConfigError``; where the caller's own frames leave too little it fails ``stack_overflow``
before the guest runs; on a thread of the advised size, runaway recursion (even one calling the
host at every level) ends as ``stack_overflow`` trapped by the engine.

The calls run in a child process, so a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.common import run_child
from wasihost.core.settings import DEFAULT_MAX_WASM_STACK
from wasihost.engine.stack import ENTRY_HEADROOM, STACK_MARGIN

# In-process mechanics: the calling thread's stack matters to the in-process engine only (a
# process runtime's guest runs on its child's own stack). In-process under --runtime=process.
pytestmark = pytest.mark.in_process

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
sys.path.insert(0, ".")
from tests.support.common import bare, native_entry
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, ConfigError
from wasihost.host.policy import Policy
from wasihost.core.registry import Profile
from wasihost.host.runtime import Host

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


# A guest burning 12M fuel a call, called from a thread too deep to enter it (one extension
# started from a shallow thread before, one never started), then from a shallow thread.
REFUSED_CHILD = """
import json, sys, threading
sys.path.insert(0, ".")
from tests.support.common import ALL_CAPS, bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

BURN = ("(local.set $i (i32.const 2000000)) (loop $l (local.set $i (i32.sub (local.get $i) "
        "(i32.const 1))) (br_if $l (local.get $i)))")
entry = "(param $in_len i32) (result i64)"
wasm = build(guest_wat(BURN + " (call $ok_null)").replace(entry, entry + " (local $i i32)", 1))
host = Host(Policy(allow=ALL_CAPS), cache_dir=None)
ran = host.admit(bare(wasm, "ran.wasm"), grants=(), fuel=20_000_000)
fresh = host.admit(bare(wasm, "fresh.wasm"), grants=(), fuel=20_000_000)
ran.call("run")
out = {}

def seen(ext, before):
    return {"state": ext.lifecycle.state.value, "starts": ext.starts,
            "last_fuel_used": ext.last_fuel_used,
            "charged": ext.usage().cpu_fuel_last_minute - before}

def refused(name, ext):
    before = ext.usage().cpu_fuel_last_minute
    try:
        ext.call("run")
        verdict = "ok"
    except CallError as exc:
        verdict = exc.failure.value + ": " + exc.message
    out[name] = {"verdict": verdict, **seen(ext, before)}

def down(levels, name, ext):
    if levels == 0:
        return refused(name, ext)
    return list(map(down, [levels - 1], [name], [ext]))[0]

threading.stack_size(int(sys.argv[1]))
for name, ext in (("ran", ran), ("fresh", fresh)):
    thread = threading.Thread(target=down, args=(600, name, ext))
    thread.start()
    thread.join()
for name, ext in (("ran", ran), ("fresh", fresh)):
    ext.call("run")  # served from this shallow thread, by the same instance if one ran
    out[name + " after"] = seen(ext, 0)
host.close()
print(json.dumps(out))
"""


def test_an_entry_refused_for_a_deep_caller_charges_nothing_and_crashes_nothing() -> None:
    # Break (issue 28, second pass on item 21): the refusal is the caller's, raised before
    # any guest code runs, but the call path took it for the guest's stack_overflow. The
    # refused call was charged the extension's previous call again (12M fuel into the CPU
    # budget and last_fuel_used: the instance's figure of that call), and it crashed the
    # extension (failed, restarted by the supervisor, quarantined after a few); on a
    # never-started extension, the start-up failed the same way.
    out, _ = run_child(REFUSED_CHILD, str(NEEDED))
    for name in ("ran", "fresh"):
        refusal = out[name]
        assert refusal["verdict"].startswith("stack_overflow: "), refusal
        assert REFUSED in refusal["verdict"]
        assert refusal["last_fuel_used"] == 0
        assert refusal["charged"] == 0
    assert out["ran"]["state"] == "running"
    assert out["fresh"]["state"] == "provisioning"
    # Not restarted: the instance that ran before the refusal serves the next call.
    assert out["ran after"]["starts"] == 1
    assert out["fresh after"] == {**out["fresh after"], "state": "running", "starts": 1}


# An embedder that lowered threading.stack_size for threads of its own, then used the host:
# every way the host runs a guest on a thread of its own. Prints what each came to.
SMALL_STACKS_CHILD = """
import asyncio, json, sys, threading, time
sys.path.insert(0, ".")
from tests.support.common import FIXTURES
from wasihost.brokers.jobs import JobsBroker, ManualClock
from wasihost.core.errors import CallError, ConfigError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

EMBEDDERS = 256 * 1024
threading.stack_size(EMBEDDERS)
logged = []
jobs = JobsBroker(clock=ManualClock())
host = Host(Policy(allow={"jobs", "log", "events"}), cache_dir=None, brokers=[jobs],
            log_sink=lambda ext, record: logged.append(record.message))
for capability in ("jobs", "log", "events"):
    host.grant("org.wasihost.fixtures.jobs", capability)
ext = host.load(FIXTURES / "jobs")
hello = host.load(FIXTURES / "hello", grants=["log"])
out = {}

def outcome(run):
    try:
        run()
        return "ok"
    except (CallError, ConfigError) as exc:
        return type(exc).__name__ + ": " + exc.message

out["main thread"] = outcome(lambda: ext.call("tick"))
out["acall"] = outcome(lambda: asyncio.run(ext.acall("tick")))
ext.call("schedule", {"command": "tick", "every_ms": 1000, "delay_ms": 0})
ext.call("schedule", {"command": "tick", "on_event": "orders.created"})
jobs.tick()
host.publish("orders.created")
deadline = time.monotonic() + 10
while jobs.runs + jobs.failed < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
out["job runs"] = [jobs.runs, jobs.failed]
hello.call("greet", {"name": "a"})
try:
    hello.call("greet", {"name": "x"}, fuel=1)  # out of fuel: a warm spare is made
except CallError:
    pass
out["spare"] = hello.wait_for_spare(10.0) and hello.spare_starts == 0
def embedders_thread():
    out["embedder's thread"] = outcome(lambda: ext.call("tick"))
thread = threading.Thread(target=embedders_thread)
thread.start()
thread.join()
host.close(timeout_s=5.0)
out["shutdown hook"] = "shutdown" in logged
out["setting after"] = threading.stack_size()
print(json.dumps(out))
"""


def test_the_hosts_own_threads_run_guests_whatever_stack_size_the_embedder_set() -> None:
    # Break (issue 28, second pass on item 21): the host's threads that run guests (call
    # threads, warm-spare threads, the jobs and events workers, the shutdown hooks' threads)
    # were started with the process-wide threading.stack_size. After an embedder lowered it
    # to 256 KiB for threads of its own, every acall was refused with a ConfigError telling
    # the embedder to raise it, no job run or event delivery ran, no warm spare was made and
    # no shutdown hook ran. Now those threads get 8 MiB (threadstack.GUEST_THREAD_STACK).
    out, _ = run_child(SMALL_STACKS_CHILD)
    assert out["main thread"] == "ok"
    assert out["acall"] == "ok"
    assert out["job runs"] == [2, 0]
    assert out["spare"] is True
    assert out["shutdown hook"] is True
    # The embedder's own small threads are still refused, and its setting is as it left it.
    assert out["embedder's thread"].startswith("ConfigError: the calling thread's stack is 256")
    assert out["setting after"] == 256 * KiB


# The recurse fixture entered on a stack of the caller's making (makecontext/swapcontext, as a
# coroutine library does), mapped before the thread starts so that it lies above the thread's
# own stack; prints what the call came to.
FOREIGN_STACK_CHILD = """
import ctypes, json, mmap, sys, threading
from pathlib import Path
from wasihost.core.errors import CallError, ConfigError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host


host = Host(Policy(allow=set()), cache_dir=None)
ext = host.load(Path("fixtures/recurse"))
libc = ctypes.CDLL(None)
size = int(sys.argv[1])
region = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(region))
own, coroutine = ctypes.create_string_buffer(8192), ctypes.create_string_buffer(8192)
out = {}

@ctypes.CFUNCTYPE(None)
def on_foreign_stack():
    try:
        ext.call("run")
        out["verdict"] = "ok"
    except (CallError, ConfigError) as exc:
        out["verdict"] = type(exc).__name__ + ": " + exc.message
    libc.setcontext(own)

def run():
    libc.getcontext(coroutine)
    # ucontext_t on x86_64 and aarch64: uc_link at 8, uc_stack.ss_sp at 16, ss_size at 32
    ctypes.c_void_p.from_buffer(coroutine, 8).value = None
    ctypes.c_void_p.from_buffer(coroutine, 16).value = base
    ctypes.c_size_t.from_buffer(coroutine, 32).value = size
    libc.makecontext(coroutine, on_foreign_stack, 0)
    libc.swapcontext(own, coroutine)

thread = threading.Thread(target=run)
thread.start()
thread.join()
print(json.dumps(out))
"""


@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "aarch64") or sys.platform != "linux",
    reason="the ucontext_t layout written is glibc's on x86_64 and aarch64",
)
def test_a_guest_entered_on_a_stack_not_the_threads_own_is_refused_not_crashed() -> None:
    # Break (issue 28, second pass on item 21): the check measured the stack pointer from the
    # thread's stack's low bound without asking whether it was on that stack at all. On a
    # coroutine's stack above the thread's, everything looked left: the recurse fixture was
    # entered on a 192 KiB stack and the process died of SIGSEGV. Its size cannot be read, so
    # such an entry is refused, however large the stack.
    for size in (192 * KiB, 4096 * KiB):
        out, _ = run_child(FOREIGN_STACK_CHILD, str(size))
        assert out["verdict"].startswith(
            "ConfigError: the guest would be entered on a stack "
            "that is not the calling thread's own"
        ), (size, out)
