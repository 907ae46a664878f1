"""Configuration of the built-in engine (pacing and request limits)."""

from __future__ import annotations

from dataclasses import dataclass

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError


@dataclass
class EngineConfig:
    """Server-wide settings; per-request overrides come from the ``eloquent_engine`` body field.

    ``raise_errors`` picks what a mid-stream ``EngineError`` does: ``False`` (default) answers like vLLM with an
    in-band ``data: {"error": ...}`` event then ``[DONE]``; ``True`` lets it escape the body iterator so that a
    wrapping middleware can format it itself.
    """

    model: str = "eloquent-builtin"
    ttft: float = 0.2
    tpot: float = 0.03
    tpot_jitter: float = 0.0
    max_tokens_default: int = 256
    max_tokens_limit: int = 8192
    max_body_bytes: int = 1_000_000
    max_concurrency: int = 4096
    raise_errors: bool = False

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot", "tpot_jitter"):
            require_finite(f"EngineConfig.{name}", getattr(self, name))
        if self.tpot_jitter > 1:
            raise ConfigError("EngineConfig.tpot_jitter is relative and must be <= 1")
        for name in ("max_tokens_default", "max_tokens_limit", "max_body_bytes", "max_concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"EngineConfig.{name} must be an int >= 1, got {value!r}")
        if self.max_tokens_default > self.max_tokens_limit:
            raise ConfigError("EngineConfig.max_tokens_default must not exceed max_tokens_limit")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("EngineConfig.model must be a non-empty string")
