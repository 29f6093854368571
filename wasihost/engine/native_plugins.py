"""Native plugins (``runtime = "native-process"``): a host executable in a walled child.

A native plugin is the guest SDK's ``native`` build: the same guest source compiled for the
host's machine, speaking the process runtime's channel (:mod:`wasihost.core.channel`) where a
Wasm guest's child does. So :class:`NativeBackend` is the process runtime with three changes:

- **What is "compiled".** Nothing is: :meth:`NativeBackend.compile` checks the executable's
  digest and puts its bytes in a sealed memfd (:class:`NativeProgram`), from which each child
  executes it. No file path is executed, so nothing can swap the file between the check and
  the start, and the plugin cannot write its own executable.
- **How the child starts.** Through the launcher (``walls.py --launch``, the same
  :func:`.walls.apply_child_walls` as every walled child): it applies every wall to itself,
  with Landlock reading only the C library files of :data:`~wasihost.core.elfbin.LIBRARIES`
  and executing only the dynamic loader, and a seccomp filter that also lets it replace its
  program, then it executes the plugin, which keeps every wall. The plugin says HELLO with the
  walls the launcher checked.
- **Fuel.** A native plugin has no fuel meter, so it claims none. The host prices each host
  call it serves, as the engine prices a Wasm guest's (the entry's base and per-byte price,
  and what its broker charges), and a host call past the call's fuel ends it ``out_of_fuel``.
  Its own computing is bounded by the deadline (the host kills its process group) and charged
  by CPU time (:attr:`ProcessInstance.cpu_ns`, FUEL_PER_CPU_NS) against the budgets.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core.elfbin import LIBRARIES, LOADERS
from ..core.errors import CallError, FailureClass
from .process import (
    CHILD_ENV,
    ChildDidNotStart,
    ProcessBackend,
    ProcessInstance,
)

if TYPE_CHECKING:
    from .hostcalls import BoundImport, Gate
    from .instance import StoreLimits
    from .wasm_engine import WasmEngine

# The address space a plugin's process may map beyond the memory its manifest allows: its
# executable and the C library (a few MiB), its threads' stacks, and glibc's malloc arenas
# (64 MiB of address space each; the environment caps them at two).
NATIVE_BASE_ADDRESS_SPACE = 256 << 20
# glibc's dynamic loader reads the library cache to find the libraries a program needs.
LD_SO_CACHE = "/etc/ld.so.cache"
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


class NativeProgram:
    """A native plugin's executable, its digest checked, held in a sealed memfd (closed when
    the program is dropped or closed). What a NativeBackend "compiles" to."""

    def __init__(self, data: bytes, sha256: str) -> None:
        self.sha256 = sha256
        self.size = len(data)
        name = f"wasihost-plugin-{sha256[:16]}"
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._closer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        self._closer()


def native_files(machine: str | None = None) -> tuple[list[str], list[str]]:
    """(readable, executable) of a native plugin's process on this machine: the dynamic
    loader, which it may execute, and the library cache and the libraries of LIBRARIES beside
    the loader, which it may read; only those that exist, as real paths."""
    machine = machine or platform.machine()
    loader = LOADERS.get(machine)
    if loader is None or not os.path.exists(loader):
        return [], []  # a statically linked plugin needs neither
    loader = os.path.realpath(loader)
    beside = os.path.dirname(loader)
    readable = [LD_SO_CACHE] if os.path.exists(LD_SO_CACHE) else []
    for name in LIBRARIES:
        path = os.path.join(beside, name)
        if os.path.exists(path):
            readable.append(os.path.realpath(path))
    return readable, [loader]


class NativeBackend(ProcessBackend):
    """The ExecutionBackend of ``runtime = "native-process"`` (module docstring). It has no
    in-process fallback: machine code never runs in the host's process."""

    def __init__(self, engine: WasmEngine, *, rlimits: Mapping[str, int] | None = None) -> None:
        super().__init__(engine, fallback=False, rlimits=rlimits)
        self._programs: weakref.WeakValueDictionary[str, NativeProgram] = (
            weakref.WeakValueDictionary()
        )
        self._programs_lock = threading.Lock()
        self._readable, self._executable = native_files()

    def compile(self, wasm: bytes, sha256: str | None = None) -> Any:
        """The executable ``wasm`` (a plugin's module bytes) as a :class:`NativeProgram`, one
        per digest while any extension holds it. Refuses bytes whose digest is not ``sha256``:
        the package was checked against it."""
        digest = hashlib.sha256(wasm).hexdigest()
        if sha256 is not None and digest != sha256:
            raise CallError(
                FailureClass.ADMISSION, "the package's sha256 does not match its executable"
            )
        with self._programs_lock:
            program = self._programs.get(digest)
            if program is None:
                try:
                    program = NativeProgram(wasm, digest)
                except OSError as exc:
                    raise CallError(
                        FailureClass.ADMISSION,
                        f"cannot hold the plugin's executable in memory ({exc.strerror or exc})",
                    ) from None
                self._programs[digest] = program
            return program

    def validates(self, wasm: bytes) -> bool:
        return False  # not Wasm: nothing here validates a module

    def new_instance(
        self,
        module: Any,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> ProcessInstance:
        if command_export is not None:
            raise CallError(FailureClass.ADMISSION, "a native plugin runs no WASI command")
        try:
            return NativeInstance(self, module, imports, gate, limits, None)
        except ChildDidNotStart as exc:
            raise CallError(FailureClass.NATIVE_PROCESS_EXIT, str(exc)) from None

    def artifact(self, module: Any) -> bytes:
        return b""  # the plugin's code is its executable, not a module sent in LOAD

    def child_settings(self) -> dict[str, Any]:
        return {}

    def address_space(self, limits: StoreLimits) -> int:
        """A plugin's RLIMIT_AS: the memory its manifest allows and NATIVE_BASE_ADDRESS_SPACE
        (its other rlimits are a Wasm child's, ProcessBackend.rlimits)."""
        return limits.max_memory_bytes + NATIVE_BASE_ADDRESS_SPACE

    launched = True

    def child_env(self) -> dict[str, str]:
        """The plugin's environment: the launcher finds what it imports by its command line
        (``-I``, ``--path``), so the plugin gets no PYTHONPATH; glibc's arenas are capped."""
        return dict(CHILD_ENV)

    def child_program(self, module: Any) -> tuple[list[str], tuple[int, ...]]:
        """The launcher's command line up to the plugin's control descriptor, and the memfd
        it executes."""
        from . import walls

        if not isinstance(module, NativeProgram):
            raise ChildDidNotStart("not a native plugin's program")
        argv = [sys.executable, "-I", os.path.abspath(walls.__file__), walls.LAUNCH_FLAG]
        for path in walls.import_dirs():
            argv += ["--path", path]
        for path in self._readable:
            argv += ["--read", path]
        for path in self._executable:
            argv += ["--exec", path]
        return [*argv, "--", str(module.fd)], (module.fd,)


class NativeInstance(ProcessInstance):
    """A native plugin's process: a ProcessInstance whose host calls the host prices, since
    the plugin meters no fuel of its own (module docstring)."""

    meters_host_calls = True
