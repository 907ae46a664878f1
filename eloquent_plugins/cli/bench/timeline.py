"""Per-token timelines of an end-to-end run, their replay in the simulator, and the term-by-term attribution of
the difference (issue 19): ``eloquent bench e2e --timeline PATH [--plot PNG]``.

For each datagram stream the front end logs when each datagram went to QUIC (``record_timings``) and the relay
logs every packet (``RelayConfig.record``); matching the two gives, per token: generated, each datagram that
carried it (sent, relay in, due, relay out, dropped), the one that delivered it, and rendered. The same stream is
then run in the simulator on the relay's recorded drop pattern (``sim.timeline_record.replay_eloquent``), and
each token's render delay is split into terms: server (generated -> first datagram sent), recovery (first
datagram -> the datagram that got through), relay in (sent -> relay read it), path (the model's one-way delay),
relay timer (due -> relay wrote it), client (relay wrote it -> rendered).
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.sim.netem import parse_trace
from eloquent_plugins.sim.relay_record import fate_trace_text
from eloquent_plugins.sim.timeline_record import TOKEN_FIELDS, SendLog, replay_eloquent, replay_tcp, token_rows

TERMS = ("server", "recovery", "relay_in", "path", "relay_timer", "client", "fallback")
"""``fallback``: a token no datagram delivered (its copies all lost, then resent on the reliable stream after
the trailer): everything from its first datagram to its render."""


PACKET_ROOM = 1200
"""Bytes of datagrams one QUIC packet holds, near enough: a transmit with more wrote more than one packet."""


def _match(sends: list[tuple[float, bytes, int]], records: list[Any], origin: float) -> list[SendLog]:
    """Each datagram send -> the packet the relay read for it: datagrams of one transmit share a packet (until
    it is full), each transmit takes the first packet read at or after it and after the previous transmit's
    (loopback keeps order)."""
    out: list[SendLog] = []
    j = -1
    batch: int | None = None
    filled = 0
    for sent, datagram, number in sends:
        if number != batch or filled + len(datagram) > PACKET_ROOM:
            j += 1
            while j < len(records) and records[j].received < sent - origin:
                j += 1
            batch, filled = number, 0
        filled += len(datagram)
        if j >= len(records):
            out.append(SendLog(sent, datagram, None, cause="unmatched"))
            continue
        r = records[j]
        out.append(SendLog(sent, datagram, None if r.due is None else r.due + origin, r.received + origin,
                           None if r.sent is None else r.sent + origin, r.cause))
    return out


def terms(row: dict[str, Any]) -> dict[str, float] | None:
    """One token's render delay split into ``TERMS`` (seconds); None if no datagram carried it."""
    k = row["delivered_by"]
    if row["first_send"] is None:
        return None
    if k is None:
        zero = dict.fromkeys(TERMS, 0.0)
        return {**zero, "server": row["first_send"] - row["generated"],
                "fallback": row["rendered"] - row["first_send"]}
    s = next(x for x in row["sends"] if x["send"] == k)
    relay_in = s["relay_in"] if s["relay_in"] is not None else s["sent"]
    due = s["due"]
    out = s["relay_out"] if s["relay_out"] is not None else due
    return {"server": row["first_send"] - row["generated"], "recovery": s["sent"] - row["first_send"],
            "relay_in": relay_in - s["sent"], "path": due - relay_in, "relay_timer": out - due,
            "client": row["rendered"] - out, "fallback": 0.0}


def _stall(rows: list[dict[str, Any]], keep: tuple[str, ...] | None) -> float:
    """Stall ratio of the stream if each token took only the ``keep`` terms (None: as measured); d is the
    smallest delay any token saw in that column, as ``E2EResult.score`` does."""
    g, r = [], []
    for row in rows:
        t = terms(row)
        if t is None:
            continue
        g.append(row["generated"])
        r.append(row["rendered"] if keep is None else row["generated"] + sum(t[k] for k in keep))
    if not g:
        return float("nan")
    d = min(b - a for a, b in zip(g, r))
    return stall_metrics(g, r, d).stall_ratio


def flows(h: Any, streams: list[Any]) -> dict[str, int]:
    """Scheme -> the relay's client index of its connection. Datagram streams name their peer; the reliable
    stream's client is the one left over."""
    relay = h.relay
    out: dict[str, int] = {}
    for s in streams:
        logged = h.server.datagram_sends(s.request_id) if s.request_id else None
        if logged is not None and logged[0]:
            index = relay.client_index(tuple(logged[0][:2]))
            if index is not None:
                out[s.scheme] = index
    rest = sorted({k[0] for k in relay.records} - set(out.values()))
    if len(rest) == 1 and "stream" in {s.scheme for s in streams}:
        out["stream"] = rest[0]
    return out


