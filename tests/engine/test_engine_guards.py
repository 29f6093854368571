"""Guards at the engine's edges: one thread at a time in an Instance, the pinned wasmtime major,
and host calls priced before work proportional to a length the guest declared."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import wasihost.brokers.random
import wasihost.engine.hostcalls
from tests.support.common import bare, native_entry, run_child
from tests.support.guests import build, guest_wat, host_import
from wasihost.core.errors import CallError, ConfigError, FailureClass
from wasihost.core.guestmem import GuestMemory
from wasihost.core.registry import HostFunction, Profile
from wasihost.engine.lowlevel import check_version
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host


def child(source: str) -> dict[str, Any]:
    """Run ``source`` in a fresh interpreter (a crash fails the test, not pytest)."""
    result: dict[str, Any] = run_child(source)[0]
    return result


# -- one thread at a time -----------------------------------------------------------------------

TWO_THREADS = """
import json, sys, threading, time
sys.path.insert(0, ".")
from tests.support.common import bare
from tests.support.guests import build, guest_wat
from wasihost.core.errors import CallError, ConfigError
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host

host = Host(Policy(), cache_dir=None)
ext = host.admit(bare(build(guest_wat("(loop $l (br $l)) (call $ok_null)")), "spin.wasm"),
                 timeout_ms=3000, fuel=10_000_000_000)
ext.start()
(instance,) = ext._instances()
report = {}

def first():
    started = time.monotonic()
    try:
        with instance.lock:
            instance.call(b"run", b"\\xf6", 1024)
        report["first"] = "returned"
    except CallError as exc:
        report["first"] = exc.failure.value
    report["first_s"] = time.monotonic() - started

thread = threading.Thread(target=first)
thread.start()
time.sleep(0.2)  # the first call is spinning in the guest now
try:
    instance.call(b"run", b"\\xf6", 1024)  # without the lock, on a second thread
    report["second"] = "returned"
except ConfigError as exc:
    report["second"] = "refused: " + exc.message
instance.close()  # from this thread, while the first call runs
report["closed"] = instance.closed
thread.join()
try:
    instance.call(b"run", b"\\xf6", 1024)
except CallError as exc:
    report["after_close"] = exc.message
print(json.dumps(report))
"""


def test_a_second_thread_in_an_instance_is_refused_and_close_waits_for_the_call() -> None:
    report = child(TWO_THREADS)
    assert report["second"].startswith("refused: "), report
    assert "Instance.lock" in report["second"]
    # close() interrupted the running call instead of freeing its Store under it.
    assert report["first"] == "deadline", report
    assert report["first_s"] < 1.5, report
    assert report["closed"] is True
    assert report["after_close"] == "instance is closed"


# -- the pinned wasmtime major ------------------------------------------------------------------


@pytest.mark.parametrize("version", ["18.0.0", "30.0.2", "51.0.0", "dev"])
def test_other_wasmtime_majors_are_refused_by_version(version: str) -> None:
    with pytest.raises(ConfigError, match=r"wasmtime 50\.x"):
        check_version(version)


def test_the_pinned_major_passes() -> None:
    check_version("50.0.1")
    check_version("50.2.0")


def test_import_with_an_old_wasmtime_fails_with_a_config_error() -> None:
    # The version is read from the name of wasmtime-py's .dist-info directory beside it (see
    # lowlevel.installed_version): the child sees an old one there.
    report = child("""
