"""Headless Chromium: the package's DevTools driver (``eloquent bench e2e --browser`` uses it), and ``open_page`` for
tests that only need a page loaded and its browser gone afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

from eloquent_plugins.cli.bench.chromium import Chromium, DevToolsError, Page, chromium_executable

__all__ = ["Chromium", "DevToolsError", "Page", "chromium_executable", "open_page"]


@contextlib.contextmanager
def open_page(url: str) -> Iterator[subprocess.Popen[bytes]]:
    """Headless Chromium showing ``url`` in a fresh profile. At the exit the browser and every process it started
    (its own process group) are stopped before the profile is removed: a renderer's or crashpad's last write into
    the profile after the browser itself had gone made the removal fail with "Directory not empty" (a CI run)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is not installed (apt-get install -y chromium)"
    profile = tempfile.mkdtemp(prefix="eloquent-chromium-test-")
    browser = subprocess.Popen(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    try:
        yield browser
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(browser.pid, signal.SIGKILL)
        for attempt in range(50):  # a killed child's last write may still land while we remove
            try:
                shutil.rmtree(profile)
                break
            except FileNotFoundError:
                break
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
