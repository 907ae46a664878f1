"""What every connection of one HTTP/3 listener shares (``ServerState``), a leaf record: the server makes it,
each connection reads it, and neither module imports the other for it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.padding import datagram_policy, declined
from eloquent_plugins.core.scheme import Scheme, sender_config_for
from eloquent_plugins.core.sender_config import SenderConfig
from eloquent_plugins.transports.body_budget import HeldBodies
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.drain import DrainState
from eloquent_plugins.transports.http3.options import FrontEndOptions


class Member(Protocol):
    """What the shared state asks of a live connection (``Http3Connection``): the drain's two steps and the
    server's close."""

    def goaway(self) -> None: ...

    def close_drained(self, *, force: bool = False) -> None: ...

    async def shutdown(self) -> None: ...


@dataclass(slots=True)
class ServerState:
    """What every connection of one listener shares."""

    app: Any
    config: StreamConfig
    options: FrontEndOptions
    plugin_manager: Any
    codecs: CodecRouter
    connections: set[Member] = field(default_factory=set)
    timings: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)
    sends: OrderedDict[str, tuple[Any, list[tuple[float, bytes, int]]]] = field(default_factory=OrderedDict)
    """With ``record_timings``: per request, its peer and (time, datagram, transmit number) of each datagram."""
    closed_with_error: int = 0
    drain: Any = None
    """The server's ``transports.drain.Drain``: GOAWAY when it begins, every connection closed when it is done."""
    bodies: HeldBodies | None = None
    """The ledger of incomplete request bodies and WebTransport heads (``transports/body_budget.py``): the serving
    stack's, which the TCP side shares (``Stack.bodies``), else one of this front end's own (``held``)."""

    def __post_init__(self) -> None:
        if self.bodies is None:
            self.bodies = HeldBodies.from_config(self.config)

    @property
    def held(self) -> HeldBodies:
        assert self.bodies is not None
        return self.bodies

    def on_drain(self, state: DrainState) -> None:
        for conn in list(self.connections):
            if state is DrainState.DRAINING:
                conn.goaway()
            elif state is DrainState.DONE:
                conn.close_drained(force=bool(self.drain is not None and self.drain.handed_over))

    def sender_config(self, scheme: Scheme, limits: Limits, codec: str, body_head: bytearray | None,
                      rtt: float | None = None) -> SenderConfig:
        """One Eloquent response's sender: the scheme's, with the listener's redundancy, ``--padding`` (unless the
        request's body declines it: ``include_obfuscation: false``) and ``--send-tick`` (datagrams only at its
        multiples). ``rtt``: the connection's RTT so far (the handshake measured it), where the sender's estimate
        starts instead of the 250 ms default: on a 60 ms path its first probe then comes 0.19 s after an unanswered
        packet, not 0.76 s (docs/results/real-links.md, point 10)."""
        config = sender_config_for(scheme, limits=limits, keepalive=self.config.keepalive_policy)
        if rtt is not None:
            config = replace(config, initial_rtt=rtt)
        if self.options.sender_redundancy is not None and scheme is Scheme.ELOQUENT:
            config = replace(config, redundancy=self.options.sender_redundancy)
        if self.config.padding != "off" and not declined(codec, body_head):
            config = replace(config, padding=datagram_policy(self.config.padding, limits.max_datagram_size))
        return replace(config, send_tick=self.config.send_tick) if self.config.send_tick else config

    def record(self, request_id: str, times: list[float]) -> None:
        if not self.options.record_timings:
            return
        self.timings[request_id] = times
        while len(self.timings) > self.options.timings_kept:
            self.timings.popitem(last=False)
