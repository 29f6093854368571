"""The unchecked fast path gives exactly what wasmtime-py's public, checked path gives."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.common import FIXTURES
from wasihost.core.limits import COMMAND_FUEL_PER_BYTE
from wasihost.host.runtime import Host

FUEL = 10_000_000


class PublicPath:
    """The echo fixture driven through ``Func.__call__`` and ``Memory.read/write``."""

    def __init__(self, wasm: bytes) -> None:
        config = wasmtime.Config()
        config.consume_fuel = True
        config.epoch_interruption = True
        engine = wasmtime.Engine(config)
        self.store = wasmtime.Store(engine)
        module = wasmtime.Module(engine, wasm)
        imports = [wasmtime.Func(self.store, i.type, lambda *a: -9) for i in module.imports]
        self._arm()
        exports = wasmtime.Instance(self.store, module, imports).exports(self.store)
        self.memory = exports["memory"]
        self.alloc = exports["wasihost_alloc"]
        self.call_fn = exports["wasihost_call"]
        self.call("wasihost.hello", {"host": "wasihost", "abi": ["1.0"]})
        self.call("wasihost.welcome", {"runtime_id": bytes(16), "granted": [], "epoch": 0})

    def _arm(self) -> None:
        self.store.set_fuel(FUEL)
        self.store.set_epoch_deadline(1_000_000)

    def call(self, command: str, value: Any) -> tuple[int, bytes]:
        self._arm()
        self.last_fuel = 0
        data = command.encode() + cbor2.dumps(value)
        ptr = self.alloc(self.store, len(data)) & 0xFFFFFFFF
        self.memory.write(self.store, data, ptr)
        packed = self.call_fn(self.store, ptr, len(command), len(data) - len(command))
        packed &= 0xFFFFFFFFFFFFFFFF
        rp, rl = packed >> 32, packed & 0xFFFFFFFF
        raw = bytes(self.memory.read(self.store, rp, rp + rl))
        self.last_fuel = FUEL - self.store.get_fuel()
        return int.from_bytes(raw[:4], "little"), raw[4:]


@pytest.fixture(scope="module")
def paths() -> Any:
    with Host(cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo")
        yield ext, PublicPath((FIXTURES / "echo" / "echo.wasm").read_bytes())


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(max_size=40)
    | st.binary(max_size=64),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=150)
@given(values)
def test_echo_agrees_on_both_paths(paths: Any, value: Any) -> None:
    ext, public = paths
    status, body = public.call("echo", value)
    assert status == 0
    assert ext.call("echo", value) == cbor2.loads(body) == value


def test_unknown_command_agrees(paths: Any) -> None:
    _, public = paths
    status, body = public.call("nosuch", None)
    assert status != 0
    assert cbor2.loads(body)["class"] == "unknown_command"



@pytest.mark.parametrize("size", [0, 1, 23, 24, 64, 255, 256, 1000, 4096])
def test_fuel_and_bytes_agree_on_both_paths(size: int) -> None:
    # The fast path's fuel (set and read through ctypes objects made once) is the guest's own
    # burn, as the public path reads it, plus the host's copies at COMMAND_FUEL_PER_BYTE: the
    # input in, the status and body out. Fresh guests on both sides, the same calls in the
    # same order, so that their allocators burn alike.
    value = bytes(range(256)) * (size // 256) + bytes(size % 256)
    public = PublicPath((FIXTURES / "echo" / "echo.wasm").read_bytes())
    with Host(cache_dir=None) as host:
        ext = host.load(FIXTURES / "echo")
        for n in range(3):
            status, body = public.call("echo", value)
            assert status == 0
            assert ext.call("echo", value) == value
            copied = len(cbor2.dumps(value)) + 4 + len(body)
            if n:  # the first call's fuel includes the start-up's
                assert ext.last_fuel_used == public.last_fuel + copied * COMMAND_FUEL_PER_BYTE
