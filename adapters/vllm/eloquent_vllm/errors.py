"""Typed errors of the vLLM adapter: each says what to change, so a user never has to read a traceback."""

from __future__ import annotations

from eloquent_plugins.core.errors import ConfigError, EloquentError


class EloquentVllmError(EloquentError):
    """Base class for errors raised by the vLLM adapter."""


class UnsupportedVllmVersion(EloquentVllmError):
    """vLLM is missing, or its internals moved in a way this adapter does not know."""


class ServeOptionsError(EloquentVllmError, ConfigError):
    """A combination of ``vllm serve`` flags this adapter cannot honour (reported as a CLI error)."""


class Http3StartError(EloquentVllmError):
    """The HTTP/3 front end could not start inside the API server (UDP port in use, bad certificate, ...)."""
