"""asyncio beside the synchronous API: ``await ext.acall(...)`` and ``async with AsyncHost(...)``.

A guest call runs on one of its host's call threads (a bounded pool, :class:`CallWorkers`), never
on the event loop: the loop only waits for a future, so guest code cannot block it. The
synchronous machinery does everything else (the instance pool, budgets, interrupts), so an
async call keeps every guarantee of :meth:`~wasihost.extension.Extension.call`.

Cancellation. Cancelling the task awaiting :func:`call_async` stops the guest of that call
alone: its instance is told to stop (:meth:`~wasihost.engine.Instance.cancel`), the guest traps
at its next epoch tick (a blocking host call wakes at once), the call ends with
:attr:`~wasihost.errors.FailureClass.CANCELLED` and its instance is dropped, never reused; the
extension's lifecycle records no crash. A call still waiting for a thread or an instance never
starts. The awaiting task waits (up to :data:`CANCEL_SETTLE_S`) for the guest to have stopped,
then raises :class:`asyncio.CancelledError`, whose ``__cause__`` is the call's
``CallError(cancelled)`` when the call ended that way. A call that had already finished when
the cancellation arrived (its effects committed) still raises ``CancelledError``: cancellation
says the caller stopped waiting, as everywhere in asyncio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import CallError, ConfigError, FailureClass
from .extension import CallTicket, Extension, _override
from .lifecycle import State

if TYPE_CHECKING:
    from .extension import Handshake
    from .extlog import LogRecord
    from .lifecycle import Lifecycle
    from .policy import Policy
    from .runtime import Host

T = TypeVar("T")

# Threads running guest calls for coroutines, per host. Guest code runs without the GIL, so
# threads beyond the cores only help calls that wait (in async host functions, or for an
# instance); 8 covers a typical host's cores plus a few such waits. Each is an OS thread with
# its own stack (8 MiB reserved by default, of which a call needs max_wasm_stack + 256 KiB).
DEFAULT_CALL_WORKERS = 8
# More threads than this is a configuration mistake, not parallelism: 2 cores or 64, calls
# beyond the cores only queue on the GIL and the CPU.
MAX_CALL_WORKERS = 256
# How long a cancelled task waits for its guest to have stopped before it raises
# CancelledError: an interrupted guest stops within an epoch tick (10 ms by default) and a
# blocking host call wakes at once; a synchronous host function that ignores its wakeup can
# hold the thread longer, and the task does not wait for that.
CANCEL_SETTLE_S = 1.0


class CallWorkers:
    """The bounded pool of threads on which a host's async calls run.

    A call waits for a free thread no longer than its own deadline: one still queued when its
    deadline passes is withdrawn and fails ``deadline`` without running."""

    def __init__(self, workers: int = DEFAULT_CALL_WORKERS) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise ConfigError(f"async_workers must be an int, got {workers!r}")
        if not 1 <= workers <= MAX_CALL_WORKERS:
            raise ConfigError(f"async_workers={workers}: must be in 1..{MAX_CALL_WORKERS}")
        self.workers = workers
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                raise ConfigError("this host is closed")
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.workers, thread_name_prefix="wasihost-call"
                )
            return self._executor.submit(fn, *args)

    def close(self) -> None:
        """No new calls; queued ones are withdrawn, running ones end as their extensions
        close (the host closes those first)."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            # From one of its own threads (a host closed inside a call), waiting would wait
            # for itself.
            on_worker = threading.current_thread().name.startswith("wasihost-call")
            executor.shutdown(wait=not on_worker, cancel_futures=True)


def _run(
    ext: Extension,
    command: str,
    value: Any,
    fuel: int | None,
    timeout_ms: int | None,
    ticket: CallTicket,
    deadline: float,
) -> tuple[bool, Any, int | None]:
    """On a call thread: the call's outcome (ok, value or exception) and the fuel it burnt
    (None if it failed before running anything)."""
    ext._local.state.fuel = None  # not an earlier call's, made on this thread for another task
    try:
        result = ext.call_cancellable(
            ticket, command, value, fuel=fuel, timeout_ms=timeout_ms, deadline=deadline
        )
    except BaseException as exc:  # carried to the awaiting task, raised there
        return False, exc, ext._local.state.fuel
    return True, result, ext._local.state.fuel


