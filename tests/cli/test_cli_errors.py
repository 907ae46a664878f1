"""Operator mistakes end in one line and exit status 2, never a traceback (issue 17, "The operator's day").

Each case runs the real ``eloquent`` command in a subprocess. A missing optional dependency is simulated by
blocking its import (``sys.modules[name] = None``); ``tests/test_packaging.py`` does the same against a real
plain install of the wheel. Unreachable Redis or upstream is one warning each and the server serves.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eloquent_plugins.cli.bench.procs import free_port
from eloquent_plugins.cli.optional import EXTRAS, extra_for, needs_extra

ROOT = Path(__file__).resolve().parents[2]


def eloquent(*args: str, block: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``eloquent ARGS`` with the modules in ``block`` made unimportable."""
    code = ("import sys\n"
            f"for name in {list(block)!r}:\n"
            "    sys.modules[name] = None\n"
            "from eloquent_plugins.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The process exited 2 with exactly one line on stderr that has every fragment, and no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


# ---- a missing optional dependency: one line naming the extra -----------------------------------------------

@pytest.mark.parametrize(("args", "block", "fragments"), [
    (("serve", "--resume-store", "redis://127.0.0.1:1/0"), ("redis", "redis.asyncio"),
     ("--resume-store redis:// needs the [redis] extra", "pip install 'eloquent-plugins[redis]'")),
    (("serve", "--upstream", "triton=grpc://127.0.0.1:1"), ("numpy",),
     ("--upstream triton=grpc://127.0.0.1:1 needs the [triton] extra", "pip install 'eloquent-plugins[triton]'")),
    (("bench", "sim", "--quick", "--plot", "never-written.png"), ("matplotlib",),
     ("bench sim --plot needs the [bench] extra", "pip install 'eloquent-plugins[bench]'")),
    (("bench", "overhead", "--quick"), ("sse_starlette",),
     ("sse-starlette baseline", "needs the [bench] extra", "pip install 'eloquent-plugins[bench]'")),
], ids=["redis", "triton", "plot", "sse-starlette"])
def test_missing_extra_is_one_line(args: tuple[str, ...], block: tuple[str, ...], fragments: tuple[str, ...],
                                   tmp_path: Path) -> None:
    port = str(free_port())
    if args[0] == "serve":
        args = (*args, "--port", port)
    started = time.monotonic()
    one_line_error(eloquent(*args, block=block), *fragments)
    assert time.monotonic() - started < 30  # said before any work (the sim, the measurement), not after
    assert not (ROOT / "never-written.png").exists()


def test_extras_named_exist_in_pyproject() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras)
    assert extra_for("redis.asyncio") == "redis" and extra_for("json") is None and extra_for(None) is None


def test_needs_extra_leaves_other_missing_modules_alone() -> None:
    """A module no extra provides is a bug or a broken install: its own error, with its traceback."""
    with pytest.raises(ModuleNotFoundError), needs_extra("x"):
        import eloquent_plugins_no_such_module  # noqa: F401


# ---- ports in use --------------------------------------------------------------------------------------------

def test_second_serve_on_a_busy_tcp_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        proc = eloquent("serve", "--port", port, "--stream-transport", "sse")
    one_line_error(proc, f"cannot listen on tcp 127.0.0.1:{port}: Address already in use", "--port")


def test_serve_on_a_busy_udp_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        udp = str(busy.getsockname()[1])
        proc = eloquent("serve", "--port", str(free_port()), "--eloquent-port", udp)
    one_line_error(proc, f"cannot listen on udp 127.0.0.1:{udp}: Address already in use", "--eloquent-port")


# ---- certificates --------------------------------------------------------------------------------------------

def test_missing_certificate(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    one_line_error(eloquent("serve", "--port", str(free_port()), "--certfile", str(missing), "--keyfile",
                            str(missing)), "TLS file not found")


def test_certificate_that_is_not_pem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    one_line_error(eloquent("serve", "--port", str(free_port()), "--certfile", str(bad), "--keyfile", str(bad)),
                   "cannot load TLS certificate")


# ---- chat against the wrong thing ----------------------------------------------------------------------------

def test_chat_sse_without_url() -> None:
    one_line_error(eloquent("chat", "--transport", "sse", "hi"), "--transport sse needs --url")


def test_chat_sse_to_nothing() -> None:
    port = free_port()
    one_line_error(eloquent("chat", "--url", f"http://127.0.0.1:{port}", "--transport", "sse", "hi"),
                   f"127.0.0.1:{port}")


@pytest.fixture
def plain_http() -> Iterator[int]:
    """A plain HTTP/1.x server (what ``eloquent serve`` is on TCP); answers a TLS ClientHello with text."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_chat_https_to_the_plain_http_side(plain_http: int) -> None:
    proc = eloquent("chat", "--url", f"https://127.0.0.1:{plain_http}", "--transport", "sse", "--insecure", "hi")
    one_line_error(proc, "WRONG_VERSION_NUMBER", f"--url http://127.0.0.1:{plain_http}")


# ---- unreachable Redis and upstream: a warning each, and the server serves -----------------------------------

def test_unreachable_redis_and_upstream_warn_and_serve() -> None:
    import redis  # noqa: F401  (the [test] extra)
    port, dead = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eloquent_plugins.cli.main", "serve", "--port", str(port), "--stream-transport",
         "sse", "--resume-store", f"redis://127.0.0.1:{dead}/0", "--upstream", f"tgi=http://127.0.0.1:{dead}"],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if not line:
                break
            lines.append(line)
            if "Uvicorn running" in line:
                break
        assert proc.poll() is None, "".join(lines)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # serving
    finally:
        proc.terminate()
        proc.wait(30)
    text = "".join(lines)
    assert "Traceback" not in text, text
    warnings = [line for line in lines if "WARNING" in line]
    assert len(warnings) == 2, text
    assert any(f"resume store redis://127.0.0.1:{dead}/0 " in w for w in warnings), text
    assert any(f"upstream tgi=http://127.0.0.1:{dead} does not answer" in w for w in warnings), text


# ---- a refused certificate: one line naming this command's flags ------------------------------------------------

def test_chat_tls_refusal_names_insecure_and_cafile(tmp_path: Path) -> None:
    """``eloquent serve``'s self-signed development certificate, not trusted: exactly one line on stderr (aioquic's
    own log line is not printed above it) that says --insecure / --cafile, not the Python client's ``verify=``."""
    from tests.support.client_servers import eloquent_serve

    with eloquent_serve(certs=str(tmp_path)) as served:
        proc = eloquent("chat", "--url", f"https://127.0.0.1:{served.port}", "--transport", "eloquent",
                        "--h3-port", str(served.udp_port), "--timeout", "10", "hi")
    line = one_line_error(proc, "TLS verification of 127.0.0.1", "--insecure", "--cafile")
    assert "verify=" not in line and "dev-cert.pem" in line
