"""Plays the host for a native plugin (the guest SDK's ``native`` feature) over a real channel.

A native plugin is a host executable (``fixtures/<name>-native/<name>-native``) that speaks the
process runtime's channel (``wasihost/core/channel.py``, docs/process-runtime.md) as the wasm
child does. :class:`NativeDriver` starts one the way the process runtime starts its children:
through :func:`wasihost.engine.spawn.spawn`, its end of an AF_UNIX socketpair as descriptor 0,
the control socket's number as its first argument, rlimits after it, the per-child secret in
the environment. It applies no wall: that is the launcher's (engine/native_plugins.py, whose
runs tests/host/test_native_runtime.py covers).

Everything the plugin sends is read as the host reads a child's frames: bounded by
:func:`~wasihost.core.channel.decode_frame` and shape-checked by
:func:`~wasihost.core.channel.expect`. Host calls (HOST) are answered by a :data:`HostHandler`
the test gives, standing in for the host's brokers, with the answers the host's own serving
sends (HOST_OK, HOST_STATUS, HOST_STOP, and MEM requests before them).
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2

from wasihost.core.channel import (
    SECRET_BYTES,
    ChannelError,
    FrameBuffer,
    Kind,
    decode_frame,
    encode_frame,
    expect,
    host_call_args,
)
from wasihost.core.registry import AbiVersion, HostFunction
from wasihost.engine.process_child import entry_record
from wasihost.engine.spawn import DEVNULL, PIPE, Spawned, spawn
from wasihost.engine.walls import SECRET_ENV, WALLS_ENV
from wasihost.host.defaults import default_registry

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TIMEOUT_S = 10.0


def program(name: str) -> Path:
    """The committed executable of native fixture ``name`` (``hello-native``, ...)."""
    return FIXTURES / name / name


def entries(*names: str, module: str = "wasihost_v1") -> list[HostFunction]:
    """The registry entries ``module.name`` of the host's default registry (ABI 1.1's view,
    which holds 1.0's entries too), in the order given: what a host admits for a plugin."""
    view = default_registry().view(AbiVersion(1, 1))
    found = []
    for name in names:
        entry = view.lookup(module, name)
        if entry is None:
            raise KeyError(f"{module}.{name}")
        found.append(entry)
    return found


@dataclass
class HostCall:
    """One HOST message: the entry it names and its arguments."""

    index: int
    entry: HostFunction
    request: bytes
    cap: int

    @property
    def value(self) -> Any:
        """The decoded CBOR request."""
        return cbor2.loads(self.request) if self.request else None


# Answers one host call: the frame the host sends back, without the trailing charge and moved
# items (the driver appends them). It may use ``driver`` to send MEM requests first.
HostHandler = Callable[["NativeDriver", HostCall], list[Any]]


def ok(value: Any) -> list[Any]:
    """HOST_OK with ``value`` encoded, as the host answers a broker's response."""
    return [Kind.HOST_OK, cbor2.dumps(value), None]


def status(code: int) -> list[Any]:
    """HOST_STATUS ``code``: the broker raised HostStatus."""
    return [Kind.HOST_STATUS, code]


def stop(kind: str, message: str) -> list[Any]:
    """HOST_STOP: the host call ends the guest's call (abort, out_of_fuel, interrupted...)."""
    return [Kind.HOST_STOP, kind, message]


@dataclass
class Storage:
    """A dict standing in for the storage broker: the requests and the answers of
    wasihost/brokers/storage.py (get: key -> bytes or NOT_FOUND; put: [key, value] -> null;
    delete: key -> bool; list: [prefix, after, limit] -> [[keys], next]; cas: [key, expected,
    new] -> bool)."""

    data: dict[str, bytes] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def __call__(self, driver: NativeDriver, call: HostCall) -> list[Any]:
        name, request = call.entry.name, call.value
        self.calls.append(name)
        if name == "storage_get":
            if request not in self.data:
                return status(8)  # NOT_FOUND
            return ok(self.data[request])
        if name == "storage_put":
            key, value = request
            self.data[key] = value
            return ok(None)
        if name == "storage_delete":
            return ok(self.data.pop(request, None) is not None)
        if name == "storage_list":
            prefix, after, limit = request
            keys = sorted(
                k for k in self.data if k.startswith(prefix) and (after is None or k > after)
            )
            page = keys[:limit]
            return ok([page, page[-1] if len(keys) > limit else None])
        if name == "storage_cas":
            key, expected, new = request
            if self.data.get(key) != expected:
                return ok(False)
            if new is None:
                self.data.pop(key, None)
            else:
                self.data[key] = new
            return ok(True)
        if name == "log":
            return ok(None)
        return status(9)  # UNSUPPORTED


