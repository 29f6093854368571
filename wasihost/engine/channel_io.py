"""Reading frames off a process-runtime channel: both ends (engine/process.py, the host's;
engine/process_child.py, the child's) wait for the other's answer the same way.

A small call is two messages a few microseconds of work apart, and on a virtual machine
waking a process blocked in ``recv`` costs 15-20 µs each way (a blocking ping-pong between two
Python processes here: 40 µs a round trip; polling: 4.4 µs). So a reader first polls the
socket without blocking for about ``SPIN_READS`` attempts (tens of microseconds; each attempt
releases the GIL), and only then sleeps in ``select``; a reader whose spins keep missing stops
spinning (:class:`Reader`). The spin is bounded, so an idle child costs no CPU past it.
"""

from __future__ import annotations

import select
import socket
import time

from ..core.channel import FrameBuffer

# Non-blocking reads before sleeping: about 30-60 µs of polling on this class of machine.
SPIN_READS = 150
RECV_BYTES = 1 << 16


class ChannelTimeout(Exception):
    """No whole frame arrived (or could be sent) by the deadline."""


def send_all(sock: socket.socket, data: bytes, deadline: float | None) -> None:
    """Send all of ``data``, waiting for room until ``deadline`` (None: wait on); raises
    :class:`ChannelTimeout` past it. A peer that stops reading fills the socket's buffer, and a
    blocking send would then wait past any deadline."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view, socket.MSG_DONTWAIT)
        except BlockingIOError:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ChannelTimeout from None
            select.select([], [sock], [], left)
            continue
        view = view[sent:]


# While the other end keeps answering only after the spin gave up, the spin takes nothing but
# the CPU the other end would run on (a busy machine: both ends of every call spun out, then
# slept, 130-310 µs a call instead of 23): a reader skips it then, and tries it again every
# RETRY_SPIN_EVERY waits. Measured with 3,000 warm calls beside a busy process: 81-311 µs a
# call spinning always, 40-42 never, 61-64 adaptive; 23-25 with both cores free (spinning
# always or adaptive), 60-77 never (benchmarks/README.md, the process section).
RETRY_SPIN_EVERY = 16


class Reader:
    """One end's reading of a channel: the frames it has cut, and whether spinning pays."""

    __slots__ = ("_missed", "frames", "sock")

    def __init__(self, sock: socket.socket, frames: FrameBuffer | None = None) -> None:
        self.sock = sock
        self.frames = frames if frames is not None else FrameBuffer()
        self._missed = 0  # consecutive waits the spin did not catch

    def body(self, deadline: float | None) -> bytes:
        """The next frame's body. Raises EOFError when the other end closed,
        :class:`ChannelTimeout` past ``deadline`` (a ``time.monotonic()`` value; None: wait
        on), ChannelError for a header over the limit, OSError for the socket's own errors."""
        frames = self.frames
        while True:
            body = frames.next_body()
            if body is not None:
                return body
            frames.feed(self._receive_some(deadline))

    def _receive_some(self, deadline: float | None) -> bytes:
        sock = self.sock
        missed = self._missed
        if missed % RETRY_SPIN_EVERY == 0:
            recv = sock.recv
            for _ in range(SPIN_READS):
                try:
                    data = recv(RECV_BYTES, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                if not data:
                    raise EOFError("the channel closed")
                self._missed = 0
                return data
        self._missed = missed + 1
        return _wait_and_receive(sock, deadline)


def _wait_and_receive(sock: socket.socket, deadline: float | None) -> bytes:
    recv = sock.recv
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ChannelTimeout
        if select.select([sock], [], [], left)[0]:
            try:
                data = recv(RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:  # woken for nothing
                continue
            if not data:
                raise EOFError("the channel closed")
            return data
