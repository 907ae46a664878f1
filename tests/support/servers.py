"""Real servers for tests, each on a free 127.0.0.1 port: uvicorn apps (in a thread), redis-server, nginx.

Every helper is a context manager that starts the server, waits until it answers, and stops it on exit.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

# One of each for the package and the tests: the fleet benchmark starts the same redis-server and nginx.
from eloquent_plugins.cli.bench.balancer import NGINX_LOCATION, run_nginx
from eloquent_plugins.cli.bench.balancer import nginx_balancer as nginx_balancer
from eloquent_plugins.cli.bench.balancer import nginx_upstream as nginx_upstream
from eloquent_plugins.cli.bench.procs import free_port as free_port
from eloquent_plugins.cli.bench.procs import wait_for_port as wait_for_port
from eloquent_plugins.cli.bench.redis_server import redis_server as redis_server


@contextlib.contextmanager
def eloquent_serve_process(*args: str, port: int | None = None,
                           env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``eloquent serve --port P ARGS`` as a user runs it: a subprocess from a temp dir, without the caller's
    ``ELOQUENT_*`` variables (``env`` sets its own); yields the process once P listens, prints the tail of its
    output on exit."""
    port = free_port() if port is None else port
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
    # The exit below is a SIGTERM, which drains: streams a test left running hold it for at most 5 s (uvicorn's
    # old graceful timeout), not the default 30.
    environ["ELOQUENT_DRAIN_TIMEOUT"] = "5"
    environ.update(env or {})
    eloquent = str(Path(sys.executable).with_name("eloquent"))
    proc = subprocess.Popen([eloquent, "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environ, cwd=tempfile.gettempdir())
    proc.port = port  # type: ignore[attr-defined]
    try:
        wait_for_port(port, timeout=60, proc=proc)
        yield proc
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        print(out.decode(errors="replace")[-3000:])


@contextlib.contextmanager
def eloquent_serve(*args: str) -> Iterator[int]:
    """``eloquent_serve_process`` yielding the port."""
    with eloquent_serve_process(*args) as proc:
        yield proc.port  # type: ignore[attr-defined]


class UvicornThread:
    """An ASGI app served by a real uvicorn in a background thread (its own event loop)."""

    def __init__(self, app: Any, *, port: int | None = None, **config: Any) -> None:
        self.app = app
        self.port = port or free_port()
        config.setdefault("log_level", "warning")
        config.setdefault("lifespan", "off")
        config.setdefault("ws", "none")
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, **config))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(5)


@dataclass(frozen=True)
class Nginx:
    url: str
    error_log: Path


@contextlib.contextmanager
def nginx_routes(routes: dict[str, int], extra: str = "") -> Iterator[Nginx]:
    """Debian's nginx as a reverse proxy: ``/<prefix>/`` to each upstream port with the prefix stripped (prefix
    ``""``: every path, passed as is), with ``extra`` directives (``proxy_read_timeout 3s;``...) in each route."""
    port = free_port()
    locations = "".join(
        NGINX_LOCATION.format(path=f"/{prefix}/" if prefix else "/", extra=extra,
                              target=f"http://127.0.0.1:{upstream}" + ("/" if prefix else ""))
        for prefix, upstream in routes.items()
    )
    with run_nginx(port, locations=locations) as tmp:
        yield Nginx(f"http://127.0.0.1:{port}", tmp / "error.log")


@contextlib.contextmanager
def nginx(upstream_port: int, extra: str = "") -> Iterator[str]:
    """One nginx in front of ``upstream_port`` alone; yields the proxy's base URL."""
    with nginx_routes({"": upstream_port}, extra) as proxy:
        yield proxy.url


class UvicornProcess:
    """An app served by ``python -m uvicorn`` in its own process (``target`` is ``module:attribute``)."""

    def __init__(self, target: str, *, env: dict[str, str] | None = None, factory: bool = False,
                 cwd: str | None = None) -> None:
        self.port = free_port()
        args = [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "warning", "--lifespan", "off", "--backlog", "2048"]
        if factory:
            args.append("--factory")
        self._args = args
        self._env = {**os.environ, **(env or {})}
        self._cwd = cwd or str(Path(__file__).resolve().parents[2])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornProcess:
        self.proc = subprocess.Popen(self._args, env=self._env, cwd=self._cwd)
        wait_for_port(self.port, proc=self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def engine_behind_middleware() -> Any:
    """Factory for ``UvicornProcess``: the built-in engine behind EloquentMiddleware configured from ELOQUENT_*."""
    import logging

    from eloquent_plugins.engine import create_engine_app
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    log_file = os.environ.get("ELOQUENT_TEST_LOG")  # stream logs of this replica, for debugging a test
    if log_file:
        handler = logging.FileHandler(f"{log_file}.{os.getpid()}")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logging.getLogger("eloquent_plugins").addHandler(handler)
        logging.getLogger("eloquent_plugins").setLevel(logging.INFO)
    return EloquentMiddleware(create_engine_app())
