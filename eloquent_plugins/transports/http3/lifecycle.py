"""The lifecycles of the HTTP/3 front end, each one explicit ``Enum`` (docs/PROTOCOL.md, section 8), in one
module as h11's ``_state.py``: what a request or a connection may do next is read here, not from flags."""

from __future__ import annotations

from enum import Enum


class RequestState(Enum):
    """One request's lifecycle on the front end (docs/PROTOCOL.md, section 8). The request body is tracked
    apart, by its ``BodyGuard``: a response may start before the body is in."""

    PENDING = "pending"
    """No response yet: the app may start one, or the front end refuses the request."""
    STARTED = "started"
    """The response headers went out; the body is being written."""
    FINISHED = "finished"
    """The response ended (or its stream was reset); later sends are dropped."""
    DISCONNECTED = "disconnected"
    """The app was told ``http.disconnect`` (client gone, response complete, or cut): nothing more is sent."""
