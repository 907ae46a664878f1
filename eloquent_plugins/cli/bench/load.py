"""``eloquent bench load``: many concurrent SSE and HTTP/3 Eloquent streams held for minutes on one server.

What a user runs is what is measured: ``eloquent serve`` (built-in engine, SSE middleware with resume, HTTP/3
front end) in its own process; one load process holds ``--sse`` streams over HTTP/1.1 (a minimal keep-alive
client, :mod:`.lighthttp`, so the load generator costs less CPU than the server), another holds ``--h3`` streams
over HTTP/3 datagrams with the project's client (``--h3-connections`` QUIC connections). Each stream slot
reopens a stream as soon as one ends, so thousands of streams start and finish during the run; every stream's
text is checked against a non-streamed answer for the same prompt.

Reported: the server's resident memory (idle, over the run, its slope once steady, per open stream), its CPU,
event throughput, the inter-event gap each client saw (p50/p99/max, against the engine's pace), time to first
token, completed streams and every error by kind. The figures are printed; nothing here asserts a target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.bench.procs import free_port, stop_process, wait_healthy

MODEL = "eloquent-builtin"
PROMPTS = 32


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

    @property
    def stream_seconds(self) -> float:
        return self.ttft + self.max_tokens * self.tpot

    @property
    def steady_after(self) -> float:
        """Seconds from the start of the ramp after which memory should no longer grow: every slot has run one
        whole stream and the first finished streams have left the replay store."""
        return self.ramp + self.stream_seconds + self.resume_ttl


# -- what each load process counts ------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    started: int = 0
    completed: int = 0
    cancelled: int = 0
    events: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    gaps: array = field(default_factory=lambda: array("d"))
    ttfts: array = field(default_factory=lambda: array("d"))
    ttft_at: array = field(default_factory=lambda: array("d"))
    window_gaps: array = field(default_factory=lambda: array("d"))

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, detail[:300])

    def event(self, now: float, last: float | None, start: float) -> None:
        self.events += 1
        if last is None:
            self.ttfts.append(now - start)
            self.ttft_at.append(now)
        else:
            gap = now - last
            self.gaps.append(gap)
            self.window_gaps.append(gap)

    def progress(self, active: int) -> dict[str, Any]:
        gaps, self.window_gaps = self.window_gaps, array("d")
        return {"t": time.monotonic(), "events": self.events, "completed": self.completed, "active": active,
                "errors": sum(self.errors.values()), "window_gaps": gaps.tobytes()}

    def final(self) -> dict[str, Any]:
        return {"final": True, "started": self.started, "completed": self.completed, "cancelled": self.cancelled,
                "events": self.events, "errors": dict(self.errors), "examples": self.examples,
                "gaps": self.gaps.tobytes(), "ttfts": self.ttfts.tobytes(), "ttft_at": self.ttft_at.tobytes()}


def _chat_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": stream,
            "max_tokens": max_tokens, "temperature": 0}


def _prompts() -> list[str]:
    return [f"Load test {k}: tell me a long story about streaming." for k in range(PROMPTS)]


def _delta(data: str) -> tuple[str | None, bool]:
    """(content delta or None, whether the event is an in-band error)."""
    obj = json.loads(data)
    if "error" in obj:
        return None, True
    for choice in obj.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            return content, False
    return None, False


# -- SSE load process -----------------------------------------------------------------------------------------


class _StreamCheck:
    """One stream as a client reads it, SSE or HTTP/3: times each content event, keeps the text, and gives the
    verdict (completed, or which error) into the tally."""

    def __init__(self, tally: Tally) -> None:
        from eloquent_plugins.core.sse_reader import SSEParser

        self.tally = tally
        self.parser = SSEParser()
        self.text: list[str] = []
        self.done = self.failed = False
        self.last: float | None = None
        self.start = time.monotonic()

    def on_piece(self, result: Any, piece: bytes) -> None:
        """``lighthttp``'s body callback: the SSE messages in ``piece``, each timed as it arrives."""
        if result.status != 200:
            return
        for message in self.parser.feed(piece):
            self.on_data(message.data, time.monotonic())

    def on_data(self, data: str, now: float, *, error: bool = False) -> None:
        """One event's data; ``error``: the transport already marked it an in-band error."""
        if not error:
            if data == "[DONE]":
                self.done = True
            if not data or data == "[DONE]":
                return
        delta, in_band = (None, True) if error else _delta(data)
        if in_band:
            self.failed = True
            self.tally.error("in-band error event", data)
        elif delta:
            self.tally.event(now, self.last, self.start)
            self.last = now
            self.text.append(delta)

    def verdict(self, expected: str, *, need_done: bool) -> None:
        """An in-band error was counted already; else a missing ``[DONE]`` (where the transport sends one) or a
        text other than the non-streamed answer is an error, and anything else a completed stream."""
        text = "".join(self.text)
        if self.failed:
            return
        if need_done and not self.done:
            self.tally.error("stream ended without [DONE]")
        elif text != expected:
            self.tally.error("text differs from the non-streamed answer", text[:200])
        else:
            self.tally.completed += 1


