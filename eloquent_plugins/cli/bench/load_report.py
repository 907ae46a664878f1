"""What ``eloquent bench load`` reports: the parent's samples, the figures made from them and the load processes'
tallies (:func:`summarize`, a JSON-ready dict), and the printed table (:func:`print_summary`), the hostile
process's figures (:mod:`.load_hostile`) beside the normal streams'."""

from __future__ import annotations

import os
import statistics
from array import array
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.stall import percentile

if TYPE_CHECKING:
    from eloquent_plugins.cli.bench.load_config import LoadConfig


def nan_percentile(values: list[float], q: float) -> float:
    """``core.stall.percentile`` (interpolated, like every other figure here), NaN rather than 0 for no values."""
    return percentile(values, q) if values else float("nan")


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y)."""
    if len(points) < 2:
        return float("nan")
    mt = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else float("nan")


@dataclass(slots=True)
class Sample:
    t: float
    server_rss: int
    server_cpu: float
    load_rss: int
    load_cpu: float
    active: int
    events: int
    errors: int
    gap_p99: float
    udp_queue: int = 0
    """The HTTP/3 port's UDP receive queue (bytes, ``load_servers.udp_socket``) at the sample."""
    udp_drops: int = 0
    """Datagrams that socket dropped (full queue) since the load began."""


