"""The SSE path: incremental parser, framing, and the ASGI middleware."""

from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.core.sse_reader import SSEMessage, SSEParser

__all__ = ["SSEMessage", "SSEParser", "format_event"]
