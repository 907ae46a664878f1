"""Triton's generate-extension JSON and SSE framing, written the same way for every upstream.

Why one encoder: the HTTP and gRPC upstreams must give byte-identical events. Keys are sorted (every
Triton capture has them in that order: ``id``, ``model_name``, ``model_version``, outputs), JSON is
compact and UTF-8, and each event is ``data: <json>\\n\\n`` as Triton writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SSE_MEDIA_TYPE = "text/event-stream; charset=utf-8"
JSON_MEDIA_TYPE = "application/json"


def encode_json(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + encode_json(payload) + b"\n\n"


def is_error(payload: Mapping[str, Any]) -> bool:
    return "error" in payload
