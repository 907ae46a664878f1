"""``eloquent bench overhead --vllm MODEL``: CPU per token in vLLM's processes, for every streaming path.

Why CPU per token: on a small machine shared by the engine, the API server and the client, tokens/s depends on
who gets the cores (single rounds spanned 0.66-1.40); the CPU time vLLM's API-server process spends per token it
serves does not. So the figure is, per run, the CPU seconds each process spent (``/proc``, see :mod:`.cpu`) over
the completion tokens of the run's valid responses; tokens/s stays as a second column.

Servers, all up at once (an idle one costs ~0.01 CPU s per 5 s; each run is attributed to the processes of the
server it used): **plugin** (``python -m eloquent_vllm.serve MODEL --stream-transport eloquent`` by default),
**vllm** (the same command without our flags: vLLM unchanged) and, when ``eloquent_openai`` is importable,
**gateway** (``eloquent serve --upstream openai=<vllm URL>``, this package's own process in front of **vllm**).
Paths, each one run per round, in an order rotated from round to round:

* ``non-streamed`` and ``vllm-streamed`` on **vllm**;
* ``plugin-non-streamed``, ``plugin-bypass`` (header ``eloquent-transport: datagram``: vLLM's own streaming in
  the plugin's server, the middleware passes it through), ``plugin-sse`` (through the middleware) and
  ``plugin-h3`` (HTTP/3 datagrams, ``eloquent_client``) on **plugin**;
* ``gateway``: streamed through the gateway; vLLM's API-server CPU is **vllm**'s, the gateway's own is reported.

Per round, ratios of API-server CPU per token are taken within the round (e.g. plugin-sse over vllm-streamed)
and the table gives their median and min-max: the paired-round spread that any "1.00x" is read against.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.cli.bench.cpu import CpuMeter, ServerProcesses, cmdline, descendants, vllm_processes
from eloquent_plugins.cli.bench.overhead_h3 import run_level_h3
from eloquent_plugins.cli.bench.overhead_live import parse_cpus, parse_levels
from eloquent_plugins.cli.bench.overhead_request import (
    BYPASS,
    NON_STREAMED,
    STREAMED,
    Mode,
    PathError,
    check_path,
    run_level,
)
from eloquent_plugins.cli.bench.procs import free_port, stop_process, wait_healthy


@dataclass(frozen=True)
class BenchPath:
    name: str
    server: str
    """The server the client talks to: ``plugin``, ``vllm`` or ``gateway``."""
    vllm: str
    """The vLLM server whose processes do the work: ``plugin`` or ``vllm``."""
    mode: Mode
    title: str
    h3: bool = False
    middleware: bool | None = None
    """Must the responses carry our middleware's headers (True), none of them (False), or unchecked (None)."""


PATHS = (
    BenchPath("non-streamed", "vllm", "vllm", NON_STREAMED, "non-streamed, vLLM without the plugin"),
    BenchPath("vllm-streamed", "vllm", "vllm", STREAMED, "vLLM's own streaming, without the plugin", middleware=False),
    BenchPath("plugin-non-streamed", "plugin", "plugin", NON_STREAMED, "non-streamed, plugin server"),
    BenchPath("plugin-bypass", "plugin", "plugin", BYPASS, "vLLM's own streaming on the plugin server (bypass)",
              middleware=False),
    BenchPath("plugin-sse", "plugin", "plugin", STREAMED, "the plugin's SSE path", middleware=True),
    BenchPath("plugin-h3", "plugin", "plugin", STREAMED, "the plugin's HTTP/3 datagram path", h3=True),
    BenchPath("gateway", "gateway", "vllm", STREAMED, "vLLM's own streaming behind the openai= gateway"),
)
RATIOS = (  # numerator, denominator, target (shown beside the figure)
    ("plugin-sse", "vllm-streamed", "<= 1.05"),
    ("plugin-bypass", "vllm-streamed", "1.00"),
    ("plugin-non-streamed", "non-streamed", "1.00"),
    ("plugin-h3", "vllm-streamed", ""),
    ("gateway", "vllm-streamed", "1.00"),
    ("plugin-sse", "plugin-bypass", ""),
    ("vllm-streamed", "non-streamed", ""),
)


# -- servers -----------------------------------------------------------------------------------------------------


def vllm_python(arg: str | None) -> str:
    if arg:
        return arg
    venv = os.environ.get("ELOQUENT_VLLM_VENV")
    return os.path.join(venv, "bin", "python") if venv else sys.executable


