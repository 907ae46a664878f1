"""What a request gives back: ``Response`` (non-streaming) and ``ResponseStream`` (events as they render, each
once, across resumes), with the server's own status and headers on every path."""

from __future__ import annotations

import asyncio
import dataclasses
import json as jsonlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.protocol import REQUEST_ID_HEADER

from eloquent_client.errors import ClientError, StreamFailed
from eloquent_client.events import ClientEvent
from eloquent_client.pacing import Pacer, Pacing

if TYPE_CHECKING:
    from eloquent_client.attempts import Attempt
    from eloquent_client.h3stream import H3Stream

_DELIVERY_NAMES = {"datagram": "eloquent", "h3-stream": "h3-stream", "sse": "sse"}


@dataclasses.dataclass(slots=True)
class Response:
    """A non-streaming response; ``delivery`` is ``h3-stream`` (HTTP/3) or ``sse`` (TCP)."""

    status: int
    headers: dict[str, str]
    content: bytes
    delivery: str = ""

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class StreamState:
    """One stream across its tries: the current try, the resume token, the next index to render."""

    def __init__(self, attempt: Attempt, token: str | None) -> None:
        self.attempt = attempt
        self.token = token
        self.next_index = 0
        self.resumes = 0
        self.moves = 0
        """Tries ended only to move the stream over to datagrams (``auto``; not cuts, not counted as resumes)."""
        self.since = time.monotonic()
        """When the current try began."""
        self.deliveries = [attempt.delivery]
        """Each try's delivery (``datagram``, ``h3-stream``, ``sse``), in order."""

    def switch(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.since = time.monotonic()
        self.deliveries.append(attempt.delivery)


class ResponseStream:
    """A streaming response; ``events()`` yields each event once as it becomes renderable."""

    def __init__(self, transport: str, status: int, headers: Mapping[str, str],
                 source: AsyncIterator[ClientEvent], pacing: Pacing | None, h3: H3Stream | None = None,
                 state: StreamState | None = None) -> None:
        self.transport = transport
        self.status = status
        self.headers = dict(headers)
        self.rendered: list[ClientEvent] = []
        self._source = source
        self._pacer = Pacer(pacing) if pacing is not None else None
        self._h3 = h3
        self._state = state
        self._consumed = False

    @property
    def request_id(self) -> str | None:
        return self.headers.get(REQUEST_ID_HEADER.decode())

    @property
    def deliveries(self) -> list[str]:
        """How each try came: ``datagram``, ``h3-stream`` or ``sse`` (more than one after a resume)."""
        if self._state is not None:
            return list(self._state.deliveries)
        return ["datagram" if self.h3 is not None and self.h3.eloquent else self.transport]

    @property
    def delivery(self) -> str:
        """How the events first came: ``eloquent`` (datagrams), ``h3-stream`` or ``sse``."""
        return _DELIVERY_NAMES.get(self.deliveries[0], self.deliveries[0])

    @property
    def resumes(self) -> int:
        return self._state.resumes if self._state is not None else 0

    @property
    def h3(self) -> H3Stream | None:
        """The HTTP/3 stream of the current try, when it is one."""
        if self._h3 is not None:
            return self._h3
        attempt = self._state.attempt if self._state is not None else None
        return getattr(attempt, "h3", None)

    async def events(self) -> AsyncIterator[ClientEvent]:
        if self._consumed:
            raise ClientError("the events of a response can be read only once")
        self._consumed = True
        async for event in self._source:
            if self._pacer is not None:
                at = self._pacer.release_at(event.rendered_at)
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                event = dataclasses.replace(event, rendered_at=max(at, event.rendered_at))
            self.rendered.append(event)
            yield event

    async def text_deltas(self) -> AsyncIterator[str]:
        """The text of OpenAI/TGI chunks as it renders; an in-band error raises ``StreamFailed``."""
        async for event in self.events():
            if event.kind == "error" or event.error is not None:
                raise StreamFailed(f"the server reported an error: {event.data}", event.error)
            text = event.text
            if text:
                yield text

    async def text(self) -> str:
        return "".join([t async for t in self.text_deltas()])


__all__ = ["Response", "ResponseStream", "StreamState"]
