"""Cheap rendering of OpenAI-format SSE chunks and responses.

Per-token server overhead matters to the benchmarks, so each request pre-renders the constant JSON around the
delta once; a token chunk is then one C-level string escape plus concatenation instead of a ``json.dumps`` of a
nested dict. The output is byte-identical to compact ``json.dumps`` of the equivalent object.
"""

from __future__ import annotations

import json
import os
from json.encoder import encode_basestring  # C-accelerated when available; ensure_ascii=False semantics
from typing import Any

from eloquent_plugins.core.codecs.openai import openai_error

DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> str:
    """Compact JSON, as on the wire."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate (JSON allows ``"\\ud800"`` in a request) replaced by U+FFFD: an error
    that echoes a client's string must not fail to encode it."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ChunkWriter:
    """Renders the ``data: {...}\\n\\n`` events of one streamed chat or completions response."""

    def __init__(self, *, chat: bool, request_id: str, created: int, model: str, include_usage: bool,
                 include_obfuscation: bool = False) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'{{"id":{dumps(request_id)},"object":"{obj}","created":{created},"model":{dumps(model)}'
        tail = ',"usage":null}\n\n' if include_usage else "}\n\n"  # OpenAI sends usage:null until the last chunk
        choice = "data: " + self._head + ',"choices":[{"index":0,'
        self._pre = choice + ('"delta":{"content":' if chat else '"text":')
        self._post = ("}," if chat else ",") + '"logprobs":null,"finish_reason":null}]' + tail
        self._obfuscate = (self._post[: -len(tail)], tail) if include_obfuscation else None
        """``stream_options.include_obfuscation: true``: each token chunk gets OpenAI's ``obfuscation`` field, a
        random string of random length (1-32 characters), so its size does not give the token's length away."""
        self._finish_pre = choice + ('"delta":{},' if chat else '"text":"",') + '"logprobs":null,"finish_reason":'
        self._finish_post = "}]" + tail
        self._role = (
            (
                choice + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]' + tail
            ).encode()
            if chat
            else b""
        )

    def role(self) -> bytes:
        """The first chat event: the assistant role with empty content."""
        return self._role

    def token(self, text: str) -> bytes:
        if self._obfuscate is not None:
            post, tail = self._obfuscate
            noise = os.urandom(16).hex()[: 1 + os.urandom(1)[0] % 32]
            return (self._pre + encode_basestring(text) + post + ',"obfuscation":"' + noise + '"' + tail).encode()
        return (self._pre + encode_basestring(text) + self._post).encode()

    def finish(self, reason: str) -> bytes:
        return (self._finish_pre + encode_basestring(reason) + self._finish_post).encode()

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (
            f'data: {self._head},"choices":[],"usage":{dumps(usage(prompt_tokens, completion_tokens))}}}\n\n'.encode()
        )

    @staticmethod
    def error(message: str, type_: str, code: int) -> bytes:
        """An in-band error event, as vLLM sends once the 200 is out."""
        body = openai_error(message, error_type=type_, code=code)
        return utf8(f"data: {dumps(body)}\n\n")


def full_response(
    *,
    chat: bool,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` / ``text_completion`` object."""
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = finish_reason
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
