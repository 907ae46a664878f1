"""Padding against size side channels: one policy for SSE writes and Eloquent datagrams (docs/SECURITY.md).

Encryption hides a streamed answer's bytes, not the size of each write or datagram, and one write per token gives
an observer every token's byte length (Whisper Leak, arXiv 2511.03675). A ``PaddingPolicy`` says what size a
write of ``n`` bytes goes out as:

* ``off``: ``n`` (nothing added, nothing computed per event).
* ``bucket``: the smallest size class (``floor`` and up, ``growth`` times apart: powers of two by default) at or
  above ``n``.
* ``constant``: a whole number of ``size``-byte units; SSE sends each unit as its own write and the datagram
  sender builds every datagram at exactly ``size`` bytes (splitting runs where needed).

The padding itself is what every receiver ignores by its own rules: an SSE comment line (``:`` ... ``\\n``) after
the event, in the same write; zero bytes after the last field of an Eloquent packet (``core.wire``). Stdlib only.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Literal

from eloquent_plugins.core.errors import ConfigError

PaddingMode = Literal["off", "bucket", "constant"]
MODES: tuple[str, ...] = ("off", "bucket", "constant")

SSE_FLOOR = 128
"""Smallest SSE size class: an OpenAI chunk is ~200-260 bytes, a TGI token event ~120."""
SSE_GROWTH = 1.25
"""Ratio between the server's SSE ``bucket`` classes: 128, 160, 200, 256, 320, 400, ... (``bench leak``: an
OpenAI chunk of the built-in engine and of vLLM each pad to one class at ~1.15x the bytes on the wire, where
powers of two cost vLLM's ~290-byte chunks 1.73x; docs/results/padding.md)."""
SSE_CONSTANT = 256
"""SSE unit of ``constant``: one OpenAI chunk with its id line fits (a longer one takes two writes)."""
DATAGRAM_FLOOR = 48
"""Smallest datagram class: one delta-encoded token entry with the header is ~20-40 bytes. With ``DATAGRAM_GROWTH``
the classes are 48, 72, 112, 168, 256, ... (``bench leak``: 1.20x the bytes on the wire and identification at
1.0-1.6x chance, where powers of two from 64 cost 1.35x; docs/results/padding.md)."""
DATAGRAM_GROWTH = 1.5
"""Ratio between datagram ``bucket`` classes: a one- or two-token datagram wastes less than with doubling."""
DATAGRAM_CONSTANT = 128
"""Datagram size of ``constant``: the run splits into datagrams of this size."""
MIN_COMMENT = 2
"""The shortest SSE comment line, ``:\\n``: a gap of one byte takes the next class (or unit) instead."""
_TABLE = 4096
"""Write sizes ``PaddingPolicy`` has the padding of at hand (most events are far smaller)."""
_CACHED = 1024
"""Comment lengths ``PaddingPolicy`` keeps built (at most ~0.5 MiB for all of them together)."""
_CEILING = 1 << 24
"""Largest SSE class: a write above it (16 MiB) is sent as it is."""


