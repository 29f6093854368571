"""asyncio beside the synchronous API: ``await ext.acall(...)`` and ``async with AsyncHost(...)``.

A guest call runs on one of its host's call threads (a bounded pool, :class:`CallWorkers`), never
on the event loop: :func:`~wasihost.host.acall.call_async` (what ``acall`` runs, importable from
here too) says how, and what cancelling the awaiting task does. :class:`AsyncHost` and
:class:`AsyncExtension` are the front end: coroutines for what may run guest code or wait, on
the call threads or the loop's default executor.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.call_ticket import CallTicket

# The async call is its own module (see its docstring); its names stay importable from here.
from .acall import CANCEL_SETTLE_S as CANCEL_SETTLE_S  # noqa: PLC0414
from .acall import call_async

# The pool is its own module so that a Host, which always has one, need not import this one;
# its names stay importable from here.
from .callworkers import DEFAULT_CALL_WORKERS, MAX_CALL_WORKERS, CallWorkers

if TYPE_CHECKING:
    from ..core.extlog import LogRecord
    from ..core.lifecycle import Lifecycle
    from .acall import CallThreads
    from .extension import Extension
    from .handshake import Handshake
    from .policy import Policy

T = TypeVar("T")


async def _on_thread(host: CallThreads, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking host operation (admission compiles, a start runs guest code) on one of the
    host's call threads, so the loop stays free. (Not a close: see AsyncExtension.aclose.)"""
    import asyncio

    future = host.call_workers().submit(functools.partial(fn, *args, **kwargs))
    return await asyncio.wrap_future(future)


class AsyncExtension:
    """An admitted extension seen from asyncio: coroutines for what may run guest code or
    wait, plain attributes for what is only read. ``sync`` is the
    :class:`~wasihost.host.extension.Extension` itself (operators' methods, ``commit`` for
    brokers)."""

    def __init__(self, ext: Extension) -> None:
        self.sync = ext

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def lifecycle(self) -> Lifecycle:
        return self.sync.lifecycle

    @property
    def handshake(self) -> Handshake | None:
        return self.sync.handshake

    @property
    def last_fuel_used(self) -> int:
        """What this task's last call of the extension burnt (start-up included)."""
        return self.sync.last_fuel_used

    def logs(self) -> tuple[LogRecord, ...]:
        return self.sync.logs()

    async def acall(
        self,
        command: str,
        value: Any = None,
        *,
        fuel: int | None = None,
        timeout_ms: int | None = None,
    ) -> Any:
        """See :meth:`Extension.acall`."""
        return await call_async(self.sync, command, value, fuel=fuel, timeout_ms=timeout_ms)

    async def astart(self) -> Handshake:
        """Instantiate and handshake now (calls do it lazily). Cancelling the awaiting task
        stops the start function or handshake at its next epoch tick, as a call's."""
        import asyncio

        ticket = CallTicket(self.sync)
        try:
            return await _on_thread(self.sync.host, self.sync.start, ticket)
        except asyncio.CancelledError:
            ticket.cancel()  # the start ran on: it would hold a call thread to its deadline
            raise

    async def aclose(self, reason: str = "closed") -> None:
        """Close for good; calls in flight are interrupted."""
        import asyncio

        # Not on a call thread: with every one in a call of this extension, the close would
        # wait behind the calls it is to interrupt until they end by themselves (red-team
        # 2026-12-01). On the loop's default executor, as AsyncHost.aclose.
        await asyncio.to_thread(self.sync.close, reason)


class AsyncHost:
    """A :class:`~wasihost.host.runtime.Host` for asyncio applications::

        async with AsyncHost(Policy(allow={"log"})) as host:
            ext = await host.load("fixtures/echo")
            out = await ext.acall("echo", "hi")

    Keyword options are the Host's; ``async_workers`` bounds the threads that run calls.
    Operator actions (``grant``, ``revoke``, ``disable``...) are quick and thread-safe: call
    them on ``host.host``."""

    def __init__(self, policy: Policy | None = None, **options: Any) -> None:
        from .runtime import Host

        self.host = Host(policy, **options)

    async def __aenter__(self) -> AsyncHost:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # Loads and updates run no guest code (compilation has its own budget; an update waits
    # for the calls in flight): on the loop's default executor, not a call thread, where with
    # every call thread in a long call they waited behind those calls.

    async def load(self, source: str | Path, **options: Any) -> AsyncExtension:
        """:meth:`Host.load`, with admission and compilation off the loop."""
        import asyncio

        return AsyncExtension(await asyncio.to_thread(self.host.load, source, **options))

    async def load_installed(self, extension: str, **options: Any) -> AsyncExtension:
        import asyncio

        return AsyncExtension(
            await asyncio.to_thread(self.host.load_installed, extension, **options)
        )

    async def update(self, source: str | Path, **options: Any) -> AsyncExtension:
        import asyncio

        return AsyncExtension(await asyncio.to_thread(self.host.update, source, **options))

    def extension(self, extension: str) -> AsyncExtension | None:
        ext = self.host.extension(extension)
        return AsyncExtension(ext) if ext is not None else None

    async def aclose(self) -> None:
        """Close the host: calls in flight are interrupted (each within a tick or so).
        Cancelled, the close goes on in its thread to the end; a close that raised is
        finished by the next ``aclose`` (see Host.close)."""
        import asyncio

        await asyncio.to_thread(self.host.close)


__all__ = [
    "DEFAULT_CALL_WORKERS",
    "MAX_CALL_WORKERS",
    "AsyncExtension",
    "AsyncHost",
    "CallWorkers",
    "call_async",
]
