"""Fuzz the SSE parser with arbitrary bytes cut into arbitrary chunks.

A hostile (or broken) upstream controls the whole ``text/event-stream`` body and the network controls where it
is split. The parser must give the same messages however the bytes are chunked, agree with a direct reading of
the WHATWG algorithm (below), and raise nothing but ``LimitExceeded`` (for an oversized message).
Run: ``python fuzz/fuzz_sse_parser.py -atheris_runs=1000000 [corpus dirs]``.
"""

from __future__ import annotations

import re
import sys

import atheris

with atheris.instrument_imports(include=["eloquent_plugins"]):
    from eloquent_plugins.core.errors import LimitExceeded
    from eloquent_plugins.core.sse_reader import SSEMessage, SSEParser

_LINE = re.compile(rb"(.*?)(\r\n|\r|\n)", re.DOTALL)


def reference(stream: bytes) -> tuple[list[tuple], str | None, int | None, int]:
    """The WHATWG event-stream interpretation, written plainly: (messages, last id, retry, comments)."""
    if stream.startswith(b"\xef\xbb\xbf"):
        stream = stream[3:]
    messages: list[tuple] = []
    data: list[str] = []
    has_data = False
    event = ""
    last_id: str | None = None
    retry: int | None = None
    comments = 0
    for match in _LINE.finditer(stream):
        line = match.group(1).decode("utf-8", errors="replace")
        if not line:
            if has_data:
                messages.append(("\n".join(data), event or "message", last_id))
            data, has_data, event = [], False, ""
            continue
        if line.startswith(":"):
            comments += 1
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
            has_data = True
        elif name == "event":
            event = value
        elif name == "id" and "\x00" not in value:
            last_id = value
        elif name == "retry" and value and all("0" <= c <= "9" for c in value):
            retry = int(value)
    return messages, last_id, retry, comments


def _normal(message: SSEMessage) -> SSEMessage:
    raw = message.raw[:-1] if message.raw.endswith(b"\r\n") else message.raw
    return SSEMessage(message.data, message.event, message.id, message.retry, message.comments, raw)


def parse(chunks: list[bytes], limit: int) -> tuple[list[SSEMessage], SSEParser]:
    parser = SSEParser(max_message_bytes=limit)
    out: list[SSEMessage] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out, parser


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    cuts = [fdp.ConsumeIntInRange(0, 64) for _ in range(fdp.ConsumeIntInRange(0, 16))]
    small_limit = fdp.ConsumeIntInRange(1, 64)
    stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    chunks: list[bytes] = []
    pos = 0
    for cut in cuts:
        chunks.append(stream[pos : pos + cut])
        pos += cut
    chunks.append(stream[pos:])

    whole, whole_parser = parse([stream], 1 << 22)
    split, split_parser = parse(chunks, 1 << 22)
    # A message is dispatched as soon as its blank line's CR arrives; when the LF of that CRLF comes in a later
    # chunk it is dropped, so ``raw`` may end in a bare CR (still a complete terminator). Nothing else may differ.
    assert [_normal(m) for m in split] == [_normal(m) for m in whole], (split, whole)
    assert (split_parser.last_event_id, split_parser.retry, split_parser.comments_seen) == \
        (whole_parser.last_event_id, whole_parser.retry, whole_parser.comments_seen)

    messages, last_id, retry, comments = reference(stream)
    assert [(m.data, m.event, m.id) for m in whole] == messages, (whole, messages)
    assert (whole_parser.last_event_id, whole_parser.retry, whole_parser.comments_seen) == \
        (last_id, retry, comments)
    # The raw bytes of each message are a slice of the stream, in order and without overlap (blocks that
    # dispatch nothing, e.g. comment-only keep-alives, are skipped between them).
    pos = 0
    for m in whole:
        found = stream.find(m.raw, pos)
        assert found >= 0 and m.raw.endswith((b"\n", b"\r")), (m.raw, stream)
        pos = found + len(m.raw)

    try:
        parse(chunks, small_limit)
    except LimitExceeded:
        pass


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
