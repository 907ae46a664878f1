"""What every ``eloquent bench load`` stream sends and reads: the model, the prompts, the request body and the
content delta of one SSE event. A leaf shared by the normal slots (:mod:`.load_clients`), the hostile mix
(:mod:`.load_hostile`) and the parent's expected texts (:mod:`.load`)."""

from __future__ import annotations

import json
from typing import Any

MODEL = "eloquent-builtin"
PROMPTS = 32


def chat_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": stream,
            "max_tokens": max_tokens, "temperature": 0}


def prompts() -> list[str]:
    return [f"Load test {k}: tell me a long story about streaming." for k in range(PROMPTS)]


def content_delta(data: str) -> tuple[str | None, bool]:
    """(content delta or None, whether the event is an in-band error)."""
    obj = json.loads(data)
    if "error" in obj:
        return None, True
    for choice in obj.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            return content, False
    return None, False
