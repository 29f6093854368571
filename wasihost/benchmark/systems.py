"""The four contenders of the call-cost table, each built once per run on the same guests:
wasihost's public API, wasmtime-py's generic API, the unchecked floor, and Extism."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs

from .guests import EXTISM_PLUGIN_WAT, extism_hostcall_wat, extism_native_wat, loop_guest_wat
from .hosts import bench_policy
from .runner import Op

# Host calls per timed command of ``host-call-64``: one call is (a command making this many
# minus one making none) / this many, so the command's own crossing cancels out.
HOST_CALLS = 1000


@attrs.frozen
class Skip:
    """A system that cannot run a scenario, and why."""

    reason: str


def request64() -> bytes:
    """A 64-byte CBOR request: ``[2, "x" * 60]`` (a valid ``log`` request too)."""
    import cbor2

    blob: bytes = cbor2.dumps([2, "x" * 60])
    assert len(blob) == 64
    return blob


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


# Payloads above this cross as raw bytes (fixtures/rawecho's ``echo-bytes``, ABI 1.1), as
# Extism's echo plugin takes them; smaller ones as CBOR, as the raw wasmtime contenders do.
RAW_ECHO_ABOVE_BYTES = 4096
# The raw echo package's payload limits: room for the 1 MiB scenario and its framing.
RAW_ECHO_LIMIT_BYTES = 2 * 1024 * 1024


class Wasihost:
    """``Extension.call`` on fixtures/echo (and fixtures/rawecho's raw byte command for large
    payloads); an embedder function for host calls."""

    def __init__(self, fixtures: Path) -> None:
        from ..host.runtime import Host
        from ..packaging.package import Package, load_package

        self.host = Host(bench_policy({"log", "clock", "random", "bench"}), cache_dir=None)
        self.host.add_function(
            "bench.noop",
            lambda ctx, request: None,
            capability="bench",
            max_request_bytes=4096,
            max_response_bytes=16,
            fuel_base=500,
            fuel_per_byte=2,
        )
        # host-call-native: the native convention's counterpart of Extism's i64 function.
        self.host.add_function(
            "bench.native",
            lambda ctx, x: 0,
            capability="bench",
            convention="native",
            params=("i64",),
            results=("i64",),
            fuel_base=100,
        )
        self.echo_dir = fixtures / "echo"
        self.echo = self.host.load(self.echo_dir)
        self.echo_package = load_package(self.echo_dir, self.host.registry.capabilities())
        self.fixtures = fixtures
        self._raw_dir: tempfile.TemporaryDirectory[str] | None = None
        self._raw_echo: Any = None
        wasm = _wat(loop_guest_wat("bench_v1", "noop", request64(), "bench"))
        self.loop_package = Package("hostcall.wasm", None, wasm, hashlib.sha256(wasm).hexdigest())
        self.loop = self.host.admit(self.loop_package, grants=["bench"])
        wasm = _wat(loop_guest_wat("bench_v1", "native", b"", "bench", native=True))
        self.native_package = Package(
            "hostcall-native.wasm", None, wasm, hashlib.sha256(wasm).hexdigest()
        )
        self.native_loop = self.host.admit(self.native_package, grants=["bench"])

    def noop(self) -> Op | Skip:
        ext = self.echo
        return _probe(lambda: ext.call("noop"), None)

    def _raw(self) -> Any:
        """fixtures/rawecho with payload limits room for the largest scenario (a copy of the
        package with a ``[resources]`` table), loaded on first use."""
        if self._raw_echo is None:
            source = self.fixtures / "rawecho"
            if not (source / "extension.toml").is_file():
                return Skip(f"{source} is absent: no raw byte echo to measure")
            self._raw_dir = tempfile.TemporaryDirectory(prefix="wasihost-bench-")
            raw = Path(self._raw_dir.name) / "rawecho"
            shutil.copytree(source, raw, ignore=shutil.ignore_patterns("src"))
            with (raw / "extension.toml").open("a") as manifest:
                manifest.write(
                    f"\n[resources]\nmax_input_bytes = {RAW_ECHO_LIMIT_BYTES}\n"
                    f"max_output_bytes = {RAW_ECHO_LIMIT_BYTES}\n"
                )
            self._raw_echo = self.host.load(raw)
        return self._raw_echo

    def echo_op(self, payload: bytes) -> Op | Skip:
        if len(payload) > RAW_ECHO_ABOVE_BYTES:
            raw = self._raw()
            if isinstance(raw, Skip):
                return raw
            return _probe(lambda: raw.call("echo-bytes", payload), payload)
        ext = self.echo
        return _probe(lambda: ext.call("echo", payload), payload)

    def hostcall(self, native: bool = False) -> tuple[Op, Op] | Skip:
        ext = self.native_loop if native else self.loop
        many = _probe(lambda: ext.call("run", HOST_CALLS), None)
        if isinstance(many, Skip):
            return many
        return many, lambda: ext.call("run", 0)

    def instantiate(self) -> Op | Skip:
        host, package = self.host, self.echo_package
        self.echo.close()  # one id is admitted once: the timed admissions take its place

        def fresh() -> object:
            ext = host.admit(package)
            try:
                return ext.call("noop")
            finally:
                ext.close()

        return _probe(fresh, None)

    def close(self) -> None:
        self.host.close()
        if self._raw_dir is not None:
            self._raw_dir.cleanup()


class RawSystems:
    """wasmtime-py's generic path and the unchecked floor, on the same guest module each."""

    def __init__(self, fixtures: Path) -> None:
        from ..engine.benchraw import RawFloor, RawModule

        self.echo_module = RawModule((fixtures / "echo" / "echo.wasm").read_bytes())
        self.generic = self.echo_module.instantiate()
        self.floor = RawFloor(self.echo_module.instantiate(raw_imports=True))
        for guest in (self.generic, self.floor):
            handshake(guest)
        loop = RawModule(_wat(loop_guest_wat("bench_v1", "noop", request64(), "bench")))
        self.loop_generic = loop.instantiate()
        self.loop_floor = RawFloor(loop.instantiate(raw_imports=True))
        native = RawModule(_wat(loop_guest_wat("bench_v1", "native", b"", "bench", native=True)))
        self.native_generic = native.instantiate()
        self.native_floor = RawFloor(native.instantiate(raw_imports=True))

    def guest(self, system: str) -> Any:
        return self.generic if system == "wasmtime-generic" else self.floor

    def noop(self, system: str) -> Op | Skip:
        import cbor2

        guest, null = self.guest(system), cbor2.dumps(None)
        return _probe(lambda: guest.call(b"noop", null), b"\0\0\0\0" + null)

    def echo_op(self, system: str, payload: bytes) -> Op | Skip:
        import cbor2

        guest, encoded = self.guest(system), cbor2.dumps(payload)
        expected = b"\0\0\0\0" + encoded
        return _probe(lambda: guest.call(b"echo", encoded), expected, raw_status=True)

    def hostcall(self, system: str, native: bool = False) -> tuple[Op, Op] | Skip:
        import cbor2

        if native:
            guest = self.native_generic if system == "wasmtime-generic" else self.native_floor
        else:
            guest = self.loop_generic if system == "wasmtime-generic" else self.loop_floor
        many, none = cbor2.dumps(HOST_CALLS), cbor2.dumps(0)
        expected = b"\0\0\0\0" + cbor2.dumps(None)
        probed = _probe(lambda: guest.call(b"run", many), expected)
        if isinstance(probed, Skip):
            return probed
        return probed, lambda: guest.call(b"run", none)

    def instantiate(self, system: str) -> Op | Skip:
        import cbor2

        from ..engine.benchraw import RawFloor

        module, null = self.echo_module, cbor2.dumps(None)
        if system == "wasmtime-generic":

            def fresh() -> object:
                guest = module.instantiate()
                handshake(guest)
                return guest.call(b"noop", null)
        else:

            def fresh() -> object:
                floor = RawFloor(module.instantiate(raw_imports=True))
                handshake(floor)
                return floor.call(b"noop", null)

        return _probe(fresh, b"\0\0\0\0" + null)


