"""Headless Firefox (Debian's ``firefox-esr``) driven over its built-in WebDriver BiDi remote agent, for ``eloquent
bench e2e --browser`` and the browser tests: no geckodriver, no download. The same ``Page`` surface as
``chromium.py`` (navigate, evaluate awaiting promises, wait_for, console). Needs ``websocket-client`` (the
``[test]`` extra). Synchronous: from asyncio code, call it through ``asyncio.to_thread``.

Firefox reads its settings from the profile's ``user.js``: WebTransport and HTTP/3 on, everything that would
reach the network on its own (updates, telemetry, safe browsing, captive-portal checks) off.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from eloquent_plugins.cli.bench.procs import stop_browser
from eloquent_plugins.core.errors import ConfigError

FIREFOX_NAMES = ("firefox-esr", "firefox")
PREFS: dict[str, Any] = {
    "network.webtransport.enabled": True,
    "network.webtransport.datagrams.enabled": True,
    "network.http.http3.enable": True,
    "remote.active-protocols": 1,  # WebDriver BiDi only
    "app.update.auto": False,
    "app.update.enabled": False,
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.startup.page": 0,
    "browser.aboutwelcome.enabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "browser.safebrowsing.provider.google4.updateURL": "",
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "extensions.update.enabled": False,
    "services.settings.server": "",
}


def firefox_executable() -> str | None:
    for name in FIREFOX_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BiDiError(RuntimeError):
    pass


class _Connection:
    """One WebDriver BiDi websocket: commands answered by id, events (console) collected on the way."""

    def __init__(self, url: str) -> None:
        try:
            import websocket  # websocket-client, the [test] extra
        except ImportError:
            raise ConfigError("driving Firefox needs websocket-client: pip install websocket-client") from None
        self.ws = websocket.create_connection(url, suppress_origin=True, timeout=120)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.console: list[str] = []

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 60.0) -> dict[str, Any]:
        with self._lock:
            message_id = next(self._ids)
            self.ws.send(json.dumps({"id": message_id, "method": method, "params": params or {}}))
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"BiDi {method} took over {timeout} s")
                self.ws.settimeout(remaining)
                message = json.loads(self.ws.recv())
                if message.get("method") == "log.entryAdded":
                    entry = message["params"]
                    self.console.append(str(entry.get("text", "")))
                if message.get("id") == message_id:
                    if message.get("type") == "error" or "error" in message and "result" not in message:
                        raise BiDiError(f"{method}: {message.get('error')}: {message.get('message')}")
                    return message.get("result", {})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


class FirefoxPage:
    """A top-level browsing context (``Page`` of chromium.py, over BiDi)."""

    def __init__(self, connection: _Connection, context: str) -> None:
        self._c = connection
        self.context = context

    @property
    def console(self) -> list[str]:
        return self._c.console

    def navigate(self, url: str, timeout: float = 60.0) -> None:
        self._c.call("browsingContext.navigate", {"context": self.context, "url": url, "wait": "complete"},
                     timeout=timeout)

    def evaluate(self, expression: str, timeout: float = 60.0) -> Any:
        """The value of ``expression`` (a promise is awaited; JSON-serializable values); a page exception raises
        BiDiError."""
        wrapped = f"(async () => JSON.stringify(await ({expression})))()"
        result = self._c.call("script.evaluate", {"expression": wrapped, "target": {"context": self.context},
                                                  "awaitPromise": True, "resultOwnership": "none"},
                              timeout=timeout + 5)
        if result.get("type") == "exception":
            details = result.get("exceptionDetails", {})
            raise BiDiError(details.get("text") or str(details))
        value = result.get("result", {})
        if value.get("type") != "string":
            return None  # undefined
        return json.loads(value["value"])

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression, timeout=10)
            except BiDiError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} not true after {timeout} s")
            time.sleep(0.05)

    def close(self) -> None:
        pass


_LISTENING = re.compile(r"WebDriver BiDi listening on (ws://\S+)")


class Firefox:
    """``with Firefox(prefs) as browser: page = browser.new_page()``; one process, a fresh profile."""

    def __init__(self, prefs: dict[str, Any] | None = None, executable: str | None = None) -> None:
        self.executable = executable or firefox_executable()
        if self.executable is None:
            raise ConfigError("firefox is not installed (apt-get install -y firefox-esr)")
        self.prefs = {**PREFS, **(prefs or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self._connection: _Connection | None = None
        self._version = ""
        self.stderr: list[str] = []

    @property
    def profile(self) -> Path:
        assert self._profile is not None
        return Path(self._profile.name)

    def version(self) -> str:
        return self._version

    def __enter__(self) -> Firefox:
        self._profile = tempfile.TemporaryDirectory(prefix="eloquent-firefox-")
        lines = [f"user_pref({json.dumps(k)}, {json.dumps(v)});" for k, v in self.prefs.items()]
        (self.profile / "user.js").write_text("\n".join(lines) + "\n")
        args = [self.executable, "--headless", "--no-remote", "--profile", str(self.profile),
                "--remote-debugging-port=0", "about:blank"]
        env = {**os.environ, "MOZ_HEADLESS": "1", "MOZ_CRASHREPORTER_DISABLE": "1"}
        # Its own process group: the content processes are stopped with it at the exit.
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                     process_group=0)
        found: list[str] = []
        ready = threading.Event()

        def read_stderr() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                if len(self.stderr) < 2000:
                    self.stderr.append(line)
                match = _LISTENING.search(line)
                if match and not found:
                    found.append(match.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read_stderr, daemon=True).start()
        if not ready.wait(60) or not found:
            tail = "\n".join(self.stderr[-20:])
            self.__exit__()
            raise RuntimeError(f"firefox did not start its WebDriver BiDi endpoint:\n{tail}")
        self._connection = _Connection(found[0].rstrip("/") + "/session")
        session = self._connection.call("session.new", {"capabilities": {"alwaysMatch": {
            "acceptInsecureCerts": False}}})
        caps = session.get("capabilities", {})
        self._version = f"Firefox {caps.get('browserVersion', '?')}"
        self._connection.call("session.subscribe", {"events": ["log.entryAdded"]})
        return self

    def new_page(self) -> FirefoxPage:
        assert self._connection is not None
        context = self._connection.call("browsingContext.create", {"type": "tab"})["context"]
        return FirefoxPage(self._connection, context)

    def __exit__(self, *exc: object) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.call("session.end", timeout=5)
            self._connection.close()
            self._connection = None
        stop_browser(self.proc, self._profile.cleanup if self._profile is not None else None)