def summarize(cfg: LoadConfig, samples: list[Sample], finals: dict[str, dict[str, Any]], *, idle_rss: int,
              drained_rss: int, cpu_seconds: float, wall: float, engine: dict[str, Any], t0: float,
              hostile: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of a run. ``finals``: the normal load processes' last tallies (``sse``, ``h3``), which alone
    make ``errors`` (the verdict); ``hostile``: the hostile process's, reported beside them under ``hostile``."""
    steady = [s for s in samples if s.t >= cfg.steady_after]
    hold = [s for s in samples if s.t >= cfg.ramp]
    streams = cfg.sse_streams + cfg.h3_streams
    out: dict[str, Any] = {"config": asdict(cfg), "cpus": os.cpu_count(), "wall_s": wall,
                           "server_cpu_share": cpu_seconds / wall if wall else 0.0, "engine_after": engine,
                           "idle_rss_mib": idle_rss / 2**20, "drained_rss_mib": drained_rss / 2**20,
                           "samples": [asdict(s) for s in samples]}
    if hold:
        out["hold_rss_mib"] = {"min": min(s.server_rss for s in hold) / 2**20,
                               "median": statistics.median(s.server_rss for s in hold) / 2**20,
                               "max": max(s.server_rss for s in hold) / 2**20}
        out["per_stream_kib"] = (statistics.median(s.server_rss for s in hold) - idle_rss) / 1024 / max(1, streams)
    if samples:
        out["udp_queue_kib"] = {"median": statistics.median(s.udp_queue for s in samples) / 1024,
                                "max": max(s.udp_queue for s in samples) / 1024}
        out["udp_drops"] = samples[-1].udp_drops
    if len(steady) >= 2:
        out["steady_from_s"] = steady[0].t
        out["steady_rss_mib"] = {"first": steady[0].server_rss / 2**20, "last": steady[-1].server_rss / 2**20,
                                 "min": min(s.server_rss for s in steady) / 2**20,
                                 "max": max(s.server_rss for s in steady) / 2**20}
        out["steady_slope_mib_per_min"] = _slope([(s.t, s.server_rss / 2**20) for s in steady]) * 60
        out["steady_load_rss_slope_mib_per_min"] = _slope([(s.t, s.load_rss / 2**20) for s in steady]) * 60
        span = steady[-1].t - steady[0].t
        out["steady_events_per_s"] = (steady[-1].events - steady[0].events) / span if span else float("nan")
        out["steady_server_cpu_share"] = statistics.fmean(s.server_cpu for s in steady)
        out["steady_load_cpu_share"] = statistics.fmean(s.load_cpu for s in steady)
    for kind, final in finals.items():
        gaps = list(array("d", final["gaps"]))
        ttfts = list(array("d", final["ttfts"]))
        held = [x for x, at in zip(ttfts, array("d", final["ttft_at"])) if at - t0 >= cfg.ramp]
        out[kind] = {k: final[k] for k in ("started", "completed", "cancelled", "refused", "lost", "migrated",
                                           "events", "errors", "examples")}
        if cfg.fleet:
            out[kind]["migration"] = migration_cost(final, gaps)
        out[kind].update({"gap_p50_ms": nan_percentile(gaps, 50) * 1000, "gap_p99_ms": nan_percentile(gaps, 99) * 1000,
                          "gap_max_ms": max(gaps, default=float("nan")) * 1000,
                          "ttft_p50_ms": nan_percentile(ttfts, 50) * 1000,
                          "ttft_p99_ms": nan_percentile(ttfts, 99) * 1000,
                          "held_ttft_p99_ms": nan_percentile(held, 99) * 1000,
                          "gaps": len(gaps)})
    out["errors"] = sum(sum(f["errors"].values()) for f in finals.values())
    if hostile is not None:
        out["hostile"] = hostile_figures(hostile)
    return out


def migration_cost(final: dict[str, Any], gaps: list[float]) -> dict[str, Any]:
    """What a migration costs the client: the gap at the splice (last event before the cut to the first after
    the resume) beside the ordinary gap, and whole-stream time of migrated against unmigrated streams."""
    splices = list(array("d", final["splice_gaps"]))
    migrated = list(array("d", final["seconds_migrated"]))
    plain = list(array("d", final["seconds_unmigrated"]))
    gap = nan_percentile(gaps, 50)
    return {"splices": len(splices), "splice_p50_ms": nan_percentile(splices, 50) * 1000,
            "splice_p99_ms": nan_percentile(splices, 99) * 1000, "splice_max_ms": max(splices, default=float("nan"))
            * 1000, "extra_p50_ms": (nan_percentile(splices, 50) - gap) * 1000,
            "extra_p99_ms": (nan_percentile(splices, 99) - gap) * 1000,
            "stream_s_migrated_p50": nan_percentile(migrated, 50), "stream_s_unmigrated_p50": nan_percentile(plain, 50)}


def print_fleet(result: dict[str, Any]) -> None:
    """Rolling restarts: per transport what became of every stream, what a migration cost, and each restart."""
    cfg, fleet = result["config"], result["fleet"]
    print(f"rolling restarts: {cfg['replicas']} replicas behind nginx (TCP + UDP), one SIGTERMed every "
          f"{cfg['restart_every']:g} s with --drain-timeout {cfg['drain_timeout']:g}; {len(fleet['restarts'])} "
          f"restarts")
    print(f"{'transport':<10} {'started':>8} {'completed':>10} {'migrated':>9} {'lost':>5} {'refused':>8} "
          f"{'cut at end':>10} {'splice p50':>11} {'splice p99':>11} {'extra p50':>10} {'extra p99':>10} "
          f"{'stream s (migr/not)':>20}")
    for kind, label in (("sse", "SSE"), ("h3", "HTTP/3")):
        if kind not in result:
            continue
        r = result[kind]
        m = r["migration"]
        print(f"{label:<10} {r['started']:>8} {r['completed']:>10} {r['migrated']:>9} {r['lost']:>5} "
              f"{r['refused']:>8} {r['cancelled']:>10} {m['splice_p50_ms']:>9.0f}ms {m['splice_p99_ms']:>9.0f}ms "
              f"{m['extra_p50_ms']:>8.0f}ms {m['extra_p99_ms']:>8.0f}ms "
              f"{m['stream_s_migrated_p50']:>9.1f}/{m['stream_s_unmigrated_p50']:<10.1f}")
    for r in fleet["restarts"]:
        print(f"  restart at t={r['signalled_at']:.0f} s, {r['replica']}: {r['in_flight']} streams in flight, "
              f"{r['finished']} finished in the drain, {r['handed_over']} handed over, {r['refused']} new requests "
              f"refused (nginx sent them on); exited after {r['exit_s']:.1f} s, ready after {r['ready_s']:.1f} s")
    print(f"  streams the replicas continued for a gone producer (their metric): {fleet['server_migrated']:.0f}; "
          "(splice: last event before the cut to the first after the resume; extra: splice minus the median gap)")


def print_summary(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(f"\nload: {cfg['sse_streams']} SSE + {cfg['h3_streams']} HTTP/3 Eloquent streams "
          f"({cfg['h3_connections']} QUIC connections), {cfg['max_tokens']} tokens each at tpot "
          f"{cfg['tpot'] * 1000:.0f} ms, held {cfg['duration']:.0f} s after a {cfg['ramp']:.0f} s ramp, "
          f"{result['cpus']} CPUs, resume TTL {cfg['resume_ttl']:.0f} s")
    c = result.get("contention")
    if c is not None:
        hog = (f"{c['processes']} CPU hog processes beside the load (they took {c['cpu_share'] * 100:.0f}% of one "
               f"core); " if c["processes"] else "no CPU hog; ")
        print(f"contention: {hog}load average {c['load_average_start']:.1f} at the start, "
              f"{c['load_average_end']:.1f} at the end")
    print(f"{'transport':<10} {'streams done':>12} {'cut at end':>10} {'events':>10} {'gap p50':>9} {'gap p99':>9} "
          f"{'gap max':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'held p99':>9} {'errors':>7}")
    for kind, label in (("sse", "SSE"), ("h3", "HTTP/3")):
        if kind not in result:
            continue
        r = result[kind]
        print(f"{label:<10} {r['completed']:>12} {r['cancelled']:>10} {r['events']:>10} {r['gap_p50_ms']:>7.0f}ms "
              f"{r['gap_p99_ms']:>7.0f}ms {r['gap_max_ms']:>7.0f}ms {r['ttft_p50_ms']:>7.0f}ms "
              f"{r['ttft_p99_ms']:>7.0f}ms {r['held_ttft_p99_ms']:>7.0f}ms {sum(r['errors'].values()):>7}")
        for kind_name, count in r["errors"].items():
            print(f"    {count} x {kind_name}: {r['examples'].get(kind_name, '')[:160]}")
    print(f"server RSS: idle {result['idle_rss_mib']:.1f} MiB", end="")
    if "hold_rss_mib" in result:
        h = result["hold_rss_mib"]
        print(f"; under load min/median/max {h['min']:.1f}/{h['median']:.1f}/{h['max']:.1f} MiB "
              f"({result['per_stream_kib']:.1f} KiB per open stream)", end="")
    print(f"; after the load {result['drained_rss_mib']:.1f} MiB")
    if "udp_queue_kib" in result:
        q = result["udp_queue_kib"]
        print(f"HTTP/3 port's UDP receive queue median/max {q['median']:.0f}/{q['max']:.0f} KiB, "
              f"{result['udp_drops']} datagrams dropped")
    if "steady_slope_mib_per_min" in result:
        s = result["steady_rss_mib"]
        print(f"steady from t={result['steady_from_s']:.0f} s: server RSS {s['first']:.1f} -> {s['last']:.1f} MiB "
              f"(min {s['min']:.1f}, max {s['max']:.1f}), slope {result['steady_slope_mib_per_min']:+.2f} MiB/min; "
              f"load processes' slope {result['steady_load_rss_slope_mib_per_min']:+.2f} MiB/min")
        print(f"throughput: {result['steady_events_per_s']:.0f} events/s received; server CPU "
              f"{result['steady_server_cpu_share'] * 100:.0f}% of one core (steady), "
              f"{result['server_cpu_share'] * 100:.0f}% over the run; load processes "
              f"{result['steady_load_cpu_share'] * 100:.0f}% (steady)")
    else:
        print("(run shorter than the steady-state window: no slope; use a longer --duration)")
    print("(TTFT 'held p99': streams that started after the ramp)")
    if "fleet" in result:
        print_fleet(result)
    if "hostile" in result:
        print_hostile(result["hostile"])
    e = result["engine_after"]
    print(f"engine after the load: running {e.get('running')}, completed {e.get('completed')}, "
          f"aborted {e.get('aborted')}, failed {e.get('failed')}; errors seen by clients: {result['errors']}"
          + (" (normal streams: the verdict)" if "hostile" in result else ""))


# -- the hostile mix -----------------------------------------------------------------------------------------------


def hostile_figures(final: dict[str, Any]) -> dict[str, Any]:
    """The hostile process's final tally as reported (JSON-ready), with the rates it actually reached."""
    out = {k: v for k, v in final.items() if k != "final"}
    seconds = final["initials_seconds"]
    out["initials_per_s"] = final["initials_sent"] / seconds if seconds else 0.0
    resumes = final["storm_resumes"]
    out["storm_resumes_total"] = sum(resumes)
    out["storm_resumes_min_per_client"] = min(resumes, default=0)
    return out


def print_hostile(h: dict[str, Any]) -> None:
    cfg, end = h["config"], h["never_at_end"]
    closed = h["never_closed"]
    refused = {**h["never_refused"], **h["storm_refused"]}
    closed_text = f" (status sent first: {closed})" if closed else ""
    print(f"hostile mix (not in the verdict): {cfg['never_readers']} never-readers: opened {h['never_opened']}, "
          f"closed by the server during the run {sum(closed.values())}{closed_text}; at the end {end['held']} "
          f"held with {end['unread_bytes']} bytes unread (status sent first: {end['statuses'] or '-'}), then read "
          f"out: {end['outcomes'] or '-'}")
    print(f"  fake QUIC Initials: {h['initials_sent']} sent in {h['initials_seconds']:.0f} s "
          f"({h['initials_per_s']:.0f}/s, asked {cfg['fake_initials_per_s']:g}/s), {h['initials_not_sent']} not "
          f"sent, {h['initials_replies']} datagrams back ({h['initials_reply_bytes']} bytes)")
    print(f"  resume storm ({cfg['resume_storm']} clients): {h['storm_completed']} streams exact, "
          f"{h['storm_mismatches']} mismatched, {h['storm_cancelled']} cut at end; {h['storm_cuts']} cuts, "
          f"{h['storm_resumes_total']} resumes (min {h['storm_resumes_min_per_client']} per client); "
          f"errors {sum(h['storm_errors'].values())}")
    if h["storm_mismatches"]:
        print(f"    {h['storm_mismatches']} x storm text differs: {h['examples'].get('storm text differs', '')[:160]}")
    for kind, count in {**h["storm_errors"], **refused}.items():
        print(f"    {count} x {kind}: {h['examples'].get(kind, '')[:160]}")
    if refused:
        print(f"  refused or shed by the server (counted, not errors): {sum(refused.values())}")
