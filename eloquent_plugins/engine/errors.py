"""Typed errors of the built-in engine and their OpenAI-format JSON bodies."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.core.codecs.openai import openai_error
from eloquent_plugins.core.errors import EloquentError


class EngineError(EloquentError, RuntimeError):
    """The engine failed while generating (e.g. the ``fail_after`` control): the stream cannot continue."""


class APIError(EloquentError):
    """A request the server refuses, rendered as ``{"error": {message, type, param, code}}`` with ``status``.

    ``type`` and ``code`` follow OpenAI's conventions (``invalid_request_error``, ``model_not_found``, ...), so
    OpenAI SDKs raise the matching exception class.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return openai_error(self.message, error_type=self.type, param=self.param, code=self.code)


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400 for a field with a bad type or value."""
    return APIError(400, message, param=param, code=code)
