"""Host functions: the one public way to serve registry entries, for embedders and for the
host's own brokers alike.

A :class:`Broker` serves some cbor-convention registry entries: it opens per-extension state
when an extension first needs it, builds the handler of each entry from that state, and closes
the state when the extension closes. An embedder's function (:meth:`HostFunctions.function`)
is an entry of its own namespace (``myapp.lookup`` since ``1.0`` is ``myapp_v1.lookup``) served
by a one-function broker; the built-in ``log``, ``clock_now``, ``random_bytes`` and ``abort``
are brokers registered the same way (:func:`wasihost.brokers.builtin_brokers`). Either way the
engine links the entry like any other: static admission, the capability gate, payload limits,
fuel and epochs are the registry's, and there is no second path.
"""

from __future__ import annotations

import inspect
import threading
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..core.errors import ConfigError
from ..core.hostlog import host_logger
from ..core.registry import HostFunction, Registry, embedder_function

# The plug-in contract (core.serving: brokers and profiles implement it below the host layer),
# re-exported from its old home; the host's own use of it is below.
from ..core.serving import (
    ASYNC_WAKE_CHECK_S,
    Broker,
    CallContext,
    Function,
    HostHandler,
    ScopedBroker,
    broker_conventions,
    refuse_any_scope,
)
from ..core.status import (
    GuestDeadline,
    GuestInterrupted,
    GuestOutOfFuel,
    HostFunctionFailed,
    HostStatus,
    Status,
)

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from ..core.serving import ExtensionView

__all__ = [
    "ASYNC_LOOP_STOP_S",
    "ASYNC_WAKE_CHECK_S",
    "NATIVE_RESULT_RANGE",
    "AsyncLoop",
    "Broker",
    "CallContext",
    "Function",
    "FunctionBroker",
    "HostFunctions",
    "HostHandler",
    "ScopedBroker",
    "broker_conventions",
    "is_async_function",
    "refuse_any_scope",
    "wait_for",
]

T = TypeVar("T")

# How long Host.close waits for the event-loop thread to finish cancelling its tasks.
ASYNC_LOOP_STOP_S = 2.0


# The values a native result of each type may take: signed or unsigned, so that ``-1`` and
# ``0xFFFF_FFFF`` both mean the i32 whose bits are all ones; anything else is the function's bug.
NATIVE_RESULT_RANGE = {"i32": (-(1 << 31), (1 << 32) - 1), "i64": (-(1 << 63), (1 << 64) - 1)}


class AsyncLoop:
    """A private event loop on its own thread, for ``async def`` host functions: started on
    first use, stopped by :meth:`close` (with its pending tasks cancelled)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Set by close(); an Event, so that the loop thread sees it without holding this
        # object alive.
        self._closed = threading.Event()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed.is_set():
                coro.close()
                raise HostStatus(Status.UNAVAILABLE)
            if self._loop is None:
                # asyncio costs tens of ms to import: only a host with async functions pays.
                import asyncio

                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._run,
                    args=(loop, self._closed),
                    name="wasihost-async",
                    daemon=True,
                )
                self._loop, self._thread = loop, thread
                thread.start()
            loop = self._loop
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, loop)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, closed: threading.Event) -> None:
        import asyncio

        asyncio.set_event_loop(loop)
        try:
            while True:
                try:
                    loop.run_forever()
                except (KeyboardInterrupt, SystemExit) as exc:
                    # asyncio lets these two out of run_forever when a task or callback
                    # raises them: one async host function's sys.exit() would end the loop
                    # that serves every extension's async functions, for good (red-team
                    # 2026-12-01). The task's future holds the exception already, so its
                    # call gets it (as a synchronous function's call does) once the loop
                    # runs on and delivers it. (No signal reaches this thread: it is never
                    # the main one.)
                    host_logger().error(
                        "an async host function raised %s; the host's event loop goes on",
                        type(exc).__name__,
                    )
                    if not closed.is_set():
                        continue
                break
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            # Host.close() called from an async host function runs on the loop's own thread,
            # which cannot join itself (RuntimeError, and the rest of the host's close was
            # skipped): the loop stops once that function's step returns.
            if thread is not threading.current_thread():
                thread.join(ASYNC_LOOP_STOP_S)


def wait_for(future: concurrent.futures.Future[T], call: Any) -> T:
    """Wait on the guest's thread for an async handler's result, until the call's deadline
    (``GuestDeadline``) or the instance's interrupt (``GuestInterrupted``), cancelling the
    task either way."""
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    wakeup: threading.Event = call.wakeup
    while True:
        if wakeup.is_set():
            future.cancel()
            raise GuestInterrupted
        left = call.deadline - time.monotonic()
        if left <= 0:
            future.cancel()
            raise GuestDeadline
        if done.wait(min(left, ASYNC_WAKE_CHECK_S)):
            break
    import concurrent.futures  # loaded already: the future is one

    try:
        return future.result()
    except concurrent.futures.CancelledError:
        # Cancelled by the host closing its loop: the guest is told the host cannot serve it.
        raise HostStatus(Status.UNAVAILABLE) from None


def is_async_function(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a coroutine for the host's loop to run: an ``async def``
    (also behind ``functools.partial``), or an object whose ``__call__`` is one."""
    # type(fn).__call__, not fn.__call__: what calling the object runs (a function's is
    # a slot wrapper, never a coroutine function).
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


