"""A callback-driven HTTP/1.1 client for throughput benchmarks that share a machine with the server they measure.

Every CPU cycle the client spends on a stream is taken from the server on a small box, and streaming costs the
client one wake-up per event where a non-streamed answer costs one: a client that parses every event (httpx +
an SSE parser + ``json.loads``) penalises the streamed side of any streamed/non-streamed comparison. This one
does the least that still checks the answer:

* one :class:`asyncio.Protocol` per keep-alive connection (``loop.create_connection``); the request is written by
  hand (``Content-Length`` body), and the response is decoded inside ``data_received`` -- no task switch, no
  timeout handle and no generator step per received piece, one timeout per request;
* the body framing is ``Transfer-Encoding: chunked``, ``Content-Length``, or read-to-close;
* a body can be kept whole (a JSON answer) or only its last ``tail`` bytes (a stream's usage chunk and
  ``data: [DONE]`` are there), and ``first`` (a compiled bytes pattern) is searched only until it first matches,
  to time the first token; the body up to that match is kept too (``prefix``) for a cheap look at the first events.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_HEAD_BYTES = 64 * 1024
MAX_PREFIX_BYTES = 16 * 1024
_CARRY = 64
"""Bytes of the previous piece searched again with the next one, for a match split across two reads."""


class ResponseError(Exception):
    """The server's bytes are not an HTTP/1.1 response this client understands, or it closed mid-response."""


@dataclass(slots=True)
class Result:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    """The whole body, or its last ``tail`` bytes."""
    prefix: bytes = b""
    """With ``first``: the body up to and including the piece where it matched (at most 16 KiB)."""
    first_s: float | None = None
    """With ``first``: seconds from writing the request to receiving the piece where it first matched."""
    body_bytes: int = 0
    pieces: int = 0
    """Body pieces handed over (one per chunk or per read, whichever is coarser)."""
    keep_alive: bool = True


