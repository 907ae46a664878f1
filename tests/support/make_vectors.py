# long: one generator per vector file, kept in one module so that regenerating them all is one command
"""Write tests/vectors/*.json: what the Python core says the wire looks like, for the JavaScript client's tests.

Every expected value here comes from the Python reference (varints, packets, deltas, a sender and receiver under
scripted loss, the assembler with control records, the SSE parser, the codecs, event ids), so tests/js/ checks the
JS port byte for byte against it, and tests/client/test_js_client.py regenerates the files to catch drift.

    python tests/support/make_vectors.py [OUT_DIR]   (default: tests/vectors)
"""

from __future__ import annotations

import heapq
import json
import random
import sys
from pathlib import Path
from typing import Any

from eloquent_client.events import text_delta

from eloquent_plugins.core.assembler import EloquentAssembler
from eloquent_plugins.core.codecs import OpenAICodec, TGICodec, TritonCodec
from eloquent_plugins.core.codecs.base import CodecError
from eloquent_plugins.core.control import ControlParser, Fallback, StreamDigest, Trailer, encode_fallback, \
    encode_trailer
from eloquent_plugins.core.delta import make_delta
from eloquent_plugins.core.errors import EloquentError
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.padding import PaddingPolicy
from eloquent_plugins.core.protocol import BadEventId, parse_event_id
from eloquent_plugins.core.receiver import EloquentReceiver, ReceiverConfig
from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.varint import encode_varint
from eloquent_plugins.core.wire import AckPacket, DataPacket, Entry, KeepAlivePacket, decode_packet, encode_packet, \
    pad_packet

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "vectors"
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Été", " naïve",
         " café", " 🦊", " ok", "\n", " \"quoted\"", " tab\t", " a", " b"]


def chunk(i: int, text: str, finish: str | None = None) -> bytes:
    """An OpenAI chat chunk as the built-in engine writes one."""
    return json.dumps({"id": "chatcmpl-7f3a", "object": "chat.completion.chunk", "created": 1700000000,
                       "model": "eloquent-tiny", "choices": [{"index": 0, "delta": {"content": text},
                                                              "finish_reason": finish}]},
                      separators=(",", ":"), ensure_ascii=False).encode()


