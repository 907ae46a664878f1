"""Incremental Server-Sent Events parser (WHATWG HTML, "Parsing an event stream"), sans-I/O.

Feed it bytes as they arrive, in any split; it returns complete messages. Used on the server side to cut an
engine's ``text/event-stream`` body into events, and by the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eloquent_plugins.core.errors import LimitExceeded


@dataclass(frozen=True, slots=True)
class SSEMessage:
    data: str
    event: str = "message"
    id: str | None = None
    """The last event id in force when this message was dispatched (None if never set)."""
    retry: int | None = None
    comments: tuple[str, ...] = field(default=())
    raw: bytes = b""
    """The message's bytes as received, up to and including the blank line that ended it."""


def one_data_line(chunk: bytes) -> bool:
    """``chunk`` is one whole message of the common shape, a ``data: `` line and its blank line, LF only (an
    engine's token): callers take its payload as ``chunk[6:-2]`` instead of parsing it, when the parser is
    ``idle``. Int arguments, so no bytes object is built per call. ``EventPath.write`` (the SSE middleware's
    per-event path) has the same test inline."""
    return chunk.startswith(b"data: ") and chunk.find(10) == len(chunk) - 2 and chunk[-1] == 10 and 13 not in chunk


class SSEParser:
    """Bytes in, messages out. Comments are reported on the next message and counted in ``comments_seen``."""

    def __init__(self, *, max_message_bytes: int = 1 << 22) -> None:
        self.max_message_bytes = max_message_bytes
        self.last_event_id: str | None = None
        self.retry: int | None = None
        self.comments_seen = 0
        self._buffer = bytearray()
        self._raw = bytearray()
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._has_field = False
        self._retry_this: int | None = None
        self._comments: list[str] = []
        self._pending_cr = False

    @property
    def idle(self) -> bool:
        """Between messages: past the stream's start (BOM), nothing buffered, no message begun. A chunk that is
        one whole message then parses the same with or without the state."""
        return self._started and not self._buffer and not self._raw and not self._pending_cr

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        if not chunk:
            return []
        buf = self._buffer
        buf += chunk
        if not self._started:
            if len(buf) < 3 and b"\xef\xbb\xbf".startswith(bytes(buf)):
                return []
            if buf.startswith(b"\xef\xbb\xbf"):
                del buf[:3]
            self._started = True
        out: list[SSEMessage] = []
        pos = 0
        n = len(buf)
        # Next LF / CR at or after pos (n: none), searched again only once pos passes them, so a chunk of many
        # short lines is parsed in linear time (searching both from every line start was quadratic).
        lf = cr = -1
        while pos < n:
            if self._pending_cr:
                self._pending_cr = False
                if buf[pos] == 0x0A:  # the LF of a CRLF split across feeds
                    if self._raw:  # mid-message: keep raw byte-exact (a dispatched message already ended at CR)
                        self._raw += b"\n"
                    pos += 1
                    continue
            if lf < pos:
                lf = buf.find(b"\n", pos)
                if lf < 0:
                    lf = n
            if cr < pos:
                cr = buf.find(b"\r", pos)
                if cr < 0:
                    cr = n
            if lf == cr:  # == n: no terminator left
                break
            if lf < cr:
                end, nxt = lf, lf + 1
            else:
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == 0x0A else cr + 1
                else:
                    nxt = cr + 1
                    self._pending_cr = True
            line = bytes(buf[pos:end])
            self._raw += buf[pos:nxt]
            pos = nxt
            message = self._line(line)
            if message is not None:
                out.append(message)
        del buf[:pos]
        if len(buf) > self.max_message_bytes or len(self._raw) > self.max_message_bytes:
            raise LimitExceeded(f"SSE message above {self.max_message_bytes} bytes")
        return out

    def _line(self, line: bytes) -> SSEMessage | None:
        if not line:
            raw = bytes(self._raw)
            self._raw.clear()
            return self._dispatch(raw)
        text = line.decode("utf-8", errors="replace")
        if text[0] == ":":
            self._comments.append(text[1:].lstrip(" "))
            self.comments_seen += 1
            return None
        name, sep, value = text.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_field = True
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():  # WHATWG: ASCII digits only
            self.retry = self._retry_this = int(value)
        return None

    def _dispatch(self, raw: bytes) -> SSEMessage | None:
        data, event, comments, retry = self._data, self._event, self._comments, self._retry_this
        self._data, self._event, self._comments, self._retry_this = [], "", [], None
        had_data = self._has_field
        self._has_field = False
        if not had_data:
            # Per spec an event with no data field is not dispatched; comments stay counted only.
            return None
        return SSEMessage("\n".join(data), event or "message", self.last_event_id, retry, tuple(comments), raw)
