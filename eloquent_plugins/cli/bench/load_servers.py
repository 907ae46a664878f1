"""The servers ``eloquent bench load`` holds its load against, and what the parent samples of them: one ``eloquent
serve``, or (``--restart-every``) a fleet of replicas behind nginx that :mod:`.load_fleet` restarts one by one."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eloquent_plugins.cli.bench.load_clients import raise_nofile
from eloquent_plugins.cli.bench.load_config import LoadConfig
from eloquent_plugins.cli.bench.procs import free_port, stop_process, wait_healthy

if TYPE_CHECKING:
    from eloquent_plugins.cli.bench.load_fleet import RollingRestarts


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # gone (a replica restarting)
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def udp_socket(port: int) -> tuple[int, int]:
    """(receive queue in bytes, datagrams dropped since it opened) of the UDP socket bound to ``port``, from
    ``/proc/net/udp`` and ``udp6`` ((0, 0) when none is found). The queue counts the kernel's memory per datagram
    (about 1 KiB for a small one), the unit ``SO_RCVBUF`` caps. Why the bench reads it: a server that takes its
    clients' datagrams in slower than they come shows it here first (the queue grows, then drops), long before
    any stream fails (issue 28)."""
    queue = drops = 0
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 13 or int(fields[1].rsplit(":", 1)[1], 16) != port:
                continue
            queue += int(fields[4].split(":")[1], 16)
            drops += int(fields[12])
    return queue, drops


@dataclass
class Servers:
    """What the parent samples: one ``eloquent serve``, or a fleet's replicas (whose processes come and go: CPU is
    summed per process, so a restart neither loses nor repeats any)."""

    port: int
    udp_port: int
    pids: Callable[[], list[int]]
    stats_ports: list[int]
    restarts: RollingRestarts | None = None
    _cpu: dict[int, float] = field(default_factory=dict)
    _spent: float = 0.0

    def rss(self) -> int:
        return sum(rss_bytes(pid) for pid in self.pids())

    def cpu(self) -> float:
        for pid in self.pids():
            now = cpu_seconds(pid)
            self._spent += max(0.0, now - self._cpu.get(pid, now))
            self._cpu[pid] = now
        return self._spent


def start_server(cfg: LoadConfig, log_path: str) -> tuple[subprocess.Popen[bytes], int, int]:
    """``eloquent serve`` with the built-in engine on free TCP/UDP ports; returns once ``/health`` answers."""
    raise_nofile()  # inherited by the server: 1000+ connections
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


@contextlib.contextmanager
def servers_under_load(cfg: LoadConfig, log_path: str) -> Iterator[tuple[Servers, Callable[[], None]]]:
    """The servers under load, and a check that raises if one died (or a rolling restart failed)."""
    if not cfg.fleet:
        proc, port, udp = start_server(cfg, log_path)

        def alive() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"the server died (exit code {proc.returncode}; log {log_path})")

        try:
            yield Servers(port, udp, lambda: [proc.pid], [port]), alive
        finally:
            stop_server(proc)
        return
    from eloquent_plugins.cli.bench import load_fleet

    with load_fleet.fleet(cfg) as f:
        restarts = load_fleet.RollingRestarts(f, cfg.restart_every, cfg.drain_timeout)
        servers = Servers(f.port, f.udp_port, f.pids, [r.port for r in f.replicas], restarts)

        def alive() -> None:
            if restarts.error is not None:
                raise RuntimeError(f"a rolling restart failed: {restarts.error!r}")

        yield servers, alive


def engine_stats(ports: list[int]) -> dict[str, Any]:
    """``/v1/engine/stats`` summed over the servers, once none runs a request any more (at most 30 s): streams cut
    at the end are abandoned, and the engine aborts them after the resume grace period."""
    import httpx

    stats: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = {}
        for port in ports:
            try:
                one = httpx.get(f"http://127.0.0.1:{port}/v1/engine/stats", timeout=10).json()
            except (httpx.HTTPError, ValueError):  # a server shedding load may refuse this too: ask again
                stats = {}
                break
            for key, value in one.items():
                if isinstance(value, (int, float)):
                    stats[key] = stats.get(key, 0) + value
        if stats.get("running") == 0:
            break
        time.sleep(1)
    return stats


def fleet_figures(restarts: RollingRestarts) -> dict[str, Any]:
    from eloquent_plugins.cli.bench.load_fleet import figures

    return figures(restarts)
