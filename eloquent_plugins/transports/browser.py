"""What a browser page needs from the server, as an ASGI wrapper around the served app (docs/BROWSER.md):

- ``GET /eloquent/client.js``: the JavaScript client's entry module (package data ``eloquent_plugins/static/``:
  ``client.js`` re-exports ``eloquent.js``, the client's API, and ``fetch.js``, ``eloquentFetch``), and the modules
  they import beside it (``/eloquent/<name>.js`` for each of ``CLIENT_MODULES``: one per core module it mirrors);
- ``GET /eloquent/cert-hash``: ``{"algorithm": "sha-256", "value": <base64>}``, the SHA-256 of the HTTP/3 front
  end's certificate, for WebTransport's ``serverCertificateHashes``. Only for a certificate browsers accept that
  way (ECDSA P-256, at most 14 days: the development one); otherwise 404 and the page uses the system's trust;
- ``GET /chat``: a chat page (prompt, tokens as they arrive, live stall ratio, the delivery used, optionally the
  same answer over SSE beside it).

Every other request goes to the app unchanged. Served on both transports (uvicorn and the HTTP/3 front end).
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path

from eloquent_plugins.transports.asgi import ASGIApp, Receive, Scope, Send
from eloquent_plugins.transports.http3.certs import cert_hash_document, configured_certificate

log = logging.getLogger("eloquent_plugins.transports.browser")

CLIENT_PATH = "/eloquent/client.js"
CLIENT_MODULES = (
    "client.js", "eloquent.js", "fetch.js", "fallback.js",  # the entries, eloquentFetch, why a stream fell back
    "errors.js", "events.js", "protocol.js", "limits.js", "bytes.js", "varint.js", "wire.js", "delta.js",
    "sha256.js", "control.js", "receiver.js", "assembler.js", "sse_reader.js", "codecs.js",  # the core's mirrors
    "client_events.js", "http.js", "sse.js", "webtransport.js", "response.js", "eloquent_client.js",  # the client
)
"""Every ES module of ``eloquent_plugins/static/`` (tests/transports/http3/test_webtransport.py checks the list against the folder)."""
MODULES = {f"/eloquent/{name}": name for name in CLIENT_MODULES}
"""The client's ES modules by path. client.js, the entry, re-exports eloquent.js and fetch.js; the modules import
each other relatively (``./wire.js``), so each is one module instance however a page reaches it."""
CERT_HASH_PATH = "/eloquent/cert-hash"
CHAT_PATH = "/chat"
_STATIC = Path(__file__).resolve().parents[1] / "static"


def static_file(name: str) -> bytes:
    """A file of ``eloquent_plugins/static`` (package data), read through importlib.resources."""
    try:
        return resources.files("eloquent_plugins").joinpath("static", name).read_bytes()
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError):
        return (_STATIC / name).read_bytes()  # a source tree that is not installed


class BrowserRoutes:
    """``BrowserRoutes(app, certfile=config.certfile)``: the browser's routes in front of ``app``."""

    def __init__(self, app: ASGIApp, *, certfile: str | None = None, chat: bool = True) -> None:
        self.app = app
        self.certfile = certfile
        """The front end's configured certificate; None: the development one."""
        self.chat = chat
        self._hash_cache: tuple[Path, int, bytes] | None = None
        self._files: dict[str, bytes] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            path = scope["path"]
            module = MODULES.get(path)
            if module is not None:
                await self._file(scope, send, module, b"text/javascript; charset=utf-8")
                return
            if path == CERT_HASH_PATH:
                await self._cert_hash(scope, send)
                return
            if self.chat and path == CHAT_PATH:
                await self._file(scope, send, "chat.html", b"text/html; charset=utf-8")
                return
        await self.app(scope, receive, send)

    async def _file(self, scope: Scope, send: Send, name: str, content_type: bytes) -> None:
        body = self._files.get(name)
        if body is None:
            try:
                body = self._files[name] = static_file(name)
            except OSError:
                await _respond(scope, send, 404, json.dumps({"error": f"{name} is not installed"}).encode(),
                               b"application/json")
                return
        await _respond(scope, send, 200, body, content_type, cache=b"no-cache")

    def hash_document(self) -> bytes | None:
        """The cert-hash body, cached per certificate file version; None when there is none to give."""
        path = configured_certificate(self.certfile)
        try:
            mtime = path.stat().st_mtime_ns
            if self._hash_cache is None or self._hash_cache[:2] != (path, mtime):
                document = cert_hash_document(path)
                body = json.dumps(document).encode() if document is not None else b""
                self._hash_cache = (path, mtime, body)
            return self._hash_cache[2] or None
        except (OSError, ValueError) as exc:
            log.debug("no certificate hash for %s: %s", path, exc)
            return None

    async def _cert_hash(self, scope: Scope, send: Send) -> None:
        body = self.hash_document()
        if body is None:
            message = ("no certificate hash: the HTTP/3 certificate is not one browsers accept by hash (ECDSA "
                       "P-256, at most 14 days); the system's trust applies")
            await _respond(scope, send, 404, json.dumps({"error": message}).encode(), b"application/json")
            return
        await _respond(scope, send, 200, body, b"application/json", cache=b"no-store")


async def _respond(scope: Scope, send: Send, status: int, body: bytes, content_type: bytes,
                   cache: bytes = b"no-store") -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
               (b"cache-control", cache)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
