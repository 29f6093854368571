"""Where a guest runs: the one interface between the call surface and an engine.

``Host`` and ``Extension`` compile, instantiate, call, interrupt and close guests through an
:class:`ExecutionBackend` and the :class:`GuestInstance` objects it makes, and through nothing
else of the engine's: each extension holds the backend of its manifest's runtime class, given
by ``Host.backend_for``. Today the one backend is the in-process engine
(:class:`wasihost.engine.WasmEngine`, which fits these protocols as it is).

The next two are additions behind the same protocols, not rewrites of the call path:
- the out-of-process runtime (``runtime = "wasm-process"``): a backend whose instances live in a
  walled child process; the ``BoundImport`` handlers it is handed stay in this process, and
  the child's host calls come back over its channel to run them, so grants, brokers, prices
  and fuel stay where they are;
- Ray workers: a call carries only (package digest, command, payload, grant epoch, budget).

Protocols only: nothing here is imported at run time (a plain run loads no extra module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence

    from ..core.errors import CallError
    from ..core.settings import EngineSettings
    from ..engine import BoundImport, Budget, CallResult, CompiledModule, StoreLimits
    from ..engine.hostcalls import Gate, HostCallCounter

class InterruptFlag(Protocol):
    """What the call path reads of an instance's host-call context on its hot path."""

    @property
    def interrupted(self) -> bool: ...


class GuestInstance(Protocol):
    """One guest's Store and instance, used by one thread at a time (its ``lock``)."""

    lock: threading.Lock
    last_call_fuel: int

    @property
    def started(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    @property
    def interrupted(self) -> bool: ...

    @property
    def context(self) -> InterruptFlag: ...

    def instantiate(self, budget: Budget) -> None: ...

    def run_command(self, budget: Budget) -> int: ...

    def call(
        self,
        command: bytes,
        payload: bytes | bytearray | memoryview,
        max_output_bytes: int,
        budget: Budget | None = None,
        may_keep_gil: bool = True,
    ) -> CallResult: ...

    def cap_memory(self, max_memory_bytes: int | None) -> None: ...

    def memory_bytes(self) -> int | None: ...

    def refused_memory_bytes(self) -> int | None: ...

    def count_host_calls(self, tally: HostCallCounter | None) -> None: ...

    def interrupt(self) -> None: ...

    def cancel(self) -> None:
        """Stop the call in flight (a CallTicket's cancel): the guest ends at its next tick."""

    def stop(self, failure: CallError) -> None: ...

    def close(self) -> None: ...


class ExecutionBackend(Protocol):
    """Compiles modules and makes the instances they run in."""

    @property
    def settings(self) -> EngineSettings: ...

    def compile(self, wasm: bytes, sha256: str | None = None) -> CompiledModule: ...

    def validates(self, wasm: bytes) -> bool: ...

    def new_instance(
        self,
        module: CompiledModule,
        imports: Sequence[BoundImport],
        gate: Gate,
        limits: StoreLimits,
        command_export: str | None = None,
    ) -> GuestInstance: ...

    def check_entry_stack(self) -> None:
        """Refuse, as an entry into a guest would be refused, a caller with too little stack."""

    def release_memory(self) -> None: ...

    def close(self) -> None: ...
