"""``eloquent bench load``: many concurrent SSE and HTTP/3 Eloquent streams held for minutes on one server.

What a user runs is what is measured: ``eloquent serve`` (built-in engine, SSE middleware with resume, HTTP/3
front end) in its own process; one load process holds ``--sse`` streams over HTTP/1.1 (a minimal keep-alive
client, :mod:`.lighthttp`, so the load generator costs less CPU than the server), another holds ``--h3`` streams
over HTTP/3 datagrams with the project's client (``--h3-connections`` QUIC connections). Each stream slot
reopens a stream as soon as one ends, so thousands of streams start and finish during the run; every stream's
text is checked against a non-streamed answer for the same prompt.

With ``--cpu-hog N``, N processes spin on the CPU beside the load for the whole run (:mod:`.load_hog`): the
streams must then still complete, or fail with a typed error, on both transports alike.

With ``--hostile`` (or its knobs ``--never-readers``, ``--fake-initials-per-s``, ``--resume-storm``) a third
process adds the traffic a public server also gets (:mod:`.load_hostile`); the verdict stays the normal streams'.

Reported: the server's resident memory (idle, over the run, its slope once steady, per open stream), its CPU,
event throughput, the inter-event gap each client saw (p50/p99/max, against the engine's pace), time to first
token, completed streams and every error by kind, and the hostile traffic actually sent. The figures are
printed; nothing here asserts a target.

Layout: this module holds the run and the command line; the configuration is :mod:`.load_config`, the servers
and their sampling :mod:`.load_servers` (the fleet under ``--restart-every``: :mod:`.load_fleet`), the requests
:mod:`.load_wire`, the clients and load processes :mod:`.load_clients`, the figures and the table :mod:`.load_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import time
from array import array
from dataclasses import replace
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.bench.load_clients import load_process, raise_nofile
from eloquent_plugins.cli.bench.load_config import (
    HOSTILE_PRESET,
    MAX_FAKE_INITIALS_PER_S,
    MAX_NEVER_READERS,
    MAX_REPLICAS,
    MAX_RESUME_STORM,
    LoadConfig,
)
from eloquent_plugins.cli.bench.load_hog import MAX_CPU_HOG, cpu_hog
from eloquent_plugins.cli.bench.load_report import Sample, nan_percentile, print_summary, summarize
from eloquent_plugins.cli.bench.load_servers import (
    cpu_seconds,
    engine_stats,
    fleet_figures,
    rss_bytes,
    servers_under_load,
    udp_socket,
)
from eloquent_plugins.cli.bench.load_wire import chat_body, prompts
from eloquent_plugins.cli.flags import add_plot, add_progress

def _expected_texts(port: int, cfg: LoadConfig) -> dict[str, str]:
    """The non-streamed answer for every prompt the load uses (with ttft/tpot 0: no need to wait for them)."""
    import httpx

    out = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for prompt in prompts():
            body = chat_body(prompt, cfg.max_tokens, False)
            body["eloquent_engine"] = {"ttft": 0, "tpot": 0}
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            out[prompt] = r.json()["choices"][0]["message"]["content"]
    return out


def _udp_since(port: int, drops0: int) -> tuple[int, int]:
    queue, drops = udp_socket(port)
    return queue, max(0, drops - drops0)


def _final(kind: str, pipe: Any, timeout: float = 60) -> dict[str, Any]:
    """The load process's last message (its final figures), skipping progress reports still in the pipe."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pipe.poll(1):
            msg = pipe.recv()
            if msg.get("final"):
                return msg
    raise RuntimeError(f"the {kind} load process sent no final figures")


