"""Reading a UDP socket in batches: asyncio's datagram transport takes one datagram per wake-up of the event loop.

Why: ``_SelectorDatagramTransport._read_ready`` calls ``recvfrom`` once each time the selector reports the socket
readable, so a QUIC endpoint takes in at most one datagram per loop iteration. A server whose loop also carries
hundreds of SSE connections (or that the scheduler gives little CPU: issue 28, ``eloquent bench load --cpu-hog``)
then reads its clients' ACKs and requests slower than they come: with the kernel's default receive buffer they
were dropped (thousands per minute), with a large one they queued for seconds; either way HTTP/3 streams stalled
until the client's watchdog cut them, and their resumes came too late (404) while SSE over TCP, which reads
whatever is queued in one ``recv``, did not notice. :class:`BatchedIntake` delivers, at each wake-up, what the
socket already holds, up to :data:`MAX_BATCH` datagrams, so intake keeps up with arrival whatever else the loop
does, and the loop still gets back to its other work after a bounded batch.

Pure asyncio and sockets (no aioquic internals): both ends may use it, the listener and the client's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

MAX_BATCH = 64
"""Datagrams delivered per wake-up at most (the first one included): about 64 x 0.1-0.3 ms of QUIC processing,
so other callbacks wait at most tens of milliseconds behind a full batch."""
MAX_DATAGRAM = 65536


class BatchedIntake(asyncio.DatagramProtocol):
    """Stands between a datagram transport and its protocol (``transport.set_protocol``): each datagram the
    transport delivers is followed by the ones already queued on the socket, read without blocking from a
    duplicate of its descriptor (closed with the transport). Everything else is passed through unchanged."""

    def __init__(self, transport: asyncio.DatagramTransport, inner: asyncio.DatagramProtocol, sock: socket.socket,
                 max_batch: int = MAX_BATCH) -> None:
        self.transport = transport
        self.inner = inner
        self._sock: socket.socket | None = sock
        self.max_batch = max_batch
        self.batches = 0
        """Wake-ups that found more than one datagram queued (diagnostics and tests)."""
        self.extra = 0
        """Datagrams read here beyond the transport's one per wake-up."""

    @classmethod
    def install(cls, transport: asyncio.DatagramTransport, max_batch: int = MAX_BATCH) -> BatchedIntake | None:
        """Put a ``BatchedIntake`` between ``transport`` and its protocol; None (nothing changed) for a transport
        without a socket of its own (an in-memory link)."""
        wrapped = transport.get_extra_info("socket")
        if wrapped is None:
            return None
        try:
            sock = wrapped.dup()
            sock.setblocking(False)
        except OSError:
            return None
        intake = cls(transport, transport.get_protocol(), sock, max_batch)  # type: ignore[arg-type]
        transport.set_protocol(intake)
        return intake

    def datagram_received(self, data: bytes, addr: Any) -> None:
        inner = self.inner
        inner.datagram_received(data, addr)
        sock = self._sock
        if sock is None:
            return
        for n in range(self.max_batch - 1):
            if self._sock is None or self.transport.is_closing():  # closed by what the last datagram did
                break
            try:
                data, addr = sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # an ICMP error queued on the socket: as the transport reports it
                inner.error_received(exc)
                break
            if n == 0:
                self.batches += 1
            self.extra += 1
            inner.datagram_received(data, addr)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)  # type: ignore[arg-type]  # a datagram transport: it is ours

    def error_received(self, exc: Exception) -> None:
        self.inner.error_received(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()
        self.inner.connection_lost(exc)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
