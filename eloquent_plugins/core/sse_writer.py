"""Writing SSE: one function, used by the middleware, gateways and the built-in engine alike."""

from __future__ import annotations


def format_event(data: bytes | str, *, event: str | None = None, id: str | None = None,
                 retry: int | None = None, space: bool = True) -> bytes:
    """Frame one message. ``data`` may contain newlines (each becomes its own ``data:`` line).

    ``space=False`` writes ``data:x`` as TGI before 2.1 did, for byte-exact reproductions.
    """
    if isinstance(data, str):
        data = data.encode()
    sep = b": " if space else b":"
    parts: list[bytes] = []
    if event is not None:
        parts.append(b"event" + sep + event.encode() + b"\n")
    if id is not None:
        parts.append(b"id" + sep + id.encode() + b"\n")
    if retry is not None:
        parts.append(b"retry" + sep + str(int(retry)).encode() + b"\n")
    if b"\n" in data or b"\r" in data:
        for line in data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
            parts.append(b"data" + sep + line + b"\n")
    else:
        parts.append(b"data" + sep + data + b"\n")
    parts.append(b"\n")
    return b"".join(parts)