def run_load(cfg: LoadConfig, *, log_path: str, progress: bool = True) -> dict[str, Any]:
    raise_nofile()
    ctx = multiprocessing.get_context("spawn")
    workers: list[tuple[str, Any, Any]] = []
    with servers_under_load(cfg, log_path) as (servers, alive), contextlib.ExitStack() as stack:
        restarts = servers.restarts
        try:
            port, udp = servers.port, servers.udp_port
            expected = _expected_texts(port, cfg)
            time.sleep(1.0)
            idle_rss = servers.rss()
            hog = stack.enter_context(cpu_hog(cfg.cpu_hog))  # stopped on the way out, whatever happens
            loadavg0 = os.getloadavg()
            drops0 = udp_socket(udp)[1]
            cpu0, t0 = servers.cpu(), time.monotonic()
            for kind, n in (("sse", cfg.sse_streams), ("h3", cfg.h3_streams), ("hostile", int(cfg.hostile))):
                if n <= 0:
                    continue
                parent, child = ctx.Pipe()
                worker = ctx.Process(target=load_process, args=(kind, cfg, port, udp, expected, child), daemon=True)
                worker.start()
                child.close()
                workers.append((kind, worker, parent))
            if restarts is not None:
                restarts.start(t0)
            last: dict[str, dict[str, Any]] = {}
            hostile_last: dict[str, Any] = {}
            samples: list[Sample] = []
            prev_cpu, prev_t = cpu0, t0
            prev_load_cpu = 0.0
            end = t0 + cfg.ramp + cfg.duration
            # Under restarts the hold lasts until every replica was restarted once (a whole rolling restart).
            cap = end + (0 if restarts is None else len(restarts.fleet.replicas) * (cfg.restart_every + 120))
            while (now := time.monotonic()) < end or (restarts is not None and not restarts.went_round()):
                if now >= cap:
                    raise RuntimeError(f"the rolling restart did not go round the fleet in {cap - t0:.0f} s")
                if now >= end:
                    end = now + cfg.sample_interval  # the samples go on to the last restart's end
                time.sleep(min(cfg.sample_interval, max(0.0, end - now)))
                window: list[float] = []
                for kind, worker, pipe in workers:
                    while pipe.poll():
                        msg = pipe.recv()
                        if kind == "hostile":  # its own figures: never mixed into the normal streams' sums
                            hostile_last = msg
                            continue
                        last[kind] = msg
                        window.extend(array("d", msg["window_gaps"]))
                    if not worker.is_alive():
                        raise RuntimeError(f"the {kind} load process died (exit code {worker.exitcode})")
                alive()
                if hog.alive() < cfg.cpu_hog:
                    raise RuntimeError(f"a CPU hog died ({hog.alive()} of {cfg.cpu_hog} left)")
                t = time.monotonic()
                cpu = servers.cpu()
                load_cpu = sum(cpu_seconds(w.pid) for _, w, _ in workers)
                sample = Sample(t - t0, servers.rss(), (cpu - prev_cpu) / (t - prev_t),
                                sum(rss_bytes(w.pid) for _, w, _ in workers), (load_cpu - prev_load_cpu) / (t - prev_t),
                                sum(m["active"] for m in last.values()), sum(m["events"] for m in last.values()),
                                sum(m["errors"] for m in last.values()), nan_percentile(window, 99),
                                *_udp_since(udp, drops0))
                prev_cpu, prev_t, prev_load_cpu = cpu, t, load_cpu
                samples.append(sample)
                if progress and (len(samples) % max(1, int(30 / cfg.sample_interval)) == 0 or t >= end):
                    print(f"  t={sample.t:6.0f} s  open streams {sample.active:5d}  events {sample.events:9d}  "
                          f"server RSS {sample.server_rss / 2**20:7.1f} MiB  CPU {sample.server_cpu * 100:5.1f}%  "
                          f"load CPU {sample.load_cpu * 100:5.1f}%  window p99 gap {sample.gap_p99 * 1000:6.0f} ms  "
                          f"errors {sample.errors}  UDP queue {sample.udp_queue / 1024:5.0f} KiB, "
                          f"{sample.udp_drops} dropped", flush=True)
                    if hostile_last:
                        print(f"           hostile: {hostile_last['line']}", flush=True)
            if restarts is not None:
                restarts.stop()  # one under way finishes first: the streams it cut resume before the stop
                alive()
            cpu_load = servers.cpu() - cpu0
            wall = time.monotonic() - t0
            hog_figures = {"processes": cfg.cpu_hog, "cpu_share": hog.cpu() / wall if wall else 0.0,
                           "load_average_start": loadavg0[0], "load_average_end": os.getloadavg()[0]}
            for _, _, pipe in workers:
                pipe.send("stop")
            finals = {kind: _final(kind, pipe) for kind, _, pipe in workers}
            for _, worker, _ in workers:
                worker.join(30)
            hostile = finals.pop("hostile", None)
            stats = engine_stats(servers.stats_ports)
            drained_rss = servers.rss()
            fleet = None if restarts is None else fleet_figures(restarts)
        finally:
            if restarts is not None:
                restarts.stop()
            for _, worker, _ in workers:
                if worker.is_alive():
                    worker.kill()
    result = summarize(cfg, samples, finals, idle_rss=idle_rss, drained_rss=drained_rss, cpu_seconds=cpu_load,
                       wall=wall, engine=stats, t0=t0, hostile=hostile)
    if fleet is not None:
        result["fleet"] = fleet
    result["contention"] = hog_figures
    return result


