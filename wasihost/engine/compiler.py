"""Compiling a module under a budget: a static shape pre-check, then a worker process.

Compile cost is the one cost a module imposes before any limit of a Store applies, and it is
superlinear in some shapes (see :mod:`wasihost.core.codeshape`). So:

1. the pure shape scan refuses, as ``admission``, a module over any of its named limits;
2. a module bigger than ``compile_in_process_max_bytes`` is compiled in a fresh interpreter
   (``compile_worker.py``, exec'd: a fork()ed child of a threaded host hangs when wasmtime
   compiles) under RLIMIT_CPU, RLIMIT_AS and a wall-clock timeout, started and ended (its
   whole process group killed) by :func:`.spawn.spawn`, like every walled child. Its artifact
   comes back through a pipe only this process holds, framed with the digests of the request
   and of the module and its own length and SHA-256; all are checked before
   ``Module.deserialize``, which also checks that the artifact was compiled for this engine's
   configuration;
3. a small module (the default threshold is where the worker's start-up would dominate) is
   compiled in-process: its worst admitted compile cost is bounded by its size (measured in
   ``docs/engine.md``).

A module that exceeds the budget is refused as ``admission`` with the reason; the worker is
killed, and nothing in the host grew.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import wasmtime

from ..core.errors import CallError, FailureClass
from ..core.settings import EngineSettings
from ..core.wasmbin import WasmFormatError, read_header
from .compile_worker import EXIT_INVALID, EXIT_NO_MEMORY, FRAME_MAGIC, options_digest
from .lowlevel import short_message
from .ticker import in_forked_child

# The worker's process plumbing is imported on a compile, not at start-up: a module found in the
# cache (every start after the first) never needs it.
if TYPE_CHECKING:
    import subprocess

    from ..core.codeshape import CodeShape
    from .spawn import Spawned

WORKER = Path(__file__).with_name("compile_worker.py")
_FRAME_HEADER = len(FRAME_MAGIC) + 32 + 32 + 8 + 32
# A serialized module is a few times its wasm size (the worst admitted shapes: ~40x, see
# docs/engine.md); the worker's address space bounds it anyway, this bounds what we read.
MAX_ARTIFACT_BYTES = 512 * 1024 * 1024
# The worker's stderr is one line of explanation; more is not read.
MAX_WORKER_STDERR = 16 * 1024
_CHUNK = 1 << 16
# Compile workers of one engine running at once. Each already uses every core (parallel
# compilation) and may use its whole memory budget; more at once would only multiply that.
MAX_CONCURRENT_WORKERS = 2
# glibc gives every thread its own malloc arena, each reserving 64 MiB of address space; the
# compile threads would spend RLIMIT_AS on reservations instead of memory.
_WORKER_ENV = {"MALLOC_ARENA_MAX": "2", "RUST_BACKTRACE": "0"}


def worker_env() -> dict[str, str]:
    """What the worker's environment holds beyond the locale and time zone (spawn() clears the
    rest): ``_WORKER_ENV``, and ``PYTHONPATH`` naming the one directory the host imported
    wasmtime from, when the interpreter would not find it by itself.

    The worker imports only the standard library and wasmtime (never wasihost), so that
    directory is all it needs. A host run from a source checkout with its dependencies on
    PYTHONPATH (or an embedder that put them on sys.path) imports wasmtime from a directory a
    fresh interpreter does not search; the worker gets exactly that one, not the parent's whole
    PYTHONPATH. A wasmtime in the interpreter's own site-packages (or its venv's) needs nothing:
    putting site-packages ahead of the standard library would let a stale backport shadow it."""
    import site

    root = os.path.dirname(os.path.dirname(os.path.abspath(wasmtime.__file__)))
    own = {os.path.realpath(p) for p in site.getsitepackages()}
    if os.path.realpath(root) in own:
        return dict(_WORKER_ENV)
    return {**_WORKER_ENV, "PYTHONPATH": root}


# Within compile_in_process_max_bytes, a module compiles in-process only if it has none of the
# shapes whose compile cost per KB is high (docs/engine.md): each loop costs ~0.1 ms and
# ~20 KB, each function ~75 us and ~6 KB, nesting is superlinear, and so are many locals live
# across many blocks. The fixtures and the WASI testsuite programs have at most 226 loops,
# 481 functions, depth 80, 355 locals and 20,163 locals x blocks in one function.
IN_PROCESS_MAX_LOOPS = 500
IN_PROCESS_MAX_FUNCTIONS = 1_000
IN_PROCESS_MAX_DEPTH = 200
IN_PROCESS_MAX_LOCALS = 500
IN_PROCESS_MAX_LOCALS_X_BLOCKS = 50_000
# Conditional branches in one function and table accesses and indirect calls in all (see
# codeshape._LEB_BRANCH): the fixtures and testsuite programs have at most 451 branches in a
# function and 169 table accesses and indirect calls in a module; at these limits a 64 KB
# module compiles in-process in at most ~0.3 s (docs/engine.md).
IN_PROCESS_MAX_BRANCHES = 1_000
IN_PROCESS_MAX_INDIRECT = 300


def cheap(shape: CodeShape) -> bool:
    """Whether a module of this shape is cheap enough to compile in-process."""
    return (
        shape.loops <= IN_PROCESS_MAX_LOOPS
        and shape.functions <= IN_PROCESS_MAX_FUNCTIONS
        and shape.max_depth <= IN_PROCESS_MAX_DEPTH
        and shape.max_locals <= IN_PROCESS_MAX_LOCALS
        and shape.max_locals_x_blocks <= IN_PROCESS_MAX_LOCALS_X_BLOCKS
        and shape.max_branches <= IN_PROCESS_MAX_BRANCHES
        and shape.indirect <= IN_PROCESS_MAX_INDIRECT
    )


def _refuse(reason: str) -> CallError:
    return CallError(FailureClass.ADMISSION, reason)


def _exchange(
    proc: subprocess.Popen[bytes], request: bytes, deadline: float
) -> tuple[bytes, bytes]:
    """Feed ``request`` to the worker and collect its output, bounded in size and time."""
    import selectors

    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = bytearray(), bytearray()
    limits = {proc.stdout.fileno(): (out, _FRAME_HEADER + MAX_ARTIFACT_BYTES),
              proc.stderr.fileno(): (err, MAX_WORKER_STDERR)}  # fmt: skip
    view = memoryview(request)
    stdin = proc.stdin.fileno()
    with selectors.DefaultSelector() as sel:
        os.set_blocking(stdin, False)
        sel.register(stdin, selectors.EVENT_WRITE)
        for fd in limits:
            sel.register(fd, selectors.EVENT_READ)
        while len(sel.get_map()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for key, _ in sel.select(left):
                fd = key.fd
                if fd == stdin:
                    try:
                        view = view[os.write(fd, view[:_CHUNK]) :]
                    except BrokenPipeError:
                        view = view[:0]
                    if not view:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                buf, cap = limits[fd]
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    sel.unregister(fd)
                elif len(buf) + len(chunk) > cap:
                    if fd == proc.stdout.fileno():
                        raise _refuse(f"compiled code is larger than {cap} bytes")
                    sel.unregister(fd)  # enough explanation
                else:
                    buf += chunk
    return bytes(out), bytes(err)


class ModuleCompiler:
    """Compiles modules for one engine, under the budget of its settings."""

    def __init__(
        self, engine: wasmtime.Engine, options: Mapping[str, object], settings: EngineSettings
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._options = dict(options)
        self._workers = threading.BoundedSemaphore(MAX_CONCURRENT_WORKERS)
        self.worker_compiles = 0

    def compile(self, wasm: bytes) -> tuple[wasmtime.Module, bytes | None]:
        """The module, and its serialized form when a worker made it (the cache stores it).

        Raises ``CallError(ADMISSION)`` (or :class:`~wasihost.core.errors.AdmissionError` from the
        shape scan) naming the reason: invalid, over a shape limit, over the budget.
        """
        try:
            imported = sum(1 for i in read_header(wasm).imports if i.kind == "func")
        except WasmFormatError as exc:
            raise _refuse(f"not a valid module: {exc}") from None
        # The shape scan is for a compile: a module found in the cache never loads it.
        from ..core.codeshape import scan_code

        shape = scan_code(wasm, imported)
        # A forked child compiles in the worker whatever the size: wasmtime's parallel compile
        # threads of the parent are not in the child, and a compile there waits for them
        # forever (tests/engine/test_short_calls.py::test_a_forked_child_ticks_on_its_own).
        small = len(wasm) <= self._settings.compile_in_process_max_bytes
        if small and cheap(shape) and not in_forked_child():
            try:
                return wasmtime.Module(self._engine, wasm), None
            except wasmtime.WasmtimeError as exc:
                raise _refuse(f"module does not validate: {short_message(str(exc))}") from None
        with self._workers:
            artifact = self._compile_in_worker(wasm)
        try:
            return wasmtime.Module.deserialize(self._engine, artifact), artifact
        except wasmtime.WasmtimeError as exc:
            raise _refuse(
                f"the compile worker's output does not fit this engine: {short_message(str(exc))}"
            ) from None

    def _compile_in_worker(self, wasm: bytes) -> bytes:
        from .spawn import PIPE, spawn

        s = self._settings
        header = json.dumps(
            {
                "options": self._options,
                "cpu_seconds": s.compile_cpu_seconds,
                "memory_bytes": s.compile_memory_bytes,
            },
            sort_keys=True,
        ).encode()
        request = struct.pack(">I", len(header)) + header + wasm
        self.worker_compiles += 1
        # -P: the worker's own directory (wasihost/engine) must not shadow top-level modules.
        argv = [sys.executable, "-P", str(WORKER)]
        worker = spawn(
            argv, env=worker_env(), stdin=PIPE, stdout=PIPE, stderr=PIPE,
            prefix="wasihost-compile-",
        )  # fmt: skip
        with worker:
            out, err, status = self._run_worker(worker, request)
        return self._check_artifact(status, out, err, header, wasm)

    def _run_worker(self, worker: Spawned, request: bytes) -> tuple[bytes, bytes, int]:
        """The worker's output and exit status; ``admission`` past the wall-clock budget. The
        caller's ``with`` ends the worker's whole process group on every path."""
        timeout = self._settings.compile_timeout_seconds
        deadline = time.monotonic() + timeout
        with contextlib.suppress(TimeoutError):
            out, err = _exchange(worker.proc, request, deadline)
            if worker.exited(deadline - time.monotonic()):
                return out, err, worker.end()
        raise _refuse(f"compiling took longer than the budget of {timeout} s of wall-clock time")

    def _check_artifact(
        self, status: int, out: bytes, err: bytes, header: bytes, wasm: bytes
    ) -> bytes:
        s = self._settings
        # Rust's own hints ("note: run with RUST_BACKTRACE=1 ...") follow the real message.
        lines = [
            line
            for line in err.decode("utf-8", "replace").strip().splitlines()
            if line.strip() and not line.startswith("note: ")
        ]
        said = short_message(lines[-1]) if lines else ""
        if status == -signal.SIGXCPU:
            raise _refuse(f"compiling exceeded the budget of {s.compile_cpu_seconds} s of CPU time")
        if status == -signal.SIGKILL:
            raise _refuse(
                f"the compile worker was killed (over the budget of {s.compile_cpu_seconds} s "
                "of CPU time, or by the system for memory)"
            )
        out_of_memory = any("memory allocation of" in line for line in lines)
        if status == EXIT_NO_MEMORY or (status == -signal.SIGABRT and out_of_memory):
            raise _refuse(
                f"compiling exceeded the budget of {s.compile_memory_bytes // (1024 * 1024)} "
                "MiB of memory"
            )
        if status == EXIT_INVALID:
            raise _refuse(f"module does not validate: {said}")
        if status != 0:
            raise _refuse(f"the compile worker failed (status {status}): {said or 'no message'}")
        if len(out) < _FRAME_HEADER or not out.startswith(FRAME_MAGIC):
            raise _refuse("the compile worker's answer is malformed")
        pos = len(FRAME_MAGIC)
        got_options, got_module = out[pos : pos + 32], out[pos + 32 : pos + 64]
        (length,) = struct.unpack(">Q", out[pos + 64 : pos + 72])
        digest = out[pos + 72 : pos + 104]
        artifact = out[_FRAME_HEADER:]
        if (
            got_options != options_digest(header)
            or got_module != hashlib.sha256(wasm).digest()
            or length != len(artifact)
            or digest != hashlib.sha256(artifact).digest()
        ):
            raise _refuse("the compile worker's answer does not match the request")
        return artifact
