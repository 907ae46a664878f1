"""``eloquent serve`` for the client tests (tests/client/): TCP and HTTP/3 on *different* port numbers
(so a client finds the UDP port only from ``Alt-Svc`` or ``h3_port``), with a certificate directory of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.servers import free_port, wait_for_port

CHAT = "/v1/chat/completions"
MODEL = "eloquent-builtin"


def chat_body(prompt: str, max_tokens: int = 40, *, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": stream,
            "max_tokens": max_tokens}


@dataclass(frozen=True)
class Served:
    port: int
    udp_port: int
    proc: subprocess.Popen[bytes]

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self, prompt: str, max_tokens: int = 40) -> str:
        """The engine's whole answer, non-streamed over plain HTTP (the reference every stream must equal)."""
        r = httpx.post(self.http + CHAT, json=chat_body(prompt, max_tokens, stream=False), timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["message"]["content"])

    def completion_text(self, prompt: str, max_tokens: int = 40) -> str:
        r = httpx.post(self.http + "/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                            "max_tokens": max_tokens}, timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])


@contextlib.contextmanager
def eloquent_serve(*args: str, env: dict[str, str] | None = None, certs: str | None = None) -> Iterator[Served]:
    port, udp_port = free_port(), free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
    clean["ELOQUENT_CACHE_DIR"] = certs or tempfile.mkdtemp(prefix="eloquent-certs-")
    clean.update(env or {})
    exe = str(Path(sys.executable).with_name("eloquent"))
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([exe, "serve", "--port", str(port), "--eloquent-port", str(udp_port),
                                 "--log-level", "warning", *args], stdout=log, stderr=subprocess.STDOUT, env=clean,
                                cwd=tempfile.gettempdir())
        try:
            wait_for_port(port, timeout=60, proc=proc)
            yield Served(port, udp_port, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.seek(0)
            print(log.read().decode(errors="replace")[-3000:])


@contextlib.asynccontextmanager
async def lossy_openai(served: Served, seed: int, loss: float = 0.10) -> AsyncIterator[tuple[Any, list[str]]]:
    """The openai SDK on ``AsyncEloquentTransport`` reaching ``served``'s HTTP/3 port through a relay with ``loss``
    each way: the client, and the ``eloquent-delivery`` of each response as it comes."""
    import openai

    from eloquent_client import AsyncEloquentTransport, PathMemory
    from eloquent_plugins.sim.netem import PathConfig
    from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay

    path = PathConfig(loss=loss, delay=0.005)
    relay = await start_relay(RelayConfig(target=("127.0.0.1", served.udp_port), upstream=path, downstream=path,
                                          seed=seed))
    deliveries: list[str] = []

    async def hook(response: httpx.Response) -> None:
        deliveries.append(response.headers.get("eloquent-delivery", "?"))

    http = httpx.AsyncClient(transport=AsyncEloquentTransport(verify=False, h3_port=relay.listen_addr[1],
                                                              h3_probe_timeout=10.0, path_memory=PathMemory()),
                             event_hooks={"response": [hook]})
    client = openai.AsyncOpenAI(base_url=served.http + "/v1", api_key="test-key", http_client=http)
    try:
        yield client, deliveries
    finally:
        await client.close()
        await relay.close()
