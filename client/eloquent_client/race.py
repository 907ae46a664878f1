"""The HTTP/3 side of one ``EloquentClient``: which UDP port to try, the QUIC connection (opened on first use,
reopened when it closed), ``auto``'s handshake racing TCP, and the connections left to their streams because
their server drains. The client asks it for a connection; the race's rules are here, its uses in ``client``.

A path whose handshake never heard back is remembered as blocked (``paths.PathMemory``, backing off); one that
only lost packets is not. A TLS failure of a background handshake is kept and raised by the next request, never
hidden behind TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any, Protocol

from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import ALT_SVC_HEADER, H3_NO_ERROR

from eloquent_client.bounds import alt_svc_port
from eloquent_client.errors import ConnectError, TLSVerificationError
from eloquent_client.handshakes import handshakes
from eloquent_client.http3 import Http3ClientConnection
from eloquent_client.paths import PathMemory


class RaceSettings(Protocol):
    """The client's settings the race reads (live: a caller may change them between requests)."""

    @property
    def transport(self) -> str: ...
    @property
    def verify(self) -> bool | str: ...
    @property
    def timeout(self) -> float: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def quic_idle_timeout(self) -> float: ...
    @property
    def stream_idle_timeout(self) -> float | None: ...
    @property
    def h3_probe_timeout(self) -> float: ...
    @property
    def udp_retry_after(self) -> float: ...
    @property
    def memory(self) -> PathMemory: ...


