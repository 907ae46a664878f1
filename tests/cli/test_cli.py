"""The ``eloquent`` commands the README shows, run for real as subprocesses."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from eloquent_client import EloquentClient

from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.servers import eloquent_serve, free_port
from tests.support.tgi_server import create_tgi_server, run_in_thread

ELOQUENT = str(Path(sys.executable).with_name("eloquent"))
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "stream": True}





@contextlib.contextmanager
def serve(*args: str) -> Iterator[int]:
    """``eloquent serve --keepalive 1 ARGS``; yields its port."""
    with eloquent_serve("--keepalive", "1", *args) as port:
        yield port


def sse_datas(body: bytes) -> list[str]:
    return [m.data for m in SSEParser().feed(body)]


async def test_serve_builtin_engine_over_sse_and_http3() -> None:
    with serve() as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            streamed = await client.post("/v1/chat/completions", json=CHAT)
            whole = await client.post("/v1/chat/completions", json={**CHAT, "stream": False})
        assert streamed.status_code == 200 and "x-eloquent-stream" in streamed.headers
        messages = SSEParser().feed(streamed.content)
        assert all(m.id and m.id.startswith(streamed.headers["x-eloquent-stream"]) for m in messages)
        text = "".join(json.loads(m.data)["choices"][0]["delta"].get("content", "")
                       for m in messages if m.data != "[DONE]" and json.loads(m.data)["choices"])
        assert text == whole.json()["choices"][0]["message"]["content"]
        async with EloquentClient(f"https://127.0.0.1:{port}", transport="eloquent", verify=False,
                                  timeout=30) as h3, h3.stream("POST", "/v1/chat/completions", json=CHAT) as stream:
            assert await stream.text() == text
            assert stream.delivery == "eloquent"


async def test_serve_tgi_upstream() -> None:
    with run_in_thread(create_tgi_server()) as tgi_url:
        body = {"inputs": "Test request", "parameters": {"max_new_tokens": 10}}
        async with httpx.AsyncClient(timeout=30) as client:
            direct = await client.post(f"{tgi_url}/generate_stream", json=body)
            with serve("--stream-transport", "sse", "--upstream", f"tgi={tgi_url}") as port:
                through = await client.post(f"http://127.0.0.1:{port}/generate_stream", json=body)
                info = await client.get(f"http://127.0.0.1:{port}/info")
        assert through.status_code == 200 and info.status_code == 200
        assert sse_datas(through.content) == sse_datas(direct.content)


def test_serve_refuses_an_unknown_upstream_kind() -> None:
    result = subprocess.run([ELOQUENT, "serve", "--upstream", "nosuch=http://127.0.0.1:1", "--port",
                             str(free_port())], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown upstream kind 'nosuch'" in result.stderr


@pytest.mark.parametrize("argv", [["bench", "sim", "--quick", "--no-progress"],
                                  ["bench", "overhead", "--quick"]])
def test_bench_commands_print_their_tables(argv: list[str], tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = subprocess.run([ELOQUENT, *argv, "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(out.read_text())
