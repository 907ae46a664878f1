"""The SSE path: incremental parser, framing, and the ASGI middleware."""

from .framing import format_event
from .parser import SSEMessage, SSEParser

__all__ = ["SSEMessage", "SSEParser", "format_event"]
