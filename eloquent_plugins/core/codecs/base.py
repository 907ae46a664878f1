"""The codec interface. Payloads are an event's SSE ``data`` field bytes, exactly as the engine wrote them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from eloquent_plugins.core.errors import EloquentError


class CodecError(EloquentError):
    """A payload that is not valid for the codec's format."""


@dataclass(frozen=True, slots=True)
class EventView:
    """The engine-neutral reading of one event."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    terminal: bool = False
    """A sentinel that ends the stream and carries nothing else (OpenAI's ``[DONE]``)."""


@runtime_checkable
class Codec(Protocol):
    name: str

    def parse(self, payload: bytes) -> EventView:
        """Read one event; raise CodecError for payloads outside the format."""

    def read(self, obj: Any) -> EventView:
        """Read one event already decoded from JSON (saves a second parse when the caller has it)."""

    def error_payload(self, message: str, *, error_type: str = "EngineError", status: int = 500,
                      code: str | int | None = None) -> bytes:
        """An error in the format's own shape: an in-band error event, or the JSON body of an error response.
        ``code`` is a machine-readable reason (``stream_not_found``) where the format has a field for it
        (OpenAI's ``code``, else the status goes there); formats without one ignore it."""

    def end_payloads(self) -> tuple[bytes, ...]:
        """Events that close a stream in this format after an error (OpenAI: ``[DONE]``)."""


def load_json(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"event payload is not JSON: {exc}") from None


def dump_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
