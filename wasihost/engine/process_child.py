"""The walled child of the process runtime: one guest instance, served over the channel.

Run by :mod:`.process` as ``python -P -m wasihost.engine.process_child CONTROL_FD`` through
:func:`.spawn.spawn`. Its standard input is its end of the channel's socketpair
(:mod:`wasihost.core.channel`); ``CONTROL_FD`` is a second socket on which the host sends one
byte to interrupt the running call (the channel itself is busy while the guest runs). The
per-child secret arrives in the environment, and is removed from it at once.

In order, the child:

1. imports everything it will ever need (the engine, wasmtime, the codec): after the walls it
   can open no file, so it could import nothing more;
2. applies its walls (:func:`.walls.apply_child_walls`): no_new_privs, a new user and network
   namespace, rlimits, Landlock with no readable path, seccomp;
3. says HELLO, then serves LOAD, START, CALL, RUN, CAP_MEMORY and QUERY until the host closes
   the channel or kills it.

The guest's imports are proxies: the engine here does what it does in-process (ranges, codec
limits, prices, fuel), then hands each host call to the HOST, which runs the real broker with
its own grants, quotas and state, reaching guest memory through MEM requests served here. The
child holds no broker, no grant and no secret; it trusts the host, and the host trusts nothing
it says (docs/process-runtime.md).
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2
import wasmtime

from ..core.channel import (
    PAYLOAD_LIMITS,
    PROTOCOL_VERSION,
    REFUSED_PREFIX,
    ChannelError,
    Kind,
    encode_frame,
)
from ..core.codec import decode, encode
from ..core.errors import CallError, FailureClass
from ..core.registry import AbiVersion, HostFunction
from ..core.settings import EngineSettings
from ..core.status import (
    GuestAbort,
    GuestDeadline,
    GuestExit,
    GuestFault,
    GuestInterrupted,
    GuestOutOfFuel,
    HostFunctionFailed,
    HostStatus,
    Status,
    StatusAnswer,
    UnreadableRequest,
)
from . import walls
from .channel_io import Reader
from .hostcalls import BoundImport
from .instance import Budget, CompiledModule, Instance, StoreLimits
from .native import MemoryGone, NativeCall
from .walls import SECRET_ENV  # the variable the per-child secret arrives in
from .wasm_engine import WasmEngine

# What a MEM request may ask of the guest-memory accessor: the GuestMemory protocol's methods.
MEM_OPS = frozenset(
    {
        "size",
        "read",
        "write",
        "read_u32",
        "read_iovec",
        "take_iovec",
        "read_u32_pair",
        "read_u64",
        "write_u32",
        "write_u64",
        "require_range",
        "require_fuel",
        "charge",
        "can_pay",
    }
)

# The registry entry's fields the engine reads; ``since`` does not matter to it.
ENTRY_FIELDS = (
    "module",
    "name",
    "capability",
    "params",
    "results",
    "max_request_bytes",
    "max_response_bytes",
    "fuel_base",
    "fuel_per_byte",
    "blocking",
    "convention",
    "denied_result",
    "never_returns",
    "commits",
    "signed_args",
    "revoked_result",
)


def entry_record(entry: HostFunction) -> dict[str, Any]:
    """What the host sends of a registry entry (LOAD)."""
    record = {name: getattr(entry, name) for name in ENTRY_FIELDS}
    record["params"] = list(entry.params)
    record["results"] = list(entry.results)
    return record


def entry_of(record: dict[str, Any]) -> HostFunction:
    fields = {name: record[name] for name in ENTRY_FIELDS}
    fields["params"] = tuple(fields["params"])
    fields["results"] = tuple(fields["results"])
    return HostFunction(since=AbiVersion(1, 0), **fields)


class Denied(Exception):
    """The host's gate refused a native host call (a revocation since the call began): the
    proxy answers the entry's denied result, as the engine does in-process."""


_HOST_ERRORS: dict[str, type[HostFunctionFailed]] = {}


