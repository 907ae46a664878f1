"""A real Triton server (PyTriton's bundled tritonserver, CPU only) with decoupled test models.

Why: the gateway tests must run against Triton itself, not a stub. PyTriton needs numpy<2, so it
lives in its own venv (``.ci/install-triton.sh`` makes ``.venv-triton``) and this module runs
there as a subprocess:

    .venv-triton/bin/python -m tests.support.triton_models --http-port P --grpc-port Q --state-dir D

It prints ``READY <http> <grpc>`` once every model is loaded. :class:`TritonServerProcess` starts
and stops it from the main venv (importing this module there does not import PyTriton).

Models (PyTriton, served with the helper from ``eloquent_triton.decoupled``):
  ``token_stream``   decoupled: ``text_input`` (+ optional ``max_tokens``, ``token_delay_s``) ->
                     one ``text_output`` per token (" word", cycling over the input's words)
  ``token_full``     not decoupled: the same tokens joined, in one response (the non-streamed output)
  ``slow_first``     decoupled: waits up to ``wait_s`` seconds before its first response, or until the
                     file named by the optional ``gate`` input exists; first token says which
                     (" gate-open" / " waited"), then the ``text_input`` tokens follow
  ``error_before``   decoupled: raises before its first response
  ``error_after``    decoupled: ``fail_after`` tokens (default 2), then raises
Python-backend model (a ``model.py`` in a model repository, since PyTriton hides cancellation):
  ``cancellable_stream``  decoupled, ``DecoupledTokenModel``: a token every ``token_delay_s``
                     (default 0.05) up to ``max_tokens`` (default 100000); when the request is
                     cancelled it writes ``<state-dir>/cancelled-<request id>`` (tokens yielded), and
                     ``completed-<request id>`` when it ran to the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

REPO_ROOT = Path(__file__).resolve().parents[2]
TRITON_ADAPTER_DIR = REPO_ROOT / "adapters" / "triton"
STATE_DIR_ENV = "ELOQUENT_TRITON_STATE_DIR"
READY_PREFIX = "READY"

UPSTREAM_KINDS = ("http", "grpc")
"""Triton's two front ends; the gateway must give the same events through either."""
ERROR_BEFORE_MESSAGE = "synthetic failure before the first token"


def error_after_message(index: int) -> str:
    """Text of the error ``error_after`` raises at token ``index``."""
    return f"synthetic failure at token {index}"


def tokens_for(text: str, max_tokens: int) -> list[str]:
    """The deterministic token sequence every model derives from ``text_input``."""
    words = text.split() or ["<empty>"]
    return [" " + words[i % len(words)] for i in range(max_tokens)]


# --------------------------------------------------------------------------- Python-backend model

_CANCELLABLE_CONFIG = """\
name: "cancellable_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "token_delay_s" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_CANCELLABLE_MODEL_PY = """\
import sys

import triton_python_backend_utils as pb_utils

# The Python-backend stub ignores PYTHONPATH: put the repo and the adapter on the path here.
for _path in {paths!r}:
    if _path not in sys.path:
        sys.path.insert(0, _path)

from tests.support.triton_models import CancellableStreamModel


class TritonPythonModel(CancellableStreamModel):
    pb_utils = pb_utils
