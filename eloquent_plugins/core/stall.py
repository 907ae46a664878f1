"""Stall ratio and lateness, defined once (docs/PROTOCOL.md section "Stall ratio") and reused everywhere.

Token i is generated at g_i and rendered at r_i; d is the path's minimum one-way delay. Token i is late by
max(0, r_i - (g_i + d)). The stall time is the total time during which at least one generated token is late
(the union of the intervals [g_i + d, r_i]); the stall ratio is stall time / (last render - first generation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from eloquent_plugins.core.errors import InvalidArgument

DEFAULT_READING_PACE = 0.31
"""Seconds per token a typical reader digests (Andes' text trace: about 79% of users)."""
DEFAULT_EXPECTED_TTFT = 1.0


@dataclass(frozen=True, slots=True)
class StallReport:
    tokens: int
    duration: float
    stall_time: float
    stall_ratio: float
    lateness_p50: float
    lateness_p95: float
    lateness_p99: float
    lateness_max: float
    qoe: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stall_time(generated: Sequence[float], rendered: Sequence[float], min_delay: float) -> float:
    """Length of the union of the late intervals [g_i + d, r_i]."""
    intervals = sorted((g + min_delay, r) for g, r in zip(generated, rendered) if r > g + min_delay)
    total = 0.0
    current_start: float | None = None
    current_end = 0.0
    for start, end in intervals:
        if current_start is None or start > current_end:
            if current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_start is not None:
        total += current_end - current_start
    return total


def andes_qoe(rendered: Sequence[float], start: float, *, pace: float = DEFAULT_READING_PACE,
              expected_ttft: float = DEFAULT_EXPECTED_TTFT) -> float:
    """Andes QoE (its authors' latest code): 1 - S_gap / S_target for a reader digesting one token per
    ``pace`` seconds, expecting the first token ``expected_ttft`` after ``start``. 1.0 is perfect."""
    n = len(rendered)
    if n == 0:
        return 1.0
    digest: float | None = None
    gap = 0.0
    for i, r in enumerate(sorted(rendered)):
        t = r - start
        digest = t if digest is None else max(t, digest + pace)
        gap += max(digest - (expected_ttft + i * pace), 0.0)
    target = n * (2 * digest - 2 * expected_ttft - n * pace) / 2  # type: ignore[operator]
    if target <= 0:
        return 1.0 if gap <= 0 else 0.0
    return max(0.0, min(1.0, 1 - gap / target))


def stall_metrics(generated: Sequence[float], rendered: Sequence[float], min_delay: float, *,
                  pace: float = DEFAULT_READING_PACE, expected_ttft: float = DEFAULT_EXPECTED_TTFT,
                  start: float | None = None) -> StallReport:
    """All stall figures for one stream. ``generated``/``rendered`` are per token, same clock, same order."""
    if len(generated) != len(rendered):
        raise InvalidArgument(f"{len(generated)} generation times but {len(rendered)} render times: "
                         "every generated token must be rendered")
    if min_delay < 0:
        raise InvalidArgument("min_delay must be >= 0")
    if not generated:
        return StallReport(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    if any(math.isnan(x) or math.isinf(x) for x in (*generated, *rendered)):
        raise InvalidArgument("generation and render times must be finite")
    lateness = [max(0.0, r - (g + min_delay)) for g, r in zip(generated, rendered)]
    duration = max(rendered) - min(generated)
    stalled = stall_time(generated, rendered, min_delay)
    ratio = stalled / duration if duration > 0 else 0.0
    return StallReport(
        tokens=len(generated), duration=duration, stall_time=stalled, stall_ratio=ratio,
        lateness_p50=percentile(lateness, 50), lateness_p95=percentile(lateness, 95),
        lateness_p99=percentile(lateness, 99), lateness_max=max(lateness),
        qoe=andes_qoe(rendered, min(generated) if start is None else start, pace=pace,
                      expected_ttft=expected_ttft))