async def _sse_slot(slot: int, cfg: LoadConfig, port: int, expected: dict[str, str], tally: Tally,
                    stop: asyncio.Event, active: list[int]) -> None:
    from eloquent_plugins.cli.bench.lighthttp import Connection, ResponseError

    prompts = list(expected)
    # A stream takes about stream_seconds; read_timeout more than that means it stalled.
    conn = Connection("127.0.0.1", port, timeout=cfg.stream_seconds + cfg.read_timeout)
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    i = 0
    try:
        while not stop.is_set():
            prompt = prompts[(slot + i) % len(prompts)]
            i += 1
            body = json.dumps(_chat_body(prompt, cfg.max_tokens, True)).encode()
            tally.started += 1
            active[0] += 1
            check = _StreamCheck(tally)

            try:
                result = await conn.request("POST", "/v1/chat/completions", body, headers, tail=1000,
                                            on_piece=check.on_piece)
                if result.status != 200:
                    tally.error(f"HTTP {result.status}", result.body.decode(errors="replace"))
                else:
                    check.verdict(expected[prompt], need_done=True)
            except asyncio.CancelledError:
                tally.cancelled += 1
                raise
            except (OSError, TimeoutError, ResponseError, ValueError) as exc:
                tally.error(f"SSE {type(exc).__name__}", str(exc))
                conn.close()
                await asyncio.sleep(0.5)
            finally:
                active[0] -= 1
    finally:
        conn.close()


# -- HTTP/3 load process ----------------------------------------------------------------------------------------


async def _h3_slot(slot: int, cfg: LoadConfig, client: Any, expected: dict[str, str], tally: Tally,
                   stop: asyncio.Event, active: list[int]) -> None:
    from eloquent_plugins.core.errors import EloquentError

    prompts = list(expected)
    i = 0
    while not stop.is_set():
        prompt = prompts[(slot + i) % len(prompts)]
        i += 1
        tally.started += 1
        active[0] += 1
        check = _StreamCheck(tally)
        try:
            async with client.stream("POST", "/v1/chat/completions",
                                     json=_chat_body(prompt, cfg.max_tokens, True)) as resp:
                async for event in resp.events():
                    check.on_data(event.data, event.rendered_at, error=event.kind == "error")
            # The reliable trailer (event count + digest) proves completeness here: no [DONE] needed.
            check.verdict(expected[prompt], need_done=False)
        except asyncio.CancelledError:
            tally.cancelled += 1
            raise
        except (EloquentError, OSError, TimeoutError, ValueError) as exc:
            tally.error(f"HTTP/3 {type(exc).__name__}", str(exc))
            await asyncio.sleep(0.5)
        finally:
            active[0] -= 1


# -- one load process -------------------------------------------------------------------------------------------


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


def _worker(kind: str, cfg: LoadConfig, port: int, udp_port: int, expected: dict[str, str], pipe: Any) -> None:
    """Entry of a load process: hold the slots until the parent says stop, reporting progress on ``pipe``."""
    _raise_nofile()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tells us to stop
    asyncio.run(_worker_main(kind, cfg, port, udp_port, expected, pipe))


async def _worker_main(kind: str, cfg: LoadConfig, port: int, udp_port: int, expected: dict[str, str],
                       pipe: Any) -> None:
    loop = asyncio.get_running_loop()
    tally = Tally()
    stop = asyncio.Event()
    active = [0]
    loop.add_reader(pipe.fileno(), stop.set)  # any message from the parent means stop
    n = cfg.sse_streams if kind == "sse" else cfg.h3_streams
    clients: list[Any] = []

    async def slot(i: int) -> None:
        await asyncio.sleep(cfg.ramp * i / max(1, n))
        if kind == "sse":
            await _sse_slot(i, cfg, port, expected, tally, stop, active)
        else:
            await _h3_slot(i, cfg, clients[i % len(clients)], expected, tally, stop, active)

    if kind == "h3":
        from eloquent_client import EloquentClient

        clients = [EloquentClient(f"https://127.0.0.1:{udp_port}", transport="eloquent", verify=False,
                                  timeout=cfg.read_timeout) for _ in range(max(1, min(cfg.h3_connections, n)))]

    async def report() -> None:
        while True:
            await asyncio.sleep(cfg.sample_interval)
            pipe.send(tally.progress(active[0]))

    tasks = [asyncio.create_task(slot(i)) for i in range(n)]
    reporter = asyncio.create_task(report())
    await stop.wait()
    loop.remove_reader(pipe.fileno())
    reporter.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, reporter, return_exceptions=True)
    for client in clients:
        try:
            await asyncio.wait_for(client.aclose(), 5)
        except Exception as exc:  # noqa: BLE001 - closing at the end must not lose the figures
            print(f"closing an HTTP/3 client: {exc!r}", file=sys.stderr)
    pipe.send(tally.final())


