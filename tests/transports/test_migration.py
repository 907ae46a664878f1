"""Migration (issue 25, item 2): two ``eloquent serve`` replicas (built-in engine) share a real redis-server; the
replica producing a stream is SIGKILLed mid-stream and the client resumes at the other one, which finds the
producer gone and continues the generation itself. The client's text and usage equal an uncut stream's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from tests.support.migration import killed_and_resumed, read_all
from tests.support.servers import eloquent_serve_process, redis_server

CHAT = "/v1/chat/completions"
HEARTBEAT = 3
"""Seconds the producer's heartbeat outlives it in these tests (15 by default): how soon a resume sees it gone."""


def _serve(redis_url: str, *extra: str) -> contextlib.AbstractContextManager:
    return eloquent_serve_process("--stream-transport", "sse", "--resume-store", f"{redis_url}?heartbeat_ttl={HEARTBEAT}",
                                  "--tpot", "0.02", "--ttft", "0.05", "--keepalive", "1", *extra)


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[str, str, str]]:
    """(redis URL, a surviving replica's URL, a replica with --migrate off); each test starts its own victim."""
    with redis_server() as url, _serve(url) as survivor, _serve(url, "--migrate", "off") as plain:
        yield url, f"http://127.0.0.1:{survivor.port}", f"http://127.0.0.1:{plain.port}"


def _body(max_tokens: int = 120, **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": "tell me about rivers"}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "stream_options": {"include_usage": True}, **extra}


def test_sigkill_mid_stream_the_other_replica_completes_the_answer(fleet):
    redis_url, survivor, _ = fleet
    body = _body()
    with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client:
        uncut = read_all(client, survivor + CHAT, body)
        with _serve(redis_url) as victim:
            answer, cut_at = killed_and_resumed(client, f"http://127.0.0.1:{victim.port}{CHAT}", survivor + CHAT,
                                                body, redis_url=redis_url, kill=victim.kill)
        metrics = client.get(survivor + "/eloquent/metrics").text
    assert 0 < cut_at < len(uncut.events) - 5, "the kill landed mid-stream"
    assert answer.complete and uncut.complete
    assert answer.text == uncut.text
    assert answer.usage == uncut.usage and answer.usage["completion_tokens"] == 120
    assert answer.finish_reason == uncut.finish_reason == "length"
    roles = [d for d in answer.datas if '"role"' in d]
    assert len(roles) == 1, "one role chunk: the continuation's own is not repeated"
    assert 'eloquent_sse_migrations_total{outcome="migrated"}' in metrics


def test_completions_route_migrates_too(fleet):
    redis_url, survivor, _ = fleet
    body = {"prompt": "once upon a time", "stream": True, "max_tokens": 80, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client:
        with _serve(redis_url) as victim:
            answer, _ = killed_and_resumed(client, f"http://127.0.0.1:{victim.port}/v1/completions",
                                           survivor + "/v1/completions", body, redis_url=redis_url, kill=victim.kill)
    # The built-in engine hashes a completions prompt as a whole, so "prompt + text" starts a different (still
    # deterministic) answer: what is checked here is the splice, not greedy equality.
    assert answer.complete
    assert answer.usage["completion_tokens"] == 80
    assert answer.finish_reason == "length"


def test_migrate_off_ends_the_stream_uncompleted(fleet):
    redis_url, _, plain = fleet
    body = _body(100)
    with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client, _serve(redis_url) as victim:
        answer, cut_at = killed_and_resumed(client, f"http://127.0.0.1:{victim.port}{CHAT}", plain + CHAT, body,
                                            redis_url=redis_url, kill=victim.kill)
    assert answer.cut and not answer.complete, "without migration the body ends uncompleted (no [DONE])"
    assert answer.events[-1][0] >= cut_at