class H3Paths:
    """The client's HTTP/3 connections and ``auto``'s race (module docstring)."""

    def __init__(self, settings: RaceSettings, *, host: str, tcp_port: int, origin: str, h3_port: int | None,
                 alt_svc_ports: tuple[int, ...]) -> None:
        self.settings = settings
        self.host = host
        self.tcp_port = tcp_port
        self.origin = origin
        self.fixed_port = h3_port
        self.alt_svc_ports = alt_svc_ports
        self.conn: Http3ClientConnection | None = None
        self.draining: set[Http3ClientConnection] = set()
        """Connections whose server drains (it refused a new stream): their streams go on, new ones go elsewhere."""
        self.lock = asyncio.Lock()
        self.task: asyncio.Task[Http3ClientConnection] | None = None
        """``auto``'s QUIC handshake, racing TCP (``race``)."""
        self._started = 0.0
        self._task_port = 0
        self._tls_error: TLSVerificationError | None = None
        """A background handshake's TLS failure, raised by the next request (never hidden behind TCP)."""

    @property
    def port(self) -> int:
        """The UDP port HTTP/3 is tried on now."""
        s = self.settings
        learned = alt_svc_port(s.memory.h3_port(self.origin), self.tcp_port, self.alt_svc_ports, s.verify)
        return self.fixed_port or learned or self.tcp_port

    def up_now(self) -> Http3ClientConnection | None:
        return self.conn if self.conn is not None and not self.conn.closed else None

    def connections(self) -> list[Http3ClientConnection]:
        """The current connection and the draining ones."""
        return [c for c in (self.conn, *self.draining) if c is not None]

    async def connection(self) -> Http3ClientConnection:
        """The HTTP/3 connection, opened on first use (with the whole ``timeout``) and reopened if it closed;
        raises ``ConnectError``."""
        async with self.lock:
            conn = self.up_now()
            task = self.task
            if conn is None and task is not None and not task.done():  # ``auto``'s handshake is under way
                with contextlib.suppress(ConnectError):
                    await asyncio.shield(task)
                conn = self.up_now()
            if conn is None:
                conn = self.conn = await self._connect(self.port)
            return conn

    async def _connect(self, port: int, timeout: float | None = None) -> Http3ClientConnection:
        s = self.settings
        conn = await Http3ClientConnection.connect(
            self.host, port, verify=s.verify, timeout=timeout or s.timeout, limits=s.limits,
            idle_timeout=s.quic_idle_timeout, stream_idle_timeout=s.stream_idle_timeout)
        conn.abort_unanswered = s.transport == "auto"
        return conn

    def race(self) -> asyncio.Task[Http3ClientConnection] | None:
        """``auto``: the QUIC handshake, started in the background unless it runs already or the path is
        remembered as blocked. It gets the whole ``timeout``: a handshake that lost packets retransmits and comes
        up (a stream that began on TCP then moves over); only one that never hears back marks the path blocked."""
        task = self.task
        port = self.port
        if task is not None and not task.done():
            if port == self._task_port:
                return task
            task.cancel()  # the origin advertised another UDP port meanwhile (``Alt-Svc``)
        if self.settings.memory.is_broken(self.host, port):
            return None
        self.task = task = asyncio.get_running_loop().create_task(self._handshake(port))
        task.add_done_callback(_retrieve)
        self._task_port = port
        self._started = time.monotonic()
        return task

    async def _handshake(self, port: int) -> Http3ClientConnection:
        memory = self.settings.memory
        try:
            conn = await handshakes(lambda timeout: self._connect(port, timeout), self.settings.timeout)
        except TLSVerificationError as exc:
            self._tls_error = exc
            raise
        except ConnectError as exc:
            if not exc.answered:  # nothing ever came back: UDP is blocked on this path
                memory.mark_broken(self.host, port, self.settings.udp_retry_after)
            raise
        memory.mark_working(self.host, port)
        if self.up_now() is not None:  # ``connection()`` made one meanwhile
            await conn.close()
            return self.conn  # type: ignore[return-value]
        if self.conn is not None:  # one that closed: its successor takes over
            await self.conn.close()
        self.conn = conn
        return conn

    async def up(self) -> Http3ClientConnection | None:
        """The HTTP/3 connection to use now, or None for TCP: under ``auto`` QUIC gets ``h3_probe_timeout`` of
        head start from the handshake's start, then TCP is used beside it (the race, ``client._open``); the
        explicit HTTP/3 transports connect (and raise); ``sse`` never. A TLS failure is raised, never hidden."""
        transport = self.settings.transport
        if transport == "sse":
            return None
        if transport != "auto":
            return await self.connection()
        if self._tls_error is not None:
            error, self._tls_error = self._tls_error, None
            raise error
        conn = self.up_now()
        if conn is not None:
            return conn
        task = self.race()
        if task is None:
            return None
        head_start = self._started + self.settings.h3_probe_timeout - time.monotonic()
        if not task.done() and head_start > 0:
            await asyncio.wait({task}, timeout=head_start)
        return self.raced(task)

    def raced(self, task: asyncio.Task[Http3ClientConnection]) -> Http3ClientConnection | None:
        if not task.done() or task.cancelled():
            return None
        error = task.exception()
        if isinstance(error, TLSVerificationError):
            self._tls_error = None
            raise error
        return self.up_now() if error is None else None

    def tcp_refused(self) -> Http3ClientConnection | None:
        """TCP said no (refused, unreachable): the connection if QUIC is already up, else None -- and the
        handshake is given up, since the server is not there (fast failure: TCP's answer is the signal)."""
        conn = self.up_now()
        if conn is not None:
            return conn
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        return None

    def udp_failed(self) -> None:
        """A request over HTTP/3 got no head (the watchdog found the path silent): under ``auto``, UDP is skipped
        for a while (backing off, ``paths``). A cut stream only resumes: its resume races UDP again."""
        if self.settings.transport == "auto":
            self.settings.memory.mark_broken(self.host, self.port, self.settings.udp_retry_after)

    def learn(self, headers: Mapping[str, str]) -> None:
        """Read ``Alt-Svc``; under ``auto`` a newly advertised UDP port gets its handshake at once, so the stream
        that brought the header can move over to it."""
        before = self.port
        self.settings.memory.learn(self.origin, headers.get(ALT_SVC_HEADER.decode()))
        if self.settings.transport == "auto" and self.port != before and self.up_now() is None:
            self.race()

    async def retire(self, conn: Http3ClientConnection) -> None:
        """``conn``'s server drains: its streams go on, new ones go to a new connection."""
        async with self.lock:
            if self.conn is conn:
                self.conn = None
                if not conn.closed:
                    self.draining.add(conn)

    async def aclose(self) -> None:
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self.conn is not None:
            await self.conn.close()
            self.conn = None
        draining, self.draining = self.draining, set()
        for conn in draining:
            await conn.close()


_APPLICATION_ERROR, _PADDING = 0x0C, 0x00
"""RFC 9000 10.2.3: a close an application sends before the handshake is confirmed goes out as a transport close,
APPLICATION_ERROR with frame type PADDING, its own code hidden."""


def closed_on_purpose(event: Any) -> bool:
    """The server closed the connection itself (no transport error): a drained replica's ``H3_NO_ERROR``, or its
    exit closing a connection still young enough that QUIC hid the code."""
    if event is None:
        return False
    if event.error_code in (0, H3_NO_ERROR):
        return True
    return bool(event.error_code == _APPLICATION_ERROR and event.frame_type == _PADDING)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """A background handshake's failure is read where it matters (``raced``); this keeps asyncio quiet."""
    if not task.cancelled():
        task.exception()
