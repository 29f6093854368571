"""What an :class:`~wasihost.host.extension.Extension` uses of the host that admitted it.

:class:`HostServices` lists the members of :class:`~wasihost.host.runtime.Host` read through
``Extension.host``: by the extension itself, and by the brokers, profile bindings and the
asyncio front end that reach the host through the extension they serve. Typed by it,
``extension.py`` never imports the runtime, which imports it. mypy, checking the ``Host`` that
``Host._build`` hands each ``Extension``, proves the list complete. For annotations only:
import it under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from ..core.extlog import LogSink
    from ..core.grants import GrantTable
    from ..core.registry import Registry
    from ..core.serving import Broker, ProfileBinding
    from ..core.sources import Clock
    from ..core.tokens import TokenIssuer
    from ..store.presence import Presence
    from ..store.state import StateStore
    from ..supervisor.eviction import Evictor
    from ..supervisor.governor import Governor
    from ..supervisor.hostcall_metrics import HostCallTally
    from ..supervisor.scheduling import Scheduler
    from ..supervisor.supervision import Supervisor
    from .call_gate import CallGate
    from .callworkers import CallWorkers
    from .functions import HostFunctions
    from .policy import Policy

# The extension type (Extension): what the host registers and forgets, and what its profile
# factories take. A parameter, so that this module need not name the class of extension.py,
# which imports this one.
E = TypeVar("E")


class HostServices(Protocol[E]):
    """The host as its extensions see it: what they read of it, and no more."""

    # Admission and the grant: what the extension may do, and the registry it links against.
    policy: Policy
    registry: Registry
    grants: GrantTable
    tokens: TokenIssuer
    # Instances: the profiles (WASI) bound per instance, the brokers of the rest (where they
    # run is the backend the host hands the extension).
    profile_factories: dict[str, Callable[[E], ProfileBinding]]
    command_memory: dict[str, int]
    functions: HostFunctions
    host_call_tally: HostCallTally
    # Bounds on running extensions: budgets, crashes, eviction, host call slots.
    governor: Governor
    supervisor: Supervisor
    evictor: Evictor | None
    scheduler: Scheduler | None
    call_gate: CallGate | None
    # What is kept: the durable state (with a state directory), the guest log's sink.
    state: StateStore | None
    presence: Presence | None
    log_sink: LogSink | None
    # Read through the extension by what serves it: the clock broker and the WASI profile
    # (clock), the http broker's use of secrets (broker: the secrets broker serving the host),
    # both as core.serving's HostView, and asyncio (call_workers: the threads its calls and
    # starts run on).
    clock: Clock

    def broker(self, name: str) -> Broker: ...

    def call_workers(self) -> CallWorkers: ...

    def journal(self, extension: str, kind: str, detail: str) -> None: ...

    def revocations_allow_commit(self) -> bool: ...

    def spare_workers(self) -> CallWorkers: ...

    def extension(self, extension: str) -> E | None: ...

    def forget(self, ext: E) -> None: ...

    def closed_one(self) -> None: ...
