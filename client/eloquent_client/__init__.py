"""eloquent-client: stream LLM responses as Eloquent HTTP/3 datagrams, as SSE on the HTTP/3 reliable stream, or as
plain SSE over TCP -- ``transport="auto"`` picks HTTP/3 when UDP answers and falls back to TCP -- with resume
across cuts, render times recorded and optional reading-pace pacing.

* ``EloquentClient`` (= ``AsyncEloquentClient``) and ``SyncEloquentClient``: the client API.
* ``AsyncEloquentTransport`` / ``EloquentTransport``: httpx transports, for both ``httpx`` and ``httpx2``, so
  httpx-based code (the openai SDK 3.x on httpx2, older SDKs on httpx, httpx-sse) gets the same delivery:
  ``openai.DefaultAsyncHttpxClient(transport=AsyncEloquentTransport(verify=False))``.

Errors: every exception class the client defines derives from ``ClientError``: ``ConnectError`` (and
``TLSVerificationError``), ``HTTPStatusError`` (and ``ResumeRefused``), ``StreamBroken``, ``IncompleteStream``,
``StreamFailed``; the same on every path. Besides those: ``ConfigError`` for bad arguments and the core's
``ProtocolError`` when a server breaks the Eloquent control records.
"""

from importlib.metadata import PackageNotFoundError, version

from eloquent_client.client import TRANSPORTS, AsyncEloquentClient, EloquentClient, Transport
from eloquent_client.errors import (
    ClientError,
    ConnectError,
    HTTPStatusError,
    IncompleteStream,
    ResumeRefused,
    StreamBroken,
    StreamFailed,
    TLSVerificationError,
)
from eloquent_client.events import ClientEvent, text_delta
from eloquent_client.h3stream import BodyKind, H3Stream, Phase
from eloquent_client.http3 import Http3ClientConnection
from eloquent_client.httpx_transport import AsyncEloquentTransport, EloquentTransport
from eloquent_client.pacing import Pacer, Pacing
from eloquent_client.paths import PathMemory
from eloquent_client.response import Response, ResponseStream
from eloquent_client.sync import SyncEloquentClient, SyncResponseStream

try:
    __version__ = version("eloquent-plugins")
    """The distribution's version (the client ships in ``eloquent-plugins``)."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "TRANSPORTS", "__version__", "AsyncEloquentClient", "AsyncEloquentTransport", "BodyKind", "ClientError", "ClientEvent",
    "ConnectError", "EloquentClient", "EloquentTransport", "H3Stream", "HTTPStatusError", "Http3ClientConnection",
    "IncompleteStream", "Pacer", "Pacing", "PathMemory", "Phase", "Response", "ResponseStream", "ResumeRefused",
    "StreamBroken", "StreamFailed", "SyncEloquentClient", "SyncResponseStream", "TLSVerificationError", "Transport",
    "text_delta",
]