async def call_async(
    ext: Extension,
    command: str,
    value: Any = None,
    *,
    fuel: int | None = None,
    timeout_ms: int | None = None,
) -> Any:
    """:meth:`Extension.call` on a call thread of ``ext``'s host (see the module docstring
    for cancellation). The deadline runs from now: waiting for a thread counts."""
    if ext.lifecycle.state is State.CLOSED:
        raise ext._unavailable()  # as call() says it, even once the host's threads are gone
    timeout = _override("timeout_ms", timeout_ms, ext.resources.timeout_ms, "timeout_ms")
    deadline = time.monotonic() + timeout / 1000
    ticket = CallTicket(ext)
    future = ext.host.call_workers().submit(
        _run, ext, command, value, fuel, timeout_ms, ticket, deadline
    )
    loop = asyncio.get_running_loop()
    waiting = asyncio.wrap_future(future, loop=loop)
    withdrawn: list[bool] = []

    def withdraw() -> None:
        # Still queued at its deadline: it never runs. (Running, its own deadline ends it.)
        if future.cancel():
            withdrawn.append(True)

    # The loop's clock is time.monotonic(), the clock of every wasihost deadline.
    timer = loop.call_at(deadline, withdraw)
    try:
        ok, outcome, used = await waiting
    except asyncio.CancelledError as cancelled:
        if withdrawn:
            raise CallError(
                FailureClass.DEADLINE,
                f"no call thread free before the call's deadline ({timeout} ms)",
            ) from None
        task = asyncio.current_task()
        if future.cancelled() and task is not None and not task.cancelling():
            # Withdrawn by the host closing its call threads (after closing its extensions),
            # not by this task's caller.
            raise ext._unavailable() from None
        ticket.cancel()
        future.cancel()  # never started: it never will
        if not future.done():
            settled = asyncio.wrap_future(future, loop=loop)
            await asyncio.wait({settled}, timeout=CANCEL_SETTLE_S)
        if future.done() and not future.cancelled():
            ok, outcome, used = future.result()
            ext._set_task_fuel(used)
            if not ok and isinstance(outcome, CallError):
                cancelled.__cause__ = outcome
        raise
    finally:
        timer.cancel()
    ext._set_task_fuel(used)
    if not ok:
        raise outcome
    return outcome


async def _on_thread(host: Host, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking host operation (admission compiles; close waits a tick per call) on one of
    the host's call threads, so the loop stays free."""
    future = host.call_workers().submit(functools.partial(fn, *args, **kwargs))
    return await asyncio.wrap_future(future)


class AsyncExtension:
    """An admitted extension seen from asyncio: coroutines for what may run guest code or
    wait, plain attributes for what is only read. ``sync`` is the
    :class:`~wasihost.extension.Extension` itself (operators' methods, ``commit`` for
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
        """Instantiate and handshake now (calls do it lazily)."""
        return await _on_thread(self.sync.host, self.sync.start)

    async def aclose(self, reason: str = "closed") -> None:
        """Close for good; calls in flight are interrupted."""
        await _on_thread(self.sync.host, self.sync.close, reason)


class AsyncHost:
    """A :class:`~wasihost.runtime.Host` for asyncio applications::

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

    async def load(self, source: str | Path, **options: Any) -> AsyncExtension:
        """:meth:`Host.load`, with admission and compilation off the loop."""
        return AsyncExtension(await _on_thread(self.host, self.host.load, source, **options))

    async def load_installed(self, extension: str, **options: Any) -> AsyncExtension:
        return AsyncExtension(
            await _on_thread(self.host, self.host.load_installed, extension, **options)
        )

    async def update(self, source: str | Path, **options: Any) -> AsyncExtension:
        return AsyncExtension(await _on_thread(self.host, self.host.update, source, **options))

    def extension(self, extension: str) -> AsyncExtension | None:
        ext = self.host.extension(extension)
        return AsyncExtension(ext) if ext is not None else None

    async def aclose(self) -> None:
        """Close the host: calls in flight are interrupted (each within a tick or so)."""
        await asyncio.to_thread(self.host.close)


__all__ = ["AsyncExtension", "AsyncHost", "CallWorkers", "call_async"]
