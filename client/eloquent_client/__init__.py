"""eloquent-client: one async API to stream LLM responses as Eloquent HTTP/3 datagrams, as SSE on the HTTP/3
reliable stream, or as plain SSE over HTTP/1.1 -- with render times recorded and optional reading-pace pacing.
"""

from eloquent_client.client import TRANSPORTS, EloquentClient, Response, ResponseStream, Transport
from eloquent_client.events import ClientError, ClientEvent, IncompleteStream, StreamFailed, text_delta
from eloquent_client.http3 import H3Stream, Http3ClientConnection
from eloquent_client.pacing import Pacer, Pacing

__all__ = [
    "TRANSPORTS", "ClientError", "ClientEvent", "EloquentClient", "H3Stream", "Http3ClientConnection",
    "IncompleteStream", "Pacer", "Pacing", "Response", "ResponseStream", "StreamFailed", "Transport",
    "text_delta",
]
