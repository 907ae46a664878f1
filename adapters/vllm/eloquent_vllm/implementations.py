"""Where the SSE middleware and the HTTP/3 server come from, resolved lazily by import path.

Why lazily and by path: the adapter must import (and vLLM must start) even when a transport's implementation
is absent or broken, and tests or experiments can swap one in through an environment variable that the API
server processes inherit (vLLM gives ``--middleware`` classes no constructor arguments).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from eloquent_vllm.errors import ServeOptionsError

SSE_MIDDLEWARE = "eloquent_plugins.transports.sse.middleware:EloquentMiddleware"
HTTP3_SERVER = "eloquent_plugins.transports.http3.server:start_http3_server"
SSE_MIDDLEWARE_ENV = "ELOQUENT_VLLM_SSE_MIDDLEWARE"
"""Override: ``module:Class`` built as ``Class(app, config=StreamConfig)``."""
HTTP3_SERVER_ENV = "ELOQUENT_VLLM_HTTP3_SERVER"
"""Override: ``module:function``, ``await function(app, host=, port=, config=)`` returns a handle with
``async close()``."""


def load_object(path: str) -> Any:
    """Import ``module:attr`` (or ``module.attr``), raising :class:`ServeOptionsError` that names the path."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ServeOptionsError(f"{path!r} is not an import path like 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or any error the module raises while importing
        raise ServeOptionsError(f"cannot import {module_name} (for {path}): {type(exc).__name__}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ServeOptionsError(f"{module_name} has no attribute {attr!r} (for {path})") from None


def sse_middleware_class(environ: Mapping[str, str] | None = None) -> Any:
    env = os.environ if environ is None else environ
    return load_object(env.get(SSE_MIDDLEWARE_ENV) or SSE_MIDDLEWARE)


def http3_server_starter(environ: Mapping[str, str] | None = None) -> Any:
    env = os.environ if environ is None else environ
    return load_object(env.get(HTTP3_SERVER_ENV) or HTTP3_SERVER)
