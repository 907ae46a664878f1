"""``--send-tick`` on the datagram path (issue 29, item 4): the sans-I/O sender with ``SenderConfig.send_tick``,
driven by a fake clock, sends every datagram (runs, probes, keep-alives) at a multiple of the tick and loses
nothing; each new event first leaves at the first multiple at or after it was pushed (at most one tick late)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.pacing import check_tick, next_tick, on_tick
from eloquent_plugins.core.padding import datagram_policy
from eloquent_plugins.core.receiver import EloquentReceiver
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.core.wire import DataPacket, decode_packet
from eloquent_plugins.transports.config import StreamConfig

BUDGET = 1286


def test_next_tick_is_the_first_multiple_at_or_after() -> None:
    assert next_tick(0.0, 0.02) == 0.0
    assert next_tick(0.001, 0.02) == pytest.approx(0.02)
    assert next_tick(0.02, 0.02) == pytest.approx(0.02)  # on the grid: no extra tick
    assert next_tick(3 * 0.1, 0.1) == pytest.approx(0.3)  # 3 * 0.1 is 0.30000000000000004: still the same tick
    assert next_tick(0.0200001, 0.02) == pytest.approx(0.04)
    assert on_tick(next_tick(12.345, 0.007), 0.007) and not on_tick(12.345, 0.007)


@pytest.mark.parametrize("bad", [-0.01, 1.5, float("nan"), float("inf"), True])
def test_the_tick_is_checked_where_it_is_configured(bad: float) -> None:
    with pytest.raises(ConfigError, match="send_tick"):
        check_tick(bad)
    with pytest.raises(ConfigError, match="send_tick"):
        SenderConfig(send_tick=bad)
    with pytest.raises(ConfigError, match="send_tick"):
        StreamConfig(send_tick=bad)


# ---- the sender on a fake clock -------------------------------------------------------------------------------
@dataclass
class Run:
    sends: list[tuple[float, bytes]] = field(default_factory=list)
    got: list[bytes] = field(default_factory=list)
    done: bool = False


def drive(config: SenderConfig, pushes: list[tuple[float, bytes]], *, loss: float = 0.0, ack_loss: float = 0.0,
          delay: float = 0.015, seed: int = 0, horizon: float = 120.0) -> Run:
    """The sender and a receiver on one fake clock, event by event in time order: the pushes at their times,
    datagrams and acks arriving ``delay`` later (or lost), and each side's timer at the deadline it names."""
    rng = random.Random(seed)
    sender = EloquentSender(1, config, now=0.0)
    receiver = EloquentReceiver(1)
    run = Run()
    queue: list[tuple[float, int, Callable[[float], None]]] = []
    order = 0
    armed: set[tuple[str, float]] = set()

    def at(when: float, action: Callable[[float], None]) -> None:
        nonlocal order
        order += 1
        heapq.heappush(queue, (when, order, action))

    def arm(side: str, deadline: float | None, now: float, fire: Callable[[float], None]) -> None:
        if deadline is not None and (side, deadline) not in armed:
            armed.add((side, deadline))

            def timer(t: float, d: float = deadline) -> None:
                armed.discard((side, d))
                fire(t)

            at(max(deadline, now), timer)

    def flush_sender(now: float) -> None:
        for datagram in sender.datagrams_to_send(now):
            run.sends.append((now, datagram))
            if rng.random() >= loss:
                at(now + delay, lambda t, d=datagram: on_data(t, d))
        arm("sender", sender.next_deadline(), now, flush_sender)

    def flush_receiver(now: float) -> None:
        for ack in receiver.datagrams_to_send(now):
            if rng.random() >= ack_loss:
                at(now + delay, lambda t, a=ack: on_ack(t, a))
        arm("receiver", receiver.next_deadline(), now, flush_receiver)

    def on_data(now: float, datagram: bytes) -> None:
        run.got.extend(e.payload for e in receiver.receive_datagram(datagram, now) if e.kind is EventKind.DATA)
        flush_receiver(now)

    def on_ack(now: float, ack: bytes) -> None:
        sender.receive_datagram(ack, now)
        flush_sender(now)

    def push(now: float, payload: bytes, last: bool) -> None:
        sender.push(payload, now)
        if last:
            sender.end(now)
        flush_sender(now)

    for i, (when, payload) in enumerate(pushes):
        at(when, lambda t, p=payload, last=i == len(pushes) - 1: push(t, p, last))
    steps = 0
    while queue and not sender.done:
        now, _, action = heapq.heappop(queue)
        steps += 1
        assert now <= horizon and steps < 200_000, f"the stream did not complete (t={now}, {steps} steps)"
        action(now)
    run.done = sender.done
    return run


