"""The built-in engine: an OpenAI-compatible streaming server that needs no GPU and no model.

It emits word pieces of embedded public-domain prose at a configurable pace, deterministically, so transport
tests and benchmarks have a cheap, reproducible token source (``eloquent serve`` / ``eloquent demo`` default).
"""

from .app import create_engine_app
from .config import EngineConfig
from .controls import EngineControls
from .core import Engine, stable_hash
from .errors import APIError, EngineError
from .tokens import EngineStats, Token

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
