"""The serving stack: the one order in which the transports' middlewares wrap an app.

The order is a correctness matter, so it is written once, here, and ``eloquent serve`` (``cli/app_factory.py``),
the vLLM plugin (``eloquent_vllm.middleware``) and the gateways (hosted by either, or by hand as in
``examples/``) all call ``wrap``. Outermost first:

1. ``AltSvcMiddleware`` (only where an HTTP/3 front end runs): every TCP response advertises its port; HTTP/3
   requests pass untouched.
2. ``CorsMiddleware`` (only with allowed origins): a preflight is answered before anything else sees it, and the
   headers the stream id travels in are exposed on both transports.
3. ``BrowserRoutes``: ``/chat``, ``/eloquent/client.js``, ``/eloquent/cert-hash`` need no body and no stream.
4. ``BodyTimeoutMiddleware``: a request body that stalls, falls under its pace or holds more than the ledger of
   incomplete bodies allows (``Stack.bodies``) is refused and the app is told the client left, before the stream
   layer or the engine start a request they have no complete body for.
5. The stream layer (``EloquentMiddleware``): keep-alive, event ids, resume, metrics, drain.
6. The app itself: the built-in engine, a gateway, vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.transports.alt_svc import AltSvcMiddleware
from eloquent_plugins.transports.asgi import ASGIApp
from eloquent_plugins.transports.body_budget import HeldBodies
from eloquent_plugins.transports.browser import BrowserRoutes
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.cors import CorsMiddleware
from eloquent_plugins.transports.request_timeouts import BodyTimeoutMiddleware

__all__ = ["ORDER", "Stack", "layers", "wrap"]

ORDER = ("alt_svc", "cors", "browser", "body_timeout", "streams")
"""The layers outermost first; a stack has these, or some of them, in this order (``layers`` reads one back)."""
_NAMES: dict[type, str] = {AltSvcMiddleware: "alt_svc", CorsMiddleware: "cors", BrowserRoutes: "browser",
                           BodyTimeoutMiddleware: "body_timeout"}


@dataclass(frozen=True, slots=True)
class Stack:
    """A wrapped app and the layers a host still talks to after building it."""

    app: ASGIApp
    """The outermost layer: what the TCP server and the HTTP/3 front end both host."""
    streams: Any
    """The stream layer (its ``drain``, its metrics), or None where it was left out."""
    alt_svc: AltSvcMiddleware | None
    """Set its ``port`` once the HTTP/3 front end is bound; None where no front end runs."""
    bodies: HeldBodies | None = None
    """The ledger of incomplete request bodies (the stream layer's, counted in its memory budget): hand it to the
    HTTP/3 front end (``start_http3_server(bodies=...)``) so both transports share its ceilings; None without the
    stream layer."""


def wrap(app: ASGIApp, config: StreamConfig, *, streams: bool = True, stream_layer: Any = None,
         plugin_manager: Any = None, drain: Any = None, cors_origins: str | Iterable[str] | None = None,
         alt_svc: bool = False, alt_svc_port: int | None = None) -> Stack:
    """``app`` inside the serving stack, in ``ORDER``.

    ``streams`` False leaves out the stream layer and what serves it (browser routes, body deadline): the app as
    it is, behind CORS and Alt-Svc only (``--stream-transport none``, a baseline). ``stream_layer`` is the class
    of the stream layer (default ``EloquentMiddleware``; vLLM's plugin may load another), built as
    ``Class(app, config=config)`` plus ``plugin_manager`` / ``drain`` where given. ``alt_svc`` adds the
    advertisement of the HTTP/3 port (``alt_svc_port``, or set later on ``Stack.alt_svc``)."""
    layer = bodies = None
    if streams:
        if stream_layer is None:
            from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

            stream_layer = EloquentMiddleware
        options = {name: value for name, value in (("plugin_manager", plugin_manager), ("drain", drain))
                   if value is not None}
        app = layer = stream_layer(app, config=config, **options)
        bodies = getattr(layer, "bodies", None)
        if not isinstance(bodies, HeldBodies):  # a stream layer of another make: a ledger outside its budget
            bodies = HeldBodies.from_config(config)
        app = BodyTimeoutMiddleware(app, config.body_timeout, min_rate=config.body_min_rate,
                                    grace=config.body_rate_grace, bodies=bodies)
        app = BrowserRoutes(app, certfile=config.certfile)
    if cors_origins:
        app = CorsMiddleware(app, cors_origins)
    advertise = None
    if alt_svc:
        app = advertise = AltSvcMiddleware(app, alt_svc_port)
    return Stack(app, layer, advertise, bodies)


def layers(app: Any, *, stream_layer: type | None = None) -> list[str]:
    """The names of ``app``'s layers, outermost first, down to the first object that is none of them (the stream
    layer, ``stream_layer`` or else ``EloquentMiddleware``, counts as ``streams`` and ends the walk)."""
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    out: list[str] = []
    while app is not None:
        kind = type(app)
        if kind in _NAMES:
            out.append(_NAMES[kind])
        elif isinstance(app, stream_layer or EloquentMiddleware):
            out.append("streams")
            break
        else:
            break
        app = getattr(app, "app", None)
    return out
