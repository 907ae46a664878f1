"""Per-scheme metrics of each scenario, the summary the issue asks for, and the JSON/table/plot outputs.

Stall figures come from ``eloquent_plugins.core.stall.stall_metrics`` (the project's single definition), per stream;
a scenario's stall ratio and QoE are the means over its streams and seeds, its lateness percentiles are over all
its tokens together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from eloquent_plugins.core.stall import DEFAULT_READING_PACE, percentile, stall_metrics
from eloquent_plugins.sim.run import ALL_SCHEMES, ELOQUENT_ADAPTIVE, ELOQUENT_X2, RACK_TLP, SCHEMES, StreamRun
from eloquent_plugins.sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class SchemeMetrics:
    stall_ratio: float
    lateness_p50: float
    lateness_p95: float
    lateness_p99: float
    qoe: float
    bytes: int
    bytes_vs_retransmission: float | None
    packets: int
    streams: int


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    scenario: Scenario
    schemes: dict[str, SchemeMetrics]

    def as_dict(self) -> dict[str, object]:
        return {"label": self.scenario.label, "scenario": self.scenario.as_dict(),
                "schemes": {name: asdict(m) for name, m in self.schemes.items()}}


def summarize_scenario(scenario: Scenario, runs: Iterable[dict[str, StreamRun]],
                       pace: float = DEFAULT_READING_PACE) -> ScenarioResult:
    per_scheme: dict[str, list[StreamRun]] = {}
    for stream in runs:
        for name, run in stream.items():
            per_scheme.setdefault(name, []).append(run)
    base_bytes = sum(r.bytes_sent for r in per_scheme.get("retransmission", []))
    out: dict[str, SchemeMetrics] = {}
    for name in [s for s in ALL_SCHEMES if s in per_scheme]:
        streams = per_scheme[name]
        reports = [stall_metrics(r.generated, r.rendered, r.min_delay, pace=pace) for r in streams]
        lateness = [max(0.0, rr - (g + r.min_delay)) for r in streams for g, rr in zip(r.generated, r.rendered)]
        total = sum(r.bytes_sent for r in streams)
        out[name] = SchemeMetrics(
            stall_ratio=sum(x.stall_ratio for x in reports) / len(reports),
            lateness_p50=percentile(lateness, 50), lateness_p95=percentile(lateness, 95),
            lateness_p99=percentile(lateness, 99), qoe=sum(x.qoe for x in reports) / len(reports),
            bytes=total, bytes_vs_retransmission=(total / base_bytes) if base_bytes and name != "oracle" else None,
            packets=sum(r.packets_sent for r in streams), streams=len(streams))
    return ScenarioResult(scenario, out)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _reduction(ours: float, baseline: float) -> float:
    return 1 - ours / baseline if baseline > 0 else math.nan


def summary(results: Sequence[ScenarioResult]) -> dict[str, float]:
    """The issue's four numbers, each over the scenarios run (means of per-scenario stall ratios)."""
    mean = {s: _mean([r.schemes[s].stall_ratio for r in results if s in r.schemes]) for s in SCHEMES}
    ratios = [r.schemes["eloquent"].bytes_vs_retransmission for r in results
              if "eloquent" in r.schemes and r.schemes["eloquent"].bytes_vs_retransmission is not None]
    return {
        "stall_reduction_vs_retransmission": _reduction(mean["eloquent"], mean["retransmission"]),
        "stall_reduction_vs_duplication": _reduction(mean["eloquent"], mean["duplication"]),
        "eloquent_over_oracle": mean["eloquent"] / mean["oracle"] if mean["oracle"] > 0 else math.nan,
        "bytes_ratio_vs_retransmission": _mean(ratios),
        **{f"mean_stall_ratio_{s}": mean[s] for s in SCHEMES},
        "duplication_bytes_ratio_vs_retransmission": _mean(
            [r.schemes["duplication"].bytes_vs_retransmission or math.nan for r in results
             if "duplication" in r.schemes]),
        "scenarios": len(results),
        **({"stall_reduction_vs_retransmission_rack_tlp": _reduction(
            mean["eloquent"], _mean([r.schemes[RACK_TLP].stall_ratio for r in results]))}
           if all(RACK_TLP in r.schemes for r in results) and results else {}),
        **({"eloquent_x2_mean_stall_ratio": _mean([r.schemes[ELOQUENT_X2].stall_ratio for r in results]),
            "eloquent_x2_bytes_ratio_vs_retransmission": _mean(
                [r.schemes[ELOQUENT_X2].bytes_vs_retransmission or math.nan for r in results])}
           if all(ELOQUENT_X2 in r.schemes for r in results) and results else {}),
        **({"eloquent_adaptive_mean_stall_ratio": _mean([r.schemes[ELOQUENT_ADAPTIVE].stall_ratio for r in results]),
            "eloquent_adaptive_bytes_ratio_vs_retransmission": _mean(
                [r.schemes[ELOQUENT_ADAPTIVE].bytes_vs_retransmission or math.nan for r in results])}
           if all(ELOQUENT_ADAPTIVE in r.schemes for r in results) and results else {}),
    }