class _Exchange:
    """One response being read: the head, then the body in its framing."""

    def __init__(self, future: asyncio.Future[Result], *, tail: int | None, first: re.Pattern[bytes] | None,
                 head_only: bool, on_piece: Callable[[Result, bytes], None] | None = None) -> None:
        self.future = future
        self.on_piece = on_piece
        self.result = Result()
        self.tail = tail
        self.first = first
        self.head_only = head_only
        self.start = time.perf_counter()
        self._buf = bytearray()
        self._head_done = False
        self._framing = ""  # "chunked", "length", "close"
        self._left = 0  # bytes still to come: of the current chunk, or of a Content-Length body
        self._need_crlf = False
        self._trailers = False
        self._kept: list[bytes] = []
        self._tail_bytes = b""
        self._carry = b""
        self._prefix: list[bytes] = []

    # -- input -------------------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if not self._head_done:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise ResponseError("response head too large")
                return
            head = bytes(self._buf[:end])
            data = bytes(self._buf[end + 4:])
            self._buf = bytearray()
            self._parse_head(head)
            if self.future.done():
                return
        if self._framing == "chunked":
            self._feed_chunked(data)
        elif self._framing == "length":
            if len(data) > self._left:
                raise ResponseError("more bytes than Content-Length")
            self._left -= len(data)
            if data:
                self._piece(data)
            if not self._left:
                self._finish()
        elif data:
            self._piece(data)

    def eof(self, exc: BaseException | None) -> None:
        if self.future.done():
            return
        if self._head_done and self._framing == "close":
            self.result.keep_alive = False
            self._finish()
            return
        where = "inside the body" if self._head_done else "before the response head"
        self.future.set_exception(ResponseError(f"connection closed {where}" + (f": {exc}" if exc else "")))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    # -- head and framing --------------------------------------------------------------------------------------

    def _parse_head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (parts[1].isascii() and parts[1].isdigit()):
            raise ResponseError(f"bad status line {lines[0][:80]!r}")
        result = self.result
        result.status = int(parts[1])
        headers = result.headers
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ResponseError(f"bad header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        result.keep_alive = connection != "close" and (parts[0] != "HTTP/1.0" or connection == "keep-alive")
        self._head_done = True
        if self.head_only or result.status in (204, 304) or 100 <= result.status < 200:
            if 100 <= result.status < 200:
                raise ResponseError(f"unexpected interim response {result.status}")
            self._finish()
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            self._framing = "chunked"
        elif "content-length" in headers:
            length = headers["content-length"]
            if not (length.isascii() and length.isdigit()):  # latin-1 "\xb2" is a digit to isdigit()
                raise ResponseError(f"bad Content-Length {length[:20]!r}")
            self._framing, self._left = "length", int(length)
            if not self._left:
                self._finish()
        else:
            self._framing = "close"
            result.keep_alive = False

    def _feed_chunked(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, size_of_buf = 0, len(buf)
        pieces: list[bytes] = []
        while True:
            if self._left:
                take = min(self._left, size_of_buf - pos)
                if not take:
                    break
                pieces.append(bytes(buf[pos:pos + take]))
                pos += take
                self._left -= take
                if self._left:
                    break
                self._need_crlf = True
            if self._need_crlf:
                if size_of_buf - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ResponseError("chunk data not followed by CRLF")
                pos += 2
                self._need_crlf = False
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if size_of_buf - pos > 4096:
                    raise ResponseError("chunk size line too long")
                break
            line = bytes(buf[pos:end])
            pos = end + 2
            if self._trailers:
                if not line:  # the blank line after the (ignored) trailers: the body is complete
                    if pos != size_of_buf:
                        raise ResponseError("bytes after the end of the chunked body")
                    del buf[:pos]
                    if pieces:
                        self._piece(b"".join(pieces))
                    self._finish()
                    return
                continue
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ResponseError(f"bad chunk size {size_text[:20]!r}") from None
            if size < 0:
                raise ResponseError(f"bad chunk size {size_text[:20]!r}")
            if size == 0:
                self._trailers = True
            else:
                self._left = size
        del buf[:pos]
        if pieces:
            self._piece(pieces[0] if len(pieces) == 1 else b"".join(pieces))

    # -- output ------------------------------------------------------------------------------------------------

    def _piece(self, piece: bytes) -> None:
        result = self.result
        result.body_bytes += len(piece)
        result.pieces += 1
        if self.on_piece is not None:
            self.on_piece(result, piece)
        if self.first is not None and result.first_s is None:
            window = self._carry + piece
            if sum(map(len, self._prefix)) < MAX_PREFIX_BYTES:
                self._prefix.append(piece)
            if self.first.search(window):
                result.first_s = time.perf_counter() - self.start
            self._carry = window[-_CARRY:]
        limit = self.tail
        if limit is None:
            self._kept.append(piece)
        elif len(piece) >= limit:
            self._tail_bytes = piece[-limit:]
        else:
            self._tail_bytes = (self._tail_bytes + piece)[-limit:]

    def _finish(self) -> None:
        result = self.result
        result.body = b"".join(self._kept) if self.tail is None else self._tail_bytes
        result.prefix = b"".join(self._prefix)[:MAX_PREFIX_BYTES]
        if not self.future.done():
            self.future.set_result(result)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.future.done():
            if self.transport is not None:  # bytes nobody asked for: the connection is out of step
                self.transport.close()
            return
        try:
            exchange.feed(data)
        except Exception as exc:  # noqa: BLE001 - any decoding failure fails this request, not the loop
            exchange.fail(exc)
            if self.transport is not None:
                self.transport.close()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.exchange is not None:
            self.exchange.eof(exc)


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time; reconnects when the last one could not be
    kept (``Connection: close``, read-to-close body, an error)."""

    def __init__(self, host: str, port: int, *, timeout: float = 600.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._protocol: _Protocol | None = None

    @property
    def is_open(self) -> bool:
        p = self._protocol
        return p is not None and not p.lost and p.transport is not None and not p.transport.is_closing()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        _transport, protocol = await asyncio.wait_for(
            loop.create_connection(_Protocol, self.host, self.port), self.timeout)
        self._protocol = protocol

    def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *,
                      tail: int | None = None, first: re.Pattern[bytes] | None = None,
                      on_piece: Callable[[Result, bytes], None] | None = None) -> Result:
        """Send one request, return its complete response. Raises ``ResponseError`` (malformed response, closed
        early), ``TimeoutError`` (no complete response within ``timeout`` seconds) or ``OSError``.

        ``on_piece(result, piece)`` is called with each body piece as it arrives (status and headers are set by
        then), for clients that look at every event (``bench load``); an exception from it fails the request."""
        if not self.is_open:
            await self.connect()
        protocol = self._protocol
        assert protocol is not None and protocol.transport is not None
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        exchange = _Exchange(future, tail=tail, first=first, head_only=method == "HEAD", on_piece=on_piece)
        protocol.exchange = exchange
        protocol.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        try:
            result = await asyncio.wait_for(future, self.timeout)
        except BaseException:
            self.close()
            raise
        finally:
            protocol.exchange = None
        if not result.keep_alive:
            self.close()
        return result
