"""The plug-in contract: what a broker, a profile binding or the supervisor is given, and what
it may read of the host that gives it.

A :class:`Broker` serves registry entries for the extensions of one host; a
:class:`ProfileBinding` serves a profile (WASI) for one instance. Both are handed the calling
extension as an :class:`ExtensionView`: the members of ``wasihost.host.extension.Extension``
read outside the host layer, and no more. Its ``host`` is a :class:`HostView` in the same way.
They are Protocols, so the layers below the host type against them without importing it, and
mypy, checking the host's ``Extension`` and ``Host`` where a view is expected, proves each view
complete.

Pure: nothing here does I/O. The views are for annotations only (imported under
``TYPE_CHECKING`` by their users); :class:`CallContext`, :func:`refuse_any_scope` and
:func:`broker_conventions` are the runtime part, loaded with the built-in brokers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import ConfigError
from .status import GuestInterrupted, HostStatus, Status

if TYPE_CHECKING:
    from pathlib import Path

    from .budgets import Account, BudgetPolicy, Resource
    from .call_ticket import CallTicket
    from .errors import CallError
    from .extlog import ExtensionLog
    from .grants import GrantTable
    from .lifecycle import Lifecycle
    from .manifest import Manifest, Resources
    from .registry import HostFunction
    from .sources import Clock

T = TypeVar("T")

HostHandler = Callable[[Any, Any], Any]
"""What the engine calls for a cbor entry: ``handler(call, request) -> response``. ``call`` is
the instance's guest-memory accessor (its ``deadline`` and ``wakeup`` concern blocking
handlers); ``request`` is the decoded, bounded CBOR value."""

# How often a guest thread waiting for a blocking handler's result (an async host function, an
# http exchange) looks at the instance's interrupt: well under the 10 ms epoch tick
# (settings.DEFAULT_EPOCH_TICK_MS) that bounds how late a running guest sees one, so a disable
# reaches a waiting call no later than a running one.
ASYNC_WAKE_CHECK_S = 0.005


# The views the layers below the host have of it and of its extensions: for the type checker
# only (imported under TYPE_CHECKING by their users), since Protocol classes this large cost
# a millisecond to make and a plain run would make them at start-up for nothing.
if TYPE_CHECKING:

    class GrantView(Protocol):
        """The capabilities an extension holds, at one grant epoch (``wasihost.host.policy.Grant``):
        the WASI profile and the secrets broker ask it :meth:`allows`, and an embedder's function
        reads it whole through :attr:`CallContext.grant`."""

        @property
        def capabilities(self) -> frozenset[str]: ...

        @property
        def epoch(self) -> int: ...

        def allows(self, capability: str) -> bool: ...


    class PolicyView(Protocol):
        """What brokers, the WASI profile and the governor read of the host's policy
        (``wasihost.host.policy.Policy``, which also holds trust material they never see)."""

        @property
        def allow(self) -> frozenset[str]: ...

        @property
        def clock_resolution_ns(self) -> int: ...

        @property
        def random_seed(self) -> bytes | None: ...

        @property
        def budgets(self) -> BudgetPolicy: ...


    class GovernorView(Protocol):
        """What brokers report to the host's budgets (``wasihost.supervisor.governor.Governor``):
        network bytes as they move, and a level's static limit refusing something."""

        def charge_request(self, ext: ExtensionView, amount: int) -> None: ...

        def take_received(self, ext: ExtensionView, amount: int) -> tuple[int, int]: ...

        def refund_received(self, ext: ExtensionView, amount: int, index: int) -> None: ...

        def refund(self, ext: ExtensionView, resource: Resource, amount: int) -> None: ...

        def level_crossed(
            self,
            ext: ExtensionView,
            resource: Resource,
            used: int,
            limit: int,
            refusal: str,
            *,
            in_call: bool,
            ending: bool = False,
        ) -> None: ...


    class StateView(Protocol):
        """The host's state directory as the storage broker finds its database in it
        (``wasihost.store.state.StateStore``)."""

        @property
        def directory(self) -> Path: ...


    class HostView(Protocol):
        """What the layers below the host read on it (``wasihost.host.runtime.Host``)."""

        @property
        def grants(self) -> GrantTable: ...

        @property
        def policy(self) -> PolicyView: ...

        @property
        def clock(self) -> Clock: ...

        @property
        def governor(self) -> GovernorView: ...

        @property
        def state(self) -> StateView | None: ...

        def broker(self, name: str) -> Broker:
            """The broker named ``name`` serving this host (``ConfigError`` if none)."""
            ...

        def journal(self, extension: str, kind: str, detail: str) -> None:
            """Record an operator-visible event of ``extension`` (a budget's action fired)."""
            ...

        def revocations_allow_commit(self) -> bool:
            """Whether the host's revocation list (if any) lets a broker commit now."""
            ...


    class ExtensionView(Protocol):
        """What the layers below the host read on an extension
        (``wasihost.host.extension.Extension``): brokers open their state from it, profile
        bindings bind to it, the governor and the evictor bound it."""

        @property
        def id(self) -> str: ...

        @property
        def host(self) -> HostView: ...

        @property
        def manifest(self) -> Manifest | None: ...

        @property
        def resources(self) -> Resources: ...

        @property
        def grant(self) -> GrantView: ...

        @property
        def log(self) -> ExtensionLog: ...

        @property
        def lifecycle(self) -> Lifecycle: ...

        @property
        def account(self) -> Account:
            """Its rate accounts under the host's budgets (the governor's)."""
            ...

        @property
        def call_epoch(self) -> int:
            """The grant epoch the call in flight on this thread was authorised under."""
            ...

        @property
        def last_fuel_used(self) -> int: ...

        def grant_scopes(self) -> dict[str, dict[str, Any]]:
            """The scopes of the capabilities it holds now."""
            ...

        def commit(self, capability: str, action: Callable[[], T]) -> tuple[bool, T | None]:
            """Run ``action`` only if the call's epoch still authorises ``capability``:
            (authorised, its result)."""
            ...

        def committer(self, capability: str) -> Callable[..., tuple[bool, Any]]:
            """:meth:`commit` bound once, for a broker that commits on every call."""
            ...

        def call(
            self,
            command: str,
            value: Any = None,
            *,
            fuel: int | None = None,
            timeout_ms: int | None = None,
        ) -> Any:
            """Run one of its commands (an event delivery)."""
            ...

        def call_cancellable(
            self,
            ticket: CallTicket,
            command: str,
            value: Any = None,
            *,
            fuel: int | None = None,
            timeout_ms: int | None = None,
            deadline: float | None = None,
        ) -> Any:
            """:meth:`call`, stopped by ``ticket.cancel()`` (a job's run)."""
            ...

        # The governor's hooks: a budget's action reaches the extension through these.

        def recheck(self) -> None: ...

        def stop_calls(self, failure: CallError, *, locked: bool = False) -> int: ...

        def terminate(self, failure: CallError) -> None: ...

        def delay_wake(self, seen_generation: int) -> threading.Event: ...

        def delay_done(self, wake: threading.Event) -> None: ...

        # The evictor's: drop its idle instances.

        def evict(self) -> int | None: ...

        # A job run's call ticket (core.call_ticket.Wakeable): a cancel wakes the calls waiting for
        # a free instance.

        def wake_waiters(self) -> None: ...