def _popen(cmd: list[str], log_path: str, env: dict[str, str], cpus: set[int] | None) -> subprocess.Popen[bytes]:
    if cpus:
        taskset = shutil.which("taskset")
        if taskset is None:
            raise RuntimeError("--server-cpus needs taskset (util-linux)")
        cmd = [taskset, "-c", ",".join(map(str, sorted(cpus))), *cmd]  # exec()s: the PID stays the server's
    with open(log_path, "wb") as log:
        # Own process group (one killpg stops its children) but the caller's session: see procs.stop_process.
        return subprocess.Popen(cmd, cwd=tempfile.gettempdir(), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, process_group=0)


@dataclass
class Server:
    label: str
    proc: subprocess.Popen[bytes]
    url: str
    log: str
    command: str
    udp_port: int | None = None
    procs: ServerProcesses | None = None


def launch_vllm(label: str, python: str, model: str, flags: list[str], extra: list[str], *,
                cpus: set[int] | None = None) -> Server:
    """``python -m eloquent_vllm.serve MODEL`` (vLLM's ``serve`` plus our flags; without them vLLM unchanged) on a
    free port, from a temporary directory (the checkout's egg-info would shadow the installed entry points)."""
    port = free_port()
    if os.path.exists(model):
        model = os.path.abspath(model)
    cmd = [python, "-m", "eloquent_vllm.serve", model, "--host", "127.0.0.1", "--port", str(port), *extra, *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_") and k != "VLLM_PLUGINS"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    log = os.path.join(tempfile.gettempdir(), f"eloquent-bench-vllm-{label}.log")
    udp = None
    if "--eloquent-port" in flags:
        udp = int(flags[flags.index("--eloquent-port") + 1])
    return Server(label, _popen(cmd, log, env, cpus), f"http://127.0.0.1:{port}", log, shlex.join(cmd[1:]), udp)


def launch_gateway(upstream: Server, *, cpus: set[int] | None = None) -> Server:
    """``eloquent serve --upstream openai=URL`` with this interpreter (our package, not vLLM's venv)."""
    port = free_port()
    cmd = [sys.executable, "-m", "eloquent_plugins.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--upstream", f"openai={upstream.url}", "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
    log = os.path.join(tempfile.gettempdir(), "eloquent-bench-vllm-gateway.log")
    return Server("gateway", _popen(cmd, log, env, cpus), f"http://127.0.0.1:{port}", log, shlex.join(cmd[1:]))


def gateway_available() -> bool:
    return importlib.util.find_spec("eloquent_openai") is not None


def udp_port() -> int:
    return free_port(socket.SOCK_DGRAM)


# -- measurement -------------------------------------------------------------------------------------------------


def _run(path: BenchPath, servers: dict[str, Server], model: str, max_tokens: int, level: int, n: int
         ) -> dict[str, Any]:
    server = servers[path.server]
    if path.h3:
        assert server.udp_port is not None
        return asyncio.run(run_level_h3(server.udp_port, model, max_tokens, level, n, name=path.name))
    run = asyncio.run(run_level(server.url, model, path.mode, max_tokens, level, n))
    run["mode"] = path.name
    return run


def _check(path: BenchPath, run: dict[str, Any]) -> None:
    if path.h3 and run["via_middleware"] < run["requests"] - run["errors"]:
        raise PathError(f"{path.name}: {run['via_middleware']} of {run['requests']} responses came as datagrams")
    if path.middleware is not None and path.mode.stream:
        check_path(run, path.middleware)


def cpu_groups(servers: dict[str, Server]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for label in ("plugin", "vllm"):
        if label in servers and servers[label].procs is not None:
            roles = servers[label].procs.roles()  # type: ignore[union-attr]
            groups[f"{label} api"], groups[f"{label} engine"] = roles["api"], roles["engine"]
    if "gateway" in servers:
        groups["gateway"] = [servers["gateway"].proc.pid, *descendants(servers["gateway"].proc.pid)]
    return groups


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def per_token_us(run: dict[str, Any], group: str) -> float:
    return 1e6 * run["cpu_s"][group] / run["tokens"] if run["tokens"] else float("nan")


def per_event_us(run: dict[str, Any], group: str) -> float:
    return 1e6 * run["cpu_s"][group] / run["events"] if run.get("events") else float("nan")


def summarise(level: int, n: int, paths: list[BenchPath], rounds: list[dict[str, dict[str, Any]]]
              ) -> dict[str, Any]:
    out: dict[str, Any] = {"concurrency": level, "requests": n, "paths": {}, "ratios": {}, "ratios_per_event": {}}
    for path in paths:
        runs = [r[path.name] for r in rounds]
        entry: dict[str, Any] = {
            "api_us_per_token": _spread([per_token_us(r, f"{path.vllm} api") for r in runs]),
            "engine_us_per_token": _spread([per_token_us(r, f"{path.vllm} engine") for r in runs]),
            "tokens_per_s": _spread([r["tokens_per_s"] for r in runs]),
            "client_cpu_us_per_token": 1e6 * sum(r["client_cpu_s"] for r in runs)
            / max(1, sum(r["tokens"] for r in runs)),
            "errors": sum(r["errors"] for r in runs)}
        if path.mode.stream:
            entry["events_per_token"] = _spread([r["events"] / r["tokens"] if r["tokens"] else float("nan")
                                                 for r in runs])
            entry["api_us_per_event"] = _spread([per_event_us(r, f"{path.vllm} api") for r in runs])
        if path.server == "gateway":
            entry["gateway_us_per_token"] = _spread([per_token_us(r, "gateway") for r in runs])
        ttfts = [r["ttft_p50_s"] for r in runs if "ttft_p50_s" in r]
        if ttfts:
            entry["ttft_p50_s_median"] = statistics.median(ttfts)
        samples = [r["error_sample"] for r in runs if "error_sample" in r]
        if samples:
            entry["error_sample"] = samples[0]
        out["paths"][path.name] = entry
    names = {p.name: p for p in paths}
    for num, den, target in RATIOS:
        if num in names and den in names:
            values = [per_token_us(r[num], f"{names[num].vllm} api") / per_token_us(r[den], f"{names[den].vllm} api")
                      for r in rounds]
            out["ratios"][f"{num}/{den}"] = {**_spread(values), "target": target}
            if names[num].mode.stream and names[den].mode.stream:  # the same, per SSE event the client got
                values = [per_event_us(r[num], f"{names[num].vllm} api")
                          / per_event_us(r[den], f"{names[den].vllm} api") for r in rounds]
                out["ratios_per_event"][f"{num}/{den}"] = _spread(values)
    if "gateway" in names and "vllm-streamed" in names:
        values = [per_token_us(r["gateway"], "gateway") / per_token_us(r["vllm-streamed"], "vllm api")
                  for r in rounds]
        out["ratios"]["gateway own/vllm-streamed"] = {**_spread(values), "target": ""}
    return out


def measure(servers: dict[str, Server], paths: list[BenchPath], model: str, max_tokens: int, levels: list[int],
            requests: int | None, rounds: int, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every level: one warm-up run per path (its path checked), then ``rounds`` rounds of every path, each run
    between two readings of every measured process's CPU time."""
    meter = CpuMeter(cpu_groups(servers))
    rows = []
    for level in levels:
        n = requests or max(4, 2 * level)
        for path in paths:
            _check(path, _run(path, servers, model, 8, level, level))
        per_round: list[dict[str, dict[str, Any]]] = []
        for i in range(rounds):
            order = paths[i % len(paths):] + paths[:i % len(paths)]
            runs: dict[str, dict[str, Any]] = {}
            for position, path in enumerate(order):
                meter.start()
                run = _run(path, servers, model, max_tokens, level, n)
                run["cpu_s"] = meter.stop()
                _check(path, run)
                run["round"], run["position"] = i, position
                runs[path.name] = run
            per_round.append(runs)
            if progress:
                cells = "  ".join(f"{p.name} {per_token_us(runs[p.name], p.vllm + ' api'):.0f}" for p in order)
                progress(f"c={level} round {i + 1}/{rounds} API us/token: {cells}")
        summary = summarise(level, n, paths, per_round)
        summary["runs"] = [run for r in per_round for run in r.values()]
        rows.append(summary)
    return rows


# -- printing ----------------------------------------------------------------------------------------------------


def _cell(spread: dict[str, Any], digits: int = 1) -> str:
    return f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}-{spread['max']:.{digits}f}]"


def print_report(result: dict[str, Any]) -> None:
    pins = [f"{what} on CPUs {result[key]}" for what, key in (("vLLM", "server_cpus"), ("gateway", "gateway_cpus"),
                                                                ("client", "client_cpus")) if result.get(key)]
    if pins:
        print("pinned: " + ", ".join(pins))
    for label, info in result["servers"].items():
        print(f"{label}: {info['command']}")
        for role, pids in info.get("processes", {}).items():
            print(f"  {role}: {', '.join(f'{pid} ({text[:60]})' for pid, text in pids.items())}")
        if info.get("how"):
            print(f"  found: {info['how']}")
    print(f"\n{'path':<20} {'conc':>4} {'API CPU us/token':<22} {'engine us/token':<24} {'gateway us/token':<20} "
          f"{'tok/s':<24} {'TTFT':>6} {'err':>3} {'events/token':<19} {'API us/event':<20}")
    for row in result["levels"]:
        for name, e in row["paths"].items():
            gw = _cell(e["gateway_us_per_token"]) if "gateway_us_per_token" in e else "-"
            ttft = f"{e['ttft_p50_s_median'] * 1000:.0f}ms" if "ttft_p50_s_median" in e else "-"
            per_event = (f"{_cell(e['events_per_token'], 2):<19} {_cell(e['api_us_per_event'])}"
                         if "events_per_token" in e else "")
            print(f"{name:<20} {row['concurrency']:>4} {_cell(e['api_us_per_token']):<22} "
                  f"{_cell(e['engine_us_per_token']):<24} {gw:<20} {_cell(e['tokens_per_s']):<24} {ttft:>6} "
                  f"{e['errors']:>3} {per_event}".rstrip())
    print("\nAPI-server CPU per token, median of per-round ratios [min-max]")
    for row in result["levels"]:
        for name, spread in row["ratios"].items():
            target = f"  (target {spread['target']})" if spread["target"] else ""
            print(f"  c={row['concurrency']:<3} {name:<42} {_cell(spread, 3)}{target}")
    print("\nthe same per SSE event received (vLLM sends fewer, fuller events when its API server falls behind)")
    for row in result["levels"]:
        for name, spread in row["ratios_per_event"].items():
            print(f"  c={row['concurrency']:<3} {name:<42} {_cell(spread, 3)}")
    for row in result["levels"]:
        for name, e in row["paths"].items():
            if "error_sample" in e:
                print(f"c={row['concurrency']} {name}: {e['errors']} errors, e.g. {e['error_sample']}")


# -- entry -------------------------------------------------------------------------------------------------------


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """Start the servers side by side, measure every path, stop them (whatever happened)."""
    import httpx

    quick = bool(getattr(args, "quick", False))
    levels = parse_levels(args.concurrency)
    rounds = args.rounds or (2 if quick else 7)
    max_tokens = 32 if quick and args.max_tokens == 256 else args.max_tokens
    python = vllm_python(args.vllm_python)
    extra = shlex.split(args.vllm_args)
    cpus = parse_cpus(args.server_cpus) if args.server_cpus else None
    flags = ["--stream-transport", args.vllm_transport, "--eloquent-keepalive", "15"]
    if args.vllm_transport == "eloquent":
        flags += ["--eloquent-port", str(udp_port())]
    servers: dict[str, Server] = {}
    try:
        servers["plugin"] = launch_vllm("plugin", python, args.vllm, flags, extra, cpus=cpus)
        servers["vllm"] = launch_vllm("vllm", python, args.vllm, [], extra, cpus=cpus)
        for server in list(servers.values()):
            print(f"starting {server.label}: {server.command}  (log {server.log})", flush=True)
        for server in list(servers.values()):
            wait_healthy(server.proc, server.url + "/health", timeout=args.vllm_startup_timeout, log_path=server.log,
                         what=f"vLLM ({server.label})", interval=1.0)
            server.procs = vllm_processes(server.proc.pid)
        gateway_note = ""
        if gateway_available() and not getattr(args, "no_gateway", False):
            gateway_cpus = getattr(args, "gateway_cpus", None)
            servers["gateway"] = launch_gateway(servers["vllm"],
                                                cpus=parse_cpus(gateway_cpus) if gateway_cpus else None)
            wait_healthy(servers["gateway"].proc, servers["gateway"].url + "/v1/models", timeout=120,
                         log_path=servers["gateway"].log, what="gateway")
        else:
            gateway_note = "eloquent_openai is not importable: no gateway path"
            print(gateway_note, flush=True)
        paths = [p for p in PATHS if p.server in servers and (not p.h3 or servers[p.server].udp_port)]
        model = args.model or httpx.get(servers["vllm"].url + "/v1/models", timeout=30).json()["data"][0]["id"]
        load_before = os.getloadavg()[0]
        levels_out = measure(servers, paths, model, max_tokens, levels, args.requests, rounds, _progress)
        info = {}
        for label, server in servers.items():
            entry: dict[str, Any] = {"command": server.command, "url": server.url}
            if server.procs is not None:
                entry["processes"] = {"api": server.procs.api, "engine": server.procs.engine,
                                      "other": server.procs.other}
                entry["how"] = server.procs.how
            else:
                entry["processes"] = {"gateway": {server.proc.pid: cmdline(server.proc.pid)}}
                entry["how"] = "the started process and its descendants"
            info[label] = entry
    finally:
        for server in servers.values():
            stop_process(server.proc, signal.SIGTERM, grace=60)
    result = {"vllm": args.vllm, "vllm_args": extra, "transport": args.vllm_transport, "model": model,
              "max_tokens": max_tokens, "concurrency": levels, "rounds": rounds, "quick": quick,
              "cpus": os.cpu_count(), "server_cpus": args.server_cpus, "client_cpus": args.client_cpus,
              "gateway_cpus": getattr(args, "gateway_cpus", None),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg()[0], "servers": info,
              "paths": [p.name for p in paths], "titles": {p.name: p.title for p in paths}, "gateway_note": gateway_note,
              "levels": levels_out}
    print_report(result)
    return result
