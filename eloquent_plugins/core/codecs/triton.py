"""Triton ``generate_stream`` events: ``{"model_name", "model_version", <outputs>}``; errors ``{"error"}``."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.core.codecs.base import CodecError, EventView, dump_json, load_json

TEXT_OUTPUTS = ("text_output", "OUTPUT", "output", "text")


def triton_error(message: str) -> dict[str, Any]:
    """Triton's error: the JSON body of an error response, and the last event of a stream that failed."""
    return {"error": message}


class TritonCodec:
    name = "triton"

    def parse(self, payload: bytes) -> EventView:
        return self.read(load_json(payload))

    def read(self, obj: Any) -> EventView:
        """Read an already-decoded event."""
        if not isinstance(obj, dict):
            raise CodecError("Triton event must be a JSON object")
        if "error" in obj:
            return EventView(error=str(obj["error"]))
        for key in TEXT_OUTPUTS:
            value = obj.get(key)
            if isinstance(value, str):
                return EventView(text=value)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return EventView(text="".join(value))
        return EventView()

    def error_payload(self, message: str, *, error_type: str = "", status: int = 500,
                      code: str | int | None = None) -> bytes:
        return dump_json(triton_error(message))

    def end_payloads(self) -> tuple[bytes, ...]:
        return ()
