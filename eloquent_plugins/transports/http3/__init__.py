"""The HTTP/3 front end (aioquic): any ASGI app over HTTP/3, with Eloquent datagram delivery on request.

A request with ``eloquent-transport: datagram`` gets its ``text/event-stream`` response as Eloquent packets in
HTTP/3 datagrams tied to the request; ``eloquent-scheme`` picks ``eloquent`` (default), ``duplicate`` or
``stream``. See docs/QUIC.md. Start it with ``server.start_http3_server`` (settings: ``options.FrontEndOptions``);
``connection`` is one client connection, ``request`` one request, ``webtransport`` the browser sessions. This
package re-exports nothing: import from the module that defines a name.
"""
