"""Request bodies, SSE text extraction and bounded polling: the small helpers many test modules need.

Each module keeps its own defaults (how many tokens, which prompt) by making its ``chat`` with ``chat_maker``, so a
body built by a test is exactly the one it built before these helpers were shared.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

ChatBody = Callable[..., dict[str, Any]]


def chat_maker(*, max_tokens: int, prompt: str = "hello", model: str | None = None,
               seed: int | None = None) -> ChatBody:
    """A ``chat(max_tokens=..., seed=..., *, stream=True, prompt=..., **engine)`` body builder with these defaults.

    ``{seed}`` in ``prompt`` becomes the request's seed (different seeds, different prompts); ``seed=None`` leaves
    the seed out of the body; keyword arguments other than ``stream`` and ``prompt`` go to ``eloquent_engine``
    (the built-in engine's per-request knobs: ``tpot``, ``fail_after``, ``pauses``...)."""
    default_tokens, default_prompt, default_seed = max_tokens, prompt, seed

    def chat(max_tokens: int = default_tokens, seed: int | None = default_seed, *, stream: bool = True,
             prompt: str = default_prompt, **engine: Any) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if model is not None:
            body["model"] = model
        body["messages"] = [{"role": "user", "content": prompt.replace("{seed}", str(seed))}]
        body["stream"] = stream
        body["max_tokens"] = max_tokens
        if seed is not None:
            body["seed"] = seed
        if engine:
            body["eloquent_engine"] = engine
        return body

    return chat


def text_of(datas: list[str]) -> str:
    """The generated text of an OpenAI-style SSE stream, from its ``data:`` payloads (``[DONE]`` and chunks
    without ``choices``, such as in-band errors, add nothing)."""
    out = []
    for data in datas:
        if data == "[DONE]":
            continue
        for choice in json.loads(data).get("choices", []):
            out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


async def wait_until(predicate: Callable[[], object], what: str = "condition", timeout: float = 10.0,
                     interval: float = 0.02) -> None:
    """Poll ``predicate`` until it holds; ``timeout`` is a guard against a hang, never a speed assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        await asyncio.sleep(interval)


async def body_writes(app: Any, body: bytes, *, extensions: dict[str, object] | None = None,
                      http_version: str = "1.1", timeout: float = 60.0) -> list[bytes]:
    """One POST to ``/v1/chat/completions`` through ``app`` in process (no server): the body writes it makes, in
    order. The client stays until the response ends."""
    writes: list[bytes] = []
    done = asyncio.Event()
    asked = False

    async def receive() -> dict[str, object]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            if message.get("body"):
                writes.append(message["body"])
            if not message.get("more_body"):
                done.set()

    secure = http_version == "3"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": http_version, "method": "POST",
             "scheme": "https" if secure else "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 443 if secure else 80), "extensions": dict(extensions or {})}
    await asyncio.wait_for(app(scope, receive, send), timeout)
    return writes
