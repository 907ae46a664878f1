"""Redundancy in the sender: the loss estimator and the copy decisions, by hand (no clock, no network model)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eloquent_plugins import EloquentReceiver, EloquentSender, EventKind, ReceiverConfig, SenderConfig
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.rtt import LossEstimator
from eloquent_plugins.core.wire import AckPacket, DataPacket, KeepAlivePacket, decode_packet, encode_packet
from tests.support.lossy_network import payloads, run_stream

NO_KEEPALIVE = KeepAlivePolicy(interval=0.0)


def _sender(**kw: object) -> EloquentSender:
    return EloquentSender(0, SenderConfig(keepalive=NO_KEEPALIVE, **kw))  # type: ignore[arg-type]


def _numbers(datagrams: list[bytes]) -> list[int]:
    return [decode_packet(d).packet_number for d in datagrams]  # type: ignore[union-attr]


def _ack(sender: EloquentSender, largest: int, now: float = 0.1) -> None:
    """The ack a receiver holding everything sent so far would send for packet ``largest``."""
    sender.receive_ack(AckPacket(0, sender.next_index, largest, 0.0), now)


# ---- the estimator ------------------------------------------------------------------------------------------
def test_estimator_starts_clean_and_counts() -> None:
    est = LossEstimator(gain=1 / 16)
    assert est.rate == 0.0
    est.on_ack(0)
    assert est.rate == 0.0 and (est.delivered, est.lost) == (1, 0)
    est.on_ack(1)  # one lost (sample 1), then the reported one (sample 0)
    assert est.rate == pytest.approx((1 / 16) * (15 / 16))
    assert (est.delivered, est.lost) == (2, 1)


@given(gaps=st.lists(st.integers(0, 6), max_size=40), gain=st.sampled_from([1 / 4, 1 / 16, 1 / 64, 1.0]))
def test_estimator_equals_the_per_packet_ewma(gaps: list[int], gain: float) -> None:
    est, rate = LossEstimator(gain=gain), 0.0
    for lost in gaps:
        est.on_ack(lost)
        for sample in [1.0] * lost + [0.0]:
            rate = (1 - gain) * rate + gain * sample
        assert est.rate == pytest.approx(rate, abs=1e-12)
        assert 0.0 <= est.rate < 1.0


def test_estimator_decays_on_a_clean_path() -> None:
    est = LossEstimator(gain=1 / 16)
    est.on_ack(3)
    peak = est.rate
    for n in range(1, 60):
        est.on_ack(0)
        assert est.rate == pytest.approx(peak * (15 / 16) ** n)
    assert est.rate < 0.01


def test_estimator_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        LossEstimator(gain=0.0)
    with pytest.raises(ValueError):
        LossEstimator(gain=1.5)
    with pytest.raises(ValueError):
        LossEstimator().on_ack(-1)


# ---- configuration ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["on", "", 0, -1, True, 1.5, None])
def test_config_rejects_bad_redundancy(bad: object) -> None:
    with pytest.raises(ValueError):
        SenderConfig(redundancy=bad)  # type: ignore[arg-type]


def test_config_rejects_bad_thresholds() -> None:
    with pytest.raises(ValueError):
        SenderConfig(redundancy_threshold=-0.1)
    with pytest.raises(ValueError):
        SenderConfig(loss_gain=0.0)


def test_default_is_off() -> None:
    assert SenderConfig().redundancy == "off"


# ---- copy decisions -----------------------------------------------------------------------------------------
def test_off_sends_one_datagram_per_flush_whatever_the_loss() -> None:
    sender = _sender()
    sender.push(b"a", 0.0)
    assert _numbers(sender.datagrams_to_send(0.0)) == [0]
    sender.push(b"b", 0.03)
    sender.push(b"c", 0.03)
    assert _numbers(sender.datagrams_to_send(0.03)) == [1]
    sender.push(b"d", 0.06)
    assert _numbers(sender.datagrams_to_send(0.06)) == [2]
    _ack(sender, 2)  # packets 0 and 1 unreported: the path loses, but "off" still sends one copy
    assert sender.loss_rate > 0.1
    sender.push(b"e", 0.2)
    assert len(sender.datagrams_to_send(0.2)) == 1 and sender.stats.redundant_packets == 0


def test_fixed_copies_are_the_same_packet_under_fresh_numbers() -> None:
    sender = _sender(redundancy=3)
    sender.push(b"hello", 0.0)
    out = sender.datagrams_to_send(0.0)
    packets = [decode_packet(d) for d in out]
    assert [p.packet_number for p in packets] == [0, 1, 2]  # type: ignore[union-attr]
    assert all(isinstance(p, DataPacket) for p in packets)
    assert len({p.entries for p in packets}) == 1  # type: ignore[union-attr]
    assert sender.stats.data_packets == 3 and sender.stats.redundant_packets == 2
    assert sender.stats.bytes_sent == sum(map(len, out))


def test_adaptive_doubles_only_while_loss_is_seen() -> None:
    sender = _sender(redundancy="adaptive", redundancy_threshold=0.01, loss_gain=1 / 16)
    now, largest = 0.0, -1
    # a clean path: every packet acked, one copy per flush
    for i in range(5):
        sender.push(b"t%d" % i, now)
        numbers = _numbers(sender.datagrams_to_send(now))
        assert numbers == [largest + 1]
        largest = numbers[0]
        _ack(sender, largest, now + 0.01)
        now += 0.03
    assert sender.loss_rate == 0.0 and sender.copies_now() == 1
    # one packet goes unreported: the next ack skips it, and the next flush goes twice
    sender.push(b"lost", now)
    lost = _numbers(sender.datagrams_to_send(now))[0]
    sender.push(b"next", now + 0.03)
    nxt = _numbers(sender.datagrams_to_send(now + 0.03))[0]
    _ack(sender, nxt, now + 0.05)
    assert nxt == lost + 1 and sender.loss.lost == 1
    assert sender.copies_now() == 2
    now += 0.06
    sender.push(b"x", now)
    pair = _numbers(sender.datagrams_to_send(now))
    assert pair == [nxt + 1, nxt + 2] and sender.stats.redundant_packets == 1
    # both copies acked, and then a clean path: the estimate decays below the threshold and copies stop
    largest = pair[-1]
    _ack(sender, pair[0], now + 0.01)
    _ack(sender, pair[1], now + 0.01)
    flushes = 0
    while sender.copies_now() == 2:
        now += 0.03
        sender.push(b"y", now)
        numbers = _numbers(sender.datagrams_to_send(now))
        assert numbers == [largest + 1, largest + 2]
        for number in numbers:
            _ack(sender, number, now + 0.01)
        largest = numbers[-1]
        flushes += 1
        assert flushes < 100
    assert sender.loss_rate < 0.01
    sender.push(b"z", now + 0.03)
    assert len(sender.datagrams_to_send(now + 0.03)) == 1


def test_a_lost_first_copy_is_not_counted_when_the_second_is_reported_as_the_skip() -> None:
    # Copies each take a number, so the estimator sees the raw path: one of two copies lost is one loss.
    sender = _sender(redundancy=2)
    sender.push(b"a", 0.0)
    _first, second = _numbers(sender.datagrams_to_send(0.0))
    _ack(sender, second)
    assert (sender.loss.lost, sender.loss.delivered) == (1, 1)


def test_keepalives_and_stale_acks_are_not_loss_samples() -> None:
    sender = EloquentSender(0, SenderConfig(keepalive=KeepAlivePolicy(interval=1.0)))
    sender.push(b"a", 0.0)
    assert _numbers(sender.datagrams_to_send(0.0)) == [0]
    _ack(sender, 0, 0.05)
    keepalive = sender.datagrams_to_send(1.1)
    assert isinstance(decode_packet(keepalive[0]), KeepAlivePacket)
    sender.push(b"b", 1.2)
    assert _numbers(sender.datagrams_to_send(1.2)) == [2]
    _ack(sender, 2, 1.25)  # number 1 was the keep-alive: receivers never ack those
    assert sender.loss.lost == 0 and sender.loss.delivered == 2
    sender.receive_ack(AckPacket(0, sender.next_index, 0, 0.0), 1.3)  # an old ack arriving late
    assert sender.loss.delivered == 2


def test_probes_are_sent_with_the_same_redundancy() -> None:
    sender = _sender(redundancy=2)
    sender.push(b"a", 0.0)
    sender.datagrams_to_send(0.0)
    deadline = sender.next_deadline()
    assert deadline is not None
    probe = sender.datagrams_to_send(deadline)
    assert _numbers(probe) == [2, 3] and sender.stats.probe_packets == 2


def test_split_run_fast_recovery_fires_on_a_copy_of_the_last_datagram() -> None:
    limits = Limits(max_datagram_size=200, max_run_datagrams=8)
    sender = EloquentSender(0, SenderConfig(limits=limits, keepalive=NO_KEEPALIVE, delta=False, redundancy=2))
    for i in range(6):
        sender.push(bytes([65 + i]) * 120, 0.0)
    numbers = _numbers(sender.datagrams_to_send(0.0))
    assert len(numbers) == 12  # six originals, then their six copies
    # the receiver got only the copy of the last datagram: it lacks the run's start, resend at once
    sender.receive_ack(AckPacket(0, 0, numbers[-1], 0.0), 0.1)
    assert _numbers(sender.datagrams_to_send(0.1))[:1] == [12]


def test_duplication_baseline_is_unchanged() -> None:
    sender = _sender(carry_unacked=False, copies=2)
    sender.push(b"a", 0.0)
    first = sender.datagrams_to_send(0.0)
    assert len(first) == 2 and first[0] == first[1]
    sender.push(b"b", 0.03)
    second = sender.datagrams_to_send(0.03)
    packet = decode_packet(second[0])
    assert isinstance(packet, DataPacket) and [e.index for e in packet.entries] == [1]
    assert sender.stats.redundant_packets == 0


@given(drop=st.lists(st.booleans(), min_size=2, max_size=2), mode=st.sampled_from(["adaptive", 2, 3]))
def test_any_surviving_copy_delivers_exactly_once(drop: list[bool], mode: object) -> None:
    sender = _sender(redundancy=mode)
    receiver = EloquentReceiver(0, ReceiverConfig())
    delivered = []
    for i, payload in enumerate([b"one", b"two", b"three"]):
        sender.push(payload, i * 0.03)
        if i == 2:
            sender.end(i * 0.03)
        out = sender.datagrams_to_send(i * 0.03)
        for j, datagram in enumerate(out):
            if j < len(drop) and drop[j] and j < len(out) - 1:
                continue  # lose some copies, never all of them
            delivered += receiver.receive_datagram(datagram, i * 0.03 + 0.01)
            for ack in receiver.datagrams_to_send(i * 0.03 + 0.01):
                sender.receive_datagram(ack, i * 0.03 + 0.02)
    assert [e.payload for e in delivered] == [b"one", b"two", b"three", b""]
    assert receiver.complete and sender.done


def test_encode_round_trip_of_a_copy_keeps_every_field_but_the_number() -> None:
    sender = _sender(redundancy=2)
    sender.push(b'{"a":1}', 0.0)
    sender.datagrams_to_send(0.0)
    _ack(sender, 1)
    sender.push(b'{"a":2}', 0.03)
    original, copy = (decode_packet(d) for d in sender.datagrams_to_send(0.03))
    assert isinstance(original, DataPacket) and isinstance(copy, DataPacket)
    assert encode_packet(copy) == encode_packet(
        DataPacket(original.stream_id, copy.packet_number, original.ref_index, original.first_index,
                   original.entries))


# ---- cadence probes -----------------------------------------------------------------------------------------
def _lossy_sender(**kw: object) -> tuple[EloquentSender, int]:
    """A sender with a 300 ms RTT that has seen two losses while pushing every 30 ms; returns it at 0.36 s, just
    after its newest push, with the number of its newest packet."""
    sender = _sender(redundancy_threshold=0.01, initial_rtt=0.3, **kw)
    for i in range(13):
        now = i * 0.03
        if i == 12:
            _ack(sender, 2, now)  # packet 2 (sent at 0.06 s) reported 300 ms later, 0 and 1 never
        sender.push(b"t%d" % i, now)
        largest = _numbers(sender.datagrams_to_send(now))[0]
    assert sender.loss_rate >= 0.01 and sender.rtt.smoothed == pytest.approx(0.3)
    return sender, largest


def test_cadence_probes_follow_the_token_cadence_until_a_pto() -> None:
    sender, largest = _lossy_sender(cadence_probes=True)
    deadline = sender.next_deadline()
    assert deadline == pytest.approx(0.36 + 1.5 * 0.03)
    times = []
    while deadline is not None and deadline < 0.36 + sender.rtt.probe_timeout(0.005):
        out = sender.datagrams_to_send(deadline)
        assert _numbers(out) == [largest + 1]
        largest += 1
        times.append(deadline)
        deadline = sender.next_deadline()
    assert len(times) >= 3 and all(b - a == pytest.approx(0.045) for a, b in itertools.pairwise(times))
    assert sender._pto_count == 0  # cadence probes leave the PTO backoff alone
    # past one PTO after the newest event left, only the ordinary (backed-off) probe timer remains
    assert deadline == pytest.approx(times[-1] + sender.rtt.probe_timeout(0.005))


def test_cadence_probes_need_observed_loss_and_the_option() -> None:
    off, _ = _lossy_sender()
    assert off.next_deadline() == pytest.approx(0.36 + off.rtt.probe_timeout(0.005))
    clean = _sender(cadence_probes=True, initial_rtt=0.3)
    for i in range(3):
        clean.push(b"t%d" % i, i * 0.03)
        clean.datagrams_to_send(i * 0.03)
    assert clean.loss_rate == 0.0
    assert clean.next_deadline() == pytest.approx(0.06 + clean.rtt.probe_timeout(0.005))


def test_cadence_probes_stop_when_the_run_is_acked() -> None:
    sender, largest = _lossy_sender(cadence_probes=True)
    _ack(sender, largest, 0.1)
    assert sender.unacked == 0 and sender.next_deadline() is None


# ---- the guarantees, with redundancy on ---------------------------------------------------------------------
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=st.lists(payloads, max_size=20), budget=st.sampled_from([128, 1200]),
       mode=st.sampled_from(["adaptive", 2]), cadence=st.booleans(), data=st.data())
def test_redundant_sender_delivers_exactly_once(events: list[bytes], budget: int, mode: object, cadence: bool,
                                                data: st.DataObject) -> None:
    limits = Limits(max_datagram_size=budget, max_run_datagrams=4)
    run_stream(events, EventKind.END, data,
               SenderConfig(limits=limits, keepalive=KeepAlivePolicy(0.5), redundancy=mode,  # type: ignore[arg-type]
                            cadence_probes=cadence),
               ReceiverConfig(limits=limits), 0.03)
