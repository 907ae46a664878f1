"""WebTransport on the HTTP/3 front end, at the aioquic level (the browser's side is tests/support/wt_client.py):
a session carries requests whose events arrive as Eloquent packets in the session's datagrams, with the same text,
headers and resume token as the HTTP routes; errors come back as status lines; a session that ends can be resumed
over SSE exactly once. Plus the development certificate browsers accept by hash, and the browser routes."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from eloquent_plugins.cli.app_factory import build_app
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports import browser
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import Http3Server, start_http3_server
from eloquent_plugins.transports.http3.certs import (
    dev_certificate,
    dev_pair,
    hash_eligible,
    renewal_due,
)
from tests.support.streams import chat_maker, text_of
from tests.support.wt_client import WTSession, open_session, wt_connect

PATH = "/v1/chat/completions"
chat = chat_maker(max_tokens=40, model="eloquent-builtin", prompt="webtransport {seed}")


@pytest.fixture
def cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ELOQUENT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


async def start(app, *, options: FrontEndOptions | None = None) -> Http3Server:  # type: ignore[no-untyped-def]
    return await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(),
                                    options=options or FrontEndOptions())


def served_app(tpot: float = 0.002):  # type: ignore[no-untyped-def]
    """What ``eloquent serve`` hosts: the engine behind the SSE middleware (ids, resume) and the browser routes."""
    config = StreamConfig()
    return build_app(config, create_plugin_manager(), engine_options={"ttft": 0.01, "tpot": tpot})


async def reference(app, body: dict) -> list[str]:  # type: ignore[no-untyped-def]
    """The SSE data payloads of the same request over plain HTTP (the ASGI app directly)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        response = await client.post(PATH, json=body)
    assert response.status_code == 200
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


def same_stream(got: list[str], expected: list[str]) -> bool:
    """Same events, same text (each response has its own completion id and time)."""
    return len(got) == len(expected) and text_of(got) == text_of(expected) and bool(text_of(got))


def payloads(events) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.payload.decode() for e in events if e.kind is EventKind.DATA]


async def session_on(srv: Http3Server, proto) -> WTSession:  # type: ignore[no-untyped-def]
    session = await open_session(proto, f"127.0.0.1:{srv.port}")
    assert session.status == 200
    return session


async def test_a_request_over_a_session_matches_the_http_route(cache) -> None:  # type: ignore[no-untyped-def]
    app = served_app()
    srv = await start(app)
    try:
        async with wt_connect("127.0.0.1", srv.port) as proto:
            session = await session_on(srv, proto)
            body = chat(40, seed=1)
            response = await session.request(PATH, body)
            assert response.status == 200
            assert response.headers["eloquent-transport"] == "datagram"
            assert response.headers["x-eloquent-stream"]  # the SSE middleware's resume token
            assert response.headers["eloquent-content-type"].startswith("text/event-stream")
            assert response.stream_id not in (None, session.session_id) and response.stream_id % 4 == 0
            assert response.datagrams > 0
            expected = await reference(app, body)
            assert same_stream(payloads(response.events), expected)
            assert [e.index for e in response.events] == list(range(len(response.events)))
            # A second request on the same session, and two at once.
            a, b = await asyncio.gather(session.request(PATH, chat(30, seed=2)),
                                        session.request(PATH, chat(30, seed=3)))
            assert a.stream_id != b.stream_id
            assert text_of(payloads(a.events)) == text_of(await reference(app, chat(30, seed=2)))
            assert text_of(payloads(b.events)) == text_of(await reference(app, chat(30, seed=3)))
    finally:
        await srv.close()


async def test_lost_datagrams_are_repaired(cache) -> None:  # type: ignore[no-untyped-def]
    app = served_app()
    srv = await start(app)
    try:
        async with wt_connect("127.0.0.1", srv.port) as proto:
            session = await session_on(srv, proto)
            proto.drop = 0.3  # the client loses 30% of the session's datagrams
            response = await session.request(PATH, chat(80, seed=4))
            assert same_stream(payloads(response.events), await reference(app, chat(80, seed=4)))
    finally:
        await srv.close()


async def test_errors_come_back_as_status_lines(cache) -> None:  # type: ignore[no-untyped-def]
    app = served_app()
    srv = await start(app)
    try:
        async with wt_connect("127.0.0.1", srv.port) as proto:
            wrong = await open_session(proto, f"127.0.0.1:{srv.port}", path="/not-webtransport")
            assert wrong.status == 404
            session = await session_on(srv, proto)
            missing = await session.request("/v1/nothing-here", chat(5))
            assert missing.status == 404 and json.loads(missing.body)["error"]["code"] == "not_found"
            bad = await session.read(await session.send_raw(b"{not json\n"))
            assert bad.status == 400 and "not JSON" in json.loads(bad.body)["error"]["message"]
            long_head = await session.read(await session.send_raw(b"x" * (70 << 10), end=False))
            assert long_head.status == 431
            invalid = await session.request(PATH, {"messages": "nope", "stream": True})
            assert invalid.status == 400 and "error" in json.loads(invalid.body)
            # The session still works after all of that.
            assert (await session.request(PATH, chat(5, seed=5))).status == 200
    finally:
        await srv.close()


