"""Put the Eloquent gateway in front of Triton's ``generate_stream`` and read it as resumable SSE.

    PYTHONPATH=adapters/triton .venv-triton/bin/python examples/triton_decoupled_model.py --grpc-port 8001
    python examples/triton_gateway.py --triton grpc://127.0.0.1:8001 --port 9000                   # serve
    python examples/triton_gateway.py --triton grpc://127.0.0.1:8001 --port 9000 --ask "streams of words"

What it shows: clients keep Triton's URL shape (``POST /v2/models/MODEL/generate_stream``), but the gateway
answers at once (Triton itself sends no headers until the model's first response), and ``EloquentMiddleware``
adds keep-alive, event ids and resume. The upstream may be ``grpc://host:8001`` or ``http://host:8000``. With
``--ask`` it serves, streams one prompt through itself with ``eloquent_client.sse.stream_sse``, prints the
text and the event ids, and exits (this is ``eloquent serve --upstream triton=URL``, SSE part, in your Python).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import httpx
import uvicorn
from eloquent_client.sse import stream_sse
from eloquent_triton.gateway import create_triton_gateway

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.stack import wrap


async def ask(gateway_url: str, model: str, prompt: str) -> None:
    """Read a Triton stream through the gateway: one ``text_output`` per event, each with an id."""
    ids = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as client:
        url = f"{gateway_url}/v2/models/{model}/generate_stream"
        async for message in stream_sse(client, "POST", url, json={"text_input": prompt}):
            event = json.loads(message.data)
            if "error" in event:
                raise SystemExit(f"Triton reported: {event['error']}")
            print(event["text_output"], end="", flush=True)
            ids.append(message.id)
    print()
    print(f"[events={len(ids)} first_id={ids[0] if ids else None} last_id={ids[-1] if ids else None}]",
          file=sys.stderr)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton", default="grpc://127.0.0.1:8001", help="grpc://host:port or http://host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--keepalive", type=float, default=15)
    parser.add_argument("--ask", metavar="PROMPT", help="stream this prompt through the gateway, then exit")
    parser.add_argument("--model", default="echo_stream", help="model to ask (with --ask)")
    args = parser.parse_args(argv)

    # the stack `eloquent serve` hosts: EloquentMiddleware, the body deadline, the browser routes
    app = wrap(create_triton_gateway(args.triton), StreamConfig(keepalive=args.keepalive)).app
    # lifespan="on": the gateway closes its upstream connection to Triton on shutdown.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="on"))
    if args.ask is None:
        await server.serve()
        return
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            return await serving  # it failed to start: show why
        await asyncio.sleep(0.05)
    try:
        await ask(f"http://{args.host}:{args.port}", args.model, args.ask)
    finally:
        server.should_exit = True
        await serving


if __name__ == "__main__":
    asyncio.run(main())
