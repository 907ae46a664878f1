"""What the client yields: one ``ClientEvent`` per rendered event, whatever the transport."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.errors import EloquentError


class ClientError(EloquentError):
    """The request could not be completed (connection closed, stream reset, bad response)."""


class IncompleteStream(ClientError):
    """The response ended before the final event, or the stream digest did not match."""


class StreamFailed(ClientError):
    """The server reported an error inside the stream (an in-band error event)."""

    def __init__(self, message: str, payload: Any = None) -> None:
        super().__init__(message)
        self.payload = payload


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
        """The text delta of an OpenAI (chat or completions) or TGI chunk; None for other events."""
        return text_delta(self.data)

    @property
    def error(self) -> Any:
        """The ``error`` object of an in-band error event, else None."""
        obj = self.json
        if isinstance(obj, dict) and "error" in obj:
            return obj["error"]
        return None


def text_delta(data: str) -> str | None:
    if not data or data[0] != "{":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            return content if isinstance(content, str) else None
        text = choice.get("text")
        return text if isinstance(text, str) else None
    token = obj.get("token")
    if isinstance(token, dict) and isinstance(token.get("text"), str) and not token.get("special"):
        return token["text"]
    return None
