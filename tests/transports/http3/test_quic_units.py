"""Sans-I/O pieces of the HTTP/3 front end: datagram admission, control records, scheme selection, certs."""

from __future__ import annotations

import datetime
import os
import stat

import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError, DecodeError, LimitExceeded
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.control import ControlParser, Fallback, StreamDigest, Trailer
from eloquent_plugins.core.scheme import Scheme, scheme_for, sender_config_for
from eloquent_plugins.transports.http3.datagram_queue import DatagramQueue
from eloquent_plugins.transports.http3.certs import (
    dev_certificate,
    generate_dev_certificate,
    resolve_certificate,
)
from eloquent_plugins.core.control import encode_fallback, encode_trailer
from eloquent_plugins.core.scheme import UnknownScheme


def test_queue_supersedes_a_parked_eloquent_run_and_serves_streams_round_robin() -> None:
    q = DatagramQueue()
    q.put(0, [b"a1", b"a2", b"a3"], supersede=True)
    q.put(4, [b"b1"], supersede=True)
    assert q.take(4) == [(0, b"a1"), (4, b"b1")]
    q.put(0, [b"A1", b"A2"], supersede=True)  # a newer run replaces what was parked (a2, a3)
    assert q.stats.superseded == 2
    assert q.take(100) == [(0, b"A1"), (0, b"A2")]
    assert not q and q.pending() == 0


def test_queue_appends_duplication_runs_and_bounds_them() -> None:
    q = DatagramQueue(max_pending=3)
    q.put(0, [b"1", b"1"], supersede=False)
    q.put(0, [b"2", b"2"], supersede=False)
    assert q.pending(0) == 3 and q.stats.dropped == 1
    assert [d for _, d in q.take(10)] == [b"1", b"2", b"2"]


def test_queue_always_releases_one_datagram_even_over_budget() -> None:
    q = DatagramQueue()
    q.put(0, [b"x" * 500, b"y"], supersede=True)
    assert q.take(10) == [(0, b"x" * 500)]
    q.discard(0)
    assert q.take(10) == []


def test_control_records_round_trip_in_any_split() -> None:
    final = StreamEvent(2, b"", EventKind.END)
    digest = StreamDigest.of([b"a", b"b", b""])
    data = encode_fallback([StreamEvent(1, b"b")]) + encode_trailer(Trailer(3, digest, final))
    parser = ControlParser()
    records = [r for i in range(len(data)) for r in parser.feed(data[i:i + 1])]
    parser.close()
    assert records == [Fallback((StreamEvent(1, b"b"),)), Trailer(3, digest, final)]


def test_digest_is_length_prefixed() -> None:
    assert StreamDigest.of([b"ab", b""]) != StreamDigest.of([b"a", b"b"])


@pytest.mark.parametrize("line", [b"nope\n", b"[]\n", b'{"type":"x"}\n', b'{"type":"trailer","count":0}\n',
                                  (b'{"type":"trailer","count":2,"sha256":"x","final":{"index":0,"kind":"end",'
                                   b'"payload":""}}\n'),
                                  b'{"type":"fallback","events":[{"index":-1,"kind":"data","payload":""}]}\n',
                                  b'{"type":"fallback","events":[{"index":1,"kind":"data","payload":"%%"}]}\n'])
def test_bad_control_records_are_typed_errors(line: bytes) -> None:
    with pytest.raises(DecodeError):
        ControlParser().feed(line)


def test_control_record_size_and_truncation() -> None:
    parser = ControlParser(max_record_bytes=10)
    with pytest.raises(LimitExceeded):
        parser.feed(b"x" * 20)
    parser = ControlParser()
    parser.feed(b'{"type":')
    with pytest.raises(DecodeError):
        parser.close()


