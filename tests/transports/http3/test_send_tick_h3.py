"""``--send-tick`` on the HTTP/3 front end's datagram path (issue 29, item 4): over real QUIC through a lossy relay
the text of a paced (and padded) stream arrives whole; and the ``EloquentMiddleware`` in front of the app leaves
the pacing of such a stream to the front end's senders (``PACING_EXTENSION``), so no event waits for two ticks.
That every datagram leaves at a multiple of the tick is ``tests/core/test_pacing.py`` (the sender on a fake
clock: exact, where the real loop's times are not)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from eloquent_plugins.engine import create_engine_app
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.transports.asgi import PACING_EXTENSION
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.client_servers import MODEL, Served, eloquent_serve, lossy_openai
from tests.support.streams import body_writes


@pytest.fixture(scope="module")
def paced_server() -> Iterator[Served]:
    with eloquent_serve("--tpot", "0.004", "--ttft", "0.02", "--send-tick", "0.02", "--padding", "bucket") as s:
        yield s


async def test_paced_datagrams_carry_the_whole_text_through_loss(paced_server: Served) -> None:
    texts = []
    async with lossy_openai(paced_server, seed=4) as (client, delivery):
        for prompt in ("Tell me about ticking rivers.", "And about clocks?"):
            stream = await client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                          messages=[{"role": "user", "content": prompt}])
            texts.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))
    assert delivery == ["datagram", "datagram"]
    assert texts[0] == paced_server.text("Tell me about ticking rivers.", 60) and len(texts[0]) > 50
    assert texts[1] == paced_server.text("And about clocks?", 60)


def _writes(tick: float, extensions: dict[str, object]) -> tuple[int, str]:
    """One stream through the middleware (``send_tick=tick``) in process: its body writes and its text."""

    async def run() -> tuple[int, str]:
        app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.002)),
                                 StreamConfig(send_tick=tick, keepalive=0.0, resume=False))
        body = json.dumps({"model": EngineConfig().model, "messages": [{"role": "user", "content": "tick"}],
                           "stream": True, "max_tokens": 40}).encode()
        writes = await body_writes(app, body, extensions=extensions, http_version="3")
        text = b"".join(writes).decode()
        contents = [json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    for line in text.splitlines() if line.startswith("data: {") and '"choices":[{' in line]
        return len(writes), "".join(contents)

    return asyncio.run(run())


def test_the_middleware_leaves_pacing_to_a_front_end_that_paces() -> None:
    """With the tick far above the token interval the middleware writes once a tick (several events a write: a
    count, not a duration); when the front end says it paces the stream itself, the middleware writes as without
    a tick, so the front end's sender is the only one holding events."""
    plain_writes, plain_text = _writes(0.0, {})
    ticked_writes, ticked_text = _writes(0.2, {})
    handed_writes, handed_text = _writes(0.2, {PACING_EXTENSION: 0.2})
    assert plain_text == ticked_text == handed_text and len(plain_text) >= 40
    assert ticked_writes < plain_writes / 2, (ticked_writes, plain_writes)
    assert handed_writes > ticked_writes * 2, (handed_writes, ticked_writes)
