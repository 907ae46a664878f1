"""What one ``eloquent bench load`` run is: its configuration and the hostile preset's bounds. A leaf: the parent
(:mod:`.load`), its load processes (:mod:`.load_clients`, :mod:`.load_hostile`) and its report (:mod:`.load_report`)
all read it, and it imports none of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadConfig:
    sse_streams: int = 1000
    h3_streams: int = 200
    h3_connections: int = 20
    duration: float = 300.0
    """Seconds the full load is held, after the ramp."""
    ramp: float = 20.0
    """Seconds over which the stream slots open, evenly spread."""
    tpot: float = 0.5
    ttft: float = 0.2
    max_tokens: int = 60
    resume_ttl: float = 30.0
    """The server's ``ELOQUENT_RESUME_TTL``: finished streams stay in the replay store this long."""
    sample_interval: float = 2.0
    read_timeout: float = 60.0
    never_readers: int = 0
    """Hostile: TCP clients that send a streaming request and never read a byte (each one the server closes is
    replaced)."""
    fake_initials_per_s: float = 0.0
    """Hostile: QUIC v1 Initial packets per second with random DCIDs and undecryptable payloads."""
    resume_storm: int = 0
    """Hostile: SSE clients that cut every stream after a few events and resume it, over and over."""
    restart_every: float = 0.0
    """Seconds between rolling restarts (0: one server, never restarted). With it the run holds ``replicas``
    servers sharing a redis-server behind nginx (:mod:`.load_fleet`)."""
    replicas: int = 2
    drain_timeout: float = 2.0
    """The replicas' ``--drain-timeout`` under restarts: streams still running then are handed over (migrated)."""
    cpu_hog: int = 0
    """Processes spinning on the CPU beside the load for the whole run (:mod:`.load_hog`): contention on purpose."""

    @property
    def stream_seconds(self) -> float:
        return self.ttft + self.max_tokens * self.tpot

    @property
    def steady_after(self) -> float:
        """Seconds from the start of the ramp after which memory should no longer grow: every slot has run one
        whole stream and the first finished streams have left the replay store."""
        return self.ramp + self.stream_seconds + self.resume_ttl

    @property
    def fleet(self) -> bool:
        return self.restart_every > 0

    @property
    def hostile(self) -> bool:
        return bool(self.never_readers or self.fake_initials_per_s or self.resume_storm)


HOSTILE_PRESET = {"never_readers": 200, "fake_initials_per_s": 300.0, "resume_storm": 50}
"""What ``--hostile`` alone adds beside the default load (each knob given on the command line wins)."""
MAX_NEVER_READERS = 5000
MAX_FAKE_INITIALS_PER_S = 20000.0
MAX_RESUME_STORM = 2000
MAX_REPLICAS = 16
