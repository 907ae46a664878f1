"""The ``triton`` upstream kind registers through the transports' upstream hook and builds the gateway."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.upstream import upstream_kinds
from eloquent_triton import plugin


def registered_kinds() -> dict[str, Any]:
    # Registered by hand: the entry point (see docs/TRITON.md) is added to pyproject.toml separately.
    return upstream_kinds(create_plugin_manager(load_entry_points=False, plugins=[plugin]))


def test_registers_the_triton_kind() -> None:
    kinds = registered_kinds()
    assert "triton" in kinds
    for url in ("http://127.0.0.1:8000", "grpc://127.0.0.1:8001"):
        app = kinds["triton"].create_app(url, StreamConfig())
        assert isinstance(app, Starlette)
        paths = {route.path for route in app.routes}
        assert "/v2/models/{model}/generate_stream" in paths
        assert "/v2/models/{model}/versions/{version}/generate" in paths


@pytest.mark.parametrize("url", ["ftp://host:1", "grpc://host-without-port", "tcp://x:1"])
def test_bad_upstream_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        registered_kinds()["triton"].create_app(url, StreamConfig())
