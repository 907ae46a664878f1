"""Drives the project's real ``EloquentSender`` and ``EloquentReceiver`` over simulated paths (no model of them).

The driver only moves bytes and time: token events go to ``push`` (the last one followed by ``end``), every
datagram the sender returns goes on the forward path, every ack the receiver returns goes back, and each side's
``next_deadline`` becomes a timer on the virtual clock. With a ``window`` (``quic_window.ServerWindow``) the
sender's datagrams are pulled the way the HTTP/3 front end pulls them, only while QUIC's congestion window has
room, and the paths carry QUIC packets (``ServerPacket`` / ``ClientPacket``) instead of bare datagrams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.receiver import EloquentReceiver, ReceiverConfig
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.link import QUIC_DATAGRAM_HEADER, SimWire
from eloquent_plugins.sim.netem import SlottedPath
from eloquent_plugins.sim.quic_window import ClientAcks, ClientPacket, ServerPacket, ServerWindow


class EloquentEndpoints:
    def __init__(self, loop: EventLoop, initial_rtt: float, send_data: Callable[[bytes], None],
                 send_ack: Callable[[bytes], None], render: Callable[[int, float], None],
                 sender_config: SenderConfig | None = None, receiver_config: ReceiverConfig | None = None,
                 copies: int = 1, window: ServerWindow | None = None) -> None:
        self.loop = loop
        self.window = window
        if window is not None:
            window.pump = self._flush_sender
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

    def on_client_packet(self, packet: ClientPacket) -> None:
        """With a window: a QUIC packet from the client (its ACK frame, its Eloquent ack), then the plan."""
        assert self.window is not None
        self.window.on_packet(packet, lambda datagram: self.sender.receive_datagram(datagram, self.loop.now))

    def _pull(self, now: float) -> list[bytes]:
        return [d for d in self.sender.datagrams_to_send(now) for _ in range(self.copies)]

    def _flush_sender(self) -> None:
        now = self.loop.now
        if self.window is None:
            for datagram in self._pull(now):
                self._send_data(datagram)
        else:
            due = self.sender.next_deadline()
            self.window.plan(now, self._pull, due is not None and due <= now)
        deadline = self.sender.next_deadline()
        if self.window is not None and deadline is not None and deadline <= now:
            return  # held by the full window: the next ack or aioquic's timer runs the plan again
        if deadline is not None and deadline not in self._sender_timers:
            self._sender_timers.add(deadline)
            self.loop.at(deadline, self._on_sender_timer, deadline)

    def _on_sender_timer(self, deadline: float) -> None:
        self._sender_timers.discard(deadline)
        self._flush_sender()

    # ---- client side ------------------------------------------------------------------------------------
    def on_server_packet(self, packet: ServerPacket) -> None:
        """With a window: a QUIC packet from the server; its datagram, if any, to the receiver."""
        if packet.datagram is not None:
            self.on_data(packet.datagram)

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


@dataclass(slots=True)
class Connection:
    """Both Eloquent endpoints on a pair of simulated paths, and the server's QUIC window if it has one."""

    ends: EloquentEndpoints
    forward: SimWire
    reverse: SimWire
    window: ServerWindow | None
    acks: ClientAcks | None


def connect(loop: EventLoop, initial_rtt: float, forward_path: SlottedPath, reverse_path: SlottedPath,
            render: Callable[[int, float], None], *, window: str = "none",
            sender_config: SenderConfig | None = None, copies: int = 1,
            observe: Callable[[float, bytes], None] | None = None) -> Connection:
    """``window`` ``none``: every datagram on the path at once, acks straight back (sizes with
    ``QUIC_DATAGRAM_HEADER``). Otherwise QUIC packets inside aioquic's ``window`` controller
    (``quic_window``): the server's ACK-only packets, the client's QUIC ACKs. ``observe(now, datagram)`` sees
    every data datagram put on the forward path."""
    if window == "none":
        def send_data(datagram: bytes) -> None:
            if observe is not None:
                observe(loop.now, datagram)
            forward.send(datagram, len(datagram))

        ends = EloquentEndpoints(loop, initial_rtt, send_data, lambda a: reverse.send(a, len(a)), render,
                                 sender_config=sender_config, copies=copies)
        forward = SimWire(loop, forward_path, QUIC_DATAGRAM_HEADER, ends.on_data)
        reverse = SimWire(loop, reverse_path, QUIC_DATAGRAM_HEADER, ends.on_ack)
        return Connection(ends, forward, reverse, None, None)

    def send_packet(packet: ServerPacket, size: int) -> None:
        if observe is not None and packet.datagram is not None:
            observe(loop.now, packet.datagram)
        forward.send(packet, size)

    def client_receives(packet: ServerPacket) -> None:
        acks.on_packet(packet)  # aioquic records the packet before its DATAGRAM reaches the receiver
        ends.on_server_packet(packet)

    quic = ServerWindow(loop, window, initial_rtt, send_packet)
    acks = ClientAcks(loop, lambda packet, size: reverse.send(packet, size))

    def unused(datagram: bytes) -> None:
        raise AssertionError("with a window every datagram goes through ServerWindow")

    ends = EloquentEndpoints(loop, initial_rtt, unused, acks.send_datagram, render, sender_config=sender_config,
                             copies=copies, window=quic)
    # Sizes are whole QUIC packets with IP/UDP (``quic_window``): the wires add no header of their own.
    forward = SimWire(loop, forward_path, 0, client_receives)
    reverse = SimWire(loop, reverse_path, 0, ends.on_client_packet)
    return Connection(ends, forward, reverse, quic, acks)
