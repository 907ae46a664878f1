"""Stream a chat completion over plain SSE (HTTP/1.1) that resumes by itself when the connection drops.

Start a server, then ask it something:

    eloquent serve --port 8000 --stream-transport sse          # or examples/starlette_app.py, or vLLM
    python examples/client_sse.py "Tell me about rivers." --url http://127.0.0.1:8000

What it shows: the same client API as examples/client_eloquent.py with ``transport="sse"``. Behind it, every
event carries an id from ``EloquentMiddleware``; if the connection breaks mid-stream, the client reconnects with
``Last-Event-ID`` and gets exactly the events it missed (the server does not run the request again), so the
printed text is the same as without the break. At the end, stderr says how many events came and the last id.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from eloquent_client import EloquentClient


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name, if the server wants one (vLLM does)")
    parser.add_argument("--max-tokens", type=int, default=100)
    args = parser.parse_args(argv)
    request: dict[str, Any] = {"messages": [{"role": "user", "content": args.prompt}], "stream": True,
                               "max_tokens": args.max_tokens}
    if args.model:
        request["model"] = args.model

    async with EloquentClient(args.url, transport="sse") as client:
        async with client.stream("POST", "/v1/chat/completions", json=request) as stream:
            async for delta in stream.text_deltas():
                print(delta, end="", flush=True)
    print()
    last_id = stream.rendered[-1].id if stream.rendered else None
    print(f"[delivery={stream.delivery} events={len(stream.rendered)} last_id={last_id}]", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
