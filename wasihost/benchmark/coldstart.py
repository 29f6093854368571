"""``cold-start``: one new ``python`` process per sample, exec to exit, doing one no-op call,
with every on-disk cache warm (bytecode, wasihost's module cache, wasmtime's serialized
module)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .guests import EXTISM_PLUGIN_WAT
from .systems import Skip

# How long one process may take before the sample is abandoned: start-up is a few hundred
# ms on a loaded machine; a minute means something is wrong, not slow.
PROCESS_TIMEOUT_S = 60

# As the console script starts the command (pyproject.toml: wasihost.cli:program).
WASIHOST_SCRIPT = "import sys\nfrom wasihost.cli import program\nsys.exit(program())\n"

# wasmtime-py's public API in a fresh process: import, deserialize the module compiled by the
# warm-up (its disk cache), instantiate, handshake, one no-op call.
GENERIC_SCRIPT = """import sys
import cbor2, wasmtime
config = wasmtime.Config()
config.consume_fuel = True
config.epoch_interruption = True
engine = wasmtime.Engine(config)
store = wasmtime.Store(engine)
module = wasmtime.Module.deserialize_file(engine, sys.argv[1])
imports = [wasmtime.Func(store, i.type, lambda *a: -9) for i in module.imports]
store.set_fuel(10_000_000)
store.set_epoch_deadline(1_000_000)
ex = wasmtime.Instance(store, module, imports).exports(store)
def call(cmd, payload):
    ptr = ex["wasihost_alloc"](store, len(cmd) + len(payload)) & 0xFFFFFFFF
    ex["memory"].write(store, cmd + payload, ptr)
    packed = ex["wasihost_call"](store, ptr, len(cmd), len(payload)) & 0xFFFFFFFFFFFFFFFF
    return bytes(ex["memory"].read(store, packed >> 32, (packed >> 32) + (packed & 0xFFFFFFFF)))
call(b"wasihost.hello", cbor2.dumps({"host": "wasihost", "abi": ["1.0"]}))
call(b"wasihost.welcome", cbor2.dumps({"runtime_id": bytes(16), "granted": [], "epoch": 0}))
assert call(b"noop", b"\\xf6") == b"\\0\\0\\0\\0\\xf6"
print("null")
"""

EXTISM_SCRIPT = """import sys
import extism
with open(sys.argv[1], "rb") as f:
    plugin = extism.Plugin(f.read(), functions=[])
plugin.call("noop", b"")
print("null")
"""


class ColdStart:
    """Makes the per-system processes and their files; one op per process."""

    def __init__(self, fixtures: Path, extism_missing: str | None) -> None:
        from ..engine.benchraw import serialize_module, wat_to_wasm

        self._tmp = tempfile.TemporaryDirectory(prefix="wasihost-bench-")
        tmp = Path(self._tmp.name)
        echo = fixtures / "echo"
        serialized = tmp / "echo.cwasm"
        serialized.write_bytes(serialize_module((echo / "echo.wasm").read_bytes()))
        plugin = tmp / "plugin.wasm"
        plugin.write_bytes(wat_to_wasm(EXTISM_PLUGIN_WAT))
        py = sys.executable
        self.env = dict(os.environ)
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        self.env["RUST_BACKTRACE"] = "0"
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.argv: dict[str, list[str] | Skip] = {
            "wasihost": [
                py,
                "-c",
                WASIHOST_SCRIPT,
                "run",
                str(echo),
                "noop",
                "--cache-dir",
                str(tmp / "modules"),
            ],
            "wasmtime-generic": [py, "-c", GENERIC_SCRIPT, str(serialized)],
            "wasmtime-floor": Skip(
                "the floor is a per-call path; its process start-up is wasmtime-generic's"
            ),
            "extism": [py, "-c", EXTISM_SCRIPT, str(plugin)]
            if extism_missing is None
            else Skip(extism_missing),
        }
        self.cwd = tmp

    def op(self, system: str) -> Callable[[], object] | Skip:
        argv = self.argv[system]
        if isinstance(argv, Skip):
            return argv

        def one() -> object:
            return self._run(argv)

        try:
            one()  # the warm-up: fills the bytecode and module caches, checks the output
        except RuntimeError as exc:
            return Skip(str(exc))
        return one

    def _run(self, argv: list[str]) -> float:
        start = time.perf_counter()
        done = subprocess.run(  # noqa: S603 - our own interpreter and arguments
            argv,
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            timeout=PROCESS_TIMEOUT_S,
            check=False,
        )
        took = time.perf_counter() - start
        if done.returncode != 0 or done.stdout != b"null\n":
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"the process exited {done.returncode}: {' '.join(tail)}")
        return took

    def close(self) -> None:
        self._tmp.cleanup()