async def test_a_session_that_ends_mid_stream_resumes_over_sse_exactly_once(cache) -> None:  # type: ignore[no-untyped-def]
    app = served_app(tpot=0.02)
    srv = await start(app)
    body = chat(80, seed=6)
    try:
        async with wt_connect("127.0.0.1", srv.port) as proto:
            session = await session_on(srv, proto)
            partial = await session.request(PATH, body, stop_after=10)
            session.close()  # the browser's session is gone; the app's stream lives on in the resume store
            token = partial.headers["x-eloquent-stream"]
            last = partial.events[-1].index
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
                rest = await client.post(PATH, json=body, headers={"last-event-id": f"{token}:{last}"})
            assert rest.status_code == 200
            tail = [line[6:] for line in rest.text.splitlines() if line.startswith("data: ")]
            whole = payloads(partial.events) + tail
            assert same_stream(whole, await reference(app, body))
            assert len({json.loads(p)["id"] for p in whole if p != "[DONE]"}) == 1  # one stream, resumed
    finally:
        await srv.close()


async def test_webtransport_can_be_turned_off(cache) -> None:  # type: ignore[no-untyped-def]
    srv = await start(served_app(), options=FrontEndOptions(webtransport_path=None))
    try:
        async with wt_connect("127.0.0.1", srv.port) as proto:
            session = await open_session(proto, f"127.0.0.1:{srv.port}")
            assert session.status != 200
    finally:
        await srv.close()
    with pytest.raises(Exception, match="must start with /"):
        FrontEndOptions(webtransport_path="eloquent").check()
    assert not FrontEndOptions.from_env({"ELOQUENT_QUIC_WEBTRANSPORT_PATH": ""}).webtransport_path
    assert FrontEndOptions.from_env({}).webtransport_path == "/eloquent/wt"


# ---- the development certificate: what browsers accept by hash ------------------------------------------------
def write_pair(directory, key, days: float) -> None:  # type: ignore[no-untyped-def]
    directory.mkdir(parents=True, exist_ok=True)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=days)).sign(key, hashes.SHA256()))
    (directory / "dev-cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "dev-key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def load(pair) -> x509.Certificate:  # type: ignore[no-untyped-def]
    return x509.load_pem_x509_certificate(pair.certfile.read_bytes())


def test_the_dev_certificate_is_ecdsa_p256_and_at_most_14_days(cache) -> None:  # type: ignore[no-untyped-def]
    cert = load(dev_certificate())
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert isinstance(cert.public_key().curve, ec.SECP256R1)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=14)
    assert hash_eligible(cert) and not renewal_due(dev_pair())


@pytest.mark.parametrize("key,days", [
    (rsa.generate_private_key(public_exponent=65537, key_size=2048), 300),  # the old development certificate
    (ec.generate_private_key(ec.SECP256R1()), 300),  # too long for browsers
    (ec.generate_private_key(ec.SECP256R1()), 1.5),  # under 2 days left
])
def test_an_old_or_expiring_dev_certificate_is_replaced(cache, key, days) -> None:  # type: ignore[no-untyped-def]
    write_pair(cache, key, days)
    before = (cache / "dev-cert.pem").read_bytes()
    assert renewal_due(dev_pair())
    pair = dev_certificate()
    assert pair.certfile.read_bytes() != before and hash_eligible(load(pair))


async def test_a_running_front_end_renews_its_dev_certificate(cache) -> None:  # type: ignore[no-untyped-def]
    srv = await start(served_app())
    try:
        write_pair(cache, ec.generate_private_key(ec.SECP256R1()), 1.0)
        srv._renew_if_due()  # what the hourly check does
        assert not renewal_due(dev_pair())
        async with wt_connect("127.0.0.1", srv.port) as proto:  # new connections get the new certificate
            await session_on(srv, proto)
            served = proto._quic.tls._peer_certificate
            assert served.public_bytes(serialization.Encoding.PEM) == dev_pair().certfile.read_bytes()
    finally:
        await srv.close()