# What a host function may raise for the engine to answer: a status, or the end of the guest's
# call (deadline, interrupt, fuel). Anything else is the function's bug (_crashed).
_PASSED_TO_ENGINE = (HostStatus, GuestDeadline, GuestInterrupted, GuestOutOfFuel)


def _crashed(name: str, ext_id: str) -> HostFunctionFailed:
    """The function ``name`` raised while serving ``ext_id``; called in its ``except``. The
    details are the host's: they go to its log, never to the guest."""
    host_logger().exception("host function %s failed serving extension %s", name, ext_id)
    return HostFunctionFailed(name)


def _returned_coroutine(
    coro: types.CoroutineType[Any, Any, Any], name: str, ext_id: str
) -> Exception:
    """A plain function that returned a coroutine (a sync wrapper round an ``async def``):
    nothing awaits it. It is closed unrun, and the operator told how to register it."""
    coro.close()
    host_logger().error(
        "host function %s returned a coroutine to extension %s without running it: register "
        "the async def itself (or an object whose __call__ is async def) so the host awaits it",
        name,
        ext_id,
    )
    return HostFunctionFailed(name)


class FunctionBroker:
    """The broker of one embedder function: stateless, its handler calls ``fn(ctx, request)``
    (an ``async def`` on the host's event-loop thread)."""

    def __init__(self, entry: HostFunction, fn: Function, loop: AsyncLoop) -> None:
        self.entry = entry
        self.fn = fn
        self.is_async = is_async_function(fn)
        self._loop = loop

    @property
    def name(self) -> str:
        return self.entry.qualified_name

    @property
    def functions(self) -> tuple[str, ...]:
        return (self.entry.qualified_name,)

    @property
    def conventions(self) -> tuple[str, ...]:
        return (self.entry.convention,)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({self.entry.capability})

    def open(self, ext: ExtensionView) -> ExtensionView:
        return ext

    def close(self, state: ExtensionView) -> None:
        pass

    def handler(self, entry: HostFunction, state: ExtensionView) -> HostHandler:
        if entry.convention == "native":
            return self._native_handler(entry, state)
        ext = state
        fn = self.fn
        loop = self._loop
        is_async = self.is_async

        name = entry.qualified_name

        if not is_async:
            # The plain function, the common case: its context ends inline, without a
            # ``finally`` or a method call (a measurable share of a small host call).
            def handle(call: Any, request: Any) -> Any:
                ctx = CallContext(ext, entry, call)
                try:
                    result = fn(ctx, request)
                except BaseException as exc:
                    ctx._call = None
                    if isinstance(exc, Exception) and not isinstance(exc, _PASSED_TO_ENGINE):
                        raise _crashed(name, ext.id) from None
                    raise
                ctx._call = None
                if type(result) is types.CoroutineType:
                    raise _returned_coroutine(result, name, ext.id)
                return result

            return handle

        def handle_async(call: Any, request: Any) -> Any:
            ctx = CallContext(ext, entry, call, threading.Lock())
            try:
                if call.woken:  # interrupted since the engine's check: start nothing
                    raise GuestInterrupted
                coro: Awaitable[Any] = fn(ctx, request)
                return wait_for(loop.submit(coro), call)  # type: ignore[arg-type]
            except _PASSED_TO_ENGINE:
                raise
            except Exception:
                raise _crashed(name, ext.id) from None
            finally:
                ctx._end()

        return handle_async

    def _native_handler(self, entry: HostFunction, ext: ExtensionView) -> HostHandler:
        """``handle(call, *ints)`` for the native convention: the engine has checked the gate
        and unpacked the arguments (signed); the function's result is checked against the
        entry's result type here, since a wrong one must not reach the guest masked."""
        fn = self.fn
        loop = self._loop
        is_async = self.is_async
        name = entry.qualified_name
        returns = bool(entry.results)
        low, high = NATIVE_RESULT_RANGE[entry.results[0]] if returns else (0, 0)

        def failed(result: Any) -> Exception:
            """The function's result is not what its entry declares: its bug, logged."""
            if type(result) is types.CoroutineType:
                return _returned_coroutine(result, name, ext.id)
            if returns:
                host_logger().error(
                    "host function %s returned %s, not an %s, to extension %s",
                    name,
                    type(result).__name__,
                    entry.results[0],
                    ext.id,
                )
            else:
                host_logger().error(
                    "host function %s returned a %s to extension %s: it has no result",
                    name,
                    type(result).__name__,
                    ext.id,
                )
            return HostFunctionFailed(name)

        def checked(result: Any) -> Any:
            """``result`` if it is what the entry declares, else the function's bug raised."""
            if returns:
                if type(result) is int and low <= result <= high:
                    return result
            elif result is None:
                return None
            raise failed(result)

        if not is_async:
            # The plain function, the common case, on the native trampoline's hot path
            # (docs/engine.md "Host-call trampolines"): its context ends inline, without a
            # ``finally`` or a method call.
            def handle(call: Any, *args: int) -> Any:
                ctx = CallContext(ext, entry, call)
                try:
                    result = fn(ctx, *args)
                except BaseException as exc:
                    ctx._call = None
                    if isinstance(exc, Exception) and not isinstance(exc, _PASSED_TO_ENGINE):
                        raise _crashed(name, ext.id) from None
                    raise
                ctx._call = None
                # checked(result), inline: a call more is measurable on a native host call.
                if type(result) is int:
                    if returns and low <= result <= high:
                        return result
                elif result is None and not returns:
                    return None
                raise failed(result)

            return handle

        def handle_async(call: Any, *args: int) -> Any:
            result: Any
            ctx = CallContext(ext, entry, call, threading.Lock())
            try:
                if call.woken:  # interrupted since the engine's check: start nothing
                    raise GuestInterrupted
                coro: Awaitable[Any] = fn(ctx, *args)
                result = wait_for(loop.submit(coro), call)  # type: ignore[arg-type]
            except _PASSED_TO_ENGINE:
                raise
            except Exception:
                raise _crashed(name, ext.id) from None
            finally:
                ctx._end()
            return checked(result)

        return handle_async


