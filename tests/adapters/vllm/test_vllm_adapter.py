"""The vLLM adapter's logic without vLLM: flag parsing and refusals, settings, and the middleware's lifespan.

Runs in the main venv in milliseconds. The same code is exercised on a real vLLM in test_vllm_plumbing.py; here
each rule gets a direct, fast check, including the failure paths a live server cannot easily provoke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from argparse import Namespace
from typing import Any, ClassVar

import httpx
import pytest
from eloquent_vllm import MIDDLEWARE_PATH
from eloquent_vllm.cli_hook import install_parser_hook, is_serve_parser

from tests.support.vllm_parser import serve_parser
from eloquent_vllm.errors import ServeOptionsError
from eloquent_vllm.implementations import HTTP3_SERVER_ENV, SSE_MIDDLEWARE_ENV
from eloquent_vllm.middleware import VllmStreamMiddleware
from eloquent_vllm.options import EloquentVllmSettings, planned_api_servers
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

HERE = __name__


class StampMiddleware:
    """Stand-in for EloquentMiddleware: records its config on each HTTP response and every lifespan message."""

    lifespan_seen: ClassVar[list[str]] = []

    def __init__(self, app: Any, config: Any = None) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async def spy(message: Any) -> None:
                StampMiddleware.lifespan_seen.append(message["type"])
                await send(message)

            await self.app(scope, receive, spy)
            return

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                stamp = f"{self.config.stream_transport};{self.config.keepalive}".encode()
                message = {**message, "headers": [*message.get("headers", []), (b"x-stamp", stamp)]}
            await send(message)

        await self.app(scope, receive, stamped)


class FakeHttp3:
    started: ClassVar[list[dict[str, Any]]] = []
    closed: int = 0
    fail: bool = False

    @classmethod
    async def start(cls, app: Any, *, host: str, port: int, config: Any) -> FakeHttp3:
        if cls.fail:
            raise OSError(98, "Address already in use")
        cls.started.append({"app": app, "host": host, "port": port, "config": config})
        return cls()

    async def close(self) -> None:
        type(self).closed += 1


start_fake_http3 = FakeHttp3.start


@pytest.fixture(autouse=True)
def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SSE_MIDDLEWARE_ENV, f"{HERE}:StampMiddleware")
    monkeypatch.setenv(HTTP3_SERVER_ENV, f"{HERE}:start_fake_http3")
    for name in ("ELOQUENT_STREAM_TRANSPORT", "ELOQUENT_KEEPALIVE", "ELOQUENT_RESUME_STORE", "ELOQUENT_ELOQUENT_PORT",
                 "ELOQUENT_CERTFILE", "ELOQUENT_KEYFILE", "VLLM_USE_RUST_FRONTEND"):
        monkeypatch.delenv(name, raising=False)
    FakeHttp3.started, FakeHttp3.closed, FakeHttp3.fail = [], 0, False
    StampMiddleware.lifespan_seen = []


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        serve_parser().parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# --- parser hook -------------------------------------------------------------------------------------------


def test_without_flag_nothing_changes() -> None:
    parser = serve_parser()
    default_list = parser._option_string_actions["--middleware"].default
    args = parser.parse_args(["model"])
    assert args.middleware == [] and args.stream_transport is None
    assert default_list == []  # the shared default list was not mutated


def test_transport_appends_our_middleware_last_and_once() -> None:
    parser = serve_parser()
    args = parser.parse_args(["model", "--middleware", "user.mw.M", "--stream-transport", "sse"])
    assert args.middleware == ["user.mw.M", MIDDLEWARE_PATH]
    parser.parse_known_args(["model", "--stream-transport", "sse"], args)  # parsing the namespace again
    assert args.middleware.count(MIDDLEWARE_PATH) == 1


def test_transport_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELOQUENT_STREAM_TRANSPORT", "sse")
    assert serve_parser().parse_args(["model"]).middleware == [MIDDLEWARE_PATH]


def test_hook_leaves_other_parsers_alone(capsys: pytest.CaptureFixture[str]) -> None:
    parser_class = type("OtherParser", (argparse.ArgumentParser,), {})
    install_parser_hook(parser_class)
    parser = parser_class(prog="vllm bench")
    assert not is_serve_parser(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--stream-transport", "sse"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_hook_installs_once() -> None:
    parser_class = type("P", (argparse.ArgumentParser,), {})
    assert install_parser_hook(parser_class) is True
    assert install_parser_hook(parser_class) is False


def test_eloquent_refuses_several_api_servers(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(["m", "--stream-transport", "eloquent", "--api-server-count", "2"], capsys)
    assert "supports one API server" in err and "--stream-transport sse" in err


def test_eloquent_refuses_data_parallel_default_of_several_servers(capsys: pytest.CaptureFixture[str]) -> None:
    assert "got 2" in parse_error(["m", "--stream-transport", "eloquent", "--data-parallel-size", "2"], capsys)


def test_several_api_servers_need_a_shared_resume_store(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(["m", "--stream-transport", "sse", "--api-server-count", "2"], capsys)
    assert "redis://" in err
    args = serve_parser().parse_args(
        ["m", "--stream-transport", "sse", "--api-server-count", "2", "--eloquent-resume-store", "redis://r:6379/0"]
    )
    assert args.middleware == [MIDDLEWARE_PATH]


def test_eloquent_over_unix_socket_needs_a_udp_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--eloquent-port" in parse_error(["m", "--stream-transport", "eloquent", "--uds", "/tmp/s"], capsys)
    args = serve_parser().parse_args(["m", "--stream-transport", "eloquent", "--uds", "/tmp/s", "--eloquent-port", "9"])
    assert EloquentVllmSettings.from_namespace(args).http3_port == 9


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--grpc"], {}, "--grpc"),
        ([], {"VLLM_USE_RUST_FRONTEND": "1"}, "VLLM_USE_RUST_FRONTEND"),
        (["--eloquent-certfile", "c.pem"], {}, "together"),
        (["--eloquent-keepalive", "-1"], {}, "keep-alive"),
        (["--eloquent-keepalive", "nan"], {}, "keep-alive"),  # NaN passed `< 0` and turned keep-alive off
        (["--eloquent-keepalive", "inf"], {}, "keep-alive"),
        (["--eloquent-port", "70000"], {}, "port"),
        (["--eloquent-resume-store", "postgres://x"], {}, "resume store"),
    ],
)
def test_bad_combinations_are_cli_errors(
    argv: list[str], env: dict[str, str], needle: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert needle in parse_error(["m", "--stream-transport", "eloquent", *argv], capsys)


def test_missing_implementation_is_a_cli_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(HTTP3_SERVER_ENV, "no_such_module_xyz:start")
    assert "cannot import no_such_module_xyz" in parse_error(["m", "--stream-transport", "eloquent"], capsys)
    # sse does not need the HTTP/3 server at all
    assert serve_parser().parse_args(["m", "--stream-transport", "sse"]).middleware == [MIDDLEWARE_PATH]


# --- settings ----------------------------------------------------------------------------------------------


def test_settings_precedence_flag_over_env_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = serve_parser()
    base = ["m", "--stream-transport", "eloquent", "--port", "8123"]
    settings = EloquentVllmSettings.from_namespace(parser.parse_args(base))
    assert settings.config is not None and settings.config.keepalive == 15.0
    assert settings.http3_port == 8123 and settings.http3_host == "0.0.0.0"
    monkeypatch.setenv("ELOQUENT_KEEPALIVE", "4")
    assert EloquentVllmSettings.from_namespace(parser.parse_args(base)).config.keepalive == 4.0  # type: ignore[union-attr]
    flagged = parser.parse_args([*base, "--eloquent-keepalive", "2.5", "--eloquent-port", "9001"])
    settings = EloquentVllmSettings.from_namespace(flagged)
    assert settings.config is not None and settings.config.keepalive == 2.5
    assert settings.http3_port == 9001 and settings.config.eloquent_port == 9001


def test_http3_certificate_defaults_to_vllm_tls_files() -> None:
    args = serve_parser().parse_args(
        ["m", "--stream-transport", "eloquent", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem"]
    )
    config = EloquentVllmSettings.from_namespace(args).config
    assert config is not None and (config.certfile, config.keyfile) == ("c.pem", "k.pem")


def test_unknown_transport_in_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELOQUENT_STREAM_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ServeOptionsError, match="carrier-pigeon"):
        EloquentVllmSettings.from_namespace(Namespace())


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, 1),
        ({"api_server_count": 3}, 3),
        ({"headless": True}, 0),
        ({"data_parallel_size": 4}, 4),
        ({"data_parallel_size": 4, "data_parallel_external_lb": True}, 1),
        ({"data_parallel_size": 4, "data_parallel_hybrid_lb": True, "data_parallel_size_local": 2}, 2),
    ],
)
def test_planned_api_servers(values: dict[str, Any], expected: int) -> None:
    assert planned_api_servers(Namespace(**values)) == expected


# --- middleware lifespan + requests --------------------------------------------------------------------------


async def _stream(request: Request) -> StreamingResponse:
    async def body() -> Any:
        for i in range(3):
            yield f"data: {i}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def make_app(args: Namespace | None) -> Starlette:
    app = Starlette(
        routes=[Route("/v1/completions", _stream, methods=["POST"]),
                Route("/health", lambda r: JSONResponse({}))],
        middleware=[Middleware(VllmStreamMiddleware)],
    )
    if args is not None:
        app.state.args = args
    return app


class Lifespan:
    """Drives an app's ASGI lifespan like uvicorn does, one message at a time."""

    def __init__(self, app: Starlette) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task = asyncio.ensure_future(
            app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, self.inbox.get, self.outbox.put)
        )

    async def step(self, message_type: str) -> dict[str, Any]:
        await self.inbox.put({"type": message_type})
        return await asyncio.wait_for(self.outbox.get(), timeout=30)