def _host_error(name: str) -> HostFunctionFailed:
    """An exception whose class bears the name of what the host's broker raised: the call ends
    ``host_error`` naming it, as in-process (the host logged it; this class is not logged)."""
    kind = _HOST_ERRORS.get(name)
    if kind is None:
        kind = _HOST_ERRORS[name] = type(name, (HostFunctionFailed,), {})
    return kind(name)


def _stop(kind: str, message: str) -> BaseException:
    """The exception a HOST_STOP of ``kind`` raises in the proxy."""
    if kind == "abort":
        return GuestAbort(message)
    if kind == "out_of_fuel":
        return GuestOutOfFuel(message)
    if kind == "deadline":
        return GuestDeadline(message)
    if kind == "interrupted":
        return GuestInterrupted(message)
    if kind == "exit":
        return GuestExit(int(message))
    if kind == "fault":
        return GuestFault(message)
    if kind == "gone":
        return MemoryGone(message)
    if kind == "denied":
        return Denied()
    return _host_error(message)


class Link:
    """The child's end of the channel."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.tally = Tally()
        self._reader = Reader(sock)

    def send(self, message: list[Any]) -> None:
        self.sock.sendall(encode_frame(message))

    def receive(self) -> list[Any]:
        # The host is trusted: its frames are read with cbor2's C decoder as they are.
        message = cbor2.loads(self._reader.body(None))
        if not isinstance(message, list) or not message:
            raise ChannelError("not a message")
        return message

    def host_call(self, index: int, call: NativeCall, args: list[Any]) -> Any:
        """Hand one host call to the host and serve its MEM requests until it answers."""
        self.send([Kind.HOST, index, *args])
        while True:
            message = self.receive()
            kind = message[0]
            if kind == Kind.MEM:
                self._serve_mem(call, message)
                continue
            _pay(call, message[-2])
            moved = message[-1]
            if type(moved) is int and moved > 0:  # what the host's broker priced as bytes
                call.moved += moved
            if kind == Kind.HOST_OK:
                body, answer = message[1], message[2]
                if answer is not None:  # the host's StatusAnswer: its status code
                    return StatusAnswer.of(Status(answer))
                return decode(body, PAYLOAD_LIMITS) if body else None
            if kind == Kind.HOST_STATUS:
                raise HostStatus(_status_of(message[1]))
            if kind == Kind.HOST_STOP:
                raise _stop(message[1], message[2])
            raise ChannelError(f"unexpected message {kind} in a host call")

    def _serve_mem(self, call: NativeCall, message: list[Any]) -> None:
        _, op, args, charge = message
        try:
            _pay(call, charge)
            if op not in MEM_OPS:
                raise ChannelError(f"unknown memory operation {op!r}")
            value = getattr(call, op)(*args)
        except GuestFault as exc:
            self.send([Kind.MEM_FAULT, "fault", str(exc)])
        except GuestOutOfFuel as exc:
            self.send([Kind.MEM_FAULT, "out_of_fuel", str(exc)])
        except GuestInterrupted as exc:
            self.send([Kind.MEM_FAULT, "interrupted", str(exc)])
        except MemoryGone as exc:
            self.send([Kind.MEM_FAULT, "gone", str(exc)])
        else:
            if isinstance(value, tuple):
                value = list(value)
            # The bytes this host call moved so far: a broker's price reads them (memio.charge).
            self.send([Kind.MEM_OK, value, call.moved])


_STATUS_CODES = {int(s): s for s in Status}


def _status_of(code: int) -> Status:
    # A Status, as in-process handlers raise it (status_trap compares by identity); a code
    # that is none is passed on as it came, and answered as in-process.
    return _STATUS_CODES.get(code, code)  # type: ignore[arg-type]


def _pay(call: NativeCall, charge: object) -> None:
    if type(charge) is int and charge > 0:
        call.charge(charge)


def _proxy(link: Link, index: int, entry: HostFunction) -> Callable[..., Any]:
    """The handler the child's engine calls for import ``index``: the host serves it."""
    if entry.convention == "native":
        # What the engine answers an ungranted native call in-process (HostContext.denied).
        denied = entry.denied_result if entry.denied_result is not None else entry.revoked_result

        def native(call: NativeCall, *args: Any) -> Any:
            try:
                return link.host_call(index, call, list(args))
            except Denied:
                link.tally.status(Status.DENIED)
                if denied is None:
                    raise HostStatus(Status.DENIED) from None  # ends the call, class denied
                return denied

        return native

    def cbor(call: NativeCall, request: Any) -> Any:
        if isinstance(request, UnreadableRequest):  # an entry that never returns (abort)
            return link.host_call(index, call, [b"", 0, request.reason])
        raw = b"" if request is None else encode(request, PAYLOAD_LIMITS)
        return link.host_call(index, call, [raw, call.room, None])

    return cbor


