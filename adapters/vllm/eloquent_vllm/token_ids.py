"""Asking vLLM for token ids on streaming chat/completions requests, so another replica can continue the answer.

A continuation on vLLM is exact under greedy decoding only as a token-id prompt (``core.continuation``: the
original prompt's ids plus the emitted ids on ``/v1/completions``); re-tokenising the emitted text can merge
pieces differently and change the answer. vLLM sends those ids when the request says ``return_token_ids``
(the first chunk carries ``prompt_token_ids``, each chunk its ``token_ids``), so while migration is on and the
streams are shared (a Redis store) this adds it to the request body. Bodies over ``limit``, non-JSON bodies and
requests that set the field themselves pass unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from eloquent_plugins.transports.asgi import Message, Receive, Scope

ROUTES = ("/v1/chat/completions", "/v1/completions")


async def with_token_ids(scope: Scope, receive: Receive, limit: int) -> tuple[Scope, Receive]:
    """``scope`` and ``receive`` for the app: the same request, with ``return_token_ids: true`` when it streams."""
    if scope.get("method") != "POST" or scope.get("path") not in ROUTES:
        return scope, receive
    read: list[Message] = []
    size = 0
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return scope, _replay(read, receive)
        size += len(message.get("body", b""))
        if size > limit:
            return scope, _replay(read, receive)
        if not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in read)
    try:
        obj: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return scope, _replay(read, receive)
    if not isinstance(obj, dict) or obj.get("stream") is not True or "return_token_ids" in obj:
        return scope, _replay(read, receive)
    obj["return_token_ids"] = True
    new = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(new)).encode()))
    return {**scope, "headers": headers}, _replay([{"type": "http.request", "body": new, "more_body": False}],
                                                   receive)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that hands out ``messages`` first, then the server's own."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