# -- the server and what the parent samples ---------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(cfg: LoadConfig, log_path: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """``eloquent serve`` with the built-in engine on free TCP/UDP ports; returns once ``/health`` answers."""
    _raise_nofile()  # inherited by the server: 1000+ connections
    port, udp = free_port(), free_port(socket.SOCK_DGRAM)
    cmd = [sys.executable, "-m", "eloquent_plugins.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--eloquent-port", str(udp), "--tpot", str(cfg.tpot), "--ttft", str(cfg.ttft), "--log-level", "warning"]
    env = {**os.environ, "ELOQUENT_RESUME_TTL": str(cfg.resume_ttl)}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                process_group=0)  # see procs.stop_process
    wait_healthy(proc, f"http://127.0.0.1:{port}/health", timeout=60, log_path=log_path, what="eloquent serve",
                 interval=0.2)
    return proc, port, udp


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, signal.SIGINT, grace=15)


def _expected_texts(port: int, cfg: LoadConfig) -> dict[str, str]:
    """The non-streamed answer for every prompt the load uses (with ttft/tpot 0: no need to wait for them)."""
    import httpx

    out = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for prompt in _prompts():
            body = _chat_body(prompt, cfg.max_tokens, False)
            body["eloquent_engine"] = {"ttft": 0, "tpot": 0}
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            out[prompt] = r.json()["choices"][0]["message"]["content"]
    return out


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


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


def run_load(cfg: LoadConfig, *, log_path: str, progress: bool = True) -> dict[str, Any]:
    import httpx

    _raise_nofile()
    proc, port, udp = start_server(cfg, log_path)
    ctx = multiprocessing.get_context("spawn")
    workers: list[tuple[str, Any, Any]] = []
    try:
        expected = _expected_texts(port, cfg)
        time.sleep(1.0)
        idle_rss = _rss_bytes(proc.pid)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        for kind, n in (("sse", cfg.sse_streams), ("h3", cfg.h3_streams)):
            if n <= 0:
                continue
            parent, child = ctx.Pipe()
            worker = ctx.Process(target=_worker, args=(kind, cfg, port, udp, expected, child), daemon=True)
            worker.start()
            child.close()
            workers.append((kind, worker, parent))
        last: dict[str, dict[str, Any]] = {}
        samples: list[Sample] = []
        prev_cpu, prev_t = cpu0, t0
        prev_load_cpu = 0.0
        end = t0 + cfg.ramp + cfg.duration
        while (now := time.monotonic()) < end:
            time.sleep(min(cfg.sample_interval, max(0.0, end - now)))
            window: list[float] = []
            for kind, worker, pipe in workers:
                while pipe.poll():
                    msg = pipe.recv()
                    last[kind] = msg
                    window.extend(array("d", msg["window_gaps"]))
                if not worker.is_alive():
                    raise RuntimeError(f"the {kind} load process died (exit code {worker.exitcode})")
            if proc.poll() is not None:
                raise RuntimeError(f"the server died (exit code {proc.returncode}; log {log_path})")
            t = time.monotonic()
            cpu = _cpu_seconds(proc.pid)
            load_cpu = sum(_cpu_seconds(w.pid) for _, w, _ in workers)
            sample = Sample(t - t0, _rss_bytes(proc.pid), (cpu - prev_cpu) / (t - prev_t),
                            sum(_rss_bytes(w.pid) for _, w, _ in workers), (load_cpu - prev_load_cpu) / (t - prev_t),
                            sum(m["active"] for m in last.values()), sum(m["events"] for m in last.values()),
                            sum(m["errors"] for m in last.values()), _percentile(window, 99))
            prev_cpu, prev_t, prev_load_cpu = cpu, t, load_cpu
            samples.append(sample)
            if progress and (len(samples) % max(1, int(30 / cfg.sample_interval)) == 0 or t >= end):
                print(f"  t={sample.t:6.0f} s  open streams {sample.active:5d}  events {sample.events:9d}  "
                      f"server RSS {sample.server_rss / 2**20:7.1f} MiB  CPU {sample.server_cpu * 100:5.1f}%  "
                      f"load CPU {sample.load_cpu * 100:5.1f}%  window p99 gap {sample.gap_p99 * 1000:6.0f} ms  "
                      f"errors {sample.errors}", flush=True)
        cpu_load = _cpu_seconds(proc.pid) - cpu0
        wall = time.monotonic() - t0
        finals: dict[str, dict[str, Any]] = {}
        for _, _, pipe in workers:
            pipe.send("stop")
        for kind, worker, pipe in workers:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if pipe.poll(1):
                    msg = pipe.recv()
                    if msg.get("final"):
                        finals[kind] = msg
                        break
            worker.join(30)
            if kind not in finals:
                raise RuntimeError(f"the {kind} load process sent no final figures")
        # Streams cut at the end are abandoned: the engine aborts them after the resume grace period (5 s).
        stats: dict[str, Any] = {}
        drain_deadline = time.monotonic() + 30
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            while time.monotonic() < drain_deadline:
                stats = client.get("/v1/engine/stats").json()
                if stats.get("running") == 0:
                    break
                time.sleep(1)
        drained_rss = _rss_bytes(proc.pid)
    finally:
        for _, worker, _ in workers:
            if worker.is_alive():
                worker.kill()
        stop_server(proc)
    return summarize(cfg, samples, finals, idle_rss=idle_rss, drained_rss=drained_rss, cpu_seconds=cpu_load,
                     wall=wall, engine=stats, t0=t0)


