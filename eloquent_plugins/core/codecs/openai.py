"""OpenAI chat/completions chunks, as vLLM, TGI's chat route and the built-in engine stream them."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.core.codecs.base import CodecError, EventView, dump_json, load_json

DONE = b"[DONE]"


def openai_error(message: str, *, error_type: str = "EngineError", param: str | None = None,
                 code: str | int | None = None) -> dict[str, Any]:
    """OpenAI's error object: the JSON body of an error response and, once a stream's 200 is out, its in-band
    error event (then ``[DONE]``); the openai SDKs raise the class that ``error_type`` / the status name."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class OpenAICodec:
    name = "openai"

    def parse(self, payload: bytes) -> EventView:
        if payload.strip() == DONE:
            return EventView(terminal=True)
        return self.read(load_json(payload))

    def read(self, obj: Any) -> EventView:
        """Read an already-decoded chunk."""
        if not isinstance(obj, dict):
            raise CodecError("OpenAI chunk must be a JSON object")
        error = obj.get("error")
        if error is not None:
            if isinstance(error, dict):
                return EventView(error=str(error.get("message", "")), error_type=str(error.get("type", "")))
            return EventView(error=str(error))
        text: list[str] = []
        token_ids: list[int] = []
        finish: str | None = None
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise CodecError("'choices' must be a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise CodecError("each choice must be an object")
            delta: Any = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                text.append(piece)
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                token_ids.extend(int(i) for i in ids if isinstance(i, int))
            if choice.get("finish_reason") is not None:
                finish = str(choice["finish_reason"])
        usage = obj.get("usage")
        return EventView(text="".join(text), token_ids=tuple(token_ids), finish_reason=finish,
                         usage=usage if isinstance(usage, dict) else None)

    def error_payload(self, message: str, *, error_type: str = "EngineError", status: int = 500,
                      code: str | int | None = None) -> bytes:
        return dump_json(openai_error(message, error_type=error_type, code=status if code is None else code))

    def end_payloads(self) -> tuple[bytes, ...]:
        return (DONE,)