import json, os, wasmtime
site = os.path.dirname(os.path.dirname(wasmtime.__file__))
real = os.listdir
os.listdir = lambda path=".": (
    ["wasmtime-30.0.0.dist-info"] if os.fspath(path) == site else real(path)
)
try:
    import wasihost.host.runtime
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
""")
    assert report["error"] == "ConfigError", report
    assert "wasmtime 30.0.0 is installed" in report["message"]


# -- pricing before work ------------------------------------------------------------------------

MODULE = "bulk_preview1"
PROFILE = Profile(
    name="bulk",
    module=MODULE,
    functions=(
        native_entry(MODULE, "fill", ("i32", "i32"), ("i32",), "bulk", fuel_per_byte=1),
        native_entry(MODULE, "blind_fill", ("i32", "i32"), ("i32",), "bulk", fuel_per_byte=1),
    ),
)
MiB = 1024 * 1024


class BulkBinding:
    """``fill`` reserves fuel for ``n`` bytes before producing them, as brokers should;
    ``blind_fill`` produces them first and relies on the write's own check."""

    work: list[int] = []  # noqa: RUF012 (reset per test)

    def __init__(self, ext: Any) -> None:
        pass

    def handler(self, e: HostFunction) -> Callable[..., Any]:
        def fill(mem: GuestMemory, ptr: int, n: int) -> int:
            mem.require_fuel(n)  # fuel_per_byte is 1
            BulkBinding.work.append(n)
            mem.write(ptr, bytes(n))
            return 0

        def blind_fill(mem: GuestMemory, ptr: int, n: int) -> int:
            data = bytes(n)
            mem.write(ptr, data)
            BulkBinding.work.append(n)
            return 0

        return {"fill": fill, "blind_fill": blind_fill}[e.name]

    def close(self) -> None:
        pass


def bulk_guest(name: str, n: int) -> bytes:
    return build(
        guest_wat(
            f"(drop (call $f (i32.const 65536) (i32.const {n}))) (call $ok_null)",
            imports=f'(import "{MODULE}" "{name}" (func $f (param i32 i32) (result i32)))',
            memory='(memory (export "memory") 20)',
        )
    )


@pytest.fixture
def bulk_host() -> Iterator[Host]:
    BulkBinding.work = []
    with Host(
        Policy(allow={"bulk", "random"}), cache_dir=None, profiles=[(PROFILE, BulkBinding)]
    ) as h:
        yield h


@pytest.mark.parametrize("name", ["fill", "blind_fill"])
def test_a_native_bulk_host_call_is_priced_before_its_work(bulk_host: Host, name: str) -> None:
    ext = bulk_host.admit(bare(bulk_guest(name, MiB), f"{name}.wasm"), grants=["bulk"], fuel=1000)
    with pytest.raises(CallError) as info:
        ext.call("run")
    assert info.value.failure is FailureClass.OUT_OF_FUEL, info.value
    assert BulkBinding.work == []
    # With the fuel to pay for it, the same call goes through.
    rich = bulk_host.admit(bare(bulk_guest(name, MiB), f"rich-{name}.wasm"), grants=["bulk"])
    assert rich.call("run") is None
    assert BulkBinding.work == [MiB]


@pytest.mark.in_process  # patches the engine's settling batch, which a child does not see
def test_a_cbor_host_call_is_priced_on_its_response_capacity_before_its_work(
    bulk_host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[Any] = []
    real = wasihost.brokers.random.random_handler

    def counting(*args: Any) -> Callable[[Any, Any], Any]:
        handle = real(*args)

        def count(call: Any, request: Any) -> Any:
            served.append(request)
            return handle(call, request)

        return count

    monkeypatch.setattr(wasihost.brokers.random, "random_handler", counting)
    # The most random_bytes may answer is under the settling batch, which may go unpaid; with
    # a batch of 10,000 units the check before the work is what stops it.
    monkeypatch.setattr(wasihost.engine.hostcalls, "SETTLE_FUEL", 10_000)
    # random_bytes(4096) into a 4099-byte buffer: up to 32,792 fuel of response.
    wasm = build(
        guest_wat(
            "(drop (call $random_bytes (i32.const 9000) (i32.const 3) (i32.const 10000) "
            "(i32.const 4099))) (call $ok_null)",
            imports=host_import("random_bytes"),
            extra='(data (i32.const 9000) "\\19\\10\\00")',
        )
    )
    poor = bulk_host.admit(bare(wasm, "poor.wasm"), grants=["random"], fuel=5000)
    with pytest.raises(CallError) as info:
        poor.call("run")
    assert info.value.failure is FailureClass.OUT_OF_FUEL, info.value
    assert served == []
    rich = bulk_host.admit(bare(wasm, "rich.wasm"), grants=["random"])
    assert rich.call("run") is None
    assert served == [4096]
