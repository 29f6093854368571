"""The compile worker: compiles one module in a fresh interpreter under rlimits.

Run as a script by :mod:`.compiler` (``python -P compile_worker.py``), never imported by it
except for :func:`build_config`. So it imports only the standard library and wasmtime: a
worker that imported wasihost would pay ~0.2 s more start-up, and could load a different copy
of it than the host's.

Protocol, over its stdin and stdout (pipes only its parent holds):

- in: a 4-byte big-endian length, that many bytes of JSON ``{"options": {...},
  "cpu_seconds": N, "memory_bytes": N}``, then the module's bytes up to end of file;
- out: ``FRAME_MAGIC``, the SHA-256 of the options JSON, the SHA-256 of the module, the
  artifact's length (8 bytes big-endian), the artifact's SHA-256, the artifact
  (``Module.serialize()``);
- exit status 0 with that frame, ``EXIT_INVALID`` for a module that does not validate,
  ``EXIT_NO_MEMORY`` when an allocation failed, with one line of explanation on stderr.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Mapping

import wasmtime

FRAME_MAGIC = b"WHCOMP1\n"
EXIT_INVALID = 2
EXIT_NO_MEMORY = 3
# The request header is a few hundred bytes of JSON; anything bigger is not from our parent.
MAX_REQUEST_HEADER = 64 * 1024

# The Config attributes the host sets; anything else in a request is refused, so a mistake in
# the parent cannot silently compile with a default the host's engine does not have.
CONFIG_OPTIONS = frozenset(
    {
        "consume_fuel",
        "epoch_interruption",
        "max_wasm_stack",
        "memory_reservation",
        "memory_guard_size",
        "memory_may_move",
        "memory_init_cow",
        "cranelift_opt_level",
        "parallel_compilation",
        "wasm_threads",
        "shared_memory",
    }
)


def build_config(options: Mapping[str, object]) -> wasmtime.Config:
    """The wasmtime Config for ``options``: the host's engine and the worker's are both built
    here, so that what the worker compiles is what the host's engine would have compiled."""
    unknown = set(options) - CONFIG_OPTIONS
    if unknown:
        raise ValueError(f"unknown engine options {sorted(unknown)}")
    config = wasmtime.Config()
    for name, value in options.items():
        setattr(config, name, value)
    return config


def options_digest(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()


def _read_exactly(stream: object, n: int) -> bytes:
    read = stream.read  # type: ignore[attr-defined]
    data = read(n)
    if len(data) != n:
        raise EOFError("request truncated")
    return bytes(data)


def _wall_self(rlimits: dict[str, int]) -> None:
    """Apply the walls of engine/walls.py to this worker: loaded from its file (it imports
    nothing of wasihost), after everything the worker will import, with reads only of the
    directories code is imported from. A wall the kernel refuses is not there, as in every
    walled child; the rlimits, which the compile budget rests on, are set in any case."""
    import importlib.util
    import os
    import resource  # here, not at the top: the host imports this module for build_config

    for name, value in rlimits.items():  # the budget holds whatever the walls below do
        resource.setrlimit(getattr(resource, name), (value, value))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "walls.py")
    spec = importlib.util.spec_from_file_location("wasihost_compile_walls", path)
    if spec is None or spec.loader is None:
        return
    walls = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = walls  # its dataclasses look their module up there
    spec.loader.exec_module(walls)
    walls.prepare_walls()
    readable = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)})
    walls.apply_child_walls(rlimits=rlimits, readable=readable)


def main() -> int:
    stdin = sys.stdin.buffer
    (size,) = struct.unpack(">I", _read_exactly(stdin, 4))
    if size > MAX_REQUEST_HEADER:
        print("request header too large", file=sys.stderr)
        return 1
    raw = _read_exactly(stdin, size)
    request = json.loads(raw)
    cpu = int(request["cpu_seconds"])
    memory = int(request["memory_bytes"])
    # The walls every child of wasihost gets (walls.apply_child_walls): the module is hostile
    # input to the compiler. Its rlimits: no core files; CPU: SIGXCPU at the budget;
    # address space: allocations fail past it.
    _wall_self({"RLIMIT_CORE": 0, "RLIMIT_CPU": cpu, "RLIMIT_AS": memory})
    wasm = stdin.read()
    try:
        engine = wasmtime.Engine(build_config(request["options"]))
        artifact = bytes(wasmtime.Module(engine, wasm).serialize())
    except MemoryError:
        print("out of memory", file=sys.stderr)
        return EXIT_NO_MEMORY
    except wasmtime.WasmtimeError as exc:
        text = str(exc)
        print(text.replace("\n", " ")[:2000], file=sys.stderr)
        lowered = text.lower()
        if "allocat" in lowered or "out of memory" in lowered:
            return EXIT_NO_MEMORY
        return EXIT_INVALID
    out = sys.stdout.buffer
    out.write(FRAME_MAGIC + options_digest(raw) + hashlib.sha256(wasm).digest())
    out.write(struct.pack(">Q", len(artifact)) + hashlib.sha256(artifact).digest())
    out.write(artifact)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