def args_for(*argv: str) -> Namespace:
    return serve_parser().parse_args(["m", "--port", "8123", *argv])


async def test_eloquent_lifespan_starts_and_stops_http3_on_the_same_app() -> None:
    app = make_app(args_for("--stream-transport", "eloquent", "--eloquent-keepalive", "3"))
    life = Lifespan(app)
    assert (await life.step("lifespan.startup"))["type"] == "lifespan.startup.complete"
    [started] = FakeHttp3.started
    assert started["app"] is app and started["port"] == 8123 and started["host"] == "0.0.0.0"
    assert started["config"].keepalive == 3.0 and started["config"].stream_transport == "eloquent"
    assert StampMiddleware.lifespan_seen == ["lifespan.startup.complete"]  # the SSE middleware saw the lifespan

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/v1/completions")
    assert response.headers["x-stamp"] == "eloquent;3.0"
    assert response.text.endswith("data: [DONE]\n\n")

    assert (await life.step("lifespan.shutdown"))["type"] == "lifespan.shutdown.complete"
    assert FakeHttp3.closed == 1
    await life.task


async def test_sse_lifespan_starts_no_http3() -> None:
    life = Lifespan(make_app(args_for("--stream-transport", "sse")))
    assert (await life.step("lifespan.startup"))["type"] == "lifespan.startup.complete"
    assert FakeHttp3.started == []
    await life.step("lifespan.shutdown")
    await life.task


