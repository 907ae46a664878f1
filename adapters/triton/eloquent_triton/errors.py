"""Errors the gateway answers with Triton's own error shape, ``{"error": "..."}``."""

from __future__ import annotations


class TritonGatewayError(Exception):
    """A request the gateway rejects before the stream starts: ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class UpstreamError(Exception):
    """The upstream failed after the stream started; becomes an in-band ``data: {"error": ...}`` event."""
