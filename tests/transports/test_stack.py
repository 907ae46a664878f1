"""The serving stack is composed once (``transports.stack.wrap``) and every host gets the same order.

``eloquent serve`` (built-in engine and each gateway kind), the vLLM plugin and the examples' hand-hosted gateways
all build their app with ``wrap``; these tests read each one's layers back and compare them with ``ORDER``."""

from __future__ import annotations

from argparse import Namespace
from types import SimpleNamespace
from typing import Any

import pytest

from eloquent_plugins.cli.app_factory import build_app, build_stack
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.alt_svc import AltSvcMiddleware
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.transports.stack import ORDER, layers, wrap

UPSTREAMS = ["tgi=http://127.0.0.1:9", "openai=http://127.0.0.1:9", "triton=grpc://127.0.0.1:9"]
"""One of each gateway kind; nothing is contacted while the app is built."""


async def _app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
    raise AssertionError


def test_wrap_puts_every_layer_in_order() -> None:
    stack = wrap(_app, StreamConfig(), cors_origins="*", alt_svc=True, alt_svc_port=8443)
    assert layers(stack.app) == list(ORDER)
    assert isinstance(stack.streams, EloquentMiddleware) and stack.streams.app is _app
    assert isinstance(stack.alt_svc, AltSvcMiddleware) and stack.alt_svc.port == 8443


def test_wrap_leaves_out_what_is_not_asked_for() -> None:
    assert layers(wrap(_app, StreamConfig()).app) == ["browser", "body_timeout", "streams"]
    bare = wrap(_app, StreamConfig(), streams=False, cors_origins="*", alt_svc=True)
    assert layers(bare.app) == ["alt_svc", "cors"] and bare.streams is None and bare.app.app.app is _app


def test_layers_reads_a_hand_built_stack_in_any_order() -> None:
    """The check can fail: a stack built by hand in another order reads back in that order."""
    from eloquent_plugins.transports.request_timeouts import BodyTimeoutMiddleware

    wrong = EloquentMiddleware(BodyTimeoutMiddleware(_app), StreamConfig())
    assert layers(BodyTimeoutMiddleware(wrong)) == ["body_timeout", "streams"]
    assert layers(AltSvcMiddleware(BodyTimeoutMiddleware(_app), None)) == ["alt_svc", "body_timeout"]


@pytest.mark.parametrize("upstream", [None, *UPSTREAMS])
def test_eloquent_serve_hosts_the_stack(upstream: str | None) -> None:
    pm = create_plugin_manager()
    config = StreamConfig(stream_transport="eloquent")
    served = build_stack(config, pm, upstream=upstream, cors_origins="https://a.example", alt_svc=True)
    assert layers(served.app) == list(ORDER)
    assert layers(build_app(config, pm, upstream=upstream)) == ["browser", "body_timeout", "streams"]
    assert layers(build_stack(config, pm, upstream=upstream, streams=False, alt_svc=True).app) == ["alt_svc"]


@pytest.mark.parametrize("transport,expected", [
    ("eloquent", [name for name in ORDER if name != "cors"]),  # vLLM has its own CORS (--allowed-origins)
    ("sse", ["browser", "body_timeout", "streams"]),
])
def test_the_vllm_plugin_hosts_the_stack(transport: str, expected: list[str]) -> None:
    from eloquent_vllm.middleware import VllmStreamMiddleware

    plugin = VllmStreamMiddleware(_app)
    plugin._setup(SimpleNamespace(state=SimpleNamespace(args=Namespace(stream_transport=transport, port=8123))))
    assert layers(plugin._inner) == expected
    assert plugin._drain is not None  # the stream layer's own, which the HTTP/3 front end follows


def test_every_path_is_in_one_order() -> None:
    """Whatever a host leaves out, what it has is ORDER's order (a subsequence of it)."""
    pm = create_plugin_manager()
    config = StreamConfig()
    for stack in (build_stack(config, pm, upstream=UPSTREAMS[0], alt_svc=True).app,
                  build_stack(config, pm, cors_origins="*").app, wrap(_app, config, alt_svc=True).app):
        got = layers(stack)
        assert got == [name for name in ORDER if name in got] and got[-1] == "streams"
