"""The built-in engine: an OpenAI-compatible streaming server that needs no GPU and no model.

It emits word pieces of embedded public-domain prose at a configurable pace, deterministically, so transport
tests and benchmarks have a cheap, reproducible token source (``eloquent serve`` / ``eloquent demo`` default).
"""

from eloquent_plugins.engine.app import create_engine_app
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.engine.controls import EngineControls
from eloquent_plugins.engine.core import Engine, stable_hash
from eloquent_plugins.engine.errors import APIError, EngineError
from eloquent_plugins.engine.tokens import EngineStats, Token

__all__ = [
    "APIError",
    "Engine",
    "EngineConfig",
    "EngineControls",
    "EngineError",
    "EngineStats",
    "Token",
    "create_engine_app",
    "stable_hash",
]
