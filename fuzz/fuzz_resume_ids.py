"""Fuzz SSE resumption: Last-Event-ID / ``?last_event_id=`` parsing and the resume checks behind it.

A hostile client controls the Last-Event-ID header, the query string and its own credentials; it may replay a
real id, forge one, or present another caller's. This target runs the same steps as the resume endpoint
(``transports/sse/resume.py``) against a ``MemoryStore`` holding one real stream: ``resume_request`` ->
``parse_event_id`` -> ``store.open`` -> owner check -> ``source.check`` -> ``take``/``ended``. Only the
errors the middleware maps to a 4xx (``BadEventId``, ``EventsGone``, ``ValueError`` from ``check``) may escape;
a forged token never opens a stream, another caller never passes the owner check, and a resume returns exactly
the events after the client's last one.
Run: ``python fuzz/fuzz_resume_ids.py -atheris_runs=1000000 [corpus dirs]``.
"""

from __future__ import annotations

import hmac
import sys
from collections.abc import Coroutine
from typing import Any

import atheris

with atheris.instrument_imports(include=["eloquent_plugins"]):
    from eloquent_plugins.transports.resume.base import StreamMeta
    from eloquent_plugins.transports.resume.memory import MemoryStore
    from eloquent_plugins.core.protocol import BadEventId, parse_event_id
    from eloquent_plugins.transports.sse.ids import identity_hash, resume_request
    from eloquent_plugins.transports.resume.log import EventsGone, StreamLog

TOKEN = "Zq3-_k9PdL0wXyA1bC2eFg"  # fixed (not secret) so crash reproducers replay; real ones come from secrets
OWNER_HEADERS = [(b"authorization", b"Bearer sk-owner")]
CREDENTIAL_HEADERS = [b"authorization", b"x-api-key", b"api-key", b"cookie", b"Authorization"]


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Drive a coroutine that never really waits (the memory store answers at once)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the coroutine suspended")


def build_store(fdp: atheris.FuzzedDataProvider) -> tuple[MemoryStore, list[bytes]]:
    store = MemoryStore(ttl=60.0, clock=lambda: 0.0)
    log = StreamLog(max_events=fdp.ConsumeIntInRange(1, 8), max_bytes=1 << 16)
    meta = StreamMeta("s-0123456789ab", identity_hash({"headers": OWNER_HEADERS}, None), 200,
                      ((b"content-type", b"text/event-stream"),), "/v1/chat/completions", "openai")
    run_sync(store.create(TOKEN, meta, log))
    frames = [b"id: %s:%d\ndata: {\"n\": %d}\n\n" % (TOKEN.encode(), i, i)
              for i in range(fdp.ConsumeIntInRange(0, 12))]
    for frame in frames:
        log.append(frame)
    if fdp.ConsumeBool():
        log.close("complete" if fdp.ConsumeBool() else "disconnected")
    return store, frames


def headers_and_query(fdp: atheris.FuzzedDataProvider) -> tuple[list[tuple[bytes, bytes]], bytes]:
    headers: list[tuple[bytes, bytes]] = []
    if fdp.ConsumeBool():
        headers.extend(OWNER_HEADERS)
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        name = CREDENTIAL_HEADERS[fdp.ConsumeIntInRange(0, len(CREDENTIAL_HEADERS) - 1)]
        headers.append((name, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24))))
    if fdp.ConsumeBool():
        headers.append((b"last-event-id", event_id(fdp).encode("latin-1", errors="replace")))
    query = b""
    if fdp.ConsumeBool():
        query = b"last_event_id=" + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80))
        if fdp.ConsumeBool():
            query = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)) + b"&" + query
    return headers, query


def event_id(fdp: atheris.FuzzedDataProvider) -> str:
    shape = fdp.ConsumeIntInRange(0, 3)
    if shape == 0:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 80))
    token = TOKEN if shape < 3 else fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 70))
    if shape == 2:
        return token
    return token + ":" + fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 20))


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    store, frames = build_store(fdp)
    headers, query = headers_and_query(fdp)
    scope = {"type": "http", "headers": headers, "query_string": query}
    raw = resume_request(scope)
    if raw is None:
        if fdp.ConsumeBool():
            return
        raw = event_id(fdp)
    assert isinstance(raw, str)
    try:
        point = parse_event_id(raw)
    except BadEventId:
        return  # 400 invalid_last_event_id
    assert 16 <= len(point.token) <= 64 and -1 <= point.after < 10**18
    assert parse_event_id(f"{point.token}:{point.after}") == point

    source = run_sync(store.open(point.token))
    if point.token != TOKEN:
        assert source is None, "a forged token opened a stream"
        return  # 404 stream_not_found
    assert source is not None
    is_owner = hmac.compare_digest(source.meta.owner, identity_hash(scope, None))
    assert is_owner == (sorted(h for h in headers if h[0] in (b"authorization", b"x-api-key", b"api-key"))
                        == OWNER_HEADERS), "the owner check does not follow the caller's credentials"
    if not is_owner:
        return  # 403 stream_forbidden
    cursor = point.after + 1
    try:
        run_sync(source.check(cursor))
    except EventsGone:
        assert cursor < source.log.base
        return  # 410 events_expired
    except ValueError:
        assert cursor > len(frames)
        return  # 400 invalid_last_event_id
    try:
        taken = source.take(cursor)
    except EventsGone:
        raise AssertionError("check() passed but take() found the events gone") from None
    assert taken == frames[cursor:], (cursor, len(taken), len(frames))
    assert source.ended(cursor) == (source.log.closed and not taken)
    source.close()


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
