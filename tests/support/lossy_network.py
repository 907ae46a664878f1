"""The real sender and receiver through an adversarial network drawn by hypothesis (loss, duplication,
reordering, delay), on a virtual clock: shared by the property tests and the redundancy tests."""

from __future__ import annotations

import heapq
import itertools

from hypothesis import strategies as st

from eloquent_plugins import EloquentReceiver, EloquentSender, EventKind, ReceiverConfig, SenderConfig
from eloquent_plugins.core.wire import DataPacket, decode_packet

LOSSY_UNTIL = 5.0
"""Virtual seconds of adversarial network; afterwards the path is clean so every stream must complete."""

payloads = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda n, t: b'{"id":"chatcmpl-1","choices":[{"delta":{"content":"%s"}}]}' % (t * n), st.integers(0, 5),
              st.sampled_from([b"a", b" the", b"\\n", b"\xc3\xa9"])),
    st.binary(min_size=200, max_size=3000),
)


def run_stream(events: list[bytes], final: EventKind, data: st.DataObject, sender_config: SenderConfig,
               receiver_config: ReceiverConfig, tpot: float) -> None:
    sender = EloquentSender(7, sender_config)
    receiver = EloquentReceiver(7, receiver_config)
    seq = itertools.count()
    network: list[tuple[float, int, str, bytes]] = []
    delivered = []
    pushes = [(i * tpot, payload) for i, payload in enumerate(events)]
    end_at = len(events) * tpot
    ended = False

    def transmit(now: float, direction: str, datagrams: list[bytes]) -> None:
        for datagram in datagrams:
            copies = 1
            if now < LOSSY_UNTIL:
                fate = data.draw(st.sampled_from(["ok", "ok", "lose", "dup", "late"]), label="fate")
                copies = {"lose": 0, "dup": 2}.get(fate, 1)
                delay = data.draw(st.floats(0.0, 0.4), label="delay") if fate == "late" else 0.02
            else:
                delay = 0.02
            for _ in range(copies):
                heapq.heappush(network, (now + delay, next(seq), direction, datagram))

    now = 0.0
    for _step in range(200_000):
        candidates = [t for t in (pushes[0][0] if pushes else None, None if ended or pushes else end_at,
                                  network[0][0] if network else None, sender.next_deadline(),
                                  receiver.next_deadline()) if t is not None]
        if receiver.complete and sender.done and not network:
            break
        assert candidates, "nothing scheduled but the stream is not complete: the protocol stalled"
        now = max(now, min(candidates))
        while pushes and pushes[0][0] <= now:
            sender.push(pushes.pop(0)[1], now)
        if not pushes and not ended and now >= end_at:
            (sender.end(now, b"[DONE]") if final is EventKind.END else sender.fail(b'{"error":"x"}', now))
            ended = True
        while network and network[0][0] <= now:
            _, _, direction, datagram = heapq.heappop(network)
            if direction == "down":
                before = receiver.next_expected
                got = receiver.receive_datagram(datagram, now)
                delivered.extend(got)
                packet = decode_packet(datagram)
                if not isinstance(packet, DataPacket):
                    continue  # keep-alive
                whole = [e.index for e in packet.entries if not e.is_fragment]
                if whole and before >= packet.first_index:
                    # Every earlier event was already here: the packet alone must make all it carries renderable.
                    assert receiver.next_expected > max(whole), (
                        f"packet carrying {whole} arrived with all earlier events present but rendering "
                        f"stopped at {receiver.next_expected}")
            else:
                sender.receive_datagram(datagram, now)
        sender.handle_timer(now)
        receiver.handle_timer(now)
        transmit(now, "down", sender.datagrams_to_send(now))
        transmit(now, "up", receiver.datagrams_to_send(now))
    else:
        raise AssertionError("stream did not complete")

    assert [e.index for e in delivered] == list(range(len(events) + 1)), "out of order, lost or repeated events"
    assert [e.payload for e in delivered[:-1]] == events
    assert all(e.kind is EventKind.DATA for e in delivered[:-1])
    assert delivered[-1].kind is final
    assert receiver.complete and sender.done