@dataclass(frozen=True, slots=True)
class PaddingPolicy:
    mode: PaddingMode = "off"
    floor: int = SSE_FLOOR
    """``bucket``: the smallest class; classes double from it."""
    size: int = SSE_CONSTANT
    """``constant``: the unit every write is a whole number of."""
    ceiling: int = _CEILING
    """``bucket``: the largest class (a datagram's budget); a larger write is sent as it is."""
    growth: float = 2.0
    """``bucket``: each class this many times the one below (rounded up to 8 bytes): 2 wastes up to half a write,
    1.5 up to a third, and closer classes tell an observer more."""
    classes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _comments: dict[int, bytes] = field(init=False, repr=False, compare=False, default_factory=dict)
    """Comment lines by length, built once each (lengths below ``_CACHED``): the SSE path pads every write."""
    _gaps: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())
    """``sse_pad(n)`` for every ``n`` below ``_TABLE`` (built by the first ``sse_writes``): one index per write
    instead of the class search."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"padding must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.floor < 16 or self.size < 16:
            raise ConfigError(f"padding sizes must be at least 16 bytes (floor={self.floor}, size={self.size})")
        if self.ceiling < self.floor:
            raise ConfigError(f"padding ceiling {self.ceiling} is below its floor {self.floor}")
        if not 1.1 <= self.growth <= 16:
            raise ConfigError(f"padding class growth must be in [1.1, 16], got {self.growth}")
        classes = []
        c = self.floor
        while c < self.ceiling:
            classes.append(c)
            c = -(-int(c * self.growth) // 8) * 8 if self.growth != 2.0 else c * 2
        classes.append(self.ceiling)
        object.__setattr__(self, "classes", tuple(classes))


    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def target(self, n: int) -> int:
        """The size a write of ``n`` bytes goes out as (``n`` itself when off or above the ceiling)."""
        if self.mode == "bucket":
            classes = self.classes
            i = bisect_left(classes, n)
            return classes[i] if i < len(classes) else n
        if self.mode == "constant":
            unit = self.size
            return -(-n // unit) * unit if n else unit
        return n

    def sizes(self) -> tuple[int, ...] | None:
        """Every size a padded datagram may take (None: unbounded, ``off``)."""
        if self.mode == "bucket":
            return self.classes
        if self.mode == "constant":
            return (self.size,)
        return None

    # ---- SSE ---------------------------------------------------------------------------------------------------
    def sse_pad(self, n: int) -> int:
        """Bytes of comment to add after an SSE write of ``n`` bytes: 0, or at least ``MIN_COMMENT``."""
        gap = self.target(n) - n
        if gap == 0 or gap >= MIN_COMMENT:
            return gap
        return self.target(n + MIN_COMMENT) - n  # one byte short of a comment: the next class up

    def sse_writes(self, frame: bytes) -> list[bytes]:
        """``frame`` (whole SSE events) as the writes that go to the client: padded with one comment line, and
        for ``constant`` cut into ``size``-byte writes (SSE is a byte stream: a cut anywhere is fine)."""
        n = len(frame)
        gaps = self._gaps
        if not gaps:  # built on the first SSE write (a datagram policy never needs it)
            gaps = tuple(self.sse_pad(i) for i in range(_TABLE))
            object.__setattr__(self, "_gaps", gaps)
        gap = gaps[n] if n < _TABLE else self.sse_pad(n)
        if gap:
            comment = self._comments.get(gap)
            if comment is None:
                comment = sse_comment(gap)
                if gap < _CACHED:
                    self._comments[gap] = comment
            frame += comment
        unit = self.size
        if len(frame) <= unit or self.mode != "constant":
            return [frame]
        return [frame[i : i + unit] for i in range(0, len(frame), unit)]


_FILL = b":" + b"p" * ((1 << 16) - 2)


def sse_comment(n: int) -> bytes:
    """An SSE comment line of exactly ``n >= 2`` bytes (``:ppp...\\n``): every SSE parser drops it."""
    if n < MIN_COMMENT:
        raise ValueError(f"an SSE comment line is at least {MIN_COMMENT} bytes, not {n}")
    if n <= len(_FILL):
        return _FILL[: n - 1] + b"\n"
    return b":" + b"p" * (n - 2) + b"\n"


def sse_policy(mode: str, growth: float = SSE_GROWTH) -> PaddingPolicy:
    """The policy of ``--padding MODE`` for SSE writes (``growth``: the ratio between ``bucket`` classes)."""
    return PaddingPolicy(mode, growth=growth)  # type: ignore[arg-type]


def datagram_policy(mode: str, budget: int, floor: int = DATAGRAM_FLOOR,
                    growth: float = DATAGRAM_GROWTH) -> PaddingPolicy:
    """The policy of ``--padding MODE`` for datagrams of at most ``budget`` bytes (``floor``: the smallest
    ``bucket`` class, ``growth``: the ratio between classes)."""
    floor = min(floor, budget)
    return PaddingPolicy(mode, floor=floor, size=min(DATAGRAM_CONSTANT, budget), ceiling=budget,  # type: ignore[arg-type]
                         growth=growth)


def parse_mode(text: str) -> PaddingMode:
    mode = text.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"padding must be one of {', '.join(MODES)}, got {text!r}")
    return mode  # type: ignore[return-value]


OBFUSCATION_KEY = b"include_obfuscation"


def obfuscation_requested(body: bytes | bytearray) -> bool | None:
    """An OpenAI request's ``stream_options.include_obfuscation`` (None when it does not say, or the body is not
    JSON): ``false`` turns padding off for that request, as on OpenAI's API. A substring test first, so a request
    that does not mention it costs no JSON parse."""
    if OBFUSCATION_KEY not in body:
        return None
    try:
        options = json.loads(body).get("stream_options")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
    value = options.get("include_obfuscation") if isinstance(options, dict) else None
    return value if isinstance(value, bool) else None


REQUEST_HEAD_MAX = 1 << 20
"""Request-body bytes a front end keeps to find ``include_obfuscation`` in (a longer body: its start only)."""


def declined(codec: str, head: bytes | bytearray | None) -> bool:
    """An OpenAI request that said ``stream_options.include_obfuscation: false``: its response is not padded, on
    SSE and on datagrams alike (``head``: the request body's start; None: not kept)."""
    return codec == "openai" and head is not None and obfuscation_requested(head) is False


def response_padding(server: PaddingPolicy | None, codec: str, transport: str,
                     head: bytes | bytearray | None) -> PaddingPolicy | None:
    """The padding one SSE response gets: the server's ``--padding``, unless the HTTP/3 front end reads this
    response into datagrams (``transport`` ``eloquent``: they pad on their own) or an OpenAI request said
    ``stream_options.include_obfuscation: false`` (``head``: the request body's start)."""
    if server is None or transport == "eloquent" or declined(codec, head):
        return None
    return server
