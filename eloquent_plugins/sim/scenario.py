"""Network conditions of one simulated scenario, and the ``--scenario "loss=0.1,burst=3,rtt=100"`` syntax."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.sim.netem import GilbertElliott, PathConfig, Trace, load_trace
from eloquent_plugins.sim.links import CROSS_FLOWS, LINK_RTT_MS
from eloquent_plugins.sim.quic_window import WINDOWS
from eloquent_plugins.sim.timeline import TokenModel, token_model

_KEYS = {
    "loss": "loss", "burst": "burst", "rtt": "rtt_ms", "jitter": "jitter_ms", "tpot": "tpot_ms",
    "bw": "bandwidth_kbps", "tokens": "tokens", "streams": "streams", "trace": "trace", "k": "copies",
    "link": "link", "cross": "cross", "queue": "queue_packets", "codel": "codel", "recarry": "recarry",
    "window": "window", "flow": "cross_flow", "decode": "decode",
}


@dataclass(frozen=True, slots=True)
class Scenario:
    loss: float = 0.05
    """Long-run loss rate, each direction."""
    burst: float = 1.0
    """Mean loss-burst length in packets."""
    rtt_ms: float = 100.0
    """Base round-trip time: each direction gets half as its one-way delay."""
    jitter_ms: float = 0.0
    tpot_ms: float = 30.0
    bandwidth_kbps: float | None = None
    tokens: int = 300
    streams: int = 4
    trace: str | None = None
    """Trace file applied to both directions (see ``eloquent_plugins.sim.netem.trace``)."""
    copies: int = 2
    """k of the duplication baseline."""
    link: str | None = None
    """A cellular capacity trace pair by name (``netem.capacity.TRACE_NAMES``) or path without ``.down``/``.up``."""
    cross: int = 0
    """1: a bulk download shares the link's bottleneck (``sim.links.BulkFlow``); needs ``link``."""
    cross_flow: str = "tcp"
    """Which bulk download (``links.CROSS_FLOWS``): the simulator's TCP, or aioquic's QUIC as end to end."""
    queue_packets: int = 100
    """The link's drop-tail queue in packets, each direction."""
    codel: int = 0
    """1: CoDel on the link's queue."""
    recarry: int = 0
    """The Eloquent schemes' ``SenderConfig.recarry_limit`` in bytes; 0: none (every packet re-carries the run)."""
    window: str = "none"
    """The Eloquent schemes' QUIC congestion window (``quic_window.WINDOWS``): ``none`` sends every datagram at
    once; ``reno`` / ``cubic`` hold them inside aioquic's controller, as the HTTP/3 front end does."""
    decode: str = "jittered"
    """How the tokens' generation times are drawn (``timeline.DECODES``): jittered, or steady as ``bench e2e``."""

    def __post_init__(self) -> None:
        GilbertElliott(self.loss, self.burst)
        require_finite("rtt_ms", self.rtt_ms)
        require_finite("jitter_ms", self.jitter_ms)
        require_finite("tpot (ms)", self.tpot_ms, strict=True)
        if self.bandwidth_kbps is not None:
            require_finite("bw (kbit/s)", self.bandwidth_kbps, strict=True)
        if self.tokens < 1 or self.streams < 1 or self.copies < 1 or self.queue_packets < 1:
            raise ConfigError("tokens, streams, k and queue must be >= 1")
        if self.recarry < 0:
            raise ConfigError("recarry (bytes) must be >= 0")
        if self.cross not in (0, 1) or self.codel not in (0, 1):
            raise ConfigError("cross and codel are 0 or 1")
        if self.cross_flow not in CROSS_FLOWS:
            raise ConfigError(f"flow must be one of {', '.join(CROSS_FLOWS)}, got {self.cross_flow!r}")
        self.token_model()  # the decode name (``timeline.token_model`` checks it)
        if self.window not in WINDOWS:
            raise ConfigError(f"window must be one of {', '.join(WINDOWS)}, got {self.window!r}")
        if self.cross and not self.link:
            raise ConfigError("cross traffic needs a link (link=TRACE)")

    @property
    def label(self) -> str:
        parts = [f"loss={self.loss:g}", f"burst={self.burst:g}", f"rtt={self.rtt_ms:g}"]
        if self.jitter_ms:
            parts.append(f"jitter={self.jitter_ms:g}")
        if self.tpot_ms != 30.0:
            parts.append(f"tpot={self.tpot_ms:g}")
        if self.bandwidth_kbps is not None:
            parts.append(f"bw={self.bandwidth_kbps:g}")
        if self.trace:
            parts.append(f"trace={self.trace}")
        if self.window != "none":
            parts.append(f"window={self.window}")
        if self.decode != "jittered":
            parts.append(f"decode={self.decode}")
        if self.link:
            parts = [f"link={self.link}", f"cross={self.cross}"]
            parts += [f"decode={self.decode}"] if self.decode != "jittered" else []
            parts += [f"flow={self.cross_flow}"] if self.cross and self.cross_flow != "tcp" else []
            parts += [f"queue={self.queue_packets}"] if self.queue_packets != 100 else []
            parts += ["codel=1"] if self.codel else []
            parts += [f"recarry={self.recarry}"] if self.recarry else []
            parts += [f"loss={self.loss:g}"] if self.loss else []
            parts += [f"rtt={self.rtt_ms:g}"] if self.rtt_ms != LINK_RTT_MS else []
        return ",".join(parts)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def path_config(self, trace: Trace | None = None) -> PathConfig:
        return PathConfig(delay=self.rtt_ms / 2000, jitter=self.jitter_ms / 1000, loss=self.loss, burst=self.burst,
                          bandwidth=None if self.bandwidth_kbps is None else self.bandwidth_kbps * 1000,
                          trace=trace)

    def token_model(self) -> TokenModel:
        return token_model(self.tokens, self.tpot_ms / 1000, self.decode)

    def load_trace(self) -> Trace | None:
        return load_trace(self.trace) if self.trace else None


def parse_scenario(spec: str, base: Scenario | None = None) -> Scenario:
    """``key=value`` pairs separated by commas; keys: loss, burst, rtt (ms), jitter (ms), tpot (ms), bw (kbit/s),
    tokens, streams, trace (file), k (duplication copies), window (none, reno, cubic), link, cross, flow (tcp,
    quic), decode (jittered, steady). Unnamed keys keep ``base``'s values."""
    values: dict[str, object] = {}
    types = {f.name: f.type for f in fields(Scenario)}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip().lower(), raw.strip()
        if not sep or not raw:
            raise ConfigError(f"scenario items must be key=value, got {item!r} in {spec!r}")
        if key not in _KEYS:
            raise ConfigError(f"unknown scenario key {key!r} in {spec!r} (known: {', '.join(_KEYS)})")
        name = _KEYS[key]
        if name in ("trace", "link", "window", "cross_flow", "decode"):
            values[name] = raw
            continue
        try:
            number = float(raw)
        except ValueError:
            raise ConfigError(f"scenario {key} must be a number, got {raw!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"scenario {key} must be finite, got {raw!r}")
        if "int" in str(types[name]):
            if number != int(number):
                raise ConfigError(f"scenario {key} must be a whole number, got {raw!r}")
            number = int(number)
        values[name] = number
    if not values:
        raise ConfigError(f"empty scenario {spec!r}")
    base = base or Scenario()
    merged = {**base.as_dict(), **values}
    return Scenario(**merged)  # type: ignore[arg-type]
