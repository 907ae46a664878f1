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


class ConnectionState(Enum):
    """One client connection's lifecycle on the front end (docs/PROTOCOL.md, section 8); it only moves along
    ``CONNECTION_TRANSITIONS``. ``Http3Connection.lifecycle`` holds it."""

    CONNECTING = "connecting"
    """QUIC is up, HTTP/3 is not negotiated yet: nothing can be answered."""
    OPEN = "open"
    """Serving requests."""
    GOING_AWAY = "going_away"
    """The server drains: GOAWAY went out, requests under way go on, new ones get the middleware's 503."""
    CLOSING = "closing"
    """The drain is over: the connection closes once its last request (an Eloquent stream's tail included) is
    done, at once if none is left."""
    FAILED = "failed"
    """The peer broke the protocol: closed by us with the error's code; nothing more is dispatched or sent."""
    TERMINATED = "terminated"
    """The client's CONNECTION_CLOSE arrived (at once, not after QUIC's draining period), or QUIC reported the
    connection gone (our close, idle timeout): final."""

    @property
    def live(self) -> bool:
        """HTTP/3 is up and the connection neither failed nor ended: requests are served and datagrams pumped."""
        return self in (ConnectionState.OPEN, ConnectionState.GOING_AWAY, ConnectionState.CLOSING)


_C = ConnectionState
CONNECTION_TRANSITIONS: dict[ConnectionState, frozenset[ConnectionState]] = {
    _C.CONNECTING: frozenset({_C.OPEN, _C.FAILED, _C.TERMINATED}),
    _C.OPEN: frozenset({_C.GOING_AWAY, _C.CLOSING, _C.FAILED, _C.TERMINATED}),
    _C.GOING_AWAY: frozenset({_C.CLOSING, _C.FAILED, _C.TERMINATED}),
    _C.CLOSING: frozenset({_C.FAILED, _C.TERMINATED}),
    _C.FAILED: frozenset({_C.TERMINATED}),
    _C.TERMINATED: frozenset(),
}
"""Where each connection state may go next (docs/PROTOCOL.md, section 8, the "leaves on" column)."""


class LifecycleError(RuntimeError):
    """A transition the lifecycle does not allow: a bug in the front end, never a peer's doing."""


def advance(current: ConnectionState, to: ConnectionState) -> ConnectionState:
    """``to``, if ``current`` may move there; raises ``LifecycleError`` otherwise."""
    if to not in CONNECTION_TRANSITIONS[current]:
        raise LifecycleError(f"an HTTP/3 connection cannot go from {current.name} to {to.name}")
    return to
