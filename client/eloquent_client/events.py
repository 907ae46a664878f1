"""What the client yields: one ``ClientEvent`` per rendered event, whatever the transport. (The error classes
live in ``errors``; their names stay importable from here.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.core.codecs import sniff_codec
from eloquent_plugins.core.codecs.base import CodecError

from eloquent_client.errors import ClientError, HTTPStatusError, IncompleteStream, StreamFailed


@dataclass(frozen=True, slots=True)
class ClientEvent:
    index: int
    data: str
    """The SSE data field (Eloquent: the event payload, which the server took from that field)."""
    rendered_at: float
    """``time.monotonic()`` when the event became renderable on this side (after pacing, if any)."""
    kind: str = "data"
    """``data``, or ``error`` for an in-band error the server ended the stream with."""
    event: str = "message"
    id: str | None = None

    @property
    def json(self) -> Any:
        """The data decoded as JSON, or None (e.g. for ``[DONE]``)."""
        try:
            return json.loads(self.data)
        except ValueError:
            return None

    @property
    def text(self) -> str | None:
        """The text delta of an OpenAI (chat or completions), TGI or Triton event; None for other events."""
        return text_delta(self.data)

    @property
    def error(self) -> Any:
        """The ``error`` object of an in-band error event, else None."""
        obj = self.json
        if isinstance(obj, dict) and "error" in obj:
            return obj["error"]
        return None


def text_delta(data: str) -> str | None:
    """The text an event adds (OpenAI chat/completions, TGI or Triton format, read by the core codecs); None
    for events that add none (role chunks, special tokens, ``[DONE]``, errors, other JSON)."""
    if not data or data[0] != "{":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    codec = sniff_codec(obj)
    if codec is None:
        return None
    try:
        view = codec.read(obj)
    except CodecError:
        return None
    return view.text or None


__all__ = ["ClientError", "ClientEvent", "HTTPStatusError", "IncompleteStream", "StreamFailed", "text_delta"]
