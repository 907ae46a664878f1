"""Fuzz the built-in engine's request handling: body reading (``_read_json``) and validation (``parse_request``).

A hostile client controls the Content-Length header, the body bytes and how they are chunked, and the JSON
value. Only the engine's ``APIError`` (a 4xx answer) may escape (``ClientDisconnect`` too, for a body cut
short), never a bare exception (which would be a 500), and an accepted request must be within the limits.
Run: ``python fuzz/fuzz_requests.py -atheris_runs=1000000 [corpus dirs]``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Coroutine
from typing import Any

import atheris

with atheris.instrument_imports(include=["eloquent_plugins"]):
    from starlette.requests import ClientDisconnect, Request

    from eloquent_plugins.engine.app import _read_json
    from eloquent_plugins.engine.config import EngineConfig
    from eloquent_plugins.engine.controls import MAX_DELAY_S
    from eloquent_plugins.engine.errors import APIError
    from eloquent_plugins.engine.requests import (
        MAX_STOP_STRINGS,
        GenerationRequest,
        parse_request,
    )

CONFIG = EngineConfig(max_body_bytes=2048)
KEYS = ["model", "messages", "prompt", "stream", "stream_options", "include_usage", "n", "temperature", "top_p",
        "presence_penalty", "frequency_penalty", "seed", "max_tokens", "max_completion_tokens", "stop",
        "eloquent_engine", "ttft", "tpot", "pauses", "fail_after", "role", "content", "type", "text", "0", "7"]
STRINGS = ["eloquent-builtin", "user", "assistant", "system", "tool", "text", "", "x", "\x00", "0", "99999"]


def value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """A JSON value shaped like a request: known keys, edge-case numbers, nesting."""
    kind = fdp.ConsumeIntInRange(0, 11 if depth < 4 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-3, 10000)
    if kind == 3:
        return [10**400, -(10**400), 2**63, -(2**63), 2**64, 8193, 8192, 0][fdp.ConsumeIntInRange(0, 7)]
    if kind == 4:
        return [float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 0.5, 2.0000001, 3600.0][
            fdp.ConsumeIntInRange(0, 7)]
    if kind == 5:
        return STRINGS[fdp.ConsumeIntInRange(0, len(STRINGS) - 1)]
    if kind in (6, 7):
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if kind in (8, 9):
        return [value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {KEYS[fdp.ConsumeIntInRange(0, len(KEYS) - 1)]: value(fdp, depth + 1)
            for _ in range(fdp.ConsumeIntInRange(0, 6))}


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Drive a coroutine that never really waits (our receive() answers at once)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the coroutine suspended")


def read_body(fdp: atheris.FuzzedDataProvider) -> Any:
    headers = []
    if fdp.ConsumeBool():
        headers.append((b"content-length", fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24))))
    messages: list[dict[str, Any]] = []
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        messages.append({"type": "http.request", "body": fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 1500)),
                         "more_body": True})
    messages[-1]["more_body"] = fdp.ConsumeIntInRange(0, 15) == 0  # True: the client goes away mid-body
    messages[-1]["body"] += fdp.ConsumeBytes(fdp.remaining_bytes())

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers, "query_string": b""}
    return run_sync(_read_json(Request(scope, receive), CONFIG.max_body_bytes))


def check(req: GenerationRequest) -> None:
    assert isinstance(req.prompt, str) and req.prompt_tokens >= 0
    assert 1 <= req.max_tokens <= CONFIG.max_tokens_limit
    assert req.seed is None or -(2**63) < req.seed < 2**63
    assert len(req.stop) <= MAX_STOP_STRINGS and all(req.stop)
    controls = req.controls
    for delay in [controls.ttft, controls.tpot, *controls.pauses.values()]:
        assert delay is None or 0 <= delay <= MAX_DELAY_S
    assert controls.fail_after is None or controls.fail_after >= 0
    assert req.include_usage in (True, False) and (req.stream or not req.include_usage)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    fdp = atheris.FuzzedDataProvider(data[1:])
    mode = data[0] % 4
    chat = bool(data[0] & 4)
    try:
        if mode == 0:
            try:
                body = json.loads(fdp.ConsumeBytes(fdp.remaining_bytes()))
            except (ValueError, RecursionError):
                return  # the app answers 400 invalid_json itself (checked in mode 3)
        elif mode in (1, 2):
            body = value(fdp)
            if mode == 2 and isinstance(body, dict):
                body.setdefault("messages" if chat else "prompt",
                                [{"role": "user", "content": "hi"}] if chat else "hi")
        else:
            body = read_body(fdp)
        check(parse_request(body, chat=chat, config=CONFIG))
    except APIError as exc:
        assert 400 <= exc.status < 500 and exc.body()["error"]["message"]
        json.dumps(exc.body())
    except ClientDisconnect:
        assert mode == 3
    # Anything else (findings 4-7 of docs/SECURITY.md were OverflowError, ValueError and TypeError: 500s, now
    # fixed) escapes and is a crash.


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
