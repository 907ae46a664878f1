"""One ``eloquent serve`` replica of a fleet (drain, rolling restarts): fixed ports, so that a restart keeps them
and the balancer's upstreams stay valid; optional shared TLS files; the output appended to one file across
restarts, to read back. What ``bench load --restart-every`` and the fleet tests run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from eloquent_plugins.cli.bench.procs import free_port, wait_for_port


@dataclass
class Replica:
    name: str
    store: str
    """The shared resume store (``redis://...``)."""
    args: tuple[str, ...] = ()
    certfile: Path | None = None
    keyfile: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    """``ELOQUENT_*`` settings of its own (the caller's are not inherited)."""
    port: int = field(default_factory=free_port)
    udp_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)
    starts: int = 0

    def __post_init__(self) -> None:
        self.log_path = Path(tempfile.gettempdir(), f"eloquent-fleet-{os.getpid()}-{self.name}-{self.port}.log")

    @property
    def base(self) -> str:
        return f"{'https' if self.certfile else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it (again) and return once its TCP port listens (``wait_ready`` for its readiness)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
        env.update(ELOQUENT_RESUME_GRACE="30", ELOQUENT_KEEPALIVE="1", ELOQUENT_CACHE_DIR=tempfile.gettempdir())
        env.update(self.env)
        udp = [] if "sse" in self.args else ["--eloquent-port", str(self.udp_port)]
        tls = ["--certfile", str(self.certfile), "--keyfile", str(self.keyfile)] if self.certfile else []
        self.starts += 1
        with self.log_path.open("ab") as out:
            out.write(f"---- start {self.starts}\n".encode())
            out.flush()
            # process_group=0: its own group for stop's kill, not its own session (see procs.stop_process)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "eloquent_plugins.cli.main", "serve", "--port", str(self.port), *udp, *tls,
                 "--resume-store", self.store, *self.args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir(),
                process_group=0)
        wait_for_port(self.port, timeout=60, proc=self.proc)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 90) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def last_log(self) -> str:
        """The output of its latest start only."""
        return self.log().rsplit("---- start", 1)[-1]

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base + path, verify=False, timeout=30)

    def ready(self) -> bool:
        try:
            return self.get("/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {self.name} not ready after {timeout} s")
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited ({self.proc.returncode}): {self.last_log()[-2000:]}")
            time.sleep(0.1)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of this replica's ``/eloquent/metrics`` (0 when absent)."""
        text = self.get("/eloquent/metrics").text
        pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$"
        match = re.search(pattern, text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def completed(self) -> int:
        return int(self.get("/v1/engine/stats").json()["completed"])
