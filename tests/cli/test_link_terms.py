"""The end-to-end trace rows' decomposition (``cli/bench/link_terms``): what the machine's processing costs on a
bursty trace and the network-only stall that takes it away, on a queue fed by hand."""

from __future__ import annotations

import pytest

from eloquent_plugins.cli.bench.link_terms import ClientArrivals, mean_terms_ms, processing, token_times
from eloquent_plugins.sim.netem import CapacityLink, TraceQueue, parse_mahimahi
from eloquent_plugins.sim.relay_record import PacketRecord

ONE_WAY = 0.030
ORIGIN = 100.0
"""The relay's start on the loop clock: token times are absolute, the records relative to it."""
BURSTS = "\n".join(str(ms) for ms in range(0, 1000, 10) for _ in range(3))
"""Three 1500-byte opportunities together every 10 ms: a cellular trace's bursts, shrunk."""


def _feed(arrivals: list[float], render_after: float) -> tuple[TraceQueue, list[PacketRecord], list[float]]:
    """Offer one packet per arrival (relay seconds); each renders ``render_after`` after the relay writes it."""
    queue = TraceQueue(CapacityLink(parse_mahimahi(BURSTS, "bursts"), queue_packets=100), record_tail=1000)
    records, rendered = [], []
    for a in arrivals:
        departure = queue.offer(a, 100)
        assert departure is not None
        due = departure + ONE_WAY
        records.append(PacketRecord(a, 100, due, sent=due + 0.0002))
        rendered.append(ORIGIN + due + 0.0002 + render_after)
    return queue, records, rendered


def test_processing_that_misses_a_burst_is_pre_not_network() -> None:
    # Generated 0.5 ms before the 10 ms burst, read by the relay 1 ms later: it waits for the 20 ms burst.
    generated = [0.0095, 0.0295]
    queue, records, rendered = _feed([g + 0.001 for g in generated], render_after=0.0005)
    times = token_times(queue, [ORIGIN + g for g in generated], rendered, records, ORIGIN)
    assert times.ready_g == pytest.approx((0.010, 0.030))
    assert times.ready_a == pytest.approx((0.020, 0.040))
    terms = times.terms(ONE_WAY)
    assert terms["pre"] == pytest.approx([0.010, 0.010])
    assert terms["net"] == pytest.approx([0.0, 0.0])
    assert terms["post"] == pytest.approx([0.0007, 0.0007])
    assert times.network_stall(ONE_WAY) == 0.0  # the network delivered each token at its floor
    assert mean_terms_ms([times], ONE_WAY)["pre"] == pytest.approx(10.0)


def test_a_token_held_back_is_network_time() -> None:
    # The first packet after generation is at once (an older token's), the one that delivers is 25 ms later.
    generated = [0.0012]
    queue, records, rendered = _feed([0.0013, 0.0262], render_after=0.0005)
    times = token_times(queue, [ORIGIN + generated[0]], rendered[1:], records, ORIGIN)
    assert times.ready_a == pytest.approx((0.010,))
    assert times.terms(ONE_WAY)["net"] == pytest.approx([0.020])  # left at the 30 ms burst, floor 10 ms
    assert times.network_stall(ONE_WAY) > 0


def test_a_token_the_window_held_while_nothing_left_is_network_time() -> None:
    """QUIC's window full and nothing leaving the server: the first packet after the token's generation is its
    own, 50 ms later. That wait is the scheme's (the simulator counts it too), not this machine's processing
    (1 ms here): ``ready_a`` stops at generation plus 5 ms, the most processing is taken to cost unless the
    stream's median is longer (a loaded machine). Processing that misses a burst stays ``pre`` (the test above)."""
    generated = [0.0012, 0.0312, 0.0612, 0.0912]
    reads = [0.0022, 0.0322, 0.0622, 0.1412]
    queue, records, rendered = _feed(reads, render_after=0.0005)
    gens = [ORIGIN + g for g in generated]
    held = (0.0, 0.0, 0.0, 0.049)
    times = token_times(queue, gens, rendered, records, ORIGIN, held=held)
    assert times.ready_a == pytest.approx((0.010, 0.040, 0.070, 0.100))  # the held token's at 92.2 ms, not 141.2
    assert times.terms(ONE_WAY)["pre"] == pytest.approx([0.0] * 4, abs=1e-9)
    assert times.terms(ONE_WAY)["net"][3] == pytest.approx(0.050)  # left at the 150 ms burst, floor 100 ms
    assert times.held == held
    unlogged = token_times(queue, gens, rendered, records, ORIGIN)  # no held log (the reliable stream): the same
    assert unlogged.ready_a == times.ready_a
    assert processing([0.0, 0.1, 0.2], [0.2, 0.1011, 0.2004], held=(0.19, 0.0, 0.0)) == pytest.approx(0.005)
    assert processing([0.0, 0.1, 0.2], [0.008, 0.109, 0.5]) == pytest.approx(0.009)  # a loaded machine's median


def test_the_client_log_names_the_delivering_packet() -> None:
    # Two packets written 10 ms apart; the client is slow and renders the first token after the second was
    # written. Without its log the later packet is taken (an upper bound), with it the right one.
    queue, records, _ = _feed([0.0005, 0.0105], render_after=0.0)
    render = ORIGIN + records[1].sent + 0.001  # type: ignore[operator]
    bound = token_times(queue, [ORIGIN + 0.0004], [render], records, ORIGIN)
    client = ClientArrivals(first=0, times=[ORIGIN + records[0].sent + 0.0001,  # type: ignore[operator]
                                            ORIGIN + records[1].sent + 0.002])  # type: ignore[operator]
    exact = token_times(queue, [ORIGIN + 0.0004], [render], records, ORIGIN, client)
    assert bound.due == pytest.approx((records[1].due,))
    assert exact.due == pytest.approx((records[0].due,))
    assert exact.terms(ONE_WAY)["net"] == pytest.approx([0.0])
    assert bound.terms(ONE_WAY)["net"] == pytest.approx([0.010])


def test_held_is_the_wait_before_the_first_datagram() -> None:
    from eloquent_plugins.cli.bench.link_terms import held_times
    from eloquent_plugins.core.events import EventKind
    from eloquent_plugins.core.wire import DataPacket, Entry, encode_packet

    def datagram(first: int, last: int) -> bytes:
        entries = tuple(Entry(i, EventKind.DATA, b"x") for i in range(first, last + 1))
        return encode_packet(DataPacket(0, first, None, first, entries))

    sends = [(1.000, datagram(0, 0), 0), (1.300, datagram(0, 1), 1), (1.301, datagram(0, 2), 2)]
    assert held_times([1.0, 1.03, 1.30], sends) == pytest.approx((0.0, 0.27, 0.001))


def test_only_the_text_tokens_count_as_the_simulator_counts_them() -> None:
    """An end-to-end stream renders the role, finish and ``[DONE]`` chunks as events too; the simulator's tokens
    are the text alone. A ``[DONE]`` whose last packet was lost stalls the whole stream's figure until ``only``
    leaves it out."""
    from eloquent_plugins.cli.bench.link_terms import TokenTimes

    ready = tuple(0.03 * i for i in range(6))
    due = tuple(r + 0.03 for r in ready[:5]) + (ready[5] + 5.0,)  # the last event (``[DONE]``) 5 s late
    times = TokenTimes(ready, ready, due, due, held=(0.0,) * 6)
    assert times.network_stall(0.03) > 0.9
    text = times.only([False, True, True, True, True, False])
    assert text.ready_a == ready[1:5] and text.due == due[1:5] and text.held == (0.0,) * 4
    assert text.network_stall(0.03) == 0.0
