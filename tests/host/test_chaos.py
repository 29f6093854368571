"""Chaos: threads call, close, revoke, reinstate, reload and update extensions of one host at
once. It ends with no crash, no LifecycleError, nothing but the documented errors, and no
leaked threads or descriptors."""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from typing import Any

import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from wasihost.core.errors import AdmissionError, CallError, ConfigError, WasihostError
from wasihost.core.lifecycle import ExtensionRevoked, ExtensionUnavailable, LifecycleError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

# The issue asks for 30 s; WASIHOST_CHAOS_SECONDS shortens it for a quick local run.
CHAOS_SECONDS = float(os.environ.get("WASIHOST_CHAOS_SECONDS", "30"))
CALLERS = 3
# name -> (command, input)
WORKLOADS: dict[str, tuple[str, Any]] = {
    "echo": ("echo", "x" * 100),
    "hello": ("greet", {"name": "ada"}),
    "hostflood": ("run", {"calls": 50}),
    "compute": ("run", {"n": 20}),
}
IDS = {name: f"org.wasihost.fixtures.{name}" for name in WORKLOADS}
# What a caller may see while operators act: every other exception is a bug.
EXPECTED = (ExtensionRevoked, ExtensionUnavailable, CallError, AdmissionError)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.soak
def test_chaos_of_calls_and_operator_actions() -> None:
    threads_before = threading.active_count()
    fds_before = open_fds()
    unexpected: list[BaseException] = []
    counts = {"ok": 0, "expected": 0, "ops": 0}
    stop = threading.Event()
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        for name in WORKLOADS:
            host.load(FIXTURES / name)

        def caller(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                name = rng.choice(list(WORKLOADS))
                ext = host.extension(IDS[name])
                if ext is None:
                    time.sleep(0.001)
                    continue
                command, value = WORKLOADS[name]
                try:
                    ext.call(command, value)
                    counts["ok"] += 1
                except EXPECTED:
                    counts["expected"] += 1
                except BaseException as exc:
                    unexpected.append(exc)

        def operator(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                name = rng.choice(list(WORKLOADS))
                ext_id = IDS[name]
                action = rng.choice(
                    ["revoke_cap", "grant_cap", "disable", "close", "reload", "update", "pause"]
                )
                try:
                    if action == "revoke_cap":
                        host.revoke(ext_id, rng.choice(["log", "clock"]))
                    elif action == "grant_cap":
                        host.grant(ext_id, rng.choice(["log", "clock"]))
                    elif action == "disable":
                        host.disable(ext_id, "chaos")
                    elif action == "pause":
                        ext = host.extension(ext_id)
                        if ext is not None:
                            ext.pause("chaos")
                            time.sleep(0.002)
                            ext.resume()
                    elif action == "close":
                        ext = host.extension(ext_id)
                        if ext is not None:
                            ext.close()
                    elif action in ("reload", "update"):
                        host.reinstate(ext_id)
                        ext = host.extension(ext_id)
                        if action == "update" and ext is not None:
                            host.update(FIXTURES / name)
                        else:
                            if ext is not None:
                                ext.close()
                            host.load(FIXTURES / name)
                    counts["ops"] += 1
                except (LifecycleError, AdmissionError) as exc:
                    # pause/resume race with calls, closes and revocations by design; an
                    # admission may lose a race with another reload of the same id.
                    if isinstance(exc, LifecycleError) and action != "pause":
                        unexpected.append(exc)
                except ConfigError:
                    pass  # the operator's own misuse (revoking what is not held): told so
                except WasihostError as exc:
                    if not isinstance(exc, EXPECTED):
                        unexpected.append(exc)
                except BaseException as exc:
                    unexpected.append(exc)
                time.sleep(rng.uniform(0, 0.01))

        workers = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
        workers.append(threading.Thread(target=operator, args=(99,)))
        for w in workers:
            w.start()
        time.sleep(CHAOS_SECONDS)
        stop.set()
        for w in workers:
            w.join(timeout=30)
            assert not w.is_alive(), "a worker hung"
    assert not unexpected, unexpected[:5]
    assert counts["ok"] > 100 and counts["ops"] > 100, counts
    gc.collect()
    # The closed host's watchdog may linger one tick.
    assert threading.active_count() <= threads_before + 1
    # wasmtime keeps one memfd (the memory image) per compiled module until it is collected.
    assert open_fds() <= fds_before + len(WORKLOADS) + 2
