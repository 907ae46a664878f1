"""Hostile load on ``eloquent serve`` (issue 18): clients that never read must not make memory grow without bound,
keep engine requests running for nobody, or starve a normal client.

The scenario runs against a real ``eloquent serve`` subprocess with a small memory budget (``max_held_bytes``)
and per-stream queue bound (``max_queued_bytes``): ``HOSTILE`` raw sockets with a tiny receive buffer send a
long streaming request and never read a byte. Measured: the server's RSS (``/proc/PID/status``), the built-in
engine's running requests (``/v1/engine/stats``), the middleware's metrics; a normal client streams the same
request over and over meanwhile and must get the exact text every time (never a 503). The server's RSS may not
grow by more than the configured budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.servers import eloquent_serve_process
from tests.support.streams import chat_maker, text_of

HOSTILE = int(os.environ.get("ELOQUENT_TEST_HOSTILE", "150"))
SECONDS = float(os.environ.get("ELOQUENT_TEST_HOSTILE_SECONDS", "20"))
"""CI runs 150 clients for 20 s; the issue's full case is ELOQUENT_TEST_HOSTILE=500 ELOQUENT_TEST_HOSTILE_SECONDS=120."""
BUDGET = max(48 << 20, HOSTILE * (128 << 10))
"""The memory budget (48 MiB for 150 clients, 62.5 for 500): the server's RSS may not grow by more (150 clients
grew it by 28-32 MiB here, so the floor leaves room for a slower CI machine's engine catch-up). It counts
what the process holds for its streams (``sse/budget.py``): logs with their objects, a reserve per live stream,
the bytes uvicorn buffers for each client (``eloquent.socket``)."""
QUEUED = 32 << 10
GRACE = 1.0
SEND_TIMEOUT = 3.0

chat = chat_maker(max_tokens=40, prompt="normal client {seed}", seed=7)


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        assert match is not None
        return int(match.group(1)) * 1024


@contextlib.contextmanager
def serve(**env: str) -> Iterator[Server]:
    """``eloquent serve`` (SSE only) with these ``ELOQUENT_*`` settings, in its own process."""
    with eloquent_serve_process("--stream-transport", "sse", "--ttft", "0.01", "--tpot", "0.01",
                                "--log-level", "warning", env=env) as proc:
        yield Server(proc.port, proc)  # type: ignore[attr-defined]


def hostile_socket(port: int, body: bytes) -> socket.socket:
    """A client that sends a streaming request and never reads: a 4 KiB receive buffer, so the kernel stops
    taking the response early and the server's queue for it grows."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


async def stream_text(client: httpx.AsyncClient, body: dict[str, object]) -> str:
    datas: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, (response.status_code, await response.aread())
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                datas.append(line[6:])
    assert datas[-1] == "[DONE]"
    return text_of(datas)


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match is not None, name
    return float(match.group(1))


async def test_clients_that_never_read_are_cut_and_bounded_while_a_normal_client_is_served() -> None:
    env = {"ELOQUENT_MAX_HELD_BYTES": str(BUDGET), "ELOQUENT_MAX_QUEUED_BYTES": str(QUEUED),
           "ELOQUENT_RESUME_GRACE": str(GRACE), "ELOQUENT_KEEPALIVE": "1", "ELOQUENT_SOCKET_SEND_BUFFER": "16384",
           "ELOQUENT_SEND_TIMEOUT": str(SEND_TIMEOUT)}
    with serve(**env) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            expected = await stream_text(client, chat())
            assert expected
            for _ in range(3):  # warm: imports, first allocations
                assert await stream_text(client, chat()) == expected
            baseline = server.rss()

            started = time.monotonic()
            # Long streams (at 10 ms a token: longer than the run) that nobody reads.
            tokens = min(8192, max(3000, int(SECONDS * 150)))  # the built-in engine caps max_tokens at 8192
            hostile_body = json.dumps(chat(max_tokens=tokens, prompt="hostile {seed}", seed=1)).encode()
            socks = [hostile_socket(server.port, hostile_body) for _ in range(HOSTILE)]
            peak, served, samples = baseline, 0, []
            running_peak = 0
            try:
                deadline = started + SECONDS
                while time.monotonic() < deadline:
                    try:
                        assert await stream_text(client, chat()) == expected
                    except AssertionError as exc:
                        print(time.monotonic() - started, samples, exc)
                        raise
                    served += 1
                    stats = (await client.get("/v1/engine/stats")).json()
                    running_peak = max(running_peak, stats["running"])
                    rss = server.rss()
                    peak = max(peak, rss)
                    held_now = metric((await client.get("/metrics")).text, "eloquent_sse_bytes_held")
                    samples.append((round(time.monotonic() - started, 1), rss >> 20, stats["running"],
                                    round(held_now / 2**20, 1)))
                metrics = (await client.get("/metrics")).text
                stats = (await client.get("/v1/engine/stats")).json()
            finally:
                for sock in socks:
                    sock.close()
            print(f"baseline RSS {baseline >> 20} MiB, peak {peak >> 20} MiB (+{(peak - baseline) >> 20} MiB), "
                  f"budget {BUDGET >> 20} MiB; {served} normal streams served; engine running peak {running_peak}, "
                  f"at the end {stats}; samples (s, MiB, running): {samples}")
            cut = metric(metrics, "eloquent_sse_clients_cut_total")
            timed_out = metric(metrics, "eloquent_sse_send_timeouts_total")
            print(f"send timeouts {timed_out:.0f}")
            held = metric(metrics, "eloquent_sse_bytes_held")
            print(f"clients cut {cut:.0f}, bytes held {held:.0f}, most held {max(x[3] for x in samples)} MiB, "
                  f"cut streams shed {metric(metrics, 'eloquent_sse_cut_streams_shed_total'):.0f}, "
                  f"budget refusals {metric(metrics, 'eloquent_sse_budget_refusals_total'):.0f}")
            assert running_peak >= HOSTILE // 2  # the hostile streams did start
            assert cut + timed_out >= HOSTILE * 0.9  # every non-reader was cut
            assert stats["running"] <= 1  # their engine requests were aborted after the grace
            assert stats["aborted"] >= HOSTILE * 0.9
            assert held <= BUDGET
            assert peak - baseline < BUDGET
            assert served >= 10