# -- the command line ----------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = LoadConfig()
    parser.add_argument("--sse", type=numbers.count, default=d.sse_streams, help="concurrent SSE streams (%(default)s)")
    parser.add_argument("--h3", type=numbers.count, default=d.h3_streams,
                        help="concurrent HTTP/3 Eloquent streams (%(default)s)")
    parser.add_argument("--h3-connections", type=numbers.positive, default=d.h3_connections,
                        help="QUIC connections the HTTP/3 streams share (%(default)s)")
    parser.add_argument("--duration", type=numbers.seconds, default=d.duration,
                        help="seconds held after the ramp (%(default)s)")
    parser.add_argument("--ramp", type=numbers.seconds, default=d.ramp, help="seconds to open every slot (%(default)s)")
    parser.add_argument("--tpot", type=numbers.seconds, default=d.tpot, help="engine seconds per token (%(default)s)")
    parser.add_argument("--ttft", type=numbers.seconds, default=d.ttft,
                        help="engine seconds to first token (%(default)s)")
    parser.add_argument("--max-tokens", type=numbers.positive, default=d.max_tokens,
                        help="tokens per stream (%(default)s)")
    parser.add_argument("--resume-ttl", type=numbers.seconds, default=d.resume_ttl,
                        help="server's resume TTL in seconds (%(default)s)")
    parser.add_argument("--sample-interval", type=numbers.positive_seconds, default=d.sample_interval,
                        help=argparse.SUPPRESS)
    parser.add_argument("--cpu-hog", type=numbers.number(int, "a whole number", high=MAX_CPU_HOG, high_open=False),
                        default=d.cpu_hog, metavar="N",
                        help="N processes spinning on the CPU beside the load for the whole run, started and "
                             "stopped by the bench: streams must still complete or fail typed (%(default)s)")
    parser.add_argument("--quick", action="store_true", help="a 30 s smoke run: 100 SSE + 20 HTTP/3 streams")
    parser.add_argument("--json", metavar="PATH", help="also write every figure and sample as JSON")
    add_plot(parser, "write a PNG of the samples over time (needs matplotlib)")
    add_progress(parser)
    fleet = parser.add_argument_group(
        "rolling restarts", "replicas sharing a redis-server behind nginx (TCP and UDP), restarted one by one")
    fleet.add_argument("--restart-every", type=numbers.seconds, default=d.restart_every, metavar="S",
                       help="SIGTERM a replica every S seconds, wait until it is back and ready, then the next; "
                            "the hold lasts until each was restarted once (0: one server; needs nginx and "
                            "redis-server)")
    fleet.add_argument("--replicas", type=numbers.number(int, "a whole number", low=1, high=MAX_REPLICAS,
                                                         high_open=False),
                       default=d.replicas, help="replicas under --restart-every (%(default)s)")
    fleet.add_argument("--drain-timeout", type=numbers.seconds, default=d.drain_timeout, metavar="SECONDS",
                       help="the replicas' --drain-timeout: streams still running then migrate (%(default)s)")
    hostile = parser.add_argument_group(
        "hostile mix", "traffic beside the normal load; the exit code is still the normal streams' verdict")
    p = HOSTILE_PRESET
    hostile.add_argument("--hostile", action="store_true",
                         help=f"add the preset mix: {p['never_readers']} never-readers, {p['fake_initials_per_s']:g} "
                              f"fake Initials/s, {p['resume_storm']} resume-storm clients (each knob below wins)")
    hostile.add_argument("--never-readers", type=numbers.number(int, "a whole number", high=MAX_NEVER_READERS,
                                                                high_open=False),
                         help="TCP clients that send a streaming request and never read (0)")
    hostile.add_argument("--fake-initials-per-s", type=numbers.number(float, "packets per second",
                                                                      high=MAX_FAKE_INITIALS_PER_S, high_open=False),
                         help="1200-byte QUIC Initials with random DCIDs sent to the UDP port per second (0)")
    hostile.add_argument("--resume-storm", type=numbers.number(int, "a whole number", high=MAX_RESUME_STORM,
                                                               high_open=False),
                         help="SSE clients that cut and resume every stream after a few events (0)")


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    from eloquent_plugins.core.errors import ConfigError

    knobs = {name: getattr(args, name, None) for name in HOSTILE_PRESET}
    if getattr(args, "hostile", False):
        knobs = {name: HOSTILE_PRESET[name] if value is None else value for name, value in knobs.items()}
    hostile = {name: value for name, value in knobs.items() if value is not None}
    knobs_more = {"restart_every": getattr(args, "restart_every", 0.0), "replicas": getattr(args, "replicas", 2),
             "drain_timeout": getattr(args, "drain_timeout", 2.0), "cpu_hog": getattr(args, "cpu_hog", 0)}
    if args.quick:
        return LoadConfig(sse_streams=100, h3_streams=20, h3_connections=4, duration=20, ramp=5, tpot=0.1,
                          max_tokens=40, resume_ttl=5, sample_interval=1, **hostile, **knobs_more)
    cfg = LoadConfig(sse_streams=args.sse, h3_streams=args.h3, h3_connections=args.h3_connections,
                     duration=args.duration, ramp=args.ramp, tpot=args.tpot, ttft=args.ttft,
                     max_tokens=args.max_tokens, resume_ttl=args.resume_ttl, sample_interval=args.sample_interval)
    if cfg.sse_streams + cfg.h3_streams == 0:
        raise ConfigError("nothing to do: --sse and --h3 are both 0")
    return replace(cfg, **hostile, **knobs_more)


def run(args: argparse.Namespace) -> int:
    import tempfile

    cfg = config_from_args(args)
    log_path = os.path.join(tempfile.gettempdir(), "eloquent-bench-load-server.log")
    mix = (f"; hostile: {cfg.never_readers} never-readers, {cfg.fake_initials_per_s:g} fake Initials/s, "
           f"{cfg.resume_storm} resume-storm clients" if cfg.hostile else "")
    where = (f"{cfg.replicas} eloquent serve replicas behind nginx with a redis-server, one restarted every "
             f"{cfg.restart_every:g} s (logs {tempfile.gettempdir()}/eloquent-fleet-*.log)" if cfg.fleet else
             f"eloquent serve (log {log_path})")
    hog = f"; {cfg.cpu_hog} CPU hog processes beside it on {os.cpu_count()} CPUs" if cfg.cpu_hog else ""
    print(f"starting {where}; {cfg.sse_streams} SSE + {cfg.h3_streams} HTTP/3 streams, "
          f"ramp {cfg.ramp:.0f} s, hold {cfg.duration:.0f} s{mix}{hog}", flush=True)
    result = run_load(cfg, log_path=log_path, progress=args.progress is not False)
    print_summary(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if result["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eloquent bench load", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
