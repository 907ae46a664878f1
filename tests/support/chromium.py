"""Headless Chromium: the package's DevTools driver (``eloquent bench e2e --browser`` uses it), and ``open_page`` for
tests that only need a page loaded and its browser gone afterwards."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from eloquent_plugins.cli.bench.chromium import Chromium, DevToolsError, Page, chromium_executable
from eloquent_plugins.cli.bench.procs import stop_browser

__all__ = ["Chromium", "DevToolsError", "Page", "chromium_executable", "open_page"]


@contextlib.contextmanager
def open_page(url: str) -> Iterator[subprocess.Popen[bytes]]:
    """Headless Chromium showing ``url`` in a fresh profile, in its own process group; at the exit the browser, its
    children and then its profile go (``procs.stop_browser``)."""
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
        stop_browser(browser, lambda: shutil.rmtree(profile), tries=50)