@dataclass
class Reply:
    """A DONE or FAIL, and the host calls served on the way."""

    message: list[Any]
    calls: list[HostCall]

    @property
    def kind(self) -> Kind:
        return Kind(self.message[0])

    @property
    def status(self) -> int:
        assert self.kind is Kind.DONE, self.message
        return int(self.message[1])

    @property
    def value(self) -> Any:
        """A DONE's body, decoded."""
        assert self.kind is Kind.DONE, self.message
        return cbor2.loads(self.message[2]) if self.message[2] else None

    @property
    def failure(self) -> tuple[str, str]:
        """A FAIL's class and message."""
        assert self.kind is Kind.FAIL, self.message
        return self.message[1], self.message[2]


class NativeDriver:
    """One native plugin process and the host's ends of its two sockets."""

    def __init__(
        self,
        executable: Path,
        *,
        walls: bytes | None = None,
        rlimits: Iterable[str] = ("RLIMIT_NOFILE=64",),
        secret: bytes | None = None,
    ) -> None:
        self.secret = secret if secret is not None else os.urandom(SECRET_BYTES)
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control, their_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {SECRET_ENV: self.secret.hex()}
        if walls is not None:
            env[WALLS_ENV] = walls.hex()
        fd = their_control.fileno()
        try:
            self.child: Spawned = spawn(
                [str(executable), str(fd), *rlimits],
                env=env,
                stdin=theirs.fileno(),
                stdout=DEVNULL,
                stderr=PIPE,
                prefix="wasihost-native-",
                pass_fds=(fd,),
            )
        finally:
            theirs.close()
            their_control.close()
        self.entries: list[HostFunction] = []
        self._frames = FrameBuffer()

    # -- frames ---------------------------------------------------------------------------

    def send(self, message: Sequence[Any]) -> None:
        self.channel.sendall(encode_frame(message))

    def send_raw(self, data: bytes) -> None:
        self.channel.sendall(data)

    def receive(self, timeout: float = TIMEOUT_S) -> list[Any]:
        """The plugin's next message, bounded and checked as the host reads it."""
        deadline = time.monotonic() + timeout
        while True:
            body = self._frames.next_body()
            if body is not None:
                return decode_frame(body)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.channel], [], [], left)[0]:
                raise TimeoutError("the plugin did not answer")
            data = self.channel.recv(1 << 16)
            if not data:
                raise EOFError("the plugin closed the channel")
            self._frames.feed(data)

    # -- the conversation -----------------------------------------------------------------

    def hello(self) -> list[Any]:
        """Its HELLO, checked: the protocol version and the secret it was given."""
        message = self.receive()
        expect(message, Kind.HELLO)
        if message[1] != 1 or message[2] != self.secret:
            raise ChannelError("the plugin failed its hello")
        return message

    def load(self, admitted: Sequence[HostFunction], artifact: bytes = b"") -> list[list[str]]:
        """LOAD with ``admitted``'s registry entries (as the host sends them); READY's names,
        checked to be exactly the admitted ones, in order."""
        self.entries = list(admitted)
        self.send(
            [Kind.LOAD, {}, artifact, [entry_record(e) for e in admitted], [0, 0, 0, 0], None]
        )
        reply = self.receive()
        expect(reply, Kind.READY)
        names: list[list[str]] = reply[1]
        if names != [[e.module, e.name] for e in admitted]:
            raise ChannelError(f"READY named {names}")
        return names

    def granted(self) -> list[str]:
        """Every capability of the loaded entries: what the host grants a plugin it trusts
        with all of them (ProcessInstance sends the granted ones with each START and CALL)."""
        return sorted({e.capability for e in self.entries})

    def start(self) -> Reply:
        return self._run([Kind.START, 0, TIMEOUT_S, self.granted()], None)

    def call(
        self,
        command: str,
        value: Any = None,
        *,
        payload: bytes | None = None,
        max_output: int = 1 << 20,
        seconds: float = TIMEOUT_S,
        host: HostHandler | None = None,
        caps: Sequence[str] | None = None,
    ) -> Reply:
        """CALL ``command`` with ``value`` (CBOR) or raw ``payload``, serving host calls with
        ``host``, granting ``caps`` (by default every capability loaded); its DONE or FAIL."""
        if payload is None:
            payload = b"" if value is None else cbor2.dumps(value)
        granted = self.granted() if caps is None else list(caps)
        message = [Kind.CALL, command.encode(), payload, max_output, True, 0, seconds, granted]
        return self._run(message, host)

    def handshake(self, granted: Sequence[str], features: Sequence[str] = ()) -> tuple[Any, Any]:
        """``wasihost.hello`` then ``wasihost.welcome``, as the host starts an instance."""
        hello = self.call("wasihost.hello").value
        welcome = {"runtime_id": b"\x01" * 16, "granted": list(granted), "epoch": 1}
        return hello, self.call("wasihost.welcome", welcome).value

    def _run(self, message: list[Any], host: HostHandler | None) -> Reply:
        self.send(message)
        calls: list[HostCall] = []
        while True:
            reply = self.receive()
            if reply[0] != Kind.HOST:
                expect(reply, Kind.DONE, Kind.FAIL)
                return Reply(reply, calls)
            index, args = host_call_args(reply)
            if not 0 <= index < len(self.entries) or len(args) != 3:
                raise ChannelError(f"a host call of import {index} with {args!r}")
            request, cap, unreadable = args
            assert type(request) is bytes and type(cap) is int and unreadable is None
            call = HostCall(index, self.entries[index], request, cap)
            calls.append(call)
            if host is None:
                raise ChannelError(f"an unexpected host call of {call.entry.name}")
            answer = host(self, call)
            self.send([*answer, 0, 0])

    def memory(self, op: str, args: list[Any]) -> list[Any]:
        """A MEM request while a host call is served: the plugin's MEM_OK or MEM_FAULT."""
        self.send([Kind.MEM, op, args, 0])
        reply = self.receive()
        expect(reply, Kind.MEM_OK, Kind.MEM_FAULT)
        return reply

    def query(self, message: Sequence[Any]) -> list[Any]:
        self.send(message)
        reply = self.receive()
        expect(reply, Kind.VALUE)
        return reply

    def interrupt(self) -> None:
        """One byte on the control socket: the command in flight ends at its next host call."""
        self.control.send(b"i")

    # -- the end --------------------------------------------------------------------------

    def wait(self, timeout: float = TIMEOUT_S) -> tuple[int, str]:
        """Its exit status once it has exited by itself, and what it wrote on stderr; a
        TimeoutError if it does not exit within ``timeout``."""
        if not self.child.exited(timeout):
            raise TimeoutError("the plugin did not exit")
        stream = self.child.proc.stderr
        said = stream.read().decode("utf-8", "replace") if stream is not None else ""
        return self.child.end(), said

    def close_channel(self) -> None:
        self.channel.close()

    def end(self) -> None:
        """Kill its process group and close everything (idempotent)."""
        for sock in (self.channel, self.control):
            sock.close()
        self.child.end()

    def __enter__(self) -> NativeDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


def started(name: str, admitted: Sequence[HostFunction], **kw: Any) -> NativeDriver:
    """A plugin of fixture ``name`` that said HELLO, was LOADed with ``admitted`` and STARTed."""
    driver = NativeDriver(program(name), **kw)
    try:
        driver.hello()
        driver.load(admitted)
        assert driver.start().message == [Kind.DONE, 0, b"", 0, None, False, None]
    except BaseException:
        driver.end()
        raise
    return driver
