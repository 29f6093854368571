"""A WASI run keeps the GIL across its guest code only while it is the process's one Python
thread (each printed line crosses into Python, and the release and re-acquisition at each
crossing cost a tenth of a line); otherwise it releases it as before. Each case runs in a fresh
interpreter, where the thread count is the test's own, through the real engine with WAT guests.
"""

from __future__ import annotations

import pytest

from tests.support.common import run_child

# In-process mechanics (the GIL of the in-process engine):
# these run in-process under --runtime=process too.
pytestmark = pytest.mark.in_process

# A guest that prints one line, then (argv[1] == "spin") loops until its deadline.
_CHILD = r'''
import hashlib, json, sys, threading, time
import wasmtime
from wasihost.core.errors import CallError
from wasihost.packaging.package import Package
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import WasiOptions, capabilities_for, wasi_profile


WAT = """
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "a\\n")
  (data (i32.const 200) "\\64\\00\\00\\00\\02\\00\\00\\00")
  (func (export "_start")
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 300)))
    (if (i32.load (i32.const 0)) (then (loop $spin (br $spin))))))
"""
mode = sys.argv[1]
kept = []
beats = []
stop = threading.Event()


def heartbeat():
    while not stop.is_set():
        beats.append(time.monotonic())
        time.sleep(0.001)


def sink(data):
    # Called during the run: the running instance tells whether it kept the GIL.
    kept.extend(i.kept_gil for i in ext._instances())
    if mode == "spin":
        threading.Thread(target=heartbeat, daemon=True).start()


if mode == "thread":  # another Python thread alive before the run
    threading.Thread(target=stop.wait, daemon=True).start()
wasm = bytes(wasmtime.wat2wasm(WAT))
if mode == "spin":  # the guest spins after its line: a word it reads is set
    wasm = bytes(wasmtime.wat2wasm(WAT.replace('(data (i32.const 100)', '(data (i32.const 0) "\\01")\n  (data (i32.const 100)')))
config = WasiOptions(stdout=sink)
caps = capabilities_for(config)
host = Host(Policy(allow=caps), cache_dir=None, profiles=[wasi_profile(config)])
pkg = Package("g.wasm", None, wasm, hashlib.sha256(wasm).hexdigest())
ext = host.admit(pkg, grants=caps, fuel=10_000_000_000, timeout_ms=400)
threads = threading.active_count()
start = time.monotonic()
try:
    outcome = ext.run_command()
except CallError as exc:
    outcome = exc.failure.value
ended = time.monotonic()
stop.set()
host.close()
during = [t for t in beats if start < t < ended]
print(json.dumps({"threads": threads, "kept": kept, "outcome": outcome,
                  "seconds": ended - start, "beats": len(during)}))
'''


def test_a_wasi_run_keeps_the_gil_only_as_the_one_python_thread() -> None:
    alone, _ = run_child(_CHILD, "alone")
    assert (alone["threads"], alone["kept"], alone["outcome"]) == (1, [True], 0)
    beside, _ = run_child(_CHILD, "thread")
    assert (beside["threads"], beside["kept"], beside["outcome"]) == (2, [False], 0)


def test_a_run_that_keeps_the_gil_still_ends_at_its_deadline_and_lets_new_threads_run() -> None:
    # The run keeps the GIL (no other thread at its start); its line's sink starts a heartbeat
    # thread, then the guest spins: the ticks need no GIL, so the 400 ms deadline still ends
    # it, and the new thread runs at each tick meanwhile (about 40 at 10 ms ticks; a GIL never
    # given up would allow none).
    spin, _ = run_child(_CHILD, "spin")
    assert (spin["kept"], spin["outcome"]) == ([True], "deadline")
    assert spin["seconds"] < 0.4 + 1.5
    assert spin["beats"] >= 5, spin
