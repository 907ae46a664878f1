"""Typed errors. Everything a peer can get wrong surfaces as one of these, never as a bare crash."""

from __future__ import annotations


class EloquentError(Exception):
    """Base class for every error this package raises on purpose."""


class ProtocolError(EloquentError):
    """The peer broke the Eloquent wire protocol; ``code`` is what a transport reports when it closes."""

    code: int = 0x1

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class DecodeError(ProtocolError):
    """Bytes that are not a well-formed packet (truncated, bad version, bad field)."""

    code = 0x2


class LimitExceeded(ProtocolError):
    """A well-formed packet asks for more than the configured limits allow."""

    code = 0x3


class ProtocolViolation(ProtocolError):
    """A well-formed packet that contradicts the stream state (ack for unsent events, changed payload)."""

    code = 0x4


class StreamClosed(EloquentError):
    """An event was pushed to a stream that already ended."""


class ConfigError(EloquentError, ValueError):
    """A setting is out of range or malformed (CLI flag, environment variable, config object)."""


class IncompleteStream(EloquentError):
    """A datagram delivery ended before its final event, or its digest did not match the trailer."""


class InvalidArgument(EloquentError, ValueError):
    """A caller passed a value a function cannot take (a negative count, mismatched sequences): neither a peer's
    mistake nor a setting's. A ``ValueError`` too, as it was before it joined the family."""