class Broker(Protocol):
    """The host side of some registry entries, with its per-extension state and teardown."""

    @property
    def name(self) -> str: ...

    @property
    def functions(self) -> tuple[str, ...]:
        """Qualified names (``module.name``) of the cbor registry entries it serves."""
        ...

    @property
    def capabilities(self) -> frozenset[str]:
        """The capabilities its entries need (checked against the registry)."""
        ...

    def open(self, ext: ExtensionView) -> Any:
        """State for one extension, made the first time one of its instances needs it."""
        ...

    def handler(self, entry: HostFunction, state: Any) -> HostHandler:
        """The handler of ``entry`` for the extension whose state this is (per instance)."""
        ...

    def close(self, state: Any) -> None:
        """The extension is closed: release its state.

        A broker that owns threads or other host-wide resources may also define
        ``shutdown()``: the host calls it once when it closes, after closing its extensions."""
        ...


class ScopedBroker(Broker, Protocol):
    """A broker whose capabilities take a grant scope (an http grant's origins, a storage
    grant's tenant): it refuses a malformed scope before the grant table stores it."""

    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        """Raise :class:`~wasihost.core.errors.ConfigError` naming what is wrong with ``scope``."""
        ...


def refuse_any_scope(capability: str, scope: Mapping[str, Any]) -> None:
    """``check_scope`` of a broker that reads no scope (log, clock, random, jobs): a scope
    given to it would be stored and shown as if it bounded something, so any key is refused."""
    if not isinstance(scope, Mapping):
        raise ConfigError("a grant scope must be a JSON object")
    if scope:
        raise ConfigError(
            f"grant scope of {capability} takes no keys (got {', '.join(sorted(map(str, scope)))})"
        )