class Extism:
    """Extism's Python SDK on a WAT plugin (noop, echo) and a host-call plugin."""

    def __init__(self) -> None:
        import extism

        self.extism = extism
        plugin_wasm = _wat(EXTISM_PLUGIN_WAT)
        self.plugin_wasm = plugin_wasm
        self.plugin = extism.Plugin(plugin_wasm, functions=[])
        i64 = extism.ValType.I64

        @extism.host_fn(  # type: ignore[untyped-decorator]
            name="noop64", namespace="extism:host/user", signature=([i64], [i64])
        )
        def noop64(plugin: Any, inputs: Any, outputs: Any, *user: Any) -> None:
            plugin.input_bytes(inputs[0])  # the 64-byte request, read as a host must
            outputs[0].value = 0

        self.hostcall_plugin = extism.Plugin(
            _wat(extism_hostcall_wat(HOST_CALLS)), functions=[noop64]
        )

        @extism.host_fn(  # type: ignore[untyped-decorator]
            name="native64", namespace="extism:host/user", signature=([i64], [i64])
        )
        def native64(plugin: Any, inputs: Any, outputs: Any, *user: Any) -> None:
            outputs[0].value = 0

        self.native_plugin = extism.Plugin(
            _wat(extism_native_wat(HOST_CALLS)), functions=[native64]
        )

    def noop(self) -> Op | Skip:
        plugin = self.plugin
        return _probe(lambda: plugin.call("noop", b""), b"", as_bytes=True)

    def echo_op(self, payload: bytes) -> Op | Skip:
        plugin = self.plugin
        return _probe(lambda: plugin.call("echo", payload), payload, as_bytes=True)

    def hostcall(self, native: bool = False) -> tuple[Op, Op] | Skip:
        plugin = self.native_plugin if native else self.hostcall_plugin
        many = _probe(lambda: plugin.call("many", b""), b"", as_bytes=True)
        if isinstance(many, Skip):
            return many
        return many, lambda: plugin.call("none", b"")

    def instantiate(self) -> Op | Skip:
        extism = self.extism
        compiled = extism.extism.CompiledPlugin(self.plugin_wasm, functions=[])

        def fresh() -> object:
            return extism.Plugin(compiled).call("noop", b"")

        return _probe(fresh, b"", as_bytes=True)


