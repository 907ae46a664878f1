"""Headless Chromium driven over the DevTools protocol, for ``eloquent bench e2e --browser`` and the browser tests:
launch Debian's ``chromium`` (no browser download, no driver), open a page, navigate, evaluate (awaiting promises),
screenshot, close. Needs the ``websocket-client`` package (the ``[test]`` extra). Synchronous: from asyncio code,
call it through ``asyncio.to_thread`` so the loop keeps serving while the page runs."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from eloquent_plugins.cli.bench.procs import stop_browser
from eloquent_plugins.core.errors import ConfigError

CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "/usr/lib/chromium-browser/chromium-browser")


def chromium_executable() -> str | None:
    """The real binary (Debian's /usr/bin/chromium is a shell wrapper), else whatever is on PATH."""
    for path in CHROMIUM_PATHS:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevToolsError(RuntimeError):
    pass


class Page:
    """One page target's DevTools connection (synchronous: send a command, read until its answer)."""

    def __init__(self, ws_url: str) -> None:
        try:
            import websocket  # websocket-client, the [test] extra
        except ImportError:
            raise ConfigError("driving Chromium needs websocket-client: pip install websocket-client") from None

        self.ws = websocket.create_connection(ws_url, suppress_origin=True, timeout=120)
        self._ids = itertools.count(1)
        self.console: list[str] = []

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 60.0) -> dict[str, Any]:
        params = params or {}
        message_id = next(self._ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"DevTools {method} took over {timeout} s")
            self.ws.settimeout(remaining)
            message = json.loads(self.ws.recv())
            if message.get("method") == "Runtime.consoleAPICalled":
                args = message["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.console.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif message.get("method") == "Log.entryAdded":
                self.console.append(message["params"]["entry"].get("text", ""))
            if message.get("id") == message_id:
                if "error" in message:
                    raise DevToolsError(f"{method}: {message['error']}")
                return message.get("result", {})

    def navigate(self, url: str, timeout: float = 60.0) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", timeout)

    def evaluate(self, expression: str, timeout: float = 60.0) -> Any:
        """The value of ``expression`` (a promise is awaited); a page exception raises DevToolsError."""
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True, "timeout": int(timeout * 1000)},
                           timeout=timeout + 5)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise DevToolsError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression, timeout=10)
            except DevToolsError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} not true after {timeout} s")
            time.sleep(0.05)

    def screenshot(self, path: Path, width: int = 1200, height: int = 760) -> None:
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                          "mobile": False})
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self.ws.close()


class Chromium:
    """``with Chromium(extra_args) as browser: page = browser.new_page()``; one process, fresh profile."""

    def __init__(self, extra_args: list[str] | None = None, executable: str | None = None) -> None:
        self.executable = executable or chromium_executable()
        if self.executable is None:
            raise ConfigError("chromium is not installed (apt-get install -y chromium)")
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0
        self.pages: list[Page] = []

    def version(self) -> str:
        return self._json("/json/version")["Browser"]

    def _json(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="eloquent-chromium-")
        profile = Path(self._profile.name)
        args = [self.executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                "--remote-debugging-port=0", *self.extra_args, "about:blank"]
        # Its own process group (the caller's session, see docs/results/vllm.md on autogroups): the renderer,
        # utility and crashpad processes it starts are stopped with it at the exit.
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
        deadline = time.monotonic() + 30
        marker = profile / "DevToolsActivePort"
        while not marker.exists() or not marker.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        self.port = int(marker.read_text().split()[0])
        return self

    def new_page(self) -> Page:
        target = self._json("/json/new?about:blank", method="PUT")
        page = Page(target["webSocketDebuggerUrl"])
        page.call("Runtime.enable")
        page.call("Page.enable")
        self.pages.append(page)
        return page

    def __exit__(self, *exc: object) -> None:
        for page in self.pages:
            try:
                page.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        stop_browser(self.proc, self._profile.cleanup if self._profile is not None else None)
