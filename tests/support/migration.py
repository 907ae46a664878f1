"""A stream cut by killing the replica (or upstream) that produces it, then resumed elsewhere: the client side of
the migration tests (``test_migration.py``, ``test_migration_vllm.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from eloquent_plugins.core.protocol import parse_event_id


@dataclass
class Answer:
    """What one client got: the events by index, and what they say."""

    events: list[tuple[int, str]] = field(default_factory=list)
    cut: bool = False
    """The body ended without completing (the server closed it unfinished)."""
    seconds: float = 0.0
    """First request to last event (a figure to print, never asserted)."""
    resume_first_s: float = 0.0
    """The resume request to its first event: what the migration costs the client beside the engine's pace."""

    @property
    def datas(self) -> list[str]:
        return [data for _, data in self.events]

    @property
    def text(self) -> str:
        out = []
        for data in self.datas:
            if data == "[DONE]":
                continue
            for choice in json.loads(data).get("choices", []):
                out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
        return "".join(out)

    def _last_with(self, key: str) -> Any:
        for data in reversed(self.datas):
            if data != "[DONE]":
                obj = json.loads(data)
                if key == "usage" and obj.get("usage"):
                    return obj["usage"]
                for choice in obj.get("choices", []) if key == "finish_reason" else ():
                    if choice.get("finish_reason"):
                        return choice["finish_reason"]
        return None

    @property
    def usage(self) -> dict[str, int] | None:
        return self._last_with("usage")  # type: ignore[no-any-return]

    @property
    def finish_reason(self) -> str | None:
        return self._last_with("finish_reason")  # type: ignore[no-any-return]

    @property
    def complete(self) -> bool:
        return bool(self.datas) and self.datas[-1] == "[DONE]"


def sse_events(response: httpx.Response) -> Iterator[tuple[str | None, str]]:
    """(id, data) of each event of an SSE body."""
    event_id: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if not line:
            if data:
                yield event_id, "\n".join(data)
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


def read_all(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    """One whole stream."""
    answer = Answer()
    start = time.monotonic()
    with client.stream("POST", url, json=body, headers=headers or {}) as response:
        assert response.status_code == 200, response.read()
        for index, (event_id, data) in enumerate(sse_events(response)):
            answer.events.append((parse_event_id(event_id).after if event_id else index, data))
    answer.seconds = time.monotonic() - start
    return answer


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll until ``predicate`` holds (a guard against a hang, never a speed assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        time.sleep(0.01)


def killed_and_resumed(client: httpx.Client, first: str, then: str, body: dict[str, Any], *, redis_url: str,
                       kill: Callable[[], None], after_events: int = 10,
                       headers: dict[str, str] | None = None) -> tuple[Answer, int]:
    """Start the stream at ``first`` (a URL), and once the client holds ``after_events`` events *and Redis holds
    them too*, ``kill()`` its producer; then resume at ``then`` from the last event both the client and Redis
    hold (a resume from an event Redis never got cannot be continued: nobody knows what it said). Returns the
    client's answer (events of the first connection up to there, then the resumed ones) and that event index."""
    import redis

    store = redis.Redis.from_url(redis_url)
    got: list[tuple[int, str]] = []
    token = ""
    killed = False
    start = time.monotonic()
    try:
        with client.stream("POST", first, json=body, headers=headers or {}) as response:
            assert response.status_code == 200, response.read()
            for event_id, data in sse_events(response):
                assert event_id is not None, "the stream is not resumable"
                point = parse_event_id(event_id)
                token = point.token
                got.append((point.after, data))
                if len(got) == after_events and not killed:
                    wait_for(lambda: store.xlen(f"eloquent:s:{token}") >= after_events, "Redis holds the events")
                    kill()
                    killed = True
    except httpx.HTTPError:
        pass
    assert killed, f"the stream ended after {len(got)} events, before the kill"
    assert got[-1][1] != "[DONE]", "the stream completed before its producer was killed"
    held = store.xlen(f"eloquent:s:{token}")
    resume_at = min(got[-1][0], held - 1)
    answer = Answer([event for event in got if event[0] <= resume_at])
    resumed = time.monotonic()
    try:
        with client.stream("POST", then, json=body, headers={**(headers or {}),
                                                              "last-event-id": f"{token}:{resume_at}"}) as response:
            assert response.status_code == 200, response.read()
            for event_id, data in sse_events(response):
                assert event_id is not None
                if not answer.resume_first_s:
                    answer.resume_first_s = time.monotonic() - resumed
                answer.events.append((parse_event_id(event_id).after, data))
    except httpx.RemoteProtocolError:
        answer.cut = True  # the body ended uncompleted: the server says the stream could not be completed
    answer.seconds = time.monotonic() - start
    indices = [index for index, _ in answer.events]
    assert indices == list(range(len(indices))), f"event ids skip or repeat: {indices}"
    return answer, resume_at