def handshake(guest: Any) -> None:
    import cbor2

    guest.call(b"wasihost.hello", cbor2.dumps({"host": "wasihost", "abi": ["1.0"]}))
    welcome = {"runtime_id": bytes(16), "granted": [], "epoch": 0}
    guest.call(b"wasihost.welcome", cbor2.dumps(welcome))


def _wat(text: str) -> bytes:
    from ..engine.benchraw import wat_to_wasm

    return wat_to_wasm(text)


def _probe(
    op: Op, expected: object, *, raw_status: bool = False, as_bytes: bool = False
) -> Op | Skip:
    """``op`` if one call of it answers ``expected``; otherwise a Skip saying what it did."""
    try:
        got = op()
    except Exception as exc:
        return Skip(_describe(exc))
    if as_bytes and got is not None:
        got = bytes(got)  # type: ignore[call-overload]
    if got != expected:
        if raw_status and isinstance(got, bytes) and len(got) >= 4:
            status = int.from_bytes(got[:4], "little", signed=True)
            return Skip(f"the guest answered status {status}, not the echo")
        return Skip(f"wrong answer ({len(got) if isinstance(got, bytes) else got!r})")
    return op


def extism_unavailable() -> str | None:
    """Why Extism cannot run here, or None."""
    try:
        import extism  # noqa: F401
    except ImportError as exc:
        return f"extism is not installed (pip install 'wasihost[bench]'): {exc}"
    return None