def payloads(n: int, seed: int, big: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        if big and i % 4 == 1:
            text += " lorem ipsum" * (big // 12)
        out.append(chunk(i, text, "stop" if i == n - 1 else None))
    return out


def error_name(exc: BaseException) -> str:
    return type(exc).__name__


def limits_json(limits: Limits) -> dict[str, int]:
    return {"maxDatagramSize": limits.max_datagram_size, "maxEventBytes": limits.max_event_bytes,
            "maxEntriesPerPacket": limits.max_entries_per_packet, "maxIndexGap": limits.max_index_gap,
            "maxBufferedBytes": limits.max_buffered_bytes, "maxRunDatagrams": limits.max_run_datagrams}


# ------------------------------------------------------------------------------------------- varints, packets
def varint_vectors() -> dict[str, Any]:
    values = [0, 1, 37, 63, 64, 151, 15293, 16383, 16384, 494878333, (1 << 30) - 1, 1 << 30, 2 ** 32, 2 ** 53 - 1]
    big = [2 ** 53, 151288809941952652, 2 ** 62 - 1]
    return {"values": [{"value": v, "hex": encode_varint(v).hex()} for v in values],
            "big": [{"value": str(v), "hex": encode_varint(v).hex()} for v in big],
            "truncated": ["", "40", "80ffff", "c0000000000000"]}


def packet_json(packet: Any) -> dict[str, Any]:
    if isinstance(packet, AckPacket):
        return {"type": "ack", "streamId": packet.stream_id, "nextExpected": packet.next_expected,
                "largestPacketNumber": packet.largest_packet_number, "ackDelay": packet.ack_delay}
    if isinstance(packet, KeepAlivePacket):
        return {"type": "keepalive", "streamId": packet.stream_id, "packetNumber": packet.packet_number}
    return {"type": "data", "streamId": packet.stream_id, "packetNumber": packet.packet_number,
            "refIndex": packet.ref_index, "firstIndex": packet.first_index,
            "entries": [{"index": e.index, "kind": int(e.kind), "middle": e.middle.hex(), "delta": e.delta,
                         "prefix": e.prefix, "suffix": e.suffix, "fragTotal": e.frag_total,
                         "fragOffset": e.frag_offset} for e in packet.entries]}


def packet_vectors() -> dict[str, Any]:
    e = Entry
    valid = [
        DataPacket(0, 0, None, 0, (e(0, EventKind.DATA, b"hello"),)),
        DataPacket(4, 7, 2, 3, (e(3, EventKind.DATA, b"abc", True, 5, 2), e(4, EventKind.DATA, b"", True, 4, 1),
                                e(5, EventKind.END, b""))),
        DataPacket(8, 300, None, 70, (e(70, EventKind.ERROR, b'{"error":"boom"}'),)),
        DataPacket(12, 16384, 99, 100, (e(100, EventKind.DATA, bytes(range(256)) * 4, False, 0, 0, 5000, 1200),)),
        DataPacket(2 ** 40, 2 ** 31, None, 2 ** 20, (e(2 ** 20, EventKind.DATA, b"x" * 70),)),
        AckPacket(4, 17, 33, 0.0), AckPacket(0, 0, 0, 0.0000025), AckPacket(4, 5000, 70000, 0.012345678),
        AckPacket(16, 1, 2, 3.5), KeepAlivePacket(4, 0), KeepAlivePacket(2 ** 14, 2 ** 30 + 5),
    ]
    good = [{"hex": encode_packet(p).hex(), "packet": packet_json(decode_packet(encode_packet(p)))} for p in valid]
    small = Limits(max_datagram_size=64, max_event_bytes=100, max_entries_per_packet=4)
    bad_hex = ["", "0101", "020100000100", "010900", "01010000000100", "01010000000000", "01010000000001 1000",
               "01010000000001 8000", "01010000000001 0300", "01010000000002 0100 0000", "01010000000001 0c000000",
               "01010000000002 0401000141 0000", "01010000000001 08000000", "0101 0000 02 01 01 0000",
               "0101 0000 02 02 01 0800000141", "01010000000001 0005ab", "01010000000001 04050000",
               "01010000000001 04020102aabb", "01010000000001 0001 41ff", "01010000000002 000141",
               "0102000000", "01020000000000", "0103000001", "01030000", "01030041", "0104000000", "0101004000"]
    small_hex = ["01010000000005" + "0000" * 5, "01010000000004" + "0000" * 4, "01010000000001 004065" + "65" * 101,
                 "01010000000001 004064" + "65" * 100, "01010000000001 04406500 01aa", "0101000001010108406400 0161",
                 "01030000" + "00" * 5000]
    bad_hex = [h.replace(" ", "") for h in bad_hex]
    small_hex = [h.replace(" ", "") for h in small_hex]
    odd = []  # hostile or edge bytes: each either decodes or raises, and JS must do the same
    for hex_, limits in [(h, None) for h in bad_hex] + [(h, small) for h in small_hex]:
        case: dict[str, Any] = {"hex": hex_, "limits": limits_json(limits) if limits else None}
        try:
            case["packet"] = packet_json(decode_packet(bytes.fromhex(hex_), limits))
        except EloquentError as exc:
            case["error"] = error_name(exc)
        odd.append(case)
    assert sum("error" in c for c in odd) > len(odd) - 8, "most odd packets should be refused"
    deltas = []
    rng = random.Random(5)
    texts = payloads(12, 9) + [b"", b"a", b"abcabc", b"abc", b"ab", b"xbc", "é🦊".encode()]
    for _ in range(24):
        ref, payload = rng.choice(texts), rng.choice(texts)
        prefix, suffix, middle = make_delta(ref, payload)
        deltas.append({"ref": ref.hex(), "payload": payload.hex(), "prefix": prefix, "suffix": suffix,
                       "middle": middle.hex()})
    padded = []  # core.padding: zero bytes after the last field, skipped by every decoder (PROTOCOL.md, "Padding")
    for p, size in zip(valid, (64, 128, 256, 1286, 1286, 64, 64, 64, 64, 64, 256)):
        raw = encode_packet(p)
        data = pad_packet(raw, size)
        padded.append({"hex": data.hex(), "size": len(data), "packet": packet_json(decode_packet(data))})
    for hex_ in (encode_packet(valid[0]).hex() + "0000000001", encode_packet(valid[5]).hex() + "00ff00"):
        odd.append({"hex": hex_, "limits": None, "error": error_name(_raises(bytes.fromhex(hex_)))})
    return {"valid": good, "odd": odd, "deltas": deltas, "padded": padded}


def _raises(data: bytes) -> EloquentError:
    try:
        decode_packet(data)
    except EloquentError as exc:
        return exc
    raise AssertionError(f"{data.hex()} decoded: non-zero bytes after a packet must be refused")


# ------------------------------------------------------------------------------------------- lossy runs
def receiver_run(name: str, seed: int, n: int, *, loss: float, ack_loss: float, ack_delay: float = 0.0,
                 jitter: float = 0.0, dup: float = 0.0, limits: Limits | None = None, big: int = 0,
                 fail: bool = False, outage: tuple[float, float] | None = None, gap_at: int = -1) -> dict[str, Any]:
    """A sender and a receiver on a scripted lossy path; the receiver's every input and output is recorded."""
    rng = random.Random(seed)
    limits = limits or Limits()
    sid = 4
    sender = EloquentSender(sid, SenderConfig(limits=limits, initial_rtt=0.05,
                                              keepalive=KeepAlivePolicy(interval=0.15)), now=0.0)
    receiver = EloquentReceiver(sid, ReceiverConfig(limits=limits, ack_delay=ack_delay))
    events = payloads(n, seed, big)
    final = b'{"error":{"message":"engine died","type":"EngineError"}}' if fail else b"[DONE]"
    queue: list[tuple[float, int, str, Any]] = []
    seq = 0

    def at(t: float, what: str, data: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(queue, (round(t, 6), seq, what, data))

    for i, payload in enumerate(events):
        at(0.01 + i * 0.02 + (0.4 if i > gap_at >= 0 else 0.0), "push", payload)
    at(0.01 + n * 0.02 + (0.4 if gap_at >= 0 else 0.0), "final", final)

    def path(now: float, data: bytes, to: str, p: float) -> None:
        copies = 2 if rng.random() < dup else 1
        for _ in range(copies):
            if rng.random() < p or (outage and outage[0] <= now < outage[1]):
                continue
            at(now + 0.01 + rng.random() * jitter, to, data)

    trace: list[dict[str, Any]] = []
    now = 0.0
    for _ in range(100_000):
        if receiver.complete and sender.done:
            break
        times = [t for t in (sender.next_deadline(), receiver.next_deadline(), queue[0][0] if queue else None)
                 if t is not None]
        now = max(now, min(times))
        if now > 60:
            raise AssertionError(f"{name}: no completion after 60 s")
        if receiver.next_deadline() is not None and receiver.next_deadline() <= now:
            acks = receiver.datagrams_to_send(now)
            trace.append({"op": "poll", "t": now, "acks": [a.hex() for a in acks]})
            for ack in acks:
                path(now, ack, "ack", ack_loss)
            continue
        if queue and queue[0][0] <= now:
            _, _, what, data = heapq.heappop(queue)
            if what == "push":
                sender.push(data, now)
            elif what == "final":
                (sender.fail(data, now) if fail else sender.end(now, data))
            elif what == "ack":
                sender.receive_datagram(data, now)
            else:
                rendered = receiver.receive_datagram(data, now)
                acks = receiver.datagrams_to_send(now)
                trace.append({"op": "datagram", "t": now, "hex": data.hex(), "rendered": [e.index for e in rendered],
                              "acks": [a.hex() for a in acks], "deadline": receiver.next_deadline()})
                for ack in acks:
                    path(now, ack, "ack", ack_loss)
        else:
            sender.handle_timer(now)
        for datagram in sender.datagrams_to_send(now):
            path(now, datagram, "deliver", loss)
    assert receiver.complete, name
    log = [*events, final]
    return {"name": name, "streamId": sid, "ackDelay": ack_delay, "limits": limits_json(limits),
            "events": [p.hex() for p in log], "finalKind": int(EventKind.ERROR if fail else EventKind.END),
            "stats": {"undecodable": receiver.stats.undecodable, "keepalives": receiver.stats.keepalives},
            "trace": trace}


def receiver_vectors() -> dict[str, Any]:
    return {"runs": [
        receiver_run("clean", 1, 8, loss=0.0, ack_loss=0.0),
        receiver_run("lossy-reordered", 2, 32, loss=0.3, ack_loss=0.2, jitter=0.05, dup=0.1),
        receiver_run("ack-delay", 3, 16, loss=0.15, ack_loss=0.1, ack_delay=0.025, jitter=0.01),
        receiver_run("fragments-error", 4, 9, loss=0.2, ack_loss=0.1, limits=Limits(max_datagram_size=256),
                     big=600, fail=True, jitter=0.005),
        receiver_run("outage-keepalive", 5, 14, loss=0.05, ack_loss=0.0, outage=(0.08, 0.35), gap_at=9),
    ]}


# ------------------------------------------------------------------------------------------- assembler
def assembler_run(name: str, seed: int, n: int, *, loss: float, cut_after: int | None = None, fail: bool = False,
                  tamper: bool = False, no_trailer: bool = False) -> dict[str, Any]:
    """EloquentResponseStream (server) to EloquentAssembler (client): datagrams, trailer, maybe a fallback."""
    rng = random.Random(seed)
    sid = 8
    server = EloquentResponseStream(sid, SenderConfig(initial_rtt=0.05), now=0.0, fallback_after=0.3)
    client = EloquentAssembler(sid)
    events = payloads(n, seed) + [b"[DONE]"]
    steps: list[dict[str, Any]] = []
    pushed = 0

    def step(op: str, now: float, data: bytes | None = None) -> bool:
        entry: dict[str, Any] = {"op": op, "t": now, "hex": data.hex() if data is not None else None}
        try:
            if op == "datagram":
                assert data is not None
                entry["rendered"] = [e.index for e in client.on_datagram(data, now)]
                entry["acks"] = [a.hex() for a in client.acks(now)]
                for ack in entry["acks"]:
                    if rng.random() >= loss:
                        server.receive_datagram(bytes.fromhex(ack), now + 0.01)
            elif op == "control":
                assert data is not None
                entry["rendered"] = [e.index for e in client.on_control(data)]
            else:
                client.on_stream_end()
        except EloquentError as exc:
            entry["error"] = error_name(exc)
        steps.append(entry)
        return "error" not in entry

    now = 0.0
    trailer = b""
    while now < 5 and not server.finished:
        now = round(now + 0.02, 6)
        if pushed < len(events):
            server.feed_body(b"data: " + events[pushed] + b"\n\n", now)
            pushed += 1
        elif not server.ended:
            trailer = server.fail("engine died", now) if fail else server.finish(now)
            if tamper:
                trailer = trailer.replace(b'"sha256":"', b'"sha256":"00', 1)
            if not no_trailer:  # the trailer in two pieces, to exercise the incremental parser
                if not step("control", now, trailer[:17]) or not step("control", now, trailer[17:]):
                    break
        for datagram in server.datagrams_to_send(now):
            cut = cut_after is not None and pushed > cut_after
            if not cut and rng.random() >= loss and not step("datagram", now, datagram):
                break
        if server.fallback_due(now):
            step("control", now, server.fallback_record())
            break
    if not steps or "error" not in steps[-1]:
        step("end", now)
    return {"name": name, "streamId": sid, "events": [p.hex() for p in events],
            "final": {"kind": int(EventKind.ERROR if fail else EventKind.END),
                      "payload": (server.codec.error_payload("engine died", error_type="InternalServerError")
                                  if fail else b"").hex()},
            "trailer": trailer.hex(), "steps": steps}


def assembler_vectors() -> dict[str, Any]:
    return {"runs": [
        assembler_run("acked", 11, 10, loss=0.1),
        assembler_run("fallback", 12, 10, loss=0.2, cut_after=4),
        assembler_run("error", 13, 6, loss=0.0, fail=True),
        assembler_run("tampered", 14, 5, loss=0.0, tamper=True),
        assembler_run("no-trailer", 15, 4, loss=0.0, no_trailer=True),
    ]}


# ------------------------------------------------------------------------------------------- control records
def control_vectors() -> dict[str, Any]:
    lists = [[], [b""], [b"ab", b""], [b"a", b"b"], [p for p in payloads(5, 21)], [bytes(range(256)) * 9]]
    digests = [{"payloads": [p.hex() for p in ps], "sha256": StreamDigest.of(ps)} for ps in lists]
    final = StreamEvent(3, b"[DONE]", EventKind.END)
    records = [encode_trailer(Trailer(4, StreamDigest.of([b"a", b"b", b"c", b"[DONE]"]), final)),
               encode_trailer(Trailer(1, "ab" * 32, StreamEvent(0, b'{"error":"x"}', EventKind.ERROR))),
               encode_fallback([StreamEvent(1, "é🦊".encode()), StreamEvent(2, b""), final]),
               encode_fallback([])]
    parsed = []
    for raw in records:
        (record,) = ControlParser().feed(raw)
        evs = [record.final] if isinstance(record, Trailer) else list(record.events)
        parsed.append({"hex": raw.hex(), "type": "trailer" if isinstance(record, Trailer) else "fallback",
                       "count": record.count if isinstance(record, Trailer) else None,
                       "sha256": record.sha256 if isinstance(record, Trailer) else None,
                       "events": [{"index": e.index, "kind": int(e.kind), "payload": e.payload.hex()} for e in evs]})
    assert all(isinstance(r, (Trailer, Fallback)) for raw in records for r in ControlParser().feed(raw))
    bad_lines = ['{"type":"trailer","count":0,"sha256":"x","final":{"index":0,"kind":"end","payload":""}}',
                 '{"type":"trailer","count":2,"sha256":"x","final":{"index":0,"kind":"end","payload":""}}',
                 '{"type":"trailer","count":1,"sha256":"x","final":{"index":0,"kind":"data","payload":""}}',
                 '{"type":"trailer","count":true,"sha256":"x","final":{"index":0,"kind":"end","payload":""}}',
                 '{"type":"trailer","count":1,"sha256":5,"final":{"index":0,"kind":"end","payload":""}}',
                 '{"type":"trailer","count":1,"sha256":"x"}',
                 '{"type":"fallback","events":{}}', '{"type":"fallback","events":[{"index":-1,"kind":"data",'
                 '"payload":""}]}', '{"type":"fallback","events":[{"index":0,"kind":"data","payload":"YQ"}]}',
                 '{"type":"fallback","events":[{"index":0,"kind":"data","payload":"Y*=="}]}',
                 '{"type":"fallback","events":[{"index":0,"kind":"nope","payload":""}]}',
                 '{"type":"other"}', "[1,2]", "not json", '{"type":"fallback","events":[7]}']
    invalid = []
    for line in bad_lines:
        try:
            ControlParser().feed(line.encode() + b"\n")
        except EloquentError as exc:
            invalid.append({"line": line, "error": error_name(exc)})
            continue
        raise AssertionError(line)
    return {"digests": digests, "records": parsed, "invalid": invalid}


# ------------------------------------------------------------------------------------------- SSE
_PADDED_EVENTS = [b"id: tok:0\ndata: {\"text\":\"Hi\"}\n\n", b"id: tok:1\ndata: {\"text\":\" there\"}\n\n",
                  b"data: [DONE]\n\n"]
SSE_CASES = {
    # core.padding: a comment line after each write (bucket), and the same cut into 256-byte writes (constant)
    "padded-bucket": b"".join(b"".join(PaddingPolicy("bucket").sse_writes(e)) for e in _PADDED_EVENTS),
    "padded-constant": b"".join(b"".join(PaddingPolicy("constant").sse_writes(e)) for e in _PADDED_EVENTS),
    "basic": b"data: one\n\ndata: two\nid: t\n\n",
    "crlf-and-cr": b"data: a\r\n\r\ndata: b\r\rdata: c\r\n\r\n",
    "multiline-comments": b": hello\n: keep-alive\ndata: x\ndata:y\ndata\n\n",
    "event-retry": b"event: delta\nretry: 1500\ndata: {}\n\nretry: 12x\ndata: z\n\n",
    "retry-superscript": "retry: ²\ndata: sup\n\nretry: ٣\ndata: arabic\n\nretry: 7\ndata: ascii\n\n".encode(),
    "ids": b"id: abc\ndata: 1\n\nid: a\x00b\ndata: 2\n\nid\ndata: 3\n\n",
    "bom-utf8": "\ufeffdata: Été 🦊\n\ndata: \ufeffkeep\n\n".encode(),
    "invalid-utf8": b"data: \xff\xfeok\xc3\n\ndata: \xe2\x82\n\n",
    "no-data": b"event: x\nid: 5\n\n: only a comment\n\ndata:\n\n",
    "unterminated": b"data: done\n\ndata: half",
    "fields": b"dat: a\ndata : b\nDATA: c\ndata: d\n\n",
}


def sse_vectors() -> dict[str, Any]:
    rng = random.Random(7)
    cases = []
    for name, stream in SSE_CASES.items():
        splits = [[], list(range(1, len(stream))), sorted(rng.sample(range(1, len(stream)), min(5, len(stream) - 1)))]
        crs = [i + 1 for i, b in enumerate(stream) if b == 0x0D and i + 1 < len(stream)]
        if crs:
            splits.append(crs)
        runs = []
        for cuts in splits:
            parser = SSEParser()
            pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
            messages = [m for piece in pieces for m in parser.feed(piece)]
            runs.append({"splits": cuts, "messages": [
                {"data": m.data, "event": m.event, "id": m.id, "retry": m.retry, "comments": list(m.comments),
                 "raw": m.raw.hex()} for m in messages],
                "state": {"lastEventId": parser.last_event_id, "retry": parser.retry,
                          "commentsSeen": parser.comments_seen}})
        datas = {json.dumps([(m["data"], m["id"], m["retry"]) for m in r["messages"]]) for r in runs}
        assert len(datas) == 1, f"{name}: the Python parser depends on the split"
        cases.append({"name": name, "hex": stream.hex(), "runs": runs})
    limit = SSEParser(max_message_bytes=16)
    try:
        limit.feed(b"data: " + b"x" * 40)
    except EloquentError as exc:
        overflow = {"maxMessageBytes": 16, "hex": (b"data: " + b"x" * 40).hex(), "error": error_name(exc)}
    return {"cases": cases, "overflow": overflow}


# ------------------------------------------------------------------------------------------- codecs, ids
CODEC_CASES: dict[str, list[str]] = {
    "openai": ['{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}', " [DONE]\n", "[DONE]",
               '{"choices":[{"index":0,"delta":{"role":"assistant"}}]}',
               '{"choices":[{"index":0,"text":" there","token_ids":[5,7],"finish_reason":"length"}],'
               '"usage":{"prompt_tokens":3,"completion_tokens":2}}',
               '{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"},"finish_reason":"stop"}]}',
               '{"error":{"message":"bad","type":"invalid_request_error","code":400}}', '{"error":"plain"}',
               '{"choices":[],"usage":{"total_tokens":9}}', '{"choices":{}}', '{"choices":"x"}', '{"choices":[1]}',
               "[1]", "nope", '{"error":null,"choices":[{"delta":{"content":"é🦊"}}]}'],
    "tgi": ['{"index":1,"token":{"id":42,"text":" world","logprob":-0.1,"special":false},"generated_text":null,'
            '"details":null}', '{"token":{"id":2,"text":"</s>","special":true},"generated_text":"x",'
            '"details":{"finish_reason":"eos_token","generated_tokens":7}}',
            '{"error":"Request failed","error_type":"generation"}', '{"error":"x","error_type":null}',
            '{"token":{"id":1}}', '{"token":"x"}', '{"details":{}}', "[]"],
    "triton": ['{"model_name":"m","model_version":"1","text_output":"abc"}', '{"OUTPUT":["a","b"]}',
               '{"output":[1,2],"text":"t"}', '{"error":"oops"}', '{"model_name":"m"}', '"str"', "{bad"],
}


def view_json(codec: Any, payload: str) -> dict[str, Any]:
    try:
        v = codec.parse(payload.encode())
    except CodecError as exc:
        return {"payload": payload, "error": error_name(exc)}
    return {"payload": payload, "view": {"text": v.text, "tokenIds": list(v.token_ids), "finishReason": v.finish_reason,
                                         "usage": v.usage, "error": v.error, "errorType": v.error_type,
                                         "terminal": v.terminal}}


def codec_vectors() -> dict[str, Any]:
    codecs = {"openai": OpenAICodec(), "tgi": TGICodec(), "triton": TritonCodec()}
    views = {name: [view_json(codecs[name], p) for p in cases] for name, cases in CODEC_CASES.items()}
    datas = [p for cases in CODEC_CASES.values() for p in cases] + ["", "{", '{"x":1}', '{"choices":[{"text":""}]}']
    return {"views": views, "textDelta": [{"data": d, "text": text_delta(d)} for d in datas]}


def event_id_vectors() -> list[dict[str, Any]]:
    token = "AbCdEfGh0123456789_-"
    cases = [f"{token}:0", f"{token}:41", f" {token}:7 ", token, f"{token}:-1", f"{token}:-2", f"{token}:x",
             f"{token}:٣", f"{token}:" + "9" * 19, f"{token}:" + "9" * 18, "short:1", "a" * 65 + ":1",
             "bad token!12345678:1", f"{token}:", f"a:b:{token}:3", ""]
    out = []
    for value in cases:
        try:
            point = parse_event_id(value)
        except BadEventId:
            out.append({"value": value, "error": "BadEventId"})
            continue
        out.append({"value": value, "token": point.token, "after": point.after})
    return out


def build() -> dict[str, Any]:
    return {"varint": varint_vectors(), "packets": packet_vectors(), "receiver": receiver_vectors(),
            "assembler": assembler_vectors(), "control": control_vectors(), "sse": sse_vectors(),
            "codecs": codec_vectors(), "event_ids": event_id_vectors()}


def write_vectors(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, value in build().items():
        path = out / f"{name}.json"
        path.write_text(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n",
                        encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_vectors(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT):
        print(f"{written_path} ({written_path.stat().st_size} bytes)")