def _clean(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(path: str | Path, results: Sequence[ScenarioResult], meta: dict[str, object]) -> None:
    doc = {"meta": meta, "summary": summary(results), "scenarios": [r.as_dict() for r in results]}
    Path(path).write_text(json.dumps(_clean(doc), indent=2) + "\n", encoding="utf-8")


def format_table(results: Sequence[ScenarioResult]) -> str:
    header = (f"{'scenario':<28} {'scheme':<24} {'stall':>7} {'p50 ms':>7} {'p95 ms':>8} {'p99 ms':>8} "
              f"{'QoE':>6} {'bytes x':>8}")
    lines = [header, "-" * len(header)]
    for r in results:
        for i, (name, m) in enumerate(r.schemes.items()):
            ratio = "-" if m.bytes_vs_retransmission is None else f"{m.bytes_vs_retransmission:.2f}"
            lines.append(f"{r.scenario.label if i == 0 else '':<28} {name:<24} {m.stall_ratio:>7.3f} "
                         f"{m.lateness_p50 * 1000:>7.0f} {m.lateness_p95 * 1000:>8.0f} {m.lateness_p99 * 1000:>8.0f} "
                         f"{m.qoe:>6.3f} {ratio:>8}")
    s = summary(results)
    lines += ["", f"Eloquent stall vs retransmission: {s['stall_reduction_vs_retransmission']:+.1%} reduction; "
                  f"vs duplication: {s['stall_reduction_vs_duplication']:+.1%}; "
                  f"Eloquent / oracle: {s['eloquent_over_oracle']:.2f}x; "
                  f"bytes vs retransmission: {s['bytes_ratio_vs_retransmission']:.2f}x"]
    if "eloquent_x2_mean_stall_ratio" in s:
        lines.append(f"Eloquent x2 (every datagram twice): mean stall {s['eloquent_x2_mean_stall_ratio']:.3f} vs "
                     f"{s['mean_stall_ratio_eloquent']:.3f}, bytes {s['eloquent_x2_bytes_ratio_vs_retransmission']:.2f}x "
                     f"retransmission's")
    if "eloquent_adaptive_mean_stall_ratio" in s:
        lines.append(f"Eloquent adaptive (runs twice while loss is seen): mean stall "
                     f"{s['eloquent_adaptive_mean_stall_ratio']:.3f} vs {s['mean_stall_ratio_eloquent']:.3f}, bytes "
                     f"{s['eloquent_adaptive_bytes_ratio_vs_retransmission']:.2f}x retransmission's")
    if "stall_reduction_vs_retransmission_rack_tlp" in s:
        lines.append(f"Eloquent stall vs retransmission with RACK-TLP: "
                     f"{s['stall_reduction_vs_retransmission_rack_tlp']:+.1%} reduction")
    return "\n".join(lines)


def plot(path: str | Path, results: Sequence[ScenarioResult]) -> None:
    """Grouped bars: mean stall ratio per scheme in each scenario (matplotlib imported only here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.scenario.label.replace(",", "\n") for r in results]
    schemes = [s for s in ALL_SCHEMES if any(s in r.schemes for r in results)]
    width = 0.8 / len(schemes)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(results) + 2), 6))
    for i, name in enumerate(schemes):
        xs = [j + (i - (len(schemes) - 1) / 2) * width for j in range(len(results))]
        ax.bar(xs, [r.schemes[name].stall_ratio if name in r.schemes else 0 for r in results], width, label=name)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("stall ratio (mean over streams)")
    ax.set_title("Stall ratio per scheme (eloquent bench sim)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
