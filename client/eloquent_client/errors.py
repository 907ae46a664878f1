"""The client's one error model: ``ClientError`` and its typed subclasses, raised alike on every path (HTTP/3
datagrams, the HTTP/3 stream, SSE over TCP), so a caller handles a failure by what happened, not by how the bytes
travelled."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from eloquent_plugins.core.errors import EloquentError
from eloquent_plugins.core.errors import IncompleteStream as CoreIncompleteStream


class ClientError(EloquentError):
    """The request could not be completed. Every exception the client defines derives from it, so
    ``except ClientError`` covers them all."""


class ConnectError(ClientError):
    """No connection could be made (no answer within the timeout, refused, unreachable)."""

    answered = False
    """HTTP/3: the server sent something before the handshake failed (a lossy path, not a blocked one)."""


class TLSVerificationError(ConnectError):
    """The server's certificate was refused: ``reason`` says why (``fix`` how to get past it legitimately)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host = host
        self.port = port
        self.reason = reason
        self.fix = (f"pass verify=False (development only), or verify=<path of the server's certificate or CA>; "
                    f"for `eloquent serve`'s development certificate that is {dev_certificate_path()}")
        super().__init__(f"TLS verification of {host}:{port} failed: {reason}. Fix: {self.fix}")


class HTTPStatusError(ClientError):
    """The server answered with a status other than 200: ``status``, ``headers`` and ``body`` (the decoded
    JSON body when it is JSON, else its text)."""

    def __init__(self, status: int, body: Any, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})
        self.content = b""
        """The raw body, when the client read it."""

    @property
    def draining(self) -> bool:
        """A server's refusal of a new stream because it drains (``transports.drain``): safe to send elsewhere."""
        error = self.body.get("error") if self.status == 503 and isinstance(self.body, dict) else None
        return isinstance(error, dict) and error.get("code") == "draining"

    @property
    def retry_after(self) -> float:
        """The ``Retry-After`` seconds, within 0..5 (1 when absent or not a number)."""
        try:
            return min(5.0, max(0.0, float(self.headers.get("retry-after", "1"))))
        except ValueError:
            return 1.0


class StreamBroken(ClientError):
    """The stream was cut (connection lost, path silent past ``stream_idle_timeout``, reset) and could not be
    continued: not resumable, or every resume attempt failed."""


class ResumeRefused(StreamBroken, HTTPStatusError):
    """The server refused to continue a cut stream (404 unknown/expired, 403 other caller, 410 gone, 503)."""

    def __init__(self, status: int, body: Any, message: str, headers: Mapping[str, str] | None = None) -> None:
        HTTPStatusError.__init__(self, status, body, message, headers)


class IncompleteStream(ClientError, CoreIncompleteStream):
    """The response ended before the final event, or the stream digest did not match.

    The core assembler raises ``core.errors.IncompleteStream``; the client re-raises it as this class (see
    ``from_core``) so that it is both a ``ClientError`` and still matches ``except`` clauses on the core one."""

    @classmethod
    def from_core(cls, error: CoreIncompleteStream) -> IncompleteStream:
        converted = cls(str(error))
        converted.__cause__ = error
        return converted


class StreamFailed(ClientError):
    """The server reported an error inside the stream (an in-band error event)."""

    def __init__(self, message: str, payload: Any = None) -> None:
        super().__init__(message)
        self.payload = payload


def dev_certificate_path() -> str:
    """Where ``eloquent serve`` keeps its development certificate (same rule as the server's ``certs``)."""
    explicit = os.environ.get("ELOQUENT_CACHE_DIR")
    if explicit:
        base = explicit
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(cache, "eloquent-plugins")
    return os.path.join(base, "dev-cert.pem")


def decode_body(raw: bytes) -> Any:
    import json

    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


__all__ = ["ClientError", "ConnectError", "HTTPStatusError", "IncompleteStream", "ResumeRefused", "StreamBroken",
           "StreamFailed", "TLSVerificationError", "dev_certificate_path"]