"""


def _cancellable_base() -> type:
    from eloquent_triton.decoupled import DecoupledTokenModel, backend_input_value

    class _CancellableStreamModel(DecoupledTokenModel):
        """Streams slowly and records in the state dir how each request ended."""

        def generate(self, request: Any) -> AsyncIterator[str]:
            pb = self.pb_utils
            text = backend_input_value(pb, request, "text_input", "")
            max_tokens = int(backend_input_value(pb, request, "max_tokens", 100000))
            delay = float(backend_input_value(pb, request, "token_delay_s", 0.05))
            request_id = request.request_id() or "anonymous"
            return _slow_tokens(text, max_tokens, delay, request_id)

    return _CancellableStreamModel


async def _slow_tokens(text: str, max_tokens: int, delay: float, request_id: str) -> AsyncIterator[str]:
    import asyncio

    state_dir = Path(os.environ[STATE_DIR_ENV])
    produced = 0
    finished = False
    try:
        for token in tokens_for(text, max_tokens):
            produced += 1  # counted before the yield: a cancel can close the generator while it waits there
            yield token
            await asyncio.sleep(delay)
        finished = True
    finally:
        name = "completed" if finished else "cancelled"
        (state_dir / f"{name}-{request_id}").write_text(str(produced))


def __getattr__(name: str) -> Any:
    # Built lazily: eloquent_triton.decoupled is on the path only inside the Triton process.
    if name == "CancellableStreamModel":
        return _cancellable_base()
    raise AttributeError(name)


def write_model_repository(root: Path) -> Path:
    """Write the Python-backend models into ``root`` (a Triton model repository)."""
    model_dir = root / "cancellable_stream"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(_CANCELLABLE_CONFIG)
    paths = [str(REPO_ROOT), str(TRITON_ADAPTER_DIR)]
    (model_dir / "1" / "model.py").write_text(_CANCELLABLE_MODEL_PY.format(paths=paths))
    return root


# --------------------------------------------------------------------------- PyTriton models


def _request_text(request: Any) -> str:
    from eloquent_triton.decoupled import input_value

    text = input_value(request, "text_input")
    if text is None:
        raise ValueError("text_input is required")
    return str(text)


def _token_stream(request: Any) -> Iterator[str]:
    from eloquent_triton.decoupled import input_value

    max_tokens = int(input_value(request, "max_tokens", 8))
    delay = float(input_value(request, "token_delay_s", 0.0))
    for token in tokens_for(_request_text(request), max_tokens):
        if delay:
            time.sleep(delay)
        yield token


async def _slow_first(request: Any) -> AsyncIterator[str]:
    import asyncio

    from eloquent_triton.decoupled import input_value

    wait_s = float(input_value(request, "wait_s", 1.0))
    gate = input_value(request, "gate")
    deadline = time.monotonic() + wait_s
    opened = False
    while time.monotonic() < deadline:
        if gate and Path(gate).exists():
            opened = True
            break
        await asyncio.sleep(0.02)
    yield " gate-open" if opened else " waited"
    for token in tokens_for(_request_text(request), int(input_value(request, "max_tokens", 3))):
        yield token


def _error_before(request: Any) -> Iterator[str]:
    raise ValueError(ERROR_BEFORE_MESSAGE)
    yield ""  # pragma: no cover - makes this a generator


def _error_after(request: Any) -> Iterator[str]:
    from eloquent_triton.decoupled import input_value

    fail_after = int(input_value(request, "fail_after", 2))
    for index, token in enumerate(tokens_for(_request_text(request), fail_after + 1)):
        if index == fail_after:
            raise ValueError(error_after_message(index))
        yield token


def _token_full(requests: list[Any]) -> list[dict[str, Any]]:
    from eloquent_triton.decoupled import token_response

    return [token_response("".join(_token_stream(request))) for request in requests]


def serve(
    http_port: int, grpc_port: int, metrics_port: int, state_dir: Path, parent_pid: int | None = None
) -> None:
    """Run Triton with every test model until SIGTERM/SIGINT or ``parent_pid`` exits (PyTriton venv)."""
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from eloquent_triton.decoupled import pytriton_streamer

    os.environ[STATE_DIR_ENV] = str(state_dir)  # inherited by tritonserver and its Python stubs
    repo = write_model_repository(state_dir / "model_repository")
    text_in = Tensor(name="text_input", dtype=bytes, shape=(1,))
    text_out = (Tensor(name="text_output", dtype=bytes, shape=(1,)),)

    def opt(name: str, dtype: Any) -> Tensor:
        return Tensor(name=name, dtype=dtype, shape=(1,), optional=True)

    streaming = ModelConfig(decoupled=True, batching=False)
    config = TritonConfig(
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        model_repository=repo,
        log_verbose=0,
    )
    stop = threading.Event()
    serving = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()
        if not serving.is_set():  # still starting (PyTriton may wait 120 s for readiness): abort now
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with Triton(config=config, workspace=state_dir / f"workspace-{http_port}") as triton:
        common = (text_in, opt("max_tokens", np.int32), opt("token_delay_s", np.float32))
        triton.bind("token_stream", pytriton_streamer(_token_stream), common, text_out, config=streaming)
        triton.bind(
            "token_full", _token_full, common, text_out, config=ModelConfig(batching=False)
        )
        triton.bind(
            "slow_first",
            pytriton_streamer(_slow_first),
            (text_in, opt("max_tokens", np.int32), opt("wait_s", np.float32), opt("gate", bytes)),
            text_out,
            config=streaming,
        )
        triton.bind("error_before", pytriton_streamer(_error_before), (text_in,), text_out, config=streaming)
        triton.bind(
            "error_after",
            pytriton_streamer(_error_after),
            (text_in, opt("fail_after", np.int32)),
            text_out,
            config=streaming,
        )
        triton.run()
        serving.set()
        print(f"{READY_PREFIX} {http_port} {grpc_port}", flush=True)
        while not stop.wait(0.5):
            if not triton.is_alive():
                raise SystemExit("tritonserver died")
            if parent_pid is not None and os.getppid() != parent_pid:
                break  # the test run that started us is gone (even by SIGKILL): do not linger


# --------------------------------------------------------------------------- launcher (main venv)


def port_below_ephemeral_range() -> int:
    """A TCP port that is free right now, below the kernel's ephemeral range.

    Why not port 0: tritonserver binds seconds after the port is chosen, and ports from the
    ephemeral range are what every outgoing connection on a busy CI box takes in the meantime.
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise OSError("no free TCP port in 20000-32000")