async def test_http3_port_in_use_fails_startup_with_the_port_named() -> None:
    FakeHttp3.fail = True
    life = Lifespan(make_app(args_for("--stream-transport", "eloquent", "--eloquent-port", "9443")))
    failed = await life.step("lifespan.startup")
    assert failed["type"] == "lifespan.startup.failed"
    assert "udp 0.0.0.0:9443" in failed["message"] and "Address already in use" in failed["message"]
    life.task.cancel()


async def test_several_api_servers_fail_eloquent_startup_at_runtime_too() -> None:
    args = args_for("--stream-transport", "eloquent")
    args.api_server_count = 2  # e.g. defaulted from the data parallel size after parsing
    failed = await Lifespan(make_app(args)).step("lifespan.startup")
    assert failed["type"] == "lifespan.startup.failed" and "one API server" in failed["message"]


async def test_broken_middleware_fails_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    args = args_for("--stream-transport", "sse")  # parsed fine; broken by the time the server process starts
    monkeypatch.setenv(SSE_MIDDLEWARE_ENV, "no_such_module_xyz:M")
    failed = await Lifespan(make_app(args)).step("lifespan.startup")
    assert failed["type"] == "lifespan.startup.failed" and "no_such_module_xyz" in failed["message"]


async def test_given_by_hand_without_flags_defaults_to_sse() -> None:
    app = make_app(None)  # no plugin, no parsed args: `--middleware eloquent_vllm.middleware.VllmStreamMiddleware`
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/v1/completions")
    assert response.headers["x-stamp"] == "sse;15.0"
    assert FakeHttp3.started == []


async def test_trickled_body_is_cut_with_408_before_vllm_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter puts the body deadline outermost: a request body that stalls gets 408, the route never runs."""
    monkeypatch.setenv("ELOQUENT_BODY_TIMEOUT", "0.2")
    ran: list[Any] = []

    async def completions(request: Request) -> JSONResponse:  # reads its body, as vLLM's routes do
        ran.append(await request.json())
        return JSONResponse({})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])],
                    middleware=[Middleware(VllmStreamMiddleware)])
    app.state.args = args_for("--stream-transport", "sse")
    sent: list[dict[str, Any]] = []
    stalled = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not stalled.is_set():
            stalled.set()
            return {"type": "http.request", "body": b'{"prompt": "x", "stre', "more_body": True}
        await asyncio.sleep(3600)  # the rest of the body never comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "scheme": "http", "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 9),
             "server": ("127.0.0.1", 8123), "app": app, "state": {}}
    from starlette.requests import ClientDisconnect

    with contextlib.suppress(ClientDisconnect):  # what the route sees: the client left (as on a real disconnect)
        await asyncio.wait_for(app(scope, receive, send), 10)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 408
    assert b"request_timeout" in sent[1]["body"]
    assert all(m.get("status") != 200 for m in sent) and ran == []
