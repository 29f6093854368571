"""The execution seam (host/backend.py): Host and Extension compile, instantiate and enter
guests only through the backend of the extension's runtime class, never through the engine
behind it. An out-of-process or Ray backend then replaces what this test's recorder wraps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.common import ALL_CAPS, FIXTURES
from tests.support.wasi import STD, run_wasihost
from wasihost.core.errors import ConfigError
from wasihost.engine import BoundImport, CompiledModule, StoreLimits, WasmEngine
from wasihost.engine.hostcalls import Gate
from wasihost.host.backend import ExecutionBackend, GuestInstance
from wasihost.host.policy import Policy
from wasihost.host.runtime import Host
from wasihost.wasi import WasiOptions, capabilities_for, wasi_profile


class Recorder:
    """A backend that runs everything on the real engine's own methods, taken before the
    test makes the engine's public ones fail: a caller going around the seam fails."""

    def __init__(self, engine: WasmEngine) -> None:
        self.settings = engine.settings
        self._compile = engine.compile
        self._validates = engine.validates
        self._new_instance = engine.new_instance
        self._check_entry_stack = engine.check_entry_stack
        self._release_memory = engine.release_memory
        self._close = engine.close
        self.calls: list[str] = []
        self.runtimes: list[str] = []

    def compile(self, wasm: bytes, sha256: str | None = None) -> CompiledModule:
        self.calls.append("compile")
        return self._compile(wasm, sha256)

    def validates(self, wasm: bytes) -> bool:
        self.calls.append("validates")
        return self._validates(wasm)

    def new_instance(
        self,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> GuestInstance:
        self.calls.append("new_instance")
        return self._new_instance(module, imports, gate, limits, command_export)

    def check_entry_stack(self) -> None:
        self.calls.append("check_entry_stack")
        self._check_entry_stack()

    def release_memory(self) -> None:
        self._release_memory()

    def close(self) -> None:
        self._close()


def _around_the_seam(*_: Any, **__: Any) -> Any:
    raise AssertionError("the engine was used around the execution backend")


def _seamed_host(monkeypatch: pytest.MonkeyPatch, host: Host) -> Recorder:
    recorder = Recorder(host.engine)

    def backend_for(runtime: str) -> ExecutionBackend:
        recorder.runtimes.append(runtime)
        return recorder

    monkeypatch.setattr(host, "backend_for", backend_for)
    for name in ("compile", "validates", "new_instance", "check_entry_stack"):
        monkeypatch.setattr(host.engine, name, _around_the_seam)
    return recorder


def test_an_extension_is_compiled_started_and_called_through_its_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        recorder = _seamed_host(monkeypatch, host)
        ext = host.load(FIXTURES / "hello")
        assert ext.backend is recorder
        assert ext.call("greet", {"name": "ada"}) == {"greeting": "hello, ada"}
        assert ext.call("greet", {"name": "bo"}) == {"greeting": "hello, bo"}
        # Asked once, for the mode it was admitted under: it runs where it compiled.
        assert recorder.runtimes == [ext.runtime]
        assert recorder.calls.count("compile") == 1
        assert recorder.calls.count("new_instance") == 1  # one instance, used twice
        assert "check_entry_stack" in recorder.calls


def test_a_plain_command_is_probed_and_compiled_through_its_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = bytearray()
    config = WasiOptions(argv=["std", "hello"], stdout=out.extend, stderr=out.extend)
    policy = Policy(allow=capabilities_for(config))
    with Host(policy, cache_dir=None, profiles=[wasi_profile(config)]) as host:
        recorder = _seamed_host(monkeypatch, host)
        run = run_wasihost(STD, host=host, config=config)
        assert run.code == 0, bytes(out)
        assert {"validates", "compile", "new_instance"} <= set(recorder.calls)


def test_each_runtime_mode_has_its_backend_and_nothing_else_has_one() -> None:
    from wasihost.engine.process import ProcessBackend

    with Host(Policy(allow=ALL_CAPS), cache_dir=None) as host:
        assert host.backend_for("in-process") is host.engine
        process = host.backend_for("process-only")
        assert isinstance(process, ProcessBackend) and not process.fallback
        assert host.backend_for("process-only") is process  # one per host and mode
        prefer = host.backend_for("prefer-process")
        assert isinstance(prefer, ProcessBackend) and prefer.fallback
        # A manifest's runtime class is not a mode: asking for it is the host's own error.
        with pytest.raises(ConfigError, match="runs no 'wasm-process' extensions"):
            host.backend_for("wasm-process")
