"""Text Generation Inference stream events (``/generate_stream``): one token per event, index from 1."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.core.codecs.base import CodecError, EventView, dump_json, load_json


def tgi_error(message: str, error_type: str = "generation") -> dict[str, Any]:
    """TGI's error on its generate routes (``/generate``, ``/generate_stream``, ``/``), as a body or an in-band
    event; ``error_type`` is one of TGI's own (validation, generation, overloaded, incomplete_generation,
    tokenizer), which the ``text-generation`` client maps to its exception classes."""
    return {"error": message, "error_type": error_type}


def tgi_chat_error(message: str, status: int) -> dict[str, Any]:
    """TGI's error event on its OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/completions``): a
    status code instead of a type, then ``[DONE]``."""
    return {"error": {"message": message, "http_status_code": status}}


class TGICodec:
    name = "tgi"

    def parse(self, payload: bytes) -> EventView:
        return self.read(load_json(payload))

    def read(self, obj: Any) -> EventView:
        """Read an already-decoded event."""
        if not isinstance(obj, dict):
            raise CodecError("TGI event must be a JSON object")
        if "error" in obj:
            return EventView(error=str(obj["error"]), error_type=str(obj.get("error_type") or ""))
        token = obj.get("token")
        if not isinstance(token, dict):
            raise CodecError("TGI event has no 'token' object")
        text = token.get("text", "")
        token_id = token.get("id")
        details = obj.get("details")
        finish = details.get("finish_reason") if isinstance(details, dict) else None
        usage = None
        if isinstance(details, dict) and "generated_tokens" in details:
            usage = {"completion_tokens": details["generated_tokens"]}
        return EventView(text="" if token.get("special") else str(text),
                         token_ids=(token_id,) if isinstance(token_id, int) else (),
                         finish_reason=str(finish) if finish is not None else None, usage=usage)

    def error_payload(self, message: str, *, error_type: str = "generation", status: int = 500,
                      code: str | int | None = None) -> bytes:
        return dump_json(tgi_error(message, error_type))

    def end_payloads(self) -> tuple[bytes, ...]:
        return ()
