"""WebTransport origins in a real browser (Debian's Chromium, headless; issue 28). Browsers apply no CORS to
WebTransport, so the front end checks the session's ``Origin`` against the ``--cors-origin`` policy itself:

- a page on an origin the policy excludes cannot open a session (the server answers 403; Chromium reports a failed
  handshake), cannot read a stream with ``fetch()`` (the preflight fails), and its no-preflight ``text/plain``
  POST is refused (415) before any generation starts;
- a page on the allowed origin opens a session and reads a whole stream over it, and the app sees the
  CONNECT's Origin even when the request's JSON head claims another.

The pages come from two small HTTP servers on their own ports (two origins), the API from ``eloquent serve``'s
app in-process (``ServeThread``), with CORS as ``--cors-origin`` sets it.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from eloquent_plugins.transports.http3.certs import dev_certificate
from eloquent_plugins.transports.http3.certs import cert_hash_document
from tests.support.chromium import Chromium, Page, chromium_executable
from tests.support.serve_thread import ServeThread

PAGE = b"<!doctype html><title>a page</title><p>a page on its own origin</p>"
TRY = """
(async () => {
  const out = {opened: false, error: null, status: null, text: "", fetchError: null, opaque: null};
  const hash = Uint8Array.from(atob(%(hash)s), (c) => c.charCodeAt(0));
  let wt;
  try {
    wt = new WebTransport(%(wt)s, {serverCertificateHashes: [{algorithm: "sha-256", value: hash}]});
    await wt.ready;
    out.opened = true;
    const stream = await wt.createBidirectionalStream();
    const writer = stream.writable.getWriter();
    await writer.write(new TextEncoder().encode(JSON.stringify(%(head)s) + "\\n" + JSON.stringify(%(body)s)));
    await writer.close();
    const reader = stream.readable.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      out.text += decoder.decode(value, {stream: true});
    }
    out.status = JSON.parse(out.text.split("\\n")[0]).status;
  } catch (err) {
    out.error = String(err);
  } finally {
    try { wt && wt.close(); } catch (err) {}
  }
  try {  // the same request with fetch(): JSON needs a preflight, which only an allowed origin passes
    const r = await fetch(%(api)s, {method: "POST", body: JSON.stringify(%(body)s),
                                    headers: {"content-type": "application/json"}});
    out.fetchText = await r.text();
  } catch (err) {
    out.fetchError = String(err);
  }
  // text/plain needs no preflight: the browser sends it and hides the answer (opaque); the server refuses it.
  const simple = await fetch(%(api)s, {method: "POST", mode: "no-cors", body: JSON.stringify(%(body)s),
                                       headers: {"content-type": "text/plain"}});
  out.opaque = simple.type;
  return out;
})()
"""


class Pages:
    """A blank page on ``http://127.0.0.1:PORT`` (its own origin), served from a thread."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(PAGE)))
                self.end_headers()
                self.wfile.write(PAGE)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Stack:
    server: ServeThread
    good: Pages
    evil: Pages
    page: Page
    posts: list[dict[str, Any]]
    """Each POST that reached the app under CORS: its path and Origin."""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    assert chromium_executable(), "chromium is not installed (apt-get install -y chromium)"
    import websocket  # noqa: F401  (websocket-client, the [test] extra: missing must fail, not skip)
    dev_certificate()
    good, evil = Pages(), Pages()
    posts: list[dict[str, Any]] = []

    def recorder(app: Any) -> Any:
        async def recording(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] == "POST":
                posts.append({"path": scope["path"], "origin": dict(scope["headers"]).get(b"origin", b"").decode()})
            await app(scope, receive, send)
        return recording

    try:
        with ServeThread(cors_origin=good.origin, inner=recorder) as server, Chromium() as browser:
            yield Stack(server, good, evil, browser.new_page(), posts)
    finally:
        good.close()
        evil.close()


def attempt(stack: Stack, page_origin: str, *, head_origin: str | None = None) -> dict[str, Any]:
    stack.page.navigate(page_origin + "/")
    document = cert_hash_document(dev_certificate().certfile)
    assert document is not None
    body = {"model": "eloquent-builtin", "stream": True, "max_tokens": 12,
            "messages": [{"role": "user", "content": "origins"}]}
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    if head_origin:
        headers["origin"] = head_origin  # what a page might claim in the head: the server must ignore it
    values = {"hash": json.dumps(document["value"]), "wt": json.dumps(f"https://127.0.0.1:{stack.server.udp_port}/eloquent/wt"),
              "head": json.dumps({"method": "POST", "path": "/v1/chat/completions", "headers": headers}),
              "body": json.dumps(body), "api": json.dumps(f"{stack.server.url}/v1/chat/completions")}
    return stack.page.evaluate(TRY % values, timeout=60)


def test_a_page_on_another_origin_cannot_open_a_session_nor_read_a_stream(stack: Stack) -> None:
    before = len(stack.posts)
    out = attempt(stack, stack.evil.origin)
    assert not out["opened"] and "handshake" in str(out["error"]).lower(), out
    assert out["text"] == ""
    assert out["fetchError"] and "Failed to fetch" in out["fetchError"], out  # the preflight fails
    assert out["opaque"] == "opaque"  # sent without a preflight, its answer hidden from the page ...
    assert stack.posts[before:] == []  # ... and refused (415) before the app: no generation started


def test_the_allowed_origin_opens_a_session_and_reads_the_stream(stack: Stack) -> None:
    before = len(stack.posts)
    out = attempt(stack, stack.good.origin, head_origin=stack.evil.origin)
    assert out["opened"] and out["error"] is None, out
    assert out["status"] == 200 and "data: [DONE]" in out["text"], out["text"][:500]
    assert "data: [DONE]" in out.get("fetchText", ""), out  # fetch() with CORS works for it too
    # Two POSTs reached the app: over WebTransport (with the session's Origin, not the head's) and fetch(); the
    # no-preflight text/plain one was refused (415) for this origin too.
    assert [p["origin"] for p in stack.posts[before:]] == [stack.good.origin] * 2, stack.posts[before:]
