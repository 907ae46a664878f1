"""The test page that loads the real npm SDKs (tests/js/sdk/node_modules) in a browser as ES modules, through an
import map (tests/support/importmap.py), beside the app: ``SdkSite(app)`` serves ``/sdk/page.html`` and the
packages' files under ``/sdk/node_modules/``, and passes every other request to ``app``."""

from __future__ import annotations

import json
import mimetypes
from typing import Any

from tests.support.importmap import CJS_PREFIX, NODE_MODULES, PREFIX, SDK_DIR, commonjs_module, import_map

PAGE_PATH = "/sdk/page.html"
_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".json": "application/json"}


class SdkSite:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.map = json.dumps(import_map())
        self.page = (SDK_DIR / "page.html").read_text().replace("<!--IMPORTMAP-->", self.map).encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/sdk/"):
            await self.app(scope, receive, send)
            return
        if path == PAGE_PATH:
            await _respond(send, 200, self.page, "text/html; charset=utf-8")
            return
        if path.startswith(CJS_PREFIX):
            try:
                source = commonjs_module(path[len(CJS_PREFIX):])
            except FileNotFoundError:
                pass
            else:
                await _respond(send, 200, source.encode(), "text/javascript")
                return
        if path.startswith(PREFIX):
            file = (NODE_MODULES / path[len(PREFIX):]).resolve()
            if file.is_relative_to(NODE_MODULES.resolve()) and file.is_file():
                kind = _TYPES.get(file.suffix) or mimetypes.guess_type(file.name)[0] or "application/octet-stream"
                await _respond(send, 200, file.read_bytes(), kind)
                return
        await _respond(send, 404, b'{"error": "not found"}', "application/json")


async def _respond(send: Any, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
