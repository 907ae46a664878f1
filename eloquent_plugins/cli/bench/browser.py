"""``eloquent bench e2e --browser``: the browser client (headless Chromium and headless Firefox ESR, the /chat page,
the JavaScript client's ``eloquentFetch`` over WebTransport) as more rows of the end-to-end table, one per engine.

Same conditions and workload as the other rows, through its own harness (engine, HTTP/3 front end, relay): the
page is served over TCP on loopback (``BrowserRoutes``: /chat, the client, the certificate hash), and opens its
WebTransport session through the relay to the front end, one request after the other. The front end records
when each event left the app, the page when it rendered it; the browser's clock is not the server's, so its
render times are shifted until its least-delayed event is as early as the least-delayed event of the Python
clients' run (the table's stall reference d): the row then measures lateness against the same reference.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from eloquent_plugins.cli.bench.chromium import Chromium
from eloquent_plugins.cli.bench.firefox import Firefox
from eloquent_plugins.cli.harness import (
    Conditions,
    E2EResult,
    StreamResult,
    Workload,
    harness,
    reference_texts,
    request_body,
)
from eloquent_plugins.core.protocol import REQUEST_ID_HEADER

_REQUEST_ID = REQUEST_ID_HEADER.decode()

ENGINES = ("chromium", "firefox")
LABELS = {"chromium": "browser (Chromium, WebTransport)", "firefox": "browser (Firefox, WebTransport)"}
LABEL = LABELS["chromium"]
HANDSHAKE_TRIES = 3


async def _not_found(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b'{"error": "not found"}'
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def run_browser(conditions: Conditions, workload: Workload,
                      engine: str = "chromium") -> tuple[list[StreamResult], list[str]]:
    """The workload's requests from the /chat page in ``engine`` (ENGINES), one after the other; the streams and
    the reference texts."""
    import uvicorn

    from eloquent_plugins.cli.bench.procs import free_port
    from eloquent_plugins.transports.browser import BrowserRoutes

    port = free_port()  # the page's origin, another port than the relay's: allowed like --cors-origin allows it
    async with harness(conditions, workload, page_origins=(f"http://127.0.0.1:{port}",)) as h:
        references = await reference_texts(h, workload)
        pages = uvicorn.Server(uvicorn.Config(BrowserRoutes(_not_found), host="127.0.0.1", port=port,
                                              log_level="warning", lifespan="off"))
        serving = asyncio.ensure_future(pages.serve())
        try:
            while not pages.started:
                if serving.done():
                    serving.result()
                await asyncio.sleep(0.02)
            relay_port = h.relay.listen_addr[1]
            url = f"http://127.0.0.1:{port}/chat?transport=webtransport&wtport={relay_port}&wttimeout=5000"
            streams = await asyncio.to_thread(_drive, url, workload, engine)
        finally:
            pages.should_exit = True
            await serving
        for result, pane in streams:
            request_id = pane.get("headers", {}).get(_REQUEST_ID)
            generated = h.server.generation_times(request_id) if request_id else None
            if result.error is None and (generated is None or len(generated) != len(result.rendered)):
                result.error = (f"server recorded {None if generated is None else len(generated)} events, "
                                f"the page rendered {len(result.rendered)}")
            elif result.error is None:
                result.generated = generated
        return [result for result, _ in streams], references


def _drive(url: str, workload: Workload, engine: str) -> list[tuple[StreamResult, dict[str, Any]]]:
    out: list[tuple[StreamResult, dict[str, Any]]] = []
    with (Firefox() if engine == "firefox" else Chromium()) as browser:
        page = browser.new_page()
        page.navigate(url)
        page.wait_for("window.eloquentChat !== undefined", timeout=30)
        for i in range(workload.requests):
            body = request_body(i, workload.max_tokens)
            for _ in range(HANDSHAKE_TRIES):  # a browser gives up a handshake after a few lost flights
                pane = page.evaluate(f"window.eloquentChat.run({{body: {json.dumps(body)}, compare: false}})"
                                     ".then(r => r.eloquent)", timeout=120)
                if pane["error"] is None or pane["times"]:  # only a session that never opened is asked again
                    break
            result = StreamResult("eloquent", i, pane["text"], [], list(pane["times"]), pane["delivery"] or "",
                                  error=pane["error"], request_id=pane.get("headers", {}).get(_REQUEST_ID))
            out.append((result, pane))
    return out


def browser_row(main: E2EResult, streams: list[StreamResult], references: list[str], label: str = LABEL) -> str:
    """The browser's row, with the main table's columns (render times aligned to the main run's reference)."""
    result = E2EResult(main.conditions, main.workload, references=references)
    scored = [s for s in streams if s.error is None and s.generated]
    if scored:
        offset = min(r - g for s in scored for g, r in zip(s.generated, s.rendered)) - main.min_delay
        for s in scored:
            s.rendered = [r - offset for r in s.rendered]
    result.streams = streams
    result.score()
    rows = [("client", "stall ratio", "pooled", "stall/stream", "late p95", "late p99", "late max", "QoE", "done",
             "text")]
    s = result.summaries().get("eloquent")
    if s is not None:
        rows.append((label, f"{s.stall_ratio_mean:.2%}", f"{s.stall_ratio_pooled:.2%}",
                     f"{s.stall_time_mean * 1000:.0f} ms", f"{s.lateness_p95 * 1000:.0f} ms",
                     f"{s.lateness_p99 * 1000:.0f} ms", f"{s.lateness_max * 1000:.0f} ms", f"{s.qoe_mean:.3f}",
                     f"{s.completed}/{s.streams}", "identical" if s.text_identical else "DIFFERENT"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines += [f"  browser request {x.request}: {x.error}" for x in streams if x.error]
    return "\n".join(lines)


def browser_table_row(main: E2EResult, engine: str = "chromium") -> str:
    """Run the browser client in ``engine`` under ``main``'s conditions and workload; its table row."""
    streams, references = asyncio.run(run_browser(main.conditions, main.workload, engine))
    return browser_row(main, streams, references, LABELS[engine])
