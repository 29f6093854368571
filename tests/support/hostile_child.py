"""A child for the process runtime that breaks the channel protocol on purpose.

Run as ``python hostile_child.py MODE CONTROL_FD RLIMITS...`` by a ProcessBackend whose
``program`` names it (tests/engine/test_process_runtime.py). It says a correct HELLO and
READY, as a child the guest took over would, then misbehaves on the first call as MODE says.
Standard library and cbor2 only: it must not depend on the host it attacks.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

import cbor2

HELLO, LOAD, READY, CALL, DONE, HOST, MEM_OK = 1, 2, 3, 5, 7, 9, 14


def send(sock: socket.socket, message: list[object]) -> None:
    body = cbor2.dumps(message)
    sock.sendall(struct.pack(">I", len(body)) + body)


def receive(sock: socket.socket) -> list[object]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                sys.exit(0)
            data += chunk
        return data

    (length,) = struct.unpack(">I", exactly(4))
    message = cbor2.loads(exactly(length))
    assert isinstance(message, list)
    return message


def misbehave(mode: str, sock: socket.socket) -> None:
    if mode == "garbage":
        sock.sendall(struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff")
    elif mode == "oversized":
        sock.sendall(struct.pack(">I", 0x7FFF_FFFF) + b"x" * 1024)
    elif mode == "wrong-kind":
        send(sock, [MEM_OK, None, 0])
    elif mode == "unknown-import":
        send(sock, [HOST, 99, b"", 64, None])
    elif mode == "oversized-request":
        send(sock, [HOST, 0, b"\x40" * (1 << 20), 64, None])
    elif mode == "fuel-lie":
        send(sock, [DONE, 0, b"\xf6", -5, None, False, None])
    elif mode == "stderr-flood":
        chunk = b"x" * 65536
        while True:
            os.write(2, chunk)
    elif mode == "stdout-flood":
        chunk = b"y" * 65536
        while True:
            os.write(1, chunk)
    elif mode == "burn":  # half a second of CPU, then a claim of no fuel at all
        end = time.process_time() + 0.5
        while time.process_time() < end:
            pass
        send(sock, [DONE, 0, b"\xf6", 0, None, False, None])
        return
    elif mode == "host-spam":  # host calls without end, each answer read: more than fuel pays
        while True:
            send(sock, [HOST, 0, b"", 64, None])
            receive(sock)
    elif mode == "host-flood":  # host calls without reading an answer: the host's sends fill
        while True:
            send(sock, [HOST, 0, b"", 64, None])
    elif mode == "exit":
        os._exit(3)
    elif mode == "hang":
        time.sleep(3600)


def main() -> None:
    mode = sys.argv[1]
    secret = bytes.fromhex(os.environ.get("WASIHOST_CHILD_SECRET", ""))
    sock = socket.socket(fileno=0)
    send(sock, [HELLO, 1, secret if mode != "bad-secret" else b"x" * 32, os.getpid(), []])
    while True:
        message = receive(sock)
        if message[0] == LOAD:
            entries = message[3]
            assert isinstance(entries, list)
            names = [[e["module"], e["name"]] for e in entries]  # type: ignore[index]
            if mode == "wrong-imports":
                names = [["evil", "thing"], *names]
            send(sock, [READY, names])
        else:
            misbehave(mode, sock)
            if mode != "burn":
                time.sleep(3600)


if __name__ == "__main__":
    main()
