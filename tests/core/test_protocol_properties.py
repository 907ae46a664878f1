"""Property tests: the real sender and receiver through arbitrary loss, duplication, reordering and delay."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eloquent_plugins import EventKind, Limits, ReceiverConfig, SenderConfig
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from tests.support.lossy_network import payloads, run_stream


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=st.lists(payloads, max_size=30), final=st.sampled_from([EventKind.END, EventKind.ERROR]),
       budget=st.sampled_from([96, 300, 1200]), tpot=st.sampled_from([0.0, 0.01, 0.05, 0.3]),
       ack_delay=st.sampled_from([0.0, 0.025]), delta=st.booleans(), data=st.data())
def test_eloquent_delivers_exactly_once_in_order(events: list[bytes], final: EventKind, budget: int, tpot: float,
                                                  ack_delay: float, delta: bool, data: st.DataObject) -> None:
    limits = Limits(max_datagram_size=budget, max_run_datagrams=4)
    run_stream(events, final, data,
               SenderConfig(limits=limits, delta=delta, keepalive=KeepAlivePolicy(0.5)),
               ReceiverConfig(limits=limits, ack_delay=ack_delay), tpot)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(events=st.lists(payloads, max_size=20), budget=st.sampled_from([128, 1200]), data=st.data())
def test_duplication_mode_also_delivers_exactly_once(events: list[bytes], budget: int, data: st.DataObject) -> None:
    limits = Limits(max_datagram_size=budget)
    run_stream(events, EventKind.END, data, SenderConfig(limits=limits, carry_unacked=False, copies=2),
               ReceiverConfig(limits=limits), 0.02)