def test_scheme_selection() -> None:
    assert scheme_for([]) is Scheme.STREAM
    assert scheme_for([(b"eloquent-transport", b"datagram")]) is Scheme.ELOQUENT
    assert scheme_for([(b"eloquent-transport", b"datagram"), (b"eloquent-scheme", b"duplicate")]) is \
        Scheme.DUPLICATE
    assert scheme_for([(b"eloquent-scheme", b"duplicate")]) is Scheme.STREAM  # datagrams were not asked for
    with pytest.raises(UnknownScheme):
        scheme_for([(b"eloquent-transport", b"datagram"), (b"eloquent-scheme", b"smoke")])
    dup = sender_config_for(Scheme.DUPLICATE, limits=Limits(), keepalive=KeepAlivePolicy(5))
    assert (dup.carry_unacked, dup.copies, dup.keepalive.interval) == (False, 2, 5)
    assert sender_config_for(Scheme.ELOQUENT, limits=Limits(), keepalive=KeepAlivePolicy()).carry_unacked


def test_dev_certificate_is_cached_and_renewed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ELOQUENT_CACHE_DIR", str(tmp_path / "cache"))
    first = dev_certificate()
    assert first.certfile.parent == tmp_path / "cache"
    assert stat.S_IMODE(os.stat(first.keyfile).st_mode) == 0o600
    again = dev_certificate()
    assert again.certfile.read_bytes() == first.certfile.read_bytes()  # cached, not regenerated
    first.certfile.write_text("garbage")
    renewed = dev_certificate()
    assert b"BEGIN CERTIFICATE" in renewed.certfile.read_bytes()

    from cryptography import x509
    cert = x509.load_pem_x509_certificate(renewed.certfile.read_bytes())
    # ECDSA P-256 for under 14 days: what browsers accept by hash (docs/BROWSER.md); renewed with 2 days left.
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=12)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=14)