def collect(h: Any, streams: list[Any], rtt: float) -> list[dict[str, Any]]:
    """Timelines (e2e and simulator replay) of every stream of a finished run; call inside the harness, before
    it closes (the relay's records and the server's logs live there). Eloquent streams replay in the simulator's
    Eloquent, the reliable stream in its retransmission baseline (``sim.tcp``), each on its own recorded drops."""
    relay = h.relay
    origin = relay.origin
    clients = flows(h, streams)
    out: list[dict[str, Any]] = []
    for s in streams:
        entry: dict[str, Any] = {"scheme": s.scheme, "request": s.request, "error": s.error}
        out.append(entry)
        if s.error is not None or not s.generated:
            continue
        g0 = s.generated[0]
        client = clients.get(s.scheme)
        down = relay.record_of(client, "down") if client is not None else []
        up = relay.record_of(client, "up") if client is not None else []
        start = g0 - origin
        texts = (fate_trace_text(down, start), fate_trace_text(up, start))
        entry["replay_traces"] = {"down": texts[0], "up": texts[1]}  # this stream's drops, replayable
        traces = (parse_trace(texts[0], "relay down"), parse_trace(texts[1], "relay up"))
        logged = h.server.datagram_sends(s.request_id) if s.request_id else None
        if logged is None:  # the reliable stream: no datagrams, only generated and rendered
            entry["e2e"] = token_rows(s.generated, s.rendered, [], g0)
            if down:
                rendered = replay_tcp(s.generated, *traces, rtt / 2, rtt)
                entry["sim"] = token_rows([g - g0 for g in s.generated], rendered, [])
            continue
        entry["e2e"] = token_rows(s.generated, s.rendered, _match(logged[1], down, origin), g0)
        if s.scheme != "eloquent":
            continue
        sim = replay_eloquent(s.generated, *traces, rtt / 2, rtt)
        entry["sim"] = sim.rows()
        entry["replay"] = {"down_drops": sum(1 for r in down if r.dropped and r.received >= start),
                           "sim_drops": sum(1 for x in sim.sends if x.dropped), "sim_details": sim.details}
    return out


