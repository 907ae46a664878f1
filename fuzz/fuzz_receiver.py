"""Fuzz the receiver with arbitrary datagram sequences, and an honest sender over a hostile network path.

Two kinds of input, picked by the first byte:

* hostile peer: a sequence of datagrams, raw or built from fuzzed fields (so the fuzzer gets past the decoder
  into deltas, fragments, gaps and final events). Only ``ProtocolError``s may escape; the receiver must deliver
  indices 0, 1, 2, ... in order, each once, nothing after a final event, and ack what it delivered.
* hostile path: a real ``EloquentSender`` whose datagrams and acks the fuzzer drops, duplicates, reorders and
  delays. Nothing may raise, the receiver must deliver exactly the sender's events, and once the path turns
  clean the stream must complete. Optionally the fuzzer also injects forged datagrams; then only typed errors
  and ordering are checked (without QUIC's AEAD a forged packet is indistinguishable from a real one).

Run: ``python fuzz/fuzz_receiver.py -atheris_runs=1000000 [corpus dirs]``.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["eloquent_plugins"]):
    from eloquent_plugins.core.errors import ProtocolError
    from eloquent_plugins.core.events import EventKind, StreamEvent
    from eloquent_plugins.core.keepalive import KeepAlivePolicy
    from eloquent_plugins.core.limits import Limits
    from eloquent_plugins.core.receiver import EloquentReceiver, ReceiverConfig
    from eloquent_plugins.core.sender import EloquentSender, SenderConfig
    from eloquent_plugins.core.wire import (
        AckPacket,
        DataPacket,
        Entry,
        KeepAlivePacket,
        decode_packet,
        encode_packet,
    )

STREAM = 5
LIMITS = Limits(max_datagram_size=96, max_event_bytes=600, max_entries_per_packet=8, max_index_gap=64,
                max_buffered_bytes=4096, max_run_datagrams=4)
MAX_STEPS = 64


class Checker:
    """Asserts the receiver's delivery contract over everything it returned so far."""

    def __init__(self, receiver: EloquentReceiver, expected: list[StreamEvent] | None) -> None:
        self.receiver = receiver
        self.expected = expected
        self.delivered: list[StreamEvent] = []

    def take(self, events: list[StreamEvent]) -> None:
        for event in events:
            assert event.index == len(self.delivered), f"out of order: {event.index} after {len(self.delivered)}"
            assert not (self.delivered and self.delivered[-1].final), "event after the final event"
            self.delivered.append(event)
            if self.expected is not None:
                assert event.index < len(self.expected), "delivered an event never sent"
                assert event == self.expected[event.index], (event, self.expected[event.index])
        r = self.receiver
        assert r.next_expected == len(self.delivered)
        assert r.complete == bool(self.delivered and self.delivered[-1].final)
        # Internal bookkeeping (private, on purpose): the out-of-order buffer holds only undelivered events and
        # its byte count is exact, so buffered bytes cannot leak on a long stream.
        assert all(i >= r.next_expected for i in r._buffer), sorted(r._buffer)
        assert r._buffered_bytes == sum(len(p) for _, p in r._buffer.values())

    def check_ack(self, now: float) -> None:
        for datagram in self.receiver.datagrams_to_send(now):
            ack = decode_packet(datagram, LIMITS)
            assert isinstance(ack, AckPacket) and ack.stream_id == STREAM
            assert ack.next_expected == self.receiver.next_expected


def forged_datagram(fdp: atheris.FuzzedDataProvider, near: int) -> bytes:
    """Raw bytes, or a packet built from fuzzed fields around index ``near`` (mostly well-formed)."""
    choice = fdp.ConsumeIntInRange(0, 3)
    if choice == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 128))
    if choice == 1:
        return encode_packet(KeepAlivePacket(STREAM if fdp.ConsumeBool() else 6, fdp.ConsumeIntInRange(0, 300)))
    first = max(0, near + fdp.ConsumeIntInRange(-4, 8))
    ref = None
    if fdp.ConsumeBool() and first > 0:
        ref = max(0, first - fdp.ConsumeIntInRange(1, 6))
    entries = []
    count = fdp.ConsumeIntInRange(1, 4)
    for i in range(count):
        kind = EventKind(fdp.ConsumeIntInRange(0, 2))
        middle = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24))
        shape = fdp.ConsumeIntInRange(0, 2)
        if shape == 1:
            entries.append(Entry(first + i, kind, middle, True, fdp.ConsumeIntInRange(0, 20),
                                 fdp.ConsumeIntInRange(0, 20)))
        elif shape == 2 and count == 1 and middle:
            total = len(middle) + fdp.ConsumeIntInRange(0, 40)
            entries.append(Entry(first, kind, middle, frag_total=total,
                                 frag_offset=fdp.ConsumeIntInRange(0, total - len(middle))))
        else:
            entries.append(Entry(first + i, kind, middle))
    if choice == 3 and fdp.ConsumeBool():
        ref = None
    return encode_packet(DataPacket(STREAM, fdp.ConsumeIntInRange(0, 300), ref, first, tuple(entries)))


