"""Datagram padding on the HTTP/3 front end (issue 29): a ``--padding constant`` server's datagrams all take the
one size, unless the OpenAI request said ``stream_options.include_obfuscation: false``, which turns it off for that
request on HTTP/3 as it does on SSE (the front end keeps the request body's start to read it)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from eloquent_client import AsyncEloquentTransport, PathMemory
from eloquent_client.h3stream import H3Stream
from eloquent_plugins.core.padding import DATAGRAM_CONSTANT
from tests.support.client_servers import MODEL, Served, eloquent_serve


@pytest.fixture(scope="module")
def padded_server() -> Iterator[Served]:
    with eloquent_serve("--tpot", "0.002", "--ttft", "0.01", "--padding", "constant") as s:
        yield s


async def _datagram_sizes(server: Served, monkeypatch: pytest.MonkeyPatch,
                          **extra: object) -> tuple[list[int], str, list[str]]:
    """Stream one answer over the datagram path; the size of every datagram the client got, the text, and the
    delivery header (``datagram`` when the datagram path was used)."""
    sizes: list[int] = []
    original = H3Stream.on_datagram

    def recording(self: H3Stream, data: bytes, now: float | None = None) -> None:
        sizes.append(len(data))
        original(self, data, now)

    monkeypatch.setattr(H3Stream, "on_datagram", recording)
    delivery: list[str] = []

    async def hook(response: httpx.Response) -> None:
        delivery.append(response.headers.get("eloquent-delivery", "?"))

    http = httpx.AsyncClient(transport=AsyncEloquentTransport(verify=False, h3_port=server.udp_port,
                                                              h3_probe_timeout=10.0, path_memory=PathMemory()),
                             event_hooks={"response": [hook]})
    client = openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="test-key", http_client=http)
    try:
        stream = await client.chat.completions.create(
            model=MODEL, stream=True, max_tokens=40, messages=[{"role": "user", "content": "pad me, or not"}],
            **extra)  # type: ignore[call-overload]
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    finally:
        await client.close()
    return sizes, text, delivery


async def test_padded_datagrams_take_the_one_size(padded_server: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes, text, delivery = await _datagram_sizes(padded_server, monkeypatch)
    assert delivery == ["datagram"] and len(sizes) >= 20
    assert set(sizes) == {DATAGRAM_CONSTANT}
    assert text == padded_server.text("pad me, or not", 40)


async def test_include_obfuscation_true_keeps_the_padding(padded_server: Served,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    sizes, _, delivery = await _datagram_sizes(padded_server, monkeypatch,
                                               extra_body={"stream_options": {"include_obfuscation": True}})
    assert delivery == ["datagram"] and set(sizes) == {DATAGRAM_CONSTANT}


async def test_include_obfuscation_false_turns_datagram_padding_off(padded_server: Served,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sizes, text, delivery = await _datagram_sizes(padded_server, monkeypatch,
                                                  extra_body={"stream_options": {"include_obfuscation": False}})
    assert delivery == ["datagram"] and len(sizes) >= 20
    assert len(set(sizes)) > 3  # unpadded: each datagram as large as its new token and the unacked run
    assert text == padded_server.text("pad me, or not", 40)