def test_configured_certificate_must_exist(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        resolve_certificate(str(tmp_path / "missing.pem"), None)
    with pytest.raises(ConfigError):
        resolve_certificate(None, str(tmp_path / "key.pem"))
    pair = generate_dev_certificate(tmp_path)
    assert resolve_certificate(str(pair.certfile), str(pair.keyfile)) == pair


def test_scheduler_sends_a_pushed_stream_directly_and_leaves_the_rest_to_plan() -> None:
    """``direct`` (the token's packet before any bookkeeping) gives exactly what ``plan`` would have released, and
    declines -- so ``plan`` keeps its order and window rules -- when something is parked, the window is full, the
    run does not fit, or the stream is due for its fallback."""
    from eloquent_plugins.core.response_stream import EloquentResponseStream
    from eloquent_plugins.core.sender import SenderConfig
    from eloquent_plugins.transports.http3.scheduler import DatagramScheduler

    def stream(stream_id: int) -> EloquentResponseStream:
        s = EloquentResponseStream(stream_id, SenderConfig(), now=0.0)
        s.feed_body(b"data: hello\n\n", 0.0)
        return s

    sched = DatagramScheduler(probe_size=1200)
    sched.add(stream(0))
    twin = stream(0)  # the same events on another scheduler: what plan releases
    other = DatagramScheduler(probe_size=1200)
    other.add(twin)
    sent = sched.direct(0, 0.0, 10_000)
    assert sent is not None and sent == other.plan(0.0, 10_000, transport_queue_empty=True).datagrams
    assert sched.direct(0, 0.0, 10_000) == []  # nothing new: nothing sent twice
    assert sched.direct(4, 0.0, 10_000) is None  # not one of its streams

    tight = DatagramScheduler(probe_size=1200)
    tight.add(stream(0))
    assert tight.direct(0, 0.0, 0) is None  # no room: plan decides (probes may exceed the window)
    assert tight.direct(0, 0.0, 5) is None and tight.queue.pending(0) == 1  # over the room: parked, as plan does
    tight.add(stream(4))
    assert tight.direct(4, 0.0, 10_000) is None  # another stream's run is parked: plan serves them in turn
    assert [sid for sid, _ in tight.plan(0.0, 10_000, transport_queue_empty=True).datagrams] == [0, 4]

    ended = DatagramScheduler(probe_size=1200)
    s = stream(0)
    s.finish(0.0)
    ended.add(s)
    assert ended.direct(0, s.fallback_after, 10_000) is None  # never acked after the trailer: the fallback goes
    assert [step.kind.value for step in ended.plan(s.fallback_after, 10_000, transport_queue_empty=True).steps] == [
        "fallback"]


def test_a_send_the_full_window_keeps_back_wakes_the_plan_at_a_pace_not_every_turn() -> None:
    """With the window full and aioquic still holding datagrams, plan cannot serve a stream whose send is due; the
    deadline stays in the past. The pump must not set its timer there (it re-ran the plan on every turn of the
    loop, about every 0.5 ms, while aioquic held a datagram): ``wake_at`` says ``BLOCKED_RETRY`` later, and the
    plain next deadline once nothing due is left."""
    from eloquent_plugins.core.response_stream import EloquentResponseStream
    from eloquent_plugins.core.sender import SenderConfig
    from eloquent_plugins.transports.http3.scheduler import BLOCKED_RETRY, DatagramScheduler

    sched = DatagramScheduler(probe_size=1200)
    s = EloquentResponseStream(0, SenderConfig(), now=0.0)
    s.feed_body(b"data: hello\n\n", 0.0)
    sched.add(s)
    assert sched.plan(0.0, 10_000, transport_queue_empty=True).datagrams  # sent, never acked
    due = sched.next_deadline()
    assert due is not None and due < 1.0, "its probe (the unacked run again) is due soon"
    at = due + 0.001
    blocked = sched.plan(at, 0, transport_queue_empty=False)  # no room, aioquic's queue not empty: no probe
    assert not blocked.datagrams and not blocked.probe and not blocked.steps
    assert sched.next_deadline() == due, "still due: nothing could go"
    assert sched.wake_at(at) == at + BLOCKED_RETRY
    served = sched.plan(at + 0.001, 10_000, transport_queue_empty=True)  # the ack opened the window
    assert served.datagrams
    after = sched.next_deadline()
    assert after is None or after > at + 0.001
    assert sched.wake_at(at + 0.001) == after, "nothing left past due: the plain next deadline"


def test_the_fallback_clock_waits_for_the_path_to_deliver_after_the_trailer() -> None:
    """A stream whose transport confirms its path falls back ``fallback_after`` after the peer acknowledged a
    packet sent after its trailer, not after the trailer itself: while the path is down (or its queue holds
    seconds) the record would wait behind the same window in several packets, in order, where each probe carries
    the whole run in one. Without confirmation the clock starts at the trailer, as before."""
    from eloquent_plugins.core.response_stream import EloquentResponseStream
    from eloquent_plugins.core.sender import SenderConfig
    from eloquent_plugins.transports.http3.scheduler import DatagramScheduler

    def trailed(confirm: bool) -> tuple[DatagramScheduler, EloquentResponseStream]:
        s = EloquentResponseStream(0, SenderConfig(), now=0.0, confirm_path=confirm)
        s.feed_body(b"data: hello\n\n", 0.0)
        s.finish(0.0)
        sched = DatagramScheduler(probe_size=1200)
        sched.add(s)
        return sched, s

    def steps(sched: DatagramScheduler, now: float, next_packet: int, acked: int) -> list[str]:
        sched.note_path(now, next_packet, acked)
        return [step.kind.value for step in sched.plan(now, 10_000, transport_queue_empty=True).steps]

    sched, s = trailed(confirm=True)
    after = s.fallback_after
    assert steps(sched, 0.0, 40, 30) == []  # the mark: packet 40, the first after the trailer
    assert s.awaiting_path and s.next_deadline() is not None  # probes still due; no fallback deadline yet
    assert steps(sched, 5 * after, 60, 39) == [], "acks of packets before the trailer: the path not yet shown"
    assert steps(sched, 6 * after, 70, 40) == [] and not s.awaiting_path  # packet 40 acked: the clock starts
    assert steps(sched, 7 * after - 0.001, 80, 75) == []
    assert steps(sched, 7 * after, 90, 85) == ["fallback"]

    plain, p = trailed(confirm=False)
    assert not p.awaiting_path
    assert steps(plain, after, 40, 30) == ["fallback"], "unconfirmed streams: the trailer starts the clock"
