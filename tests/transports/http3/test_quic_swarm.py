"""Issue 28's probe against ``eloquent serve``: 3,000 real QUIC connections from one address (127.0.0.2), each
through its TLS handshake, opening no stream and PINGing every second past the idle timeout. Before the connection
caps the server held every one: +275 MiB RSS here (the issue: +281 MiB, 96 KiB each), and PINGs kept them for
ever. Now: at most ``max_connections_per_address`` from that address (idle ones closed for newcomers, newcomers
refused when none is idle), none kept past the idle timeout without a stream, the RSS growth inside the budget
below, and a legitimate client's stream (from 127.0.0.1) beside them keeps its pace.

The swarm (``tests/support/quic_swarm.py``) runs in its own process at a lower priority (an attacker's CPU is its
own, not the server's: here the two share a busy machine), the server in another; RSS is read from /proc; the
listener's counters come from ``/eloquent/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from eloquent_client import EloquentClient

from tests.support.servers import eloquent_serve_process

SWARM = int(os.environ.get("ELOQUENT_TEST_QUIC_SWARM", "3000"))
"""The issue's size; fewer for a quick look (``ELOQUENT_TEST_QUIC_SWARM=500``)."""
PER_ADDRESS = 128
"""``max_connections_per_address`` (the default, set explicitly here)."""
IDLE = 3.0
"""The QUIC idle timeout, short so the test waits past it: also the most a connection may carry no stream."""
PER_CONNECTION = 96 << 10
"""What one idle connection costs the server: issue 28 measured 96 KiB (281 MiB for 3,000); 275 MiB here."""
CHURN = 32 << 20
"""What a stream of short-lived connections costs whatever the cap: the handshake path's allocations and the
garbage aioquic's connections leave for the collector (each is a reference cycle), settled. Measured from a fresh
server: +31 MiB at a cap of 32 for 3,000 connections, +34 MiB for 8,000 (flat after the first 2,000), +33 MiB at
a cap of 256."""
BUDGET = 2 * PER_ADDRESS * PER_CONNECTION + CHURN
"""56 MiB: the cap's 128 connections twice over at 96 KiB each (those an eviction closes live on for aioquic's
closing period, 3 x PTO, then wait for the collector) plus ``CHURN``. Without the caps the swarm grew the server
by 275 MiB, and more with every connection."""
SWARM_ADDRESS = "127.0.0.2"
CHAT = {"model": "eloquent-builtin", "messages": [{"role": "user", "content": "beside a swarm"}], "stream": True,
        "max_tokens": 1000}


def rss(pid: int) -> int:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert match is not None
    return int(match.group(1)) << 10


def counter(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match is not None, name
    return float(match.group(1))


async def run_swarm(port: int, count: int, hold: float) -> dict[str, Any]:
    """``tests/support/quic_swarm.py`` in its own process; its report."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.quic_swarm", "--port", str(port), "--bind", SWARM_ADDRESS,
        "--count", str(count), "--hold", str(hold), "--ping", "1", "--nice", "10",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[3])
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


async def paced_streams(client: EloquentClient, times: list[float]) -> None:
    """One long stream after another on the same connection, until cancelled: when each event came."""
    while True:
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as stream:
            async for _ in stream.events():
                times.append(time.monotonic())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
async def test_a_swarm_of_pinging_connections_from_one_address_is_capped_and_closed() -> None:
    env = {"ELOQUENT_QUIC_IDLE_TIMEOUT": str(IDLE), "ELOQUENT_QUIC_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS)}
    with eloquent_serve_process("--tpot", "0.02", "--ttft", "0.05", "--log-level", "warning", env=env) as proc:
        port = proc.port  # type: ignore[attr-defined]
        # Warm the handshake path (first-use allocations, not per connection) and let those connections close.
        warm = await run_swarm(port, PER_ADDRESS, IDLE + 1.5)
        assert warm["connected"] == PER_ADDRESS, warm
        times: list[float] = []
        async with EloquentClient(f"https://127.0.0.1:{port}", transport="eloquent", verify=False,
                                  timeout=60) as client:
            legit = asyncio.create_task(paced_streams(client, times))
            try:
                while len(times) < 20:
                    await asyncio.sleep(0.05)
                    assert not legit.done(), legit.exception()
                baseline = peak = rss(proc.pid)
                samples: list[tuple[float, int]] = []
                started = time.monotonic()
                swarm = asyncio.create_task(run_swarm(port, SWARM, IDLE + 3))
                while not swarm.done():
                    now = rss(proc.pid)
                    peak = max(peak, now)
                    samples.append((round(time.monotonic() - started, 1), now >> 20))
                    await asyncio.sleep(0.25)
                report = swarm.result()
                stopped = time.monotonic()
                assert not legit.done(), legit.exception()
            finally:
                legit.cancel()
                await asyncio.gather(legit, return_exceptions=True)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            metrics = (await http.get("/eloquent/metrics")).text
    marks = [t for t in times if t >= started] + [stopped]
    gap = max(b - a for a, b in zip(marks, marks[1:]))
    refused, evicted, idle_closed, expired = (counter(metrics, f"eloquent_{name}_total") for name in (
        "quic_connections_refused", "quic_connections_evicted", "quic_connections_idle_closed",
        "quic_handshakes_expired"))
    held = counter(metrics, "eloquent_quic_connections")
    print(f"swarm: {report}; RSS {baseline >> 20} -> peak {peak >> 20} MiB (+{(peak - baseline) / 2**20:.1f}, "
          f"budget {BUDGET >> 20}); legit stream's largest gap {gap:.3f} s over {len(marks)} events; refused "
          f"{refused:.0f}, evicted {evicted:.0f}, idle-closed {idle_closed:.0f}, handshakes expired {expired:.0f}, "
          f"held at the end {held:.0f}; samples (s, MiB): {samples[::8]}")
    assert report["attempted"] == SWARM
    assert report["connected"] > 2 * PER_ADDRESS  # real handshakes, more than the cap lets the server hold
    # PINGs past the idle timeout kept none: the server closed every connection that got through (the warm-up's
    # too), and holds nothing but the legitimate client's at the end.
    assert evicted + idle_closed + expired >= report["connected"] + warm["connected"]
    assert idle_closed >= 1 and held <= 1
    assert peak - baseline <= BUDGET, f"RSS grew {(peak - baseline) / 2**20:.1f} MiB"
    assert gap < 1.0, gap
