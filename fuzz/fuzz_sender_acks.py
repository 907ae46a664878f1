"""Fuzz the sender's acknowledgement handler: after sending some events it is fed arbitrary ack datagrams.

A hostile receiver controls every ack field. Only ``ProtocolError``s may escape ``receive_datagram``, a refused
ack must leave the sender's state unchanged, and the sender must stay sane: the acked count only grows and
never passes what was sent, the RTT estimate and the next deadline stay finite, and every datagram it emits
decodes and fits the budget.
Run: ``python fuzz/fuzz_sender_acks.py -atheris_runs=1000000 [corpus dirs]``.
"""

from __future__ import annotations

import math
import sys

import atheris

with atheris.instrument_imports(include=["eloquent_plugins"]):
    from eloquent_plugins.core.errors import ProtocolError
    from eloquent_plugins.core.events import EventKind
    from eloquent_plugins.core.keepalive import KeepAlivePolicy
    from eloquent_plugins.core.limits import Limits
    from eloquent_plugins.core.padding import datagram_policy
    from eloquent_plugins.core.sender import EloquentSender, SenderConfig
    from eloquent_plugins.core.wire import (
        AckPacket,
        DataPacket,
        KeepAlivePacket,
        decode_packet,
        encode_packet,
    )

STREAM = 3
LIMITS = Limits(max_datagram_size=80, max_event_bytes=400, max_entries_per_packet=6, max_run_datagrams=3)
MAX_STEPS = 48
PADDINGS = (None, datagram_policy("bucket", LIMITS.max_datagram_size))
"""Unpadded, or every datagram padded to one of the bucket classes (64, 80) of this budget."""


def ack_datagram(fdp: atheris.FuzzedDataProvider, sender: EloquentSender) -> bytes:
    """Raw bytes, or an ack whose fields sit around the values that matter (sent count, packet numbers)."""
    choice = fdp.ConsumeIntInRange(0, 4)
    if choice == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
    if choice == 1:
        return encode_packet(KeepAlivePacket(STREAM, fdp.ConsumeIntInRange(0, 10)))
    if choice == 2:
        return fdp.ConsumeBytes(2) + encode_packet(AckPacket(STREAM, 0, 0, 0.0))[2:]  # odd version/type bytes
    stream = STREAM if fdp.ConsumeIntInRange(0, 7) else fdp.ConsumeIntInRange(0, (1 << 62) - 1)
    if choice == 3:
        next_expected = fdp.ConsumeIntInRange(0, (1 << 62) - 1)
        largest = fdp.ConsumeIntInRange(0, (1 << 62) - 1)
    else:
        next_expected = max(0, sender.acked + fdp.ConsumeIntInRange(-2, 6))
        largest = max(0, sender.stats.data_packets + sender.stats.keepalive_packets + fdp.ConsumeIntInRange(-8, 2))
    delay = fdp.ConsumeIntInRange(0, (1 << 62) - 1) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 50_000)
    return encode_packet(AckPacket(stream, next_expected, largest, delay / 1_000_000))


def snapshot(sender: EloquentSender) -> tuple:
    return (sender.acked, sender.unacked, sender.next_index, sender.rtt.smoothed, sender.rtt.variance,
            sender.rtt.samples, sender.stats.acks_received)


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    config = SenderConfig(limits=LIMITS, keepalive=KeepAlivePolicy(interval=float(fdp.ConsumeIntInRange(0, 2))),
                          delta=fdp.ConsumeBool(), carry_unacked=fdp.ConsumeIntInRange(0, 3) != 0,
                          copies=fdp.ConsumeIntInRange(1, 2), padding=PADDINGS[fdp.ConsumeIntInRange(0, 1)])
    sizes = config.padding.sizes() if config.padding is not None else None
    sender = EloquentSender(STREAM, config)
    now = 0.0
    previous = b"{}"
    for _ in range(MAX_STEPS):
        if fdp.remaining_bytes() == 0:
            break
        action = fdp.ConsumeIntInRange(0, 5)
        if action == 0 and not sender.ended:
            size = fdp.ConsumeIntInRange(0, 300 if fdp.ConsumeIntInRange(0, 7) == 0 else 30)
            previous = previous[: fdp.ConsumeIntInRange(0, len(previous))] + fdp.ConsumeBytes(size)
            previous = previous[: LIMITS.max_event_bytes]
            kind = EventKind(fdp.ConsumeIntInRange(0, 2)) if fdp.ConsumeIntInRange(0, 7) == 0 else EventKind.DATA
            sender.push(previous, now, kind)
        elif action <= 3:
            before = snapshot(sender)
            try:
                sender.receive_datagram(ack_datagram(fdp, sender), now)
            except ProtocolError:
                assert snapshot(sender) == before, "a refused ack changed the sender's state"
            else:
                assert sender.acked >= before[0]
        else:
            now += 0.001 * fdp.ConsumeIntInRange(0, 3000)
        assert 0 <= sender.acked <= sender.next_index
        assert sender.unacked == sender.next_index - sender.acked
        assert math.isfinite(sender.rtt.smoothed) and math.isfinite(sender.rtt.variance)
        deadline = sender.next_deadline()
        assert deadline is None or math.isfinite(deadline)
        for datagram in sender.datagrams_to_send(now):
            assert len(datagram) <= LIMITS.max_datagram_size
            assert sizes is None or len(datagram) in sizes, f"padded datagram of {len(datagram)} bytes"
            packet = decode_packet(datagram, LIMITS)
            assert isinstance(packet, (DataPacket, KeepAlivePacket)) and packet.stream_id == STREAM
            if isinstance(packet, DataPacket):
                assert packet.first_index >= sender.acked or packet.entries[0].is_fragment
                assert packet.first_index + len(packet.entries) <= sender.next_index


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