def hostile_peer(fdp: atheris.FuzzedDataProvider) -> None:
    receiver = EloquentReceiver(STREAM, ReceiverConfig(LIMITS, ack_delay=0.01 * fdp.ConsumeIntInRange(0, 2)))
    check = Checker(receiver, None)
    now = 0.0
    for _ in range(MAX_STEPS):
        if fdp.remaining_bytes() == 0:
            break
        now += 0.001 * fdp.ConsumeIntInRange(0, 20)
        try:
            check.take(receiver.receive_datagram(forged_datagram(fdp, receiver.next_expected), now))
        except ProtocolError:
            return  # the transport closes the connection here
        check.check_ack(now)


def payload(fdp: atheris.FuzzedDataProvider, previous: bytes) -> bytes:
    """An engine-like event: mostly a small edit of the previous one (so deltas apply), sometimes large."""
    shape = fdp.ConsumeIntInRange(0, 7)
    if shape == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 500))  # large: fragmented on a 96-byte budget
    if shape == 1 or not previous:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
    cut = fdp.ConsumeIntInRange(0, len(previous))
    return previous[:cut] + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 6)) + previous[cut + 1:]


def hostile_path(fdp: atheris.FuzzedDataProvider) -> None:
    config = SenderConfig(limits=LIMITS, keepalive=KeepAlivePolicy(interval=0.5 * fdp.ConsumeIntInRange(0, 2)),
                          delta=fdp.ConsumeIntInRange(0, 3) != 0, carry_unacked=fdp.ConsumeIntInRange(0, 3) != 0,
                          copies=fdp.ConsumeIntInRange(1, 2), initial_rtt=0.05)
    sender = EloquentSender(STREAM, config)
    receiver = EloquentReceiver(STREAM, ReceiverConfig(LIMITS, ack_delay=0.005 * fdp.ConsumeIntInRange(0, 2)))
    sent: list[StreamEvent] = []
    check = Checker(receiver, sent)
    to_receiver: list[bytes] = []
    to_sender: list[bytes] = []
    now = 0.0
    forged = False

    def pump() -> None:
        for datagram in sender.datagrams_to_send(now):
            assert len(datagram) <= LIMITS.max_datagram_size
            to_receiver.append(datagram)
        to_sender.extend(receiver.datagrams_to_send(now))

    for _ in range(MAX_STEPS):
        if fdp.remaining_bytes() == 0:
            break
        action = fdp.ConsumeIntInRange(0, 9)
        if action <= 1 and not sender.ended:
            previous = sent[-1].payload if sent else b""
            if fdp.ConsumeIntInRange(0, 9) == 0:
                kind = EventKind.END if fdp.ConsumeBool() else EventKind.ERROR
            else:
                kind = EventKind.DATA
            sent.append(sender.push(payload(fdp, previous), now, kind))
        elif action <= 4 and to_receiver:
            # Deliver any in-flight datagram (reordering); keep it in flight sometimes (duplication).
            i = fdp.ConsumeIntInRange(0, len(to_receiver) - 1)
            datagram = to_receiver[i] if fdp.ConsumeIntInRange(0, 3) == 0 else to_receiver.pop(i)
            try:
                check.take(receiver.receive_datagram(datagram, now))
            except ProtocolError:
                assert forged, "an honest sender's datagram was refused"
                return
        elif action <= 6 and to_sender:
            i = fdp.ConsumeIntInRange(0, len(to_sender) - 1)
            try:
                sender.receive_datagram(to_sender.pop(i), now)
            except ProtocolError:
                # Acks for forged packets (numbers or events the sender never sent) are refused, rightly.
                assert forged, "the sender refused an honest receiver's ack"
                return
        elif action == 7:
            # Loss: drop a datagram in either direction.
            queue = to_receiver if fdp.ConsumeBool() else to_sender
            if queue:
                queue.pop(fdp.ConsumeIntInRange(0, len(queue) - 1))
        elif action == 8 and fdp.ConsumeIntInRange(0, 3) == 0:
            forged = True
            check.expected = None
            try:
                check.take(receiver.receive_datagram(forged_datagram(fdp, receiver.next_expected), now))
            except ProtocolError:
                return
        else:
            now += 0.01 * fdp.ConsumeIntInRange(0, 100)
            sender.handle_timer(now)
        pump()

    if forged:
        return
    # The path turns clean: everything the sender sends arrives, in order. An ended stream must complete.
    to_receiver.clear()
    to_sender.clear()
    if not sender.ended:
        sent.append(sender.end(now))
    # Bounded by simulated time, not by a few rounds: a datagram the path held for seconds is a valid RTT sample
    # (RFC 9002), so the tail probe may come only after PTO = srtt + 4 rttvar, minutes in the worst case here.
    for _ in range(5000):
        if receiver.complete and sender.done:
            break
        deadline = sender.next_deadline()
        if deadline is not None:
            now = max(now, deadline)
        now += 0.001
        for datagram in sender.datagrams_to_send(now):
            check.take(receiver.receive_datagram(datagram, now))
        for ack in receiver.datagrams_to_send(now + 1.0):
            sender.receive_datagram(ack, now)
    assert receiver.complete and sender.done, (receiver.next_expected, len(sent), sender.acked)
    assert len(check.delivered) == len(sent)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        hostile_peer(fdp)
    else:
        hostile_path(fdp)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
