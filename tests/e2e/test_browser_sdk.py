"""The real npm SDKs in real browsers, with ``fetch: eloquentFetch``: the ``openai`` package and the Vercel AI SDK
(``ai`` + ``@ai-sdk/openai``, ``streamText``), loaded as ES modules through an import map (tests/js/sdk, installed by
``npm ci`` in ./dev test), in headless Chromium (DevTools protocol) and headless Firefox ESR (WebDriver BiDi),
against the app ``eloquent serve`` hosts:

- through the lossy relay (10% loss in bursts of 2, 100 ms RTT, both ways), each SDK streams its answer over
  WebTransport datagrams (``eloquent-delivery: datagram``) with the same text as plain ``fetch`` over SSE;
- with UDP blocked, each completes over SSE and says why (``eloquent-fallback: open-timeout``, logged; the next
  request: ``remembered``);
- a certificate the browser refuses falls back too, with the browser's reason;
- a page that is not a secure context (``http://`` on a name other than localhost) falls back with
  ``insecure-context``, and /chat shows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from eloquent_plugins.cli.bench.chromium import Chromium
from eloquent_plugins.cli.bench.firefox import Firefox
from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import Relay, RelayConfig, start_relay
from eloquent_plugins.transports.http3.options import FrontEndOptions
from tests.support.importmap import NODE_MODULES
from tests.support.sdk_site import PAGE_PATH, SdkSite
from tests.support.serve_thread import ServeThread
from tests.support.udp_switch import UdpSwitch, start_switch

LOSSY = PathConfig(delay=0.05, loss=0.10, burst=2.0)
SDKS = ("openai", "vercel")
OPEN_TRIES = 3
"""A WebTransport handshake whose packets the relay keeps dropping can fail (Chromium gives up after a few lost
flights): eloquentFetch then falls back, as it should; this test measures the datagram path, so it asks again."""
FIGURES: dict[str, Any] = {}
INSECURE_HOST = "eloquent.test"
"""Resolved to 127.0.0.1 by the browser alone (Chromium's host rules, Firefox's localDomains): an http:// page on it
is not a secure context, so the browser hides WebTransport."""


@dataclass
class Servers:
    lossy: ServeThread
    relay: Relay
    server: ServeThread
    switch: UdpSwitch


async def _close_switch(switch: UdpSwitch) -> None:
    switch.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    assert NODE_MODULES.is_dir(), "tests/js/sdk/node_modules is missing: run `npm ci` in tests/js/sdk (./dev test does)"
    engine = {"ttft": 0.05, "tpot": 0.02}
    with ServeThread(engine=engine, wrap=SdkSite) as lossy, \
            ServeThread(engine=engine, wrap=SdkSite, options=FrontEndOptions(idle_timeout=3.0)) as server:
        relay = lossy.call(start_relay(RelayConfig(target=("127.0.0.1", lossy.udp_port), upstream=LOSSY,
                                                   downstream=LOSSY, seed=5)))
        switch = server.call(start_switch(("127.0.0.1", server.udp_port)))
        try:
            yield Servers(lossy, relay, server, switch)
        finally:
            lossy.call(relay.close())
            server.call(_close_switch(switch))


@pytest.fixture(scope="module", params=["chromium", "firefox"])
def page(request: pytest.FixtureRequest) -> Iterator[Any]:
    import websocket  # noqa: F401  (websocket-client, the [test] extra: missing must fail, not skip)
    browser = (Chromium([f"--host-resolver-rules=MAP {INSECURE_HOST} 127.0.0.1"]) if request.param == "chromium"
               else Firefox({"network.dns.localDomains": INSECURE_HOST}))
    with browser:
        FIGURES.setdefault("browsers", []).append(browser.version())
        yield browser.new_page()


def load(page: Any, origin: str) -> None:
    page.navigate(origin + PAGE_PATH)
    try:
        page.wait_for("window.sdk !== undefined", timeout=30)
    except TimeoutError:
        raise AssertionError(f"the SDK page did not load: {page.console[-5:]}") from None


def run(page: Any, sdk: str, eloquent: dict[str, Any] | None, max_tokens: int) -> dict[str, Any]:
    body = {"sdk": sdk, "eloquent": eloquent, "prompt": f"Tell me a story ({sdk})", "maxTokens": max_tokens}
    result = page.evaluate(f"window.sdk.run({json.dumps(body)})", timeout=120)
    assert result["ok"], result["error"]
    assert result["text"], result
    return result


def test_sdks_stream_over_datagrams_through_loss_with_the_sse_text(servers: Servers, page: Any) -> None:
    load(page, servers.lossy.url)
    relay_port = servers.relay.listen_addr[1]
    for sdk in SDKS:
        reference = run(page, sdk, None, 150)  # plain fetch: SSE over TCP
        dropped = servers.relay.stats.downstream.dropped
        for _ in range(OPEN_TRIES):
            result = run(page, sdk, {"webTransportPort": relay_port, "webTransportTimeout": 5000}, 150)
            if result["delivery"] == "datagram" or result["fallback"] is None:
                break
            FIGURES.setdefault("open_retries", []).append((sdk, result["fallback"]["reason"]))
            page.evaluate("window.sdk.forget()")
        assert result["delivery"] == "datagram", result
        assert result["headers"]["eloquent-delivery"] == "datagram"
        assert result["serverHeaders"]["eloquent-transport"] == "datagram"
        assert not result["fellBack"] and result["fallback"] is None and not result["logged"]
        assert result["text"] == reference["text"]
        assert servers.relay.stats.downstream.dropped > dropped, "the relay dropped none of this stream's packets"
    print(f"\n{FIGURES.get('browsers')}: retries {FIGURES.get('open_retries', [])}; relay dropped "
          f"{servers.relay.stats.upstream.dropped} up, {servers.relay.stats.downstream.dropped} down")


def test_udp_blocked_sdks_complete_over_sse_and_say_why(servers: Servers, page: Any) -> None:
    load(page, servers.server.url)
    references = {sdk: run(page, sdk, None, 40) for sdk in SDKS}
    servers.switch.blocked = True
    try:
        # retryAfter: the failure is remembered for a minute, however slow this machine is between the two
        results = {sdk: run(page, sdk, {"webTransportPort": servers.switch.port, "retryAfter": 60_000}, 40)
                   for sdk in SDKS}
    finally:
        servers.switch.blocked = False
    assert servers.switch.dropped > 0, "the page did try WebTransport first"
    first, second = results["openai"], results["vercel"]
    for sdk, result in results.items():
        assert result["delivery"] == "sse" and result["headers"]["eloquent-delivery"] == "sse", result
        assert result["text"] == references[sdk]["text"]
        assert result["logged"] and result["logged"][0]["reason"] == result["fallback"]["reason"]
    assert first["headers"]["eloquent-fallback"] == "open-timeout", first
    assert "did not open in time" in first["fallback"]["message"]
    # The next request does not wait again: the failure is remembered, and the reason says which one.
    assert second["headers"]["eloquent-fallback"] == "remembered", second
    assert "did not open in time" in second["fallback"]["message"]


def test_a_refused_certificate_falls_back_with_the_browsers_reason(servers: Servers, page: Any) -> None:
    load(page, servers.server.url)
    page.evaluate("window.sdk.forget()")
    wrong = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80="  # a SHA-256 that is not the server's certificate's
    result = run(page, "openai", {"webTransportPort": servers.server.udp_port, "certificateHash": wrong,
                                  "webTransportTimeout": 10000}, 20)
    assert result["delivery"] == "sse", result
    # Firefox names the certificate; Chromium reports every handshake failure alike ("Opening handshake failed").
    assert result["fallback"]["reason"] in ("certificate-refused", "handshake-failed"), result["fallback"]
    assert result["headers"]["eloquent-fallback"] == result["fallback"]["reason"]
    FIGURES.setdefault("certificate", []).append(result["fallback"]["message"])
    print(f"\n{FIGURES['certificate'][-1]}")


def test_an_insecure_page_falls_back_and_says_why(servers: Servers, page: Any) -> None:
    origin = f"http://{INSECURE_HOST}:{servers.server.port}"
    load(page, origin)
    assert page.evaluate("isSecureContext") is False
    result = run(page, "openai", {"webTransportPort": servers.server.udp_port}, 20)
    assert result["delivery"] == "sse" and result["headers"]["eloquent-fallback"] == "insecure-context", result
    assert result["logged"][0]["reason"] == "insecure-context"
    page.navigate(f"{origin}/chat")  # the chat page says it too
    page.wait_for("window.eloquentChat !== undefined", timeout=30)
    pane = page.evaluate("window.eloquentChat.run({prompt: 'x', maxTokens: 10, compare: false})", timeout=60)["eloquent"]
    assert pane["error"] is None and pane["delivery"] == "sse", pane
    assert pane["fallback"]["reason"] == "insecure-context"
    shown = page.evaluate("document.querySelector('[data-testid=fallback]').textContent")
    assert "not a secure context" in shown, shown