def attribution(timelines: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean per-token terms (ms) on both sides and the stall ratio as each processing term is taken away."""
    pairs = [t for t in timelines if "sim" in t and t["scheme"] == "eloquent"]
    if not pairs:
        return {}

    def mean_terms(key: str) -> dict[str, float]:
        ts = [x for t in pairs for row in t[key] if (x := terms(row)) is not None]
        return {k: 1000 * statistics.fmean(x[k] for x in ts) for k in TERMS}

    def recovered(key: str) -> dict[str, float]:
        ts = [x["recovery"] for t in pairs for row in t[key] if (x := terms(row)) is not None and
              x["recovery"] > 0.002]
        return {"tokens": len(ts), "mean_ms": 1000 * statistics.fmean(ts) if ts else 0.0}

    steps = [("e2e as measured", None), ("- server processing", ("recovery", "relay_in", "path", "relay_timer",
                                                                "client", "fallback")),
             ("- relay scheduling (in + timer)", ("recovery", "path", "client", "fallback")),
             ("- client processing (network only)", ("recovery", "path", "fallback"))]
    stall = {label: statistics.fmean(_stall(t["e2e"], keep) for t in pairs) for label, keep in steps}
    stall["simulator, replayed drops"] = statistics.fmean(_stall(t["sim"], None) for t in pairs)
    out = {"streams": len(pairs), "terms_ms": {"e2e": mean_terms("e2e"), "sim": mean_terms("sim")},
           "recovered_tokens": {"e2e": recovered("e2e"), "sim": recovered("sim")}, "stall_ratio": stall}
    baseline = [t for t in timelines if "sim" in t and t["scheme"] == "stream"]
    if baseline:
        e2e_stream = statistics.fmean(_plain_stall(t["e2e"]) for t in baseline)
        sim_stream = statistics.fmean(_plain_stall(t["sim"]) for t in baseline)
        out["reliable_stream"] = {
            "e2e_http3_stream": e2e_stream, "sim_tcp_replayed": sim_stream,
            "reduction_e2e": 1 - stall["e2e as measured"] / e2e_stream if e2e_stream else None,
            "reduction_sim_replayed": 1 - stall["simulator, replayed drops"] / sim_stream if sim_stream else None}
    return out


def _plain_stall(rows: list[dict[str, Any]]) -> float:
    g = [r["generated"] for r in rows]
    r = [x["rendered"] for x in rows]
    return stall_metrics(g, r, min(b - a for a, b in zip(g, r))).stall_ratio if g else float("nan")


def format_attribution(a: dict[str, Any]) -> str:
    if not a:
        return "no datagram stream to attribute"
    lines = [f"per-token render delay, mean over {a['streams']} Eloquent stream(s) (ms):",
             f"  {'term':<14}{'e2e':>9}{'sim':>9}{'e2e - sim':>11}"]
    e, s = a["terms_ms"]["e2e"], a["terms_ms"]["sim"]
    for k in TERMS:
        lines.append(f"  {k:<14}{e[k]:>9.2f}{s[k]:>9.2f}{e[k] - s[k]:>11.2f}")
    lines.append(f"  {'total':<14}{sum(e.values()):>9.2f}{sum(s.values()):>9.2f}"
                 f"{sum(e.values()) - sum(s.values()):>11.2f}")
    re, rs = a["recovered_tokens"]["e2e"], a["recovered_tokens"]["sim"]
    lines.append(f"  tokens waiting > 2 ms for a resend: e2e {re['tokens']} (mean {re['mean_ms']:.1f} ms), "
                 f"sim {rs['tokens']} (mean {rs['mean_ms']:.1f} ms)")
    lines.append("mean stall ratio as each term is taken away:")
    for label, v in a["stall_ratio"].items():
        lines.append(f"  {label:<38}{v:>8.2%}")
    b = a.get("reliable_stream")
    if b:
        lines.append(f"the reliable stream on its own recorded drops: HTTP/3 stream e2e {b['e2e_http3_stream']:.2%}, "
                     f"the simulator's TCP baseline {b['sim_tcp_replayed']:.2%}; Eloquent's reduction: e2e "
                     f"{b['reduction_e2e']:.1%}, simulator (both replayed) {b['reduction_sim_replayed']:.1%}")
    return "\n".join(lines)


def write(path: str, timelines: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fp:
        json.dump({**extra, "streams": timelines}, fp)


def plot(path: str, timelines: list[dict[str, Any]]) -> bool:
    """One Eloquent stream's timeline, end to end and replayed in the simulator, side by side. False if there is
    no such stream or matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pair = next((t for t in timelines if "sim" in t), None)
    if pair is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key, title in ((axes[0], "e2e", "end to end (real QUIC through the relay)"),
                           (axes[1], "sim", "simulator (replayed drops)")):
        rows = pair[key]
        g = [r["generated"] for r in rows]
        ax.plot(g, [1000 * (r["rendered"] - r["generated"]) for r in rows], ".-", lw=0.6, ms=3,
                label="rendered - generated")
        lost = [(r["generated"], 1000 * (x["sent"] - r["generated"])) for r in rows for x in r["sends"]
                if x["dropped"]]
        if lost:
            ax.plot(*zip(*lost), "x", color="tab:red", ms=5, label="datagram dropped (at its send)")
        ax.set_title(title)
        ax.set_xlabel("generation time (s from first token)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle(f"{pair['scheme']} request {pair['request']}: per-token timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def flow_loss(h: Any, streams: list[Any]) -> dict[str, float]:
    """Per scheme, the share of its server -> client packets the relay dropped (any cause): with a shared
    bottleneck, whether one flow's extra copies cost the others."""
    out: dict[str, float] = {}
    for scheme, index in flows(h, streams).items():
        down = h.relay.record_of(index, "down")
        out[scheme] = sum(1 for r in down if r.dropped) / len(down) if down else 0.0
    return out


def add_arguments(parser: Any) -> None:
    parser.add_argument("--timeline", metavar="PATH", default=None,
                        help="write every stream's per-token timeline (and the Eloquent streams' simulator replay "
                        "on the relay's recorded drops) as JSON, and print the term-by-term attribution")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="draw one Eloquent stream's timeline, end to end and simulated, side by side")


def report(args: Any, result: Any, floor: Any = None) -> None:
    """What ``bench e2e`` prints and writes beyond the table: flow loss, attribution, timeline JSON, plot."""
    if result.flow_loss:
        print("share of server -> client packets dropped at the relay, per flow: " +
              ", ".join(f"{k} {v:.1%}" for k, v in result.flow_loss.items()))
    if not result.timelines:
        return
    a = attribution(result.timelines)
    lossless = attribution(floor.timelines) if floor is not None and floor.timelines else {}
    if lossless:
        print("lossless calibration run, " + format_attribution(lossless))
    print(format_attribution(a))
    if getattr(args, "timeline", None):
        extra: dict[str, Any] = {"conditions": result.as_json()["conditions"], "min_delay": result.min_delay,
                                 "attribution": a, "token_fields": list(TOKEN_FIELDS)}
        if floor is not None:
            extra["floor"] = {k: v.stall_ratio_mean for k, v in floor.summaries().items()}
            extra["floor_attribution"] = lossless
            extra["floor_streams"] = floor.timelines
        write(args.timeline, result.timelines, extra)
    if getattr(args, "plot", None) and not plot(args.plot, result.timelines):
        print("no plot: matplotlib missing or no Eloquent stream")


