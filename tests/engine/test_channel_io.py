"""The process runtime's channel reads and writes (engine/channel_io.py): whole frames in
order whatever their size, the other end's close, timeouts, a closed socket, a peer that stops
reading, and Ctrl-C reaching a thread that waits, with a deadline or without."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from wasihost.core.channel import HEADER_BYTES, encode_frame
from wasihost.engine.channel_io import ChannelTimeout, Reader, send_all


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_frames_cross_whole_and_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    messages = [[1, b"x" * n, "text", None] for n in (0, 1, 100, 70_000, 300_000)]
    received: list[bytes] = []

    def read() -> None:
        reader = Reader(b)
        for _ in messages:
            received.append(reader.body(time.monotonic() + 10))

    reading = threading.Thread(target=read)
    reading.start()
    for message in messages:
        send_all(a, encode_frame(message), time.monotonic() + 10)
    reading.join(10)
    assert not reading.is_alive()
    assert received == [encode_frame(m)[HEADER_BYTES:] for m in messages]


def test_the_other_end_closing_is_end_of_channel(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.close()
    with pytest.raises(EOFError):
        Reader(b).body(time.monotonic() + 5)


def test_nothing_by_the_deadline_is_a_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    _, b = pair
    started = time.monotonic()
    with pytest.raises(ChannelTimeout):
        Reader(b).body(started + 0.2)
    took = time.monotonic() - started
    assert 0.19 <= took < 2.0
    with pytest.raises(ChannelTimeout):  # a deadline already past: at once
        Reader(b).body(time.monotonic() - 1)


def test_a_closed_socket_fails_as_oserror(pair: tuple[socket.socket, socket.socket]) -> None:
    _, b = pair
    b.close()
    with pytest.raises(OSError, match="Bad file descriptor"):
        Reader(b).body(time.monotonic() + 1)
    with pytest.raises(OSError, match="Bad file descriptor"):
        send_all(b, b"xyz", time.monotonic() + 1)


def test_a_full_buffer_waits_for_room_then_times_out(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, _ = pair
    with pytest.raises(ChannelTimeout):
        send_all(a, bytes(64 << 20), time.monotonic() + 0.3)


@pytest.mark.parametrize("wait_s", [None, 30.0], ids=["no deadline", "a far deadline"])
def test_ctrl_c_reaches_a_waiting_thread(
    pair: tuple[socket.socket, socket.socket], wait_s: float | None
) -> None:
    """SIGINT during a wait runs Python's handler, which ends it: the host waits with its
    call's deadline (a signal that lands in the spin is seen within a slice of the wait); the
    child waits with none, and a signal interrupts its sleep."""
    _, b = pair
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            Reader(b).body(None if wait_s is None else started + wait_s)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 3.0
