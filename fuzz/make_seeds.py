"""Write the seed corpora in ``fuzz/corpus/<target>/`` from real traffic of the code under test.

Wire seeds are datagrams an ``EloquentSender``/``EloquentReceiver`` pair actually exchanges (whole events,
deltas, fragments, acks, keep-alives); SSE seeds are real event streams in the OpenAI, TGI and Triton formats
with keep-alives and CRLF line ends; request seeds are real request bodies; resume seeds are real event ids.
Seeds are small on purpose. Re-run after a wire format change: ``python fuzz/make_seeds.py``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.padding import datagram_policy
from eloquent_plugins.core.receiver import EloquentReceiver
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.transports.sse.ids import new_token

CORPUS = Path(__file__).resolve().parent / "corpus"


def _write(target: str, blobs: list[bytes]) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for blob in blobs:
        (folder / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)


def _openai_chunks(n: int) -> list[bytes]:
    words = ["It", " was", " the", " best", " of", " times", ",", " it", " was", " the", " worst"]
    return [json.dumps({"id": "chatcmpl-8f2a", "object": "chat.completion.chunk", "created": 1732900000,
                        "model": "eloquent-builtin",
                        "choices": [{"index": 0, "delta": {"content": words[i % len(words)]},
                                     "finish_reason": None}]}, separators=(",", ":")).encode()
            for i in range(n)]


def wire_datagrams() -> list[bytes]:
    """Datagrams of a real exchange: a small budget forces split runs and fragments, loss forces resends."""
    limits = Limits(max_datagram_size=200)
    sender = EloquentSender(7, SenderConfig(limits=limits))
    receiver = EloquentReceiver(7)
    out: list[bytes] = []
    now = 0.0
    events = _openai_chunks(6) + [b"x" * 450]
    for i, payload in enumerate(events):
        sender.push(payload, now)
        datagrams = sender.datagrams_to_send(now)
        out.extend(datagrams)
        for datagram in datagrams[:-1] if i % 3 == 1 else datagrams:  # lose one now and then
            receiver.receive_datagram(datagram, now)
        acks = receiver.datagrams_to_send(now)
        out.extend(acks)
        for ack in acks:
            sender.receive_datagram(ack, now)
        now += 0.05
    sender.end(now, b"[DONE]")
    now += 20.0  # past the keep-alive interval and the probe timeout
    datagrams = sender.datagrams_to_send(now)
    out.extend(datagrams)
    for datagram in datagrams:
        receiver.receive_datagram(datagram, now)
    out.extend(receiver.datagrams_to_send(now))
    idle = EloquentSender(9)
    out.extend(idle.datagrams_to_send(16.0))  # a KEEPALIVE
    padded = EloquentSender(11, SenderConfig(limits=limits, padding=datagram_policy("bucket", 200)))
    for payload in _openai_chunks(2):  # padded datagrams (zero bytes after the last field)
        padded.push(payload, now)
        out.extend(padded.datagrams_to_send(now))
    return out


def sse_streams() -> list[bytes]:
    openai = b"".join(b"data: " + c + b"\n\n" for c in _openai_chunks(3)) + b"data: [DONE]\n\n"
    tgi = (b'data:{"token":{"id":1,"text":" Hello","logprob":-0.1,"special":false},"generated_text":null}\n\n'
           b": keep-alive\n\n"
           b'data:{"token":{"id":2,"text":"!","logprob":-0.2,"special":false},"generated_text":" Hello!"}\n\n')
    triton = (b'event: message\r\nid: ' + new_token().encode() + b':0\r\n'
              b'data: {"model_name":"m","model_version":"1","text_output":"Hi"}\r\n\r\n'
              b"retry: 2000\r\n: keep-alive\r\n\r\n")
    error = (b'\xef\xbb\xbfdata: {"error": {"message": "engine failed", "type": "EngineError", "code": 500}}\n'
             b"data: second line\n\n\n\n")
    # retry: with non-ASCII digits is ignored (WHATWG: ASCII digits only); str.isdigit() took "²" and int() raised.
    retry = "retry: \u00b2\ndata: a\n\nretry: \u0663\ndata: b\n\nretry: 7\ndata: c\n\n".encode()
    return [openai, tgi, triton, error, retry]


def request_bodies() -> list[bytes]:
    chat = {"model": "eloquent-builtin", "messages": [{"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 16, "temperature": 0.7,
            "top_p": 1, "seed": 42, "stop": ["\n\n", "END"], "n": 1,
            "eloquent_engine": {"ttft": 0, "tpot": 0.01, "pauses": {"0": 1.5}, "fail_after": 20}}
    completion = {"model": "eloquent-builtin", "prompt": ["Once upon a time"], "max_tokens": 8, "stream": False,
                  "presence_penalty": -0.5, "frequency_penalty": 0.5}
    tokens = {"prompt": [1, 2, 3], "max_completion_tokens": 4}
    return [b"\x00" + json.dumps(chat).encode(), b"\x01" + json.dumps(completion).encode(),
            b"\x01" + json.dumps(tokens).encode(), b"\x00{}", b"\x00[]"]


def event_ids() -> list[bytes]:
    token = new_token().encode()
    return [token + b":0", token + b":123", token, token + b":-1", b"  " + token + b":7\t", b"garbage"]


def main() -> None:
    _write("wire", [b"\x00" + d for d in wire_datagrams()])  # first byte: limits selector of fuzz_wire.py
    _write("sse_parser", [b"\x00\x00" + s for s in sse_streams()])  # no cuts, then the stream
    _write("requests", request_bodies())
    _write("resume_ids", event_ids())


if __name__ == "__main__":
    main()
