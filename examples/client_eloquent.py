"""Stream a chat completion over HTTP/3 with Eloquent datagrams: the README's client snippet, runnable.

Start a server, then ask it something:

    eloquent serve --port 8000                       # built-in engine: SSE on TCP 8000, HTTP/3 on UDP 8000
    python examples/client_eloquent.py "Tell me about rivers." --url https://127.0.0.1:8000

What it shows: the text renders as the datagrams arrive (any packet that gets through carries every token not
yet acknowledged, so a lost packet does not hold up later tokens), and the stream is checked against the
server's count and digest before it ends. At the end, stderr says how the events came (``delivery=eloquent``
means datagrams). Works the same against ``vllm serve MODEL --stream-transport eloquent`` (pass ``--model``).
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
    parser.add_argument("--url", default="https://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name, if the server wants one (vLLM does)")
    parser.add_argument("--max-tokens", type=int, default=100)
    args = parser.parse_args(argv)
    request: dict[str, Any] = {"messages": [{"role": "user", "content": args.prompt}], "stream": True,
                               "max_tokens": args.max_tokens}
    if args.model:
        request["model"] = args.model

    # verify=False: `eloquent serve` uses a self-signed development certificate unless given --certfile/--keyfile.
    async with EloquentClient(args.url, transport="eloquent", verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=request) as stream:
            async for delta in stream.text_deltas():
                print(delta, end="", flush=True)
    print()
    print(f"[delivery={stream.delivery} events={len(stream.rendered)}]", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
