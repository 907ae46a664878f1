"""Your own Starlette token-streaming app, made robust by one line: ``EloquentMiddleware``.

Run it, then stream from it (or read it with examples/client_sse.py):

    python examples/starlette_app.py --port 8000
    curl -N localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "hi"}]}'

What it shows: the app writes plain OpenAI-style SSE chunks and knows nothing about transports; the middleware
adds keep-alive comments during silences (here the pause before the first token), an ``id: <stream>:<n>`` on
every event, and resume: a client that reconnects with ``Last-Event-ID`` gets exactly the events it missed,
without the app being called again. ``--resume-store redis://127.0.0.1:6379/0`` shares streams between
replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware


async def tokens(prompt: str, first_token_delay: float) -> AsyncIterator[bytes]:
    """A stand-in model: a pause (queue, prefill), then one OpenAI chat chunk per word, then ``[DONE]``."""
    await asyncio.sleep(first_token_delay)
    for word in f"You said: {prompt}".split():
        chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f" {word}"}}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
        await asyncio.sleep(0.02)  # one decode step
    yield b"data: [DONE]\n\n"


async def chat(request: Request) -> StreamingResponse:
    body = await request.json()
    delay = float(body.get("first_token_delay", 0.5))
    return StreamingResponse(tokens(body["messages"][-1]["content"], delay), media_type="text/event-stream")


def create_app(keepalive: float = 15, resume_store: str = "memory://") -> EloquentMiddleware:
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    # The README's middleware snippet: wrap the app (a FastAPI() app the same way), configure it with a StreamConfig.
    return EloquentMiddleware(app, StreamConfig(keepalive=keepalive, resume_store=resume_store))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keepalive", type=float, default=15, help="seconds of silence before a keep-alive")
    parser.add_argument("--resume-store", default="memory://", help="memory:// or redis://host:port/db")
    args = parser.parse_args(argv)
    uvicorn.run(create_app(args.keepalive, args.resume_store), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