def broker_conventions(broker: Broker) -> frozenset[str]:
    """The calling conventions ``broker``'s handlers speak: ``cbor`` unless it says more in a
    ``conventions`` attribute (the log broker also serves ABI 2.0's native ``log``)."""
    return frozenset(getattr(broker, "conventions", ("cbor",)))


class ProfileBinding(Protocol):
    """The brokers of one profile (e.g. WASI) for one instance of one extension.

    Made fresh for every instance, because profile state (open file descriptors, for WASI)
    belongs to the instance and must not survive a discarded one.
    """

    def handler(self, entry: HostFunction) -> Callable[..., Any]: ...

    def close(self) -> None: ...


if TYPE_CHECKING:
    ProfileFactory = Callable[[ExtensionView], ProfileBinding]
    """Makes the :class:`ProfileBinding` of each new instance of an extension."""


class CallContext:
    """What an embedder's host function knows of the call it serves. It serves that host call
    only: once the call is over (the function returned, or, for an ``async def``, its call
    stopped waiting for it), :meth:`charge` raises ``GuestInterrupted`` and reaches nothing."""

    __slots__ = ("_call", "_ext", "_lock", "epoch", "function")

    def __init__(
        self,
        ext: ExtensionView,
        function: HostFunction,
        call: Any,
        lock: threading.Lock | None = None,
    ) -> None:
        self._ext = ext
        # The instance's guest accessor while the host call runs; None once it is over
        # (_end). Its charge settles fuel on the instance's Store by address, and an async
        # function's coroutine may outlive its call (it went on after its cancellation):
        # by then the Store is freed, or serving the instance's next call (red-team
        # 2026-12-01).
        self._call: Any = call
        # For an async function, whose coroutine runs on the host's loop thread: charge and
        # _end take it, so the call cannot end (and its Store go) half-way through a charge.
        self._lock = lock
        self.function = function
        # The grant epoch this call was authorised under: a commit checks it is still current.
        self.epoch = ext.call_epoch

    @property
    def extension(self) -> str:
        """The calling extension's id."""
        return self._ext.id

    @property
    def grant(self) -> GrantView:
        """The capabilities the calling extension holds now."""
        return self._ext.grant

    @property
    def scope(self) -> dict[str, Any]:
        """The scope the operator granted this function's capability with (``{}`` if none)."""
        return self._ext.grant_scopes().get(self.function.capability, {})

    @property
    def deadline(self) -> float:
        """The call's wall-clock deadline, on ``time.monotonic()``'s clock (0.0, long past,
        once the call is over)."""
        call = self._call
        return float(call.deadline) if call is not None else 0.0

    def charge(self, units: int) -> None:
        """Pay ``units`` fuel for a step of work the function is about to do, before doing it
        (an item scanned, a byte range hashed): a budget that cannot pay ends the guest's call
        ``out_of_fuel`` at this point (the exception this raises must be let through). For
        work that grows with what the guest asks, so the guest's fuel bounds it. Once the
        call is over, ``GuestInterrupted``: nothing is left to pay with."""
        lock = self._lock
        if lock is None:
            call = self._call
            if call is None:
                raise GuestInterrupted
            call.charge(units)
            return
        with lock:
            call = self._call
            if call is None:
                raise GuestInterrupted
            call.charge(units)

    def _end(self) -> None:
        """The host call is over (on its guest's thread, as the handler returns)."""
        lock = self._lock
        if lock is None:
            self._call = None
            return
        with lock:
            self._call = None

    def commit(self, action: Callable[[], T]) -> T:
        """Run ``action`` (an effect a later call can observe) only if the call's grant epoch
        still authorises this function's capability, atomically with respect to every grant
        change: nothing commits after a revocation returns. Otherwise raise
        ``HostStatus(DENIED)`` (the guest gets ``DENIED``)."""
        host = self._ext.host
        if not host.revocations_allow_commit():
            raise HostStatus(Status.DENIED)
        authorised, result = host.grants.commit(
            self._ext.id, self.epoch, self.function.capability, action
        )
        if not authorised:
            raise HostStatus(Status.DENIED)
        return result  # type: ignore[return-value]


Function = Callable[..., Any]
"""An embedder's host function: ``fn(ctx, request) -> response`` (cbor convention) or
``fn(ctx, *ints) -> int | None`` (native convention), or ``async def``."""
