"""``bench leak``'s cost figures: bytes against ``off`` (payload and on the wire), stall at the simulated loss,
CPU per event, and the row each variant reports (with the attacker's scores, ``leak_attack``)."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from eloquent_plugins.cli.bench.leak_attack import Observed, identification, token_length_recovery
from eloquent_plugins.cli.bench.leak_paths import BUDGET, Source
from eloquent_plugins.core.padding import datagram_policy, sse_policy
from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.core.wire import pad_packet
from eloquent_plugins.sim.run import StreamSeeds, run_tcp
from eloquent_plugins.sim.scenario import Scenario

TLS_RECORD = 22
"""TLS 1.3 per record: 5 header bytes, a content-type byte, a 16-byte tag (on top of the TCP/IP header)."""


def sse_stall(observed: list[Observed], scenario: Scenario, source: Source, seed: int) -> float:
    """Stall ratio of SSE over simulated TCP at the scenario's loss, each token's write as large as observed
    (``observed`` run by run, as ``observe_sse`` returns them)."""
    ratios = []
    answers = len(source.prompts)
    for i, obs in enumerate(observed):
        rng = random.Random(f"{seed}/tcp/{i}")
        timeline = source.timeline(i // answers, obs.answer, rng)
        sizes = [s for s, n in zip(obs.sizes, obs.token_lengths) if n is not None][: len(timeline.times)]
        if len(sizes) < len(timeline.times):
            sizes += [sizes[-1] if sizes else 256] * (len(timeline.times) - len(sizes))
        result = run_tcp(scenario, timeline, StreamSeeds.derive(seed, i), None, 1, "retransmission", sizes=sizes)
        ratios.append(stall_metrics(result.generated, result.rendered, result.min_delay).stall_ratio)
    return statistics.fmean(ratios)



# ---- padding's own CPU ---------------------------------------------------------------------------------------
def padding_cpu(mode: str, frame: bytes, datagram: bytes, n: int = 20000) -> tuple[float, float]:
    """Nanoseconds per call of what padding adds per event: the SSE writes of one frame, one padded datagram."""
    if mode == "off":
        return 0.0, 0.0
    sse, dgram = sse_policy(mode), datagram_policy(mode, BUDGET)
    start = time.perf_counter()
    for _ in range(n):
        sse.sse_writes(frame)
    mid = time.perf_counter()
    for _ in range(n):
        pad_packet(datagram, dgram.target(len(datagram)))
    end = time.perf_counter()
    return (mid - start) / n * 1e9, (end - mid) / n * 1e9


def summarize(path: str, mode: str, observed: list[Observed], runs: int, answers: int, tokens: int,
              cpu: float, stall: float, raw: int, overhead: int, raw_writes: int | None) -> dict[str, Any]:
    """``raw``: the bytes without padding (SSE: of these writes; datagrams: of the ``off`` run, whose packets the
    padded runs would have sent); ``raw_writes``: writes without padding (``off``'s; None: as many as now)."""
    recovered, baseline = token_length_recovery(observed, runs, answers, path == "datagram")
    accuracy = identification(observed, runs, answers, tokens)
    by_size = max(accuracy["sizes"], accuracy["histogram"])
    padded = sum(sum(o.sizes) for o in observed)
    writes = sum(len(o.sizes) for o in observed)
    raw_writes = writes if raw_writes is None else raw_writes
    latency = [x for o in observed for x in o.latency]
    return {
        "path": path, "mode": mode, "streams": len(observed),
        "token_length_recovery": round(recovered, 3), "token_length_baseline": round(baseline, 3),
        "identification_sizes": round(by_size, 3), "identification_sizes_x_chance": round(by_size * answers, 2),
        "identification_timed": round(accuracy["gaps"], 3),
        "identification_timed_x_chance": round(accuracy["gaps"] * answers, 2),
        "identification_by_features": {k: round(v, 3) for k, v in accuracy.items()}, "chance": round(1 / answers, 3),
        "bytes_ratio": round(padded / max(1, raw), 3),
        "wire_bytes_ratio": round((padded + overhead * writes) / max(1, raw + overhead * raw_writes), 3),
        "sizes_seen": len({s for o in observed for s in o.sizes}),
        "stall_ratio": round(stall, 4), "cpu_us_per_event": round(cpu * 1e6, 1),
        "latency_ms_mean": round(statistics.fmean(latency) * 1000, 2) if latency else None,
        "latency_ms_p95": round(sorted(latency)[int(0.95 * (len(latency) - 1))] * 1000, 2) if latency else None,
    }