def summarize(cfg: LoadConfig, samples: list[Sample], finals: dict[str, dict[str, Any]], *, idle_rss: int,
              drained_rss: int, cpu_seconds: float, wall: float, engine: dict[str, Any],
              t0: float) -> dict[str, Any]:
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
        out[kind] = {k: final[k] for k in ("started", "completed", "cancelled", "events", "errors", "examples")}
        out[kind].update({"gap_p50_ms": _percentile(gaps, 50) * 1000, "gap_p99_ms": _percentile(gaps, 99) * 1000,
                          "gap_max_ms": max(gaps, default=float("nan")) * 1000,
                          "ttft_p50_ms": _percentile(ttfts, 50) * 1000, "ttft_p99_ms": _percentile(ttfts, 99) * 1000,
                          "held_ttft_p99_ms": _percentile(held, 99) * 1000,
                          "gaps": len(gaps)})
    out["errors"] = sum(sum(f["errors"].values()) for f in finals.values())
    return out


def print_summary(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(f"\nload: {cfg['sse_streams']} SSE + {cfg['h3_streams']} HTTP/3 Eloquent streams "
          f"({cfg['h3_connections']} QUIC connections), {cfg['max_tokens']} tokens each at tpot "
          f"{cfg['tpot'] * 1000:.0f} ms, held {cfg['duration']:.0f} s after a {cfg['ramp']:.0f} s ramp, "
          f"{result['cpus']} CPUs, resume TTL {cfg['resume_ttl']:.0f} s")
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
    e = result["engine_after"]
    print(f"engine after the load: running {e.get('running')}, completed {e.get('completed')}, "
          f"aborted {e.get('aborted')}, failed {e.get('failed')}; errors seen by clients: {result['errors']}")


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
    parser.add_argument("--quick", action="store_true", help="a 30 s smoke run: 100 SSE + 20 HTTP/3 streams")
    parser.add_argument("--json", metavar="PATH", help="also write every figure and sample as JSON")


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    from eloquent_plugins.core.errors import ConfigError

    if args.quick:
        return LoadConfig(sse_streams=100, h3_streams=20, h3_connections=4, duration=20, ramp=5, tpot=0.1,
                          max_tokens=40, resume_ttl=5, sample_interval=1)
    cfg = LoadConfig(sse_streams=args.sse, h3_streams=args.h3, h3_connections=args.h3_connections,
                     duration=args.duration, ramp=args.ramp, tpot=args.tpot, ttft=args.ttft,
                     max_tokens=args.max_tokens, resume_ttl=args.resume_ttl, sample_interval=args.sample_interval)
    if cfg.sse_streams + cfg.h3_streams == 0:
        raise ConfigError("nothing to do: --sse and --h3 are both 0")
    return cfg


def run(args: argparse.Namespace) -> int:
    import tempfile

    cfg = config_from_args(args)
    log_path = os.path.join(tempfile.gettempdir(), "eloquent-bench-load-server.log")
    print(f"starting eloquent serve (log {log_path}); {cfg.sse_streams} SSE + {cfg.h3_streams} HTTP/3 streams, "
          f"ramp {cfg.ramp:.0f} s, hold {cfg.duration:.0f} s", flush=True)
    result = run_load(cfg, log_path=log_path)
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
