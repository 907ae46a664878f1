"""The TCP baselines' receiving half: in-order reassembly, delayed ACKs and SACK (see ``sim.tcp``)."""

from __future__ import annotations

from collections.abc import Callable

from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.tcp import Ack, Segment, TcpConfig


class TcpReceiver:
    """Reassembles in order; tells the renderer when each token becomes readable."""

    def __init__(self, loop: EventLoop, config: TcpConfig, send_ack: Callable[[Ack], None],
                 render: Callable[[int, float], None]) -> None:
        self.loop = loop
        self.config = config
        self._send_ack = send_ack
        self._render = render
        self._next = 0
        self._ooo: dict[int, Segment] = {}
        self._unacked_in_order = 0
        self._delack_at: float | None = None

    def on_segment(self, segment: Segment) -> None:
        if segment.index < self._next or segment.index in self._ooo:
            if self.config.copies == 1 or segment.retransmission:
                self._ack_now()  # a repeat is answered at once (D-SACK in Linux): the ACK may have been lost
            return
        if segment.index > self._next:
            self._ooo[segment.index] = segment
            self._ack_now()  # out of order: a duplicate ACK carrying SACK, at once
            return
        had_gap = bool(self._ooo)
        self._deliver(segment)
        while self._next in self._ooo:
            self._deliver(self._ooo.pop(self._next))
        if had_gap:
            self._ack_now()
            return
        self._unacked_in_order += 1
        if self._unacked_in_order >= 2:
            self._ack_now()
        elif self._delack_at is None:
            self._delack_at = self.loop.now + self.config.delayed_ack
            self.loop.at(self._delack_at, self._on_delack, self._delack_at)

    def _deliver(self, segment: Segment) -> None:
        for token in segment.tokens:
            self._render(token, self.loop.now)
        self._next = segment.index + 1

    def _on_delack(self, when: float) -> None:
        if self._delack_at == when:
            self._ack_now()

    def _ack_now(self) -> None:
        self._unacked_in_order = 0
        self._delack_at = None
        self._send_ack(Ack(self._next, frozenset(self._ooo)))