class HostFunctions:
    """A host's table of brokers: which broker serves each cbor registry entry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.loop = AsyncLoop()
        self._brokers: dict[tuple[str, str], Broker] = {}

    def add_broker(self, broker: Broker) -> None:
        """Serve ``broker.functions``: each must be a cbor entry of the registry with one of
        ``broker.capabilities``, not served yet. Before any extension is admitted."""
        self.registry.check_open(f"broker {broker.name}")
        conventions = broker_conventions(broker)
        keys = []
        entries = []
        for qualified in broker.functions:
            module, _, name = qualified.rpartition(".")
            entry = self.registry.lookup(module, name)
            if (
                entry is None
                or entry.convention not in conventions
                or (
                    # Profile entries (WASI) are their binding's, never a broker's; an
                    # embedder's native entries and ABI 2.0's are served by brokers.
                    entry.convention != "cbor"
                    and self.registry.profile_for_module(module) is not None
                )
            ):
                raise ConfigError(
                    f"broker {broker.name} serves {qualified}, which is not a "
                    f"{' or '.join(sorted(conventions))} entry of this host's registry"
                )
            entries.append(entry)
        # A core entry carried into a later major (``wasihost_v1.storage_get`` as
        # ``wasihost_v2.storage_get``) is served by the same broker, unless another broker
        # serves it already: an embedder's replacement broker serves every major at once.
        for entry in self.registry.carried(entries, conventions):
            if (entry.module, entry.name) not in self._brokers:
                entries.append(entry)
        for entry in entries:
            module, name, qualified = entry.module, entry.name, entry.qualified_name
            if entry.capability not in broker.capabilities:
                raise ConfigError(
                    f"broker {broker.name}: {qualified} needs capability {entry.capability!r}, "
                    f"not among the broker's {sorted(broker.capabilities)}"
                )
            if (module, name) in self._brokers or (module, name) in keys:
                raise ConfigError(f"{qualified} is served twice")
            keys.append((module, name))
        for key in keys:
            self._brokers[key] = broker

    def register(
        self,
        name: str,
        fn: Function,
        *,
        capability: str,
        since: str = "1.0",
        convention: str = "cbor",
        params: tuple[str, ...] | None = None,
        results: tuple[str, ...] | None = None,
        max_request_bytes: int | None = None,
        max_response_bytes: int | None = None,
        fuel_base: int,
        fuel_per_byte: int | None = None,
        commits: bool = False,
        doc: str = "",
        request: str = "",
        response: str = "",
    ) -> HostFunction:
        """Add the embedder function ``name`` (``NAMESPACE.NAME``) to the registry and serve it
        with ``fn``; returns its registry entry. ``convention="native"`` with ``params`` and
        ``results`` (``"i32"``/``"i64"``) makes it ``fn(ctx, *ints) -> int | None``, with no
        payload limits (see :func:`wasihost.core.registry.embedder_function`)."""
        if not callable(fn):
            raise ConfigError(f"{name}: the host function must be callable")
        entry = embedder_function(
            name,
            capability=capability,
            since=since,
            convention=convention,
            params=params,
            results=results,
            max_request_bytes=max_request_bytes,
            max_response_bytes=max_response_bytes,
            fuel_base=fuel_base,
            fuel_per_byte=fuel_per_byte,
            blocking=is_async_function(fn),
            commits=commits,
            doc=doc or (inspect.getdoc(fn) or "").split("\n\n")[0],
            request=request,
            response=response,
        )
        with self.registry.changing:  # the entry and its broker, as one change
            if (entry.module, entry.name) in self._brokers:
                raise ConfigError(f"host function {entry.qualified_name} is registered twice")
            self.registry.add_function(entry)
            self.add_broker(FunctionBroker(entry, fn, self.loop))
        return entry

    def function(self, name: str, **options: Any) -> Callable[[Function], Function]:
        """Decorator form of :meth:`register`; returns the function unchanged."""

        def decorate(fn: Function) -> Function:
            self.register(name, fn, **options)
            return fn

        return decorate

    def broker_for(self, entry: HostFunction) -> Broker | None:
        return self._brokers.get((entry.module, entry.name))

    def check_scope(self, capability: str, scope: Mapping[str, Any]) -> None:
        """Let each broker serving ``capability`` refuse a malformed grant scope. A scope for a
        capability no broker reads is left to the embedder's functions (``ctx.scope``)."""
        checked = set()
        for broker in self._brokers.values():
            # The capability first: asking a deferred built-in for check_scope makes it.
            if capability not in broker.capabilities or id(broker) in checked:
                continue
            check = getattr(broker, "check_scope", None)
            if check is None:
                continue
            checked.add(id(broker))
            check(capability, scope)

    def brokers(self) -> list[Broker]:
        """Every broker serving this host, once each (a deferred built-in is made now)."""
        return self._unique(made_only=False)

    def made_brokers(self) -> list[Broker]:
        """The brokers serving this host that exist: a built-in not made yet (see
        brokers.DeferredBroker) is left out, as no extension used it and it holds nothing to
        quiesce or shut down."""
        return self._unique(made_only=True)

    def _unique(self, made_only: bool) -> list[Broker]:
        from ..brokers import DeferredBroker, resolved

        unique: dict[int, Broker] = {}
        for serving in self._brokers.values():
            if made_only and isinstance(serving, DeferredBroker) and not serving.loaded:
                continue
            broker = cast("Broker", resolved(serving))
            unique.setdefault(id(broker), broker)
        return list(unique.values())

    def broker(self, name: str) -> Broker:
        from ..brokers import resolved

        for broker in self._brokers.values():
            if broker.name == name:
                return cast("Broker", resolved(broker))
        raise ConfigError(f"no broker named {name!r} serves this host")

    def close(self) -> None:
        """The host is closing (its extensions are closed): stop the event loop and let each
        broker with a ``shutdown()`` stop what it runs (the events dispatchers). One broker
        failing to shut down keeps no other from it (nor from stopping its threads): the
        first failure is raised after every broker was asked, the others noted on it."""
        failures: list[Exception] = []
        steps = [self.loop.close]
        done = set()
        for broker in self.made_brokers():
            shutdown = getattr(broker, "shutdown", None)
            if shutdown is not None and id(broker) not in done:
                done.add(id(broker))
                steps.append(shutdown)
        for step in steps:
            try:
                step()
            except Exception as exc:
                failures.append(exc)
        if failures:
            first = failures[0]
            for other in failures[1:]:
                first.add_note(f"another shutdown failed too: {type(other).__name__}: {other}")
            raise first