def pushes_at(times: list[float], payloads: list[bytes]) -> list[tuple[float, bytes]]:
    return list(zip(times, payloads))


def first_sends(run: Run) -> dict[int, float]:
    """When each event first left (the newest entry of each data packet is the one it brought)."""
    first: dict[int, float] = {}
    for when, datagram in run.sends:
        packet = decode_packet(datagram, Limits(max_datagram_size=BUDGET))
        if isinstance(packet, DataPacket):
            for entry in packet.entries:
                first.setdefault(entry.index, when)
    return first


def test_without_loss_each_event_leaves_at_the_next_multiple_and_several_share_one() -> None:
    tick = 0.02
    times = [0.003 + 0.007 * i for i in range(30)]  # 7 ms per token: two or three tokens per tick
    payloads = [f"token {i}".encode() for i in range(30)]
    run = drive(SenderConfig(send_tick=tick, initial_rtt=0.05), pushes_at(times, payloads))
    assert run.done and run.got == payloads
    assert all(on_tick(when, tick) for when, _ in run.sends), [w for w, _ in run.sends if not on_tick(w, tick)]
    first = first_sends(run)
    assert [first[i] for i in range(30)] == pytest.approx([next_tick(t, tick) for t in times])
    flushes = {round(when / tick) for when, _ in run.sends}
    assert len(flushes) < len(times)  # coalesced: fewer send instants than tokens


def test_without_a_tick_the_same_stream_sends_off_the_grid() -> None:
    """The control: the test above can fail (its times are not multiples of anything by chance)."""
    times = [0.003 + 0.007 * i for i in range(30)]
    run = drive(SenderConfig(initial_rtt=0.05), pushes_at(times, [b"x%d" % i for i in range(30)]))
    assert run.done
    assert sum(not on_tick(when, 0.02) for when, _ in run.sends) >= 20


def test_probes_and_keepalives_wait_for_the_grid_too() -> None:
    """A silence longer than the keep-alive interval and a lossy path: keep-alives and probes on the grid."""
    tick = 0.025
    times = [0.01, 0.02, 0.9, 3.3, 3.31]  # gaps of 0.9 and 2.4 s: keep-alives at 0.5 s idle
    payloads = [b"a", b"bb", b"ccc", b"dddd", b"eeeee"]
    config = SenderConfig(send_tick=tick, initial_rtt=0.05, keepalive=KeepAlivePolicy(interval=0.5))
    for seed in range(20):
        run = drive(config, pushes_at(times, payloads), loss=0.3, ack_loss=0.3, seed=seed)
        assert run.done and run.got == payloads
        assert all(on_tick(when, tick) for when, _ in run.sends)
    assert len(run.sends) > len(times)  # more than one send per token: keep-alives and probes went out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(st.binary(min_size=0, max_size=40) | st.binary(min_size=1500, max_size=3000),
                         min_size=1, max_size=30),
       gaps=st.lists(st.floats(0.0, 0.2), min_size=30, max_size=30),
       tick=st.sampled_from([0.001, 0.005, 0.02, 0.05]), padding=st.sampled_from(["off", "bucket", "constant"]),
       seed=st.integers(0, 2**32), loss=st.floats(0.0, 0.4), ack_loss=st.floats(0.0, 0.4),
       delay=st.floats(0.001, 0.1))
def test_paced_datagrams_leave_only_at_multiples_of_the_tick_and_lose_nothing(
        payloads: list[bytes], gaps: list[float], tick: float, padding: str, seed: int, loss: float,
        ack_loss: float, delay: float) -> None:
    """Random token sequences (some larger than a datagram: fragments) at random times, random data and ack
    loss and delay: every datagram (runs, fast repairs, probes) leaves at a multiple of the tick, each event
    first leaves no later than the multiple after its push unless a run was cut, and every event arrives, in
    order (with padding, still one of the policy's sizes)."""
    times = [sum(gaps[: i + 1]) for i in range(len(payloads))]
    policy = datagram_policy(padding, BUDGET) if padding != "off" else None
    config = SenderConfig(limits=Limits(max_datagram_size=BUDGET), padding=policy, initial_rtt=0.05,
                          send_tick=tick)
    run = drive(config, pushes_at(times, payloads), loss=loss, ack_loss=ack_loss, delay=delay, seed=seed)
    assert run.done and run.got == payloads
    off = [when for when, _ in run.sends if not on_tick(when, tick)]
    assert not off, f"{len(off)} sends off the {tick} s grid, first at {off[0]}"
    if policy is not None:
        assert {len(d) for _, d in run.sends} <= set(policy.sizes() or ())
    if loss == 0.0 and all(len(p) <= 40 for p in payloads):
        first = first_sends(run)
        assert all(first[i] <= next_tick(t, tick) + 1e-9 for i, t in enumerate(times))
