"""A throwaway redis-server on a free port, for what runs a fleet (``bench load --restart-every``) and the tests:
the replicas' shared resume store, with nothing saved to disk."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from eloquent_plugins.cli.bench.procs import free_port, wait_for_port


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server (Debian package ``redis-server``); yields its ``redis://`` URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="eloquent-redis-") as tmp:
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--dir", tmp, "--protected-mode", "no"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc=proc)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