# ---- the browser routes ------------------------------------------------------------------------------------------
async def test_cert_hash_client_js_and_chat_are_served(cache, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pair = dev_certificate()
    app = served_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        document = (await client.get("/eloquent/cert-hash")).json()
        der = load(pair).public_bytes(serialization.Encoding.DER)
        assert document == {"algorithm": "sha-256", "value": base64.b64encode(hashlib.sha256(der).digest()).decode()}
        js = await client.get("/eloquent/client.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert 'export * from "./eloquent.js"' in js.text and 'export * from "./fetch.js"' in js.text  # the entry
        for module, marker in (("eloquent.js", 'from "./eloquent_client.js"'),
                               ("eloquent_client.js", "export class EloquentClient"),
                               ("wire.js", "export function decodePacket"),
                               ("fetch.js", "export function createEloquentFetch"),
                               ("fallback.js", "export const FallbackReason")):
            served = await client.get(f"/eloquent/{module}")  # what the entry imports, beside it
            assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
            assert marker in served.text, module
        static = Path(browser.__file__).resolve().parents[1] / "static"
        assert sorted(browser.CLIENT_MODULES) == sorted(p.name for p in static.glob("*.js"))  # every module served
        for module in browser.CLIENT_MODULES:
            served = await client.get(f"/eloquent/{module}")
            assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript"), module
            assert served.headers["cache-control"] == "no-cache" and served.content == (static / module).read_bytes()
        page = await client.get("/chat")
        assert page.status_code == 200 and 'from "/eloquent/client.js"' in page.text
        assert (await client.get("/v1/models")).status_code == 200  # everything else reaches the app
    # A certificate browsers would not take by hash (a real one, here RSA): no hash, the system's trust applies.
    write_pair(tmp_path / "real", rsa.generate_private_key(public_exponent=65537, key_size=2048), 90)
    config = StreamConfig(certfile=str(tmp_path / "real" / "dev-cert.pem"), keyfile=str(tmp_path / "real" / "dev-key.pem"))
    real = build_app(config, create_plugin_manager())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(real), base_url="http://test") as client:
        assert (await client.get("/eloquent/cert-hash")).status_code == 404


# ---- origins: browsers apply no CORS to WebTransport, so the front end checks (issue 28) ------------------------
async def test_sessions_follow_the_cors_origin_policy_and_keep_the_connect_origin(cache) -> None:  # type: ignore[no-untyped-def]
    seen: list[bytes | None] = []
    inner = served_app()

    async def recording(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(b"origin"))
        await inner(scope, receive, send)

    srv = await start(recording, options=FrontEndOptions(cors_origins=("https://good.example",)))
    authority = f"127.0.0.1:{srv.port}"
    try:
        async with wt_connect("127.0.0.1", srv.port) as proto:
            for origin, status in (("https://evil.example", 403), ("null", 403), ("http://localhost", 403),
                                   (f"https://127.0.0.1:{srv.port + 1}", 403), ("https://good.example", 200),
                                   ("https://good.example/", 200), (f"http://{authority}", 200), (None, 200)):
                session = await open_session(proto, authority, origin=origin)
                assert session.status == status, (origin, session.status)
            assert seen == []  # no refused session reached the app
            good = await open_session(proto, authority, origin="https://good.example")
            # A head that claims another Origin: the app sees the CONNECT's (the checked one).
            response = await good.request(PATH, chat(5, seed=9), headers={"Origin": "https://evil.example"})
            assert response.status == 200 and response.events
            assert seen == [b"https://good.example"]
    finally:
        await srv.close()
    assert FrontEndOptions().origin_policy().allows(None, b"x:1")  # a non-browser client, as before
    star = FrontEndOptions(cors_origins=("*",)).origin_policy()
    assert star.allows(b"https://anything.example", b"127.0.0.1:4433")


async def test_a_cross_origin_form_post_never_starts_a_generation() -> None:
    from eloquent_plugins.transports.cors import CorsMiddleware

    started: list[str] = []
    inner = served_app()

    async def counting(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["method"] == "POST":
            started.append(scope["path"])
        await inner(scope, receive, send)

    app = CorsMiddleware(counting, "https://good.example")
    body = json.dumps(chat(5, seed=10))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://server.test") as client:
        for origin, content_type in (("https://evil.example", "text/plain"), ("https://good.example", "text/plain"),
                                     ("null", "application/x-www-form-urlencoded"), ("https://evil.example", None)):
            headers = {"origin": origin, **({"content-type": content_type} if content_type else {})}
            refused = await client.post(PATH, content=body, headers=headers)
            assert refused.status_code == 415, (origin, content_type)
            assert refused.json()["error"]["code"] == "unsupported_media_type"
        assert started == []
        # JSON (a browser preflights it), a same-origin page, and a non-browser client are served as before.
        for headers in ({"origin": "https://good.example", "content-type": "application/json"},
                        {"origin": "http://server.test", "content-type": "text/plain"},
                        {"content-type": "text/plain"}):
            ok = await client.post(PATH, content=body, headers=headers)
            assert ok.status_code == 200, (headers, ok.status_code, ok.text[:200])
        assert len(started) == 3
