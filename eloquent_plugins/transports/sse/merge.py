"""Merging queued OpenAI text deltas into one chunk (``StreamConfig.merge_deltas``).

Only runs when several events wait for one slow client, so it costs nothing when the client keeps up. A merged
chunk carries the id of the last event it absorbed, so a resume after it continues at the right place. Only plain
content deltas are merged (no role, finish reason, tool calls, logprobs or usage), in both chat and completions.
"""

from __future__ import annotations

import json
from typing import Any

_ID = b"id: "
_DATA = b"data: "


def _split(frame: bytes) -> tuple[bytes, Any, str] | None:
    """(id line, chunk object, key) for a frame that is exactly an id line plus one mergeable data line."""
    if not frame.startswith(_ID) or frame.count(b"\n") != 3:
        return None
    id_line, data_line, _blank, _end = frame.split(b"\n")
    if not data_line.startswith(_DATA):
        return None
    try:
        obj = json.loads(data_line[6:])
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("usage") is not None:
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("finish_reason") is not None or choice.get("logprobs") is not None:
        return None
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if set(delta) != {"content"} or not isinstance(delta["content"], str):
            return None
        return id_line, obj, "delta"
    if isinstance(choice.get("text"), str) and "delta" not in choice:
        return id_line, obj, "text"
    return None


def _text(obj: Any, key: str) -> str:
    choice = obj["choices"][0]
    return choice["delta"]["content"] if key == "delta" else choice["text"]


def merge_openai(frames: list[bytes]) -> tuple[list[bytes], int]:
    """Frames with runs of consecutive content deltas (same chunk id, kind and choice index) merged, and how
    many events disappeared into a neighbour."""
    out: list[bytes] = []
    run: list[tuple[bytes, bytes, Any, str]] = []
    merged = 0

    def flush() -> None:
        nonlocal merged
        if len(run) == 1:
            out.append(run[0][0])  # a lone frame goes out byte for byte
        elif run:
            _frame0, _id0, first, key = run[0]
            text = "".join(_text(obj, key) for _f, _i, obj, _k in run)
            if key == "delta":
                first["choices"][0]["delta"]["content"] = text
            else:
                first["choices"][0]["text"] = text
            out.append(_frame(run[-1][1], first))
            merged += len(run) - 1
        run.clear()

    for frame in frames:
        parts = _split(frame)
        if parts is None:
            flush()
            out.append(frame)
            continue
        id_line, obj, key = parts
        if run and (key != run[0][3] or obj.get("id") != run[0][2].get("id")
                    or obj["choices"][0].get("index") != run[0][2]["choices"][0].get("index")):
            flush()
        run.append((frame, id_line, obj, key))
    flush()
    return out, merged


def _frame(id_line: bytes, obj: Any) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return id_line + b"\n" + _DATA + data + b"\n\n"