class Tally:
    """The engine's host-call refusals and call-ending failures in this child, by class, sent
    with each answer (the host's operator metrics count them, HostCallTally)."""

    def __init__(self) -> None:
        self.statuses: dict[int, int] = {}
        self.failures: dict[str, int] = {}
        self.refused: set[str] = set()

    def status(self, code: int) -> None:
        self.statuses[int(code)] = self.statuses.get(int(code), 0) + 1

    def failure(self, failure: FailureClass) -> None:
        self.failures[failure.value] = self.failures.get(failure.value, 0) + 1

    def take(self) -> list[Any] | None:
        """[code, n, ..., class, n, ...] since the last answer; None when nothing happened."""
        if not self.statuses and not self.failures and not self.refused:
            return None
        flat: list[Any] = []
        for code, n in self.statuses.items():
            flat += [code, n]
        for name, n in self.failures.items():
            flat += [name, n]
        for capability in self.refused:
            flat += [REFUSED_PREFIX + capability, 1]
        self.statuses.clear()
        self.failures.clear()
        self.refused.clear()
        return flat


class Served:
    """The one instance this child runs, and the engine it runs in."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.engine: WasmEngine | None = None
        self.instance: Instance | None = None
        self.caps: frozenset[str] = frozenset()
        self.tally = link.tally

    def load(self, message: list[Any]) -> list[Any]:
        _, settings, artifact, records, limits, command_export = message
        engine = self.engine = WasmEngine(EngineSettings(**settings))
        module = wasmtime.Module.deserialize(engine.wasmtime_engine, artifact)
        compiled = CompiledModule(module, "")
        entries = [entry_of(r) for r in records]
        imports = [BoundImport(e, _proxy(self.link, i, e)) for i, e in enumerate(entries)]
        self.instance = engine.new_instance(
            compiled, imports, self._gate, StoreLimits(*limits), command_export
        )
        self.instance.count_host_calls(self.tally)
        return [Kind.READY, [list(name) for name in compiled.import_names()]]

    def _gate(self, entry: HostFunction) -> bool:
        # The host's grants as they stood when the call began; the host checks its own again
        # at each host call (a revocation since then is refused there).
        if entry.capability in self.caps:
            return True
        self.tally.refused.add(entry.capability)  # the host records it as asked for
        return False

    def _budget(self, fuel: int, seconds_left: float) -> Budget:
        budget = Budget(fuel, 0)
        budget.deadline = time.monotonic() + seconds_left
        return budget

    def run(self, message: list[Any]) -> list[Any]:
        kind = message[0]
        instance = self.instance
        if instance is None:
            raise ChannelError("no module loaded")
        fuel, seconds_left, caps = message[-3:]
        self.caps = frozenset(caps)
        budget = self._budget(fuel, seconds_left)
        before = budget.fuel
        try:
            if kind == Kind.START:
                instance.instantiate(budget)
                result: list[Any] = [Kind.DONE, 0, b"", budget.used]
            elif kind == Kind.RUN:
                code = instance.run_command(budget)
                result = [Kind.DONE, code, b"", budget.used]
            else:
                _, command, payload, max_output, may_keep_gil = message[:5]
                answer = instance.call(command, payload, max_output, budget, may_keep_gil)
                result = [Kind.DONE, answer.status, answer.body, answer.fuel_used]
        except CallError as exc:
            used = budget.used or (before - budget.fuel)
            failed = [Kind.FAIL, exc.failure.value, exc.message, used]
            return [*failed, instance.exit_code, instance.interrupted, self.tally.take()]
        # interrupted: a host call ended the guest mid-way, and it is not to be entered again.
        return [*result, instance.exit_code, instance.interrupted, self.tally.take()]

    def query(self, message: list[Any]) -> list[Any]:
        instance = self.instance
        if instance is None:
            return [Kind.VALUE, None]
        if message[0] == Kind.CAP_MEMORY:
            instance.cap_memory(message[1])
            return [Kind.VALUE, None]
        what = message[1]
        if what == "memory":
            return [Kind.VALUE, instance.memory_bytes()]
        if what == "refused":
            return [Kind.VALUE, instance.refused_memory_bytes()]
        if what == "fuel":
            return [Kind.VALUE, instance.last_call_fuel]
        return [Kind.VALUE, None]


def _watch_control(control: socket.socket, served: Served) -> None:
    """The control socket's thread: each byte interrupts the running call (the host knows
    why); the host gone (end of file) ends the child."""
    while True:
        try:
            data = control.recv(64)
        except OSError:
            data = b""
        if not data:
            os._exit(0)
        instance = served.instance
        if instance is not None:
            instance.interrupt()


def serve(link: Link, served: Served) -> None:
    while True:
        try:
            message = link.receive()
        except EOFError:
            return
        kind = message[0]
        if kind == Kind.LOAD:
            link.send(served.load(message))
        elif kind in (Kind.START, Kind.CALL, Kind.RUN):
            link.send(served.run(message))
        elif kind in (Kind.CAP_MEMORY, Kind.QUERY):
            link.send(served.query(message))
        else:
            raise ChannelError(f"unexpected message {kind}")


def _readable() -> list[str]:
    """What the child may still read after its walls: the directories it imports code from
    (the interpreter's library, site-packages, wasihost itself), so that a module imported
    late on a rare path loads; nothing else of the filesystem."""
    return sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)})


def _preload() -> None:
    """Import what the engine and codec import lazily, before the walls: the hot paths must
    not reach the filesystem at all."""
    import logging

    from ..core import codec_fast, hostlog

    encode({"a": [1, 2.5, b"x", None, True]})
    decode(cbor2.dumps({"a": [1, 2.5, b"x", None, True, {"b": "c"}]}))
    _ = (logging, codec_fast, hostlog)


def main(argv: list[str]) -> int:
    secret = bytes.fromhex(os.environ.pop(SECRET_ENV, ""))
    channel = socket.socket(fileno=0)
    control = socket.socket(fileno=int(argv[0]))
    limits = {name: int(value) for name, value in (a.split("=", 1) for a in argv[1:])}
    _preload()
    walls.prepare_walls()
    checked = walls.apply_child_walls(rlimits=limits, readable=_readable())
    link = Link(channel)
    served = Served(link)
    threading.Thread(target=_watch_control, args=(control, served), daemon=True).start()
    report = [[w.name, w.state, walls.short_detail(w.detail)] for w in checked]
    _freeze_heap()
    link.send([Kind.HELLO, PROTOCOL_VERSION, secret, os.getpid(), report])
    serve(link, served)
    return 0


def _freeze_heap() -> None:
    """Move everything imported so far (about 30,000 objects: the engine, wasmtime, the codec)
    out of the cyclic collector's reach; what is made later is still collected. A full
    collection of that heap took 3-6 ms here, and the host charges a call for the child's CPU
    past CPU_ALLOWANCE_NS (1 ms, engine/process.py): one landing in a small call would charge
    its extension millions of fuel its guest never used. No collection first: it would cost
    every child's start those milliseconds, for the little garbage the imports leave."""
    gc.freeze()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
