"""Put the Eloquent gateway in front of a TGI server and read it with TGI's own ``text-generation`` client.

    text-generation-launcher --model-id ... --port 3000                 # your TGI
    python examples/tgi_gateway.py --tgi http://127.0.0.1:3000 --port 8000                    # serve
    python examples/tgi_gateway.py --tgi http://127.0.0.1:3000 --port 8000 --ask "Why is the sky blue?"

What it shows: the gateway speaks TGI's routes and schemas, so the unchanged ``text_generation.AsyncClient``
only points at another URL; in between, ``EloquentMiddleware`` adds keep-alive, event ids and resume. With
``--ask`` the script serves the gateway, streams one prompt through it, prints the tokens and exits (this is
``eloquent serve --upstream tgi=URL``, SSE part, done in your own Python).
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from eloquent_tgi.gateway import create_tgi_gateway
from text_generation import AsyncClient

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.stack import wrap


async def ask(gateway_url: str, prompt: str, max_new_tokens: int) -> None:
    """TGI's client, unchanged; only the URL is the gateway's."""
    client = AsyncClient(gateway_url, timeout=600)  # its default 10 s limits the whole request: long streams die
    async for response in client.generate_stream(prompt, max_new_tokens=max_new_tokens):
        if not response.token.special:
            print(response.token.text, end="", flush=True)
    print()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tgi", default="http://127.0.0.1:3000", help="the TGI server's URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keepalive", type=float, default=15)
    parser.add_argument("--ask", metavar="PROMPT", help="stream this prompt through the gateway, then exit")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    args = parser.parse_args(argv)

    config = StreamConfig(keepalive=args.keepalive)
    app = wrap(create_tgi_gateway(args.tgi, config), config).app  # the stack `eloquent serve` hosts
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    if args.ask is None:
        await server.serve()
        return
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            return await serving  # it failed to start: show why
        await asyncio.sleep(0.05)
    try:
        await ask(f"http://{args.host}:{args.port}", args.ask, args.max_new_tokens)
    finally:
        server.should_exit = True
        await serving


if __name__ == "__main__":
    asyncio.run(main())
