"""Nothing a broker keeps reaches guest memory after its instance is gone.

A broker keeps the GuestMemory of a host call of extension A; A is closed, and extension C
(whose memory may now sit at A's old address) runs. Every access through the kept object
raises a clean error, before and after C closes, instead of reading or writing C's memory or
freed memory (which crashed the process). No view of guest memory is handed to brokers at
all, and the engine's own view is released with its Store.

The accesses run in a child process, so a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

import pytest

from tests.support.common import run_child

CHILD = """
import gc, json, sys
sys.path.insert(0, ".")
from tests.support.common import bare, native_entry
from tests.support.guests import build, guest_wat
from wasihost.host.policy import Policy
from wasihost.core.registry import Profile
from wasihost.host.runtime import Host

MODULE = "keep_preview1"
PROFILE = Profile(name="keep", module=MODULE,
                  functions=(native_entry(MODULE, "touch", ("i32",), ("i32",), "keep"),))
KEPT = []
VIEWS = []

class Keep:
    def __init__(self, ext): pass
    def handler(self, e):
        def touch(mem, n):
            KEPT.append(mem)
            value = mem.read_u32(n)
            VIEWS.append(mem._view)  # what a broker reaching into privates could keep
            return value
        return touch
    def close(self): pass

def guest(fill):
    # Fills its first page with `fill`, then touches the host once.
    return build(f'''(module
      (import "{MODULE}" "touch" (func $touch (param i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "_start")
        (memory.fill (i32.const 0) (i32.const {fill}) (i32.const 65536))
        (drop (call $touch (i32.const 0)))))''')

def attempt(what, action):
    try:
        result = action()
    except Exception as exc:
        return f"{what}: {type(exc).__name__}"
    return f"{what}: returned {result!r}"

def accesses(mem, view):
    return [
        attempt("read", lambda: mem.read(0, 16)),
        attempt("write", lambda: mem.write(0, b"\\x99" * 16)),
        attempt("read_u32", lambda: mem.read_u32(0)),
        attempt("write_u64", lambda: mem.write_u64(8, 1)),
        attempt("read_iovec", lambda: mem.read_iovec(0, 8)),
        attempt("size", lambda: mem.size()),
        attempt("private view", lambda: bytes(view[:16])),
        attempt("private view write", lambda: view.__setitem__(0, 0x99)),
    ]

host = Host(Policy(allow={"keep"}), cache_dir=None, profiles=[(PROFILE, Keep)])
a = host.admit(bare(guest(0xAA), "a.wasm"), grants=["keep"])
c = host.admit(bare(guest(0xCC), "c.wasm"), grants=["keep"])
# Each run_command closes its instance as it ends: A's memory is gone once it returns.
a.run_command()
report = {"has_view": hasattr(KEPT[0], "view")}
report["after_a"] = accesses(KEPT[0], VIEWS[0])
c.run_command()
report["after_c"] = accesses(KEPT[0], VIEWS[0]) + accesses(KEPT[1], VIEWS[1])

# An ABI guest whose instance stays up between calls, and a host dropped without close():
# the kept accessor keeps what it reads alive (its Store and memory handle), so it must neither
# crash nor reach another Store's memory.
abi = build(guest_wat(
    "(memory.fill (i32.const 65536) (i32.const 0xDD) (i32.const 65536))"
    " (drop (call $touch (i32.const 65536))) (call $ok_null)",
    imports=f'(import "{MODULE}" "touch" (func $touch (param i32) (result i32)))',
    memory='(memory (export "memory") 2)',
))
dropped_host = Host(Policy(allow={"keep"}), cache_dir=None, profiles=[(PROFILE, Keep)])
d = dropped_host.admit(bare(abi, "d.wasm"), grants=["keep"])
d.call("run")
kept_d = KEPT[-1]
del d, dropped_host
gc.collect()
e = host.admit(bare(guest(0xEE), "e.wasm"), grants=["keep"])
e.run_command()
try:
    report["dropped"] = kept_d.read(65536, 4).hex()
except Exception as exc:
    report["dropped"] = type(exc).__name__
print(json.dumps(report))
"""


@pytest.mark.in_process
def test_kept_guest_memory_fails_cleanly_after_its_instance_closes() -> None:
    report, _ = run_child(CHILD)
    assert report["has_view"] is False  # brokers get no memoryview to keep
    for phase in ("after_a", "after_c"):
        for outcome in report[phase]:
            what, result = outcome.split(": ", 1)
            expected = "ValueError" if what.startswith("private view") else "MemoryGone"
            assert result == expected, (phase, outcome)
    # Dropped, not closed: its own (kept) memory or a clean error, never another Store's.
    assert report["dropped"] in ("dddddddd", "MemoryGone"), report["dropped"]