def triton_python() -> Path:
    """Interpreter of the PyTriton venv (``ELOQUENT_TRITON_PYTHON`` or ``.venv-triton``)."""
    configured = os.environ.get("ELOQUENT_TRITON_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".venv-triton" / "bin" / "python"


_PORT_CLASH_SIGNS = ("already in use", "Address in use", "Failed to listen", "failed to start")


class TritonStartError(RuntimeError):
    """The Triton test server did not come up; the message carries its log."""


@dataclass
class TritonServerProcess:
    """The test server as a subprocess; ``start()`` blocks until every model is loaded."""

    state_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="eloquent-triton-")))
    startup_timeout_s: float = 300.0
    port_attempts: int = 3
    http_port: int = field(default_factory=port_below_ephemeral_range)
    grpc_port: int = field(default_factory=port_below_ephemeral_range)
    metrics_port: int = field(default_factory=port_below_ephemeral_range)
    process: subprocess.Popen[str] | None = None
    startup_s: float | None = None
    _log: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    def url(self, kind: str) -> str:
        """The upstream URL the gateway takes for ``kind`` (one of ``UPSTREAM_KINDS``)."""
        return {"http": self.http_url, "grpc": self.grpc_url}[kind]

    def __enter__(self) -> Self:
        return self.start()  # raises TritonStartError, with the server log, if Triton does not come up

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def log(self) -> str:
        return "".join(self._log)

    def _env(self, python: Path) -> dict[str, str]:
        libdir = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        env = dict(os.environ)
        ld_path = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = libdir + (":" + ld_path if ld_path else "")
        python_path = env.get("PYTHONPATH")
        paths = [str(REPO_ROOT), str(TRITON_ADAPTER_DIR)]
        env["PYTHONPATH"] = os.pathsep.join(paths + ([python_path] if python_path else []))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> Self:
        """Start and wait for READY; a port taken in the meantime means new ports and one more try."""
        python = triton_python()
        if not python.exists():
            raise TritonStartError(f"{python} not found: run .ci/install-triton.sh first")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        for attempt in range(1, self.port_attempts + 1):
            self._log.append(f"--- launch {attempt}: ports {self.http_port}/{self.grpc_port}/{self.metrics_port}\n")
            port_clash = self._start_once(python)
            if self.process is not None and self.process.poll() is None and not port_clash:
                self.startup_s = time.monotonic() - began
                return self
            self.stop()
            if not port_clash or attempt == self.port_attempts:
                break
            self.http_port, self.grpc_port, self.metrics_port = (
                port_below_ephemeral_range(), port_below_ephemeral_range(), port_below_ephemeral_range())
        raise TritonStartError(
            f"Triton test server did not become ready (startup limit {self.startup_timeout_s:.0f}s, "
            f"exit code {self.process.returncode if self.process else None}). Log:\n{self.log()[-20000:]}"
        )

    def _start_once(self, python: Path) -> bool:
        """One launch; returns True if it failed because a port was taken."""
        command = [
            str(python), "-m", "tests.support.triton_models",
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            "--state-dir", str(self.state_dir),
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=self._env(python),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            process_group=0,  # not a new session (own scheduler autogroup): see tests/support/vllm.py launch()
        )
        ready = threading.Event()
        clash = threading.Event()
        threading.Thread(target=self._pump, args=(ready, clash), daemon=True).start()
        ready.wait(self.startup_timeout_s)
        return clash.is_set()

    def _pump(self, ready: threading.Event, clash: threading.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self._log.append(line)
            if line.startswith(READY_PREFIX):
                ready.set()
            elif any(sign in line for sign in _PORT_CLASH_SIGNS):
                clash.set()
                ready.set()  # no point waiting for PyTriton's own 120 s readiness limit
        ready.set()  # process ended: wake start() so it reports the failure at once

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=45)  # Triton gives in-flight requests 30 s
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=0, help="0: pick a free one")
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="eloquent-triton-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    serve(args.http_port, args.grpc_port, args.metrics_port or port_below_ephemeral_range(), state_dir,
          args.parent_pid)


if __name__ == "__main__":
    sys.exit(main())
