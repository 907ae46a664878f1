"""Drives the project's real ``EloquentSender`` and ``EloquentReceiver`` over simulated paths (no model of them).

The driver only moves bytes and time: token events go to ``push`` (the last one followed by ``end``), every
datagram the sender returns goes on the forward path, every ack the receiver returns goes back, and each side's
``next_deadline`` becomes a timer on the virtual clock.
"""

from __future__ import annotations

from collections.abc import Callable

from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.receiver import EloquentReceiver, ReceiverConfig
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.sim.clock import EventLoop


class EloquentEndpoints:
    def __init__(self, loop: EventLoop, initial_rtt: float, send_data: Callable[[bytes], None],
                 send_ack: Callable[[bytes], None], render: Callable[[int, float], None],
                 sender_config: SenderConfig | None = None, receiver_config: ReceiverConfig | None = None,
                 copies: int = 1) -> None:
        self.loop = loop
        self.copies = copies
        """Transport-level repetition of every data datagram (a sensitivity variant; 1 is plain Eloquent)."""
        config = sender_config or SenderConfig(initial_rtt=initial_rtt,
                                               keepalive=KeepAlivePolicy(interval=0.0))
        self.sender = EloquentSender(0, config, now=loop.now)
        self.receiver = EloquentReceiver(0, receiver_config or ReceiverConfig())
        self._send_data = send_data
        self._send_ack = send_ack
        self._render = render
        self._sender_timers: set[float] = set()
        self._receiver_timers: set[float] = set()

    # ---- server side ------------------------------------------------------------------------------------
    def push(self, payload: bytes, end_payload: bytes | None = None) -> None:
        now = self.loop.now
        self.sender.push(payload, now)
        if end_payload is not None:
            self.sender.end(now, end_payload)
        self._flush_sender()

    def on_ack(self, datagram: bytes) -> None:
        self.sender.receive_datagram(datagram, self.loop.now)
        self._flush_sender()

    def _flush_sender(self) -> None:
        now = self.loop.now
        for datagram in self.sender.datagrams_to_send(now):
            for _ in range(self.copies):
                self._send_data(datagram)
        deadline = self.sender.next_deadline()
        if deadline is not None and deadline not in self._sender_timers:
            self._sender_timers.add(deadline)
            self.loop.at(deadline, self._on_sender_timer, deadline)

    def _on_sender_timer(self, deadline: float) -> None:
        self._sender_timers.discard(deadline)
        self._flush_sender()

    # ---- client side ------------------------------------------------------------------------------------
    def on_data(self, datagram: bytes) -> None:
        now = self.loop.now
        for event in self.receiver.receive_datagram(datagram, now):
            if event.kind is EventKind.DATA:
                self._render(event.index, now)
        self._flush_receiver()

    def _flush_receiver(self) -> None:
        for ack in self.receiver.datagrams_to_send(self.loop.now):
            self._send_ack(ack)
        deadline = self.receiver.next_deadline()
        if deadline is not None and deadline not in self._receiver_timers:
            self._receiver_timers.add(deadline)
            self.loop.at(deadline, self._on_receiver_timer, deadline)

    def _on_receiver_timer(self, deadline: float) -> None:
        self._receiver_timers.discard(deadline)
        self._flush_receiver()
