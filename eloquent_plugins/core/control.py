"""What the reliable request stream carries when a request's events travel as datagrams.

The body of an Eloquent response (response header ``eloquent-transport: datagram``) is a sequence of control
records, one JSON object per line:

* ``{"type": "trailer", "count": N, "sha256": HEX, "final": EVENT}`` -- written once, when the app's body
  ends: the number of events (the final one included), the stream digest (``StreamDigest``) and the final
  event itself, so the end of the stream never depends on a datagram.
* ``{"type": "fallback", "events": [EVENT, ...]}`` -- the events the client had still not acknowledged a
  while after the trailer (its acks are its report of what is missing); sent at most once, then the stream
  ends. With it the client always ends with the complete stream, whatever happens to datagrams.

``EVENT`` is ``{"index": I, "kind": "data"|"end"|"error", "payload": BASE64}``. Payloads are base64 because an
event is bytes (an SSE data field, in practice UTF-8 JSON).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from eloquent_plugins.core.errors import DecodeError, LimitExceeded
from eloquent_plugins.core.events import EventKind, StreamEvent

_KINDS = {"data": EventKind.DATA, "end": EventKind.END, "error": EventKind.ERROR}
_NAMES = {v: k for k, v in _KINDS.items()}


class StreamDigest:
    """SHA-256 over the events in order, each as an 8-byte big-endian length then its payload (the length
    makes the digest of ``[b"ab", b""]`` differ from ``[b"a", b"b"]``)."""

    __slots__ = ("_hash", "count")

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def update(self, payload: bytes) -> None:
        self._hash.update(len(payload).to_bytes(8, "big"))
        self._hash.update(payload)
        self.count += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    @classmethod
    def of(cls, payloads: Iterable[bytes]) -> str:
        digest = cls()
        for payload in payloads:
            digest.update(payload)
        return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Trailer:
    count: int
    sha256: str
    final: StreamEvent


@dataclass(frozen=True, slots=True)
class Fallback:
    events: tuple[StreamEvent, ...]


Record = Trailer | Fallback


def _event_json(event: StreamEvent) -> dict[str, object]:
    return {"index": event.index, "kind": _NAMES[event.kind],
            "payload": base64.b64encode(event.payload).decode("ascii")}


def encode_trailer(trailer: Trailer) -> bytes:
    return json.dumps({"type": "trailer", "count": trailer.count, "sha256": trailer.sha256,
                       "final": _event_json(trailer.final)}, separators=(",", ":")).encode() + b"\n"


def encode_fallback(events: Iterable[StreamEvent]) -> bytes:
    return json.dumps({"type": "fallback", "events": [_event_json(e) for e in events]},
                      separators=(",", ":")).encode() + b"\n"


def _event(obj: object) -> StreamEvent:
    if not isinstance(obj, dict):
        raise DecodeError("control record: event is not an object")
    index, kind, payload = obj.get("index"), obj.get("kind"), obj.get("payload")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise DecodeError(f"control record: bad event index {index!r}")
    if kind not in _KINDS or not isinstance(payload, str):
        raise DecodeError(f"control record: bad event kind {kind!r} or payload")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DecodeError("control record: payload is not base64") from None
    return StreamEvent(index, raw, _KINDS[kind])


class ControlParser:
    """Incremental parser for the control records; ``max_record_bytes`` bounds what one line may hold."""

    def __init__(self, *, max_record_bytes: int = 64 << 20) -> None:
        self.max_record_bytes = max_record_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Record]:
        start = len(self._buffer)  # the bytes before had no newline: search only the new ones (else a long
        self._buffer += data       # record fed in small chunks costs O(n^2), issue 28)
        out: list[Record] = []
        end = self._buffer.find(b"\n", start)
        while end >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if line.strip():
                out.append(self._record(line))
            end = self._buffer.find(b"\n")
        if len(self._buffer) > self.max_record_bytes:
            raise LimitExceeded(f"control record above {self.max_record_bytes} bytes")
        return out

    def close(self) -> None:
        """The stream ended: a partial record left over is an error."""
        if self._buffer.strip():
            raise DecodeError("the response ended inside a control record")

    @staticmethod
    def _record(line: bytes) -> Record:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise DecodeError("control record is not JSON") from None
        if not isinstance(obj, dict):
            raise DecodeError("control record is not an object")
        if obj.get("type") == "trailer":
            count, digest = obj.get("count"), obj.get("sha256")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1 or not isinstance(digest, str):
                raise DecodeError("trailer: bad count or digest")
            final = _event(obj.get("final"))
            if final.kind is EventKind.DATA or final.index != count - 1:
                raise DecodeError("trailer: the final event must be END/ERROR at index count - 1")
            return Trailer(count, digest, final)
        if obj.get("type") == "fallback":
            events = obj.get("events")
            if not isinstance(events, list):
                raise DecodeError("fallback: events is not a list")
            return Fallback(tuple(_event(e) for e in events))
        raise DecodeError(f"unknown control record type {obj.get('type')!r}")
