"""TGI before 2.1 (axum 0.6) writes ``data:`` with no space: the gateway keeps that framing and clients still work."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import text_generation
from eloquent_tgi.gateway import create_tgi_gateway
from text_generation import errors as tg_errors

from tests.support.tgi_server import TGIServerConfig, create_tgi_server, run_in_thread


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    with run_in_thread(create_tgi_server(TGIServerConfig(space=False, version="2.0.4"))) as upstream, \
            run_in_thread(create_tgi_gateway(upstream)) as gateway:
        yield upstream, gateway


@pytest.mark.parametrize("inputs", ["Test request", "x !error=validation !after=2"])
def test_no_space_framing_is_kept_byte_for_byte(urls: tuple[str, str], inputs: str) -> None:
    body = {"inputs": inputs, "parameters": {"details": True, "max_new_tokens": 4}}
    direct, via = (httpx.post(url + "/generate_stream", json=body, timeout=30) for url in urls)
    assert via.content == direct.content
    assert via.content.startswith(b'data:{"') and b"data: " not in via.content


def test_chat_done_without_space(urls: tuple[str, str]) -> None:
    body = {"model": "tgi", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2}
    direct, via = (httpx.post(url + "/v1/chat/completions", json=body, timeout=30) for url in urls)
    assert via.content == direct.content and via.content.endswith(b"\n\ndata:[DONE]\n\n")


async def test_text_generation_client_reads_the_same(urls: tuple[str, str]) -> None:
    runs = []
    for url in urls:
        client = text_generation.AsyncClient(url, timeout=60)
        runs.append([r.model_dump() async for r in client.generate_stream("Test request", max_new_tokens=3)])
    assert runs[0] == runs[1] and [r["token"]["id"] for r in runs[1]] == [363, 847, 2754]


def test_errors_still_typed(urls: tuple[str, str]) -> None:
    for url in urls:
        with pytest.raises(tg_errors.OverloadedError, match="Model is overloaded"):
            list(text_generation.Client(url, timeout=60).generate_stream("x !error=overloaded"))
