"""Serving: the SSE middleware (``sse/``), the replay stores (``resume/``), the HTTP/3 front end with Eloquent
datagrams and WebTransport (``http3/``), and what every served app shares (CORS, Alt-Svc, metrics, telemetry, the
access log, the gateways' upstream relay). A transport wraps any ASGI app; it imports the core, never the engine,
the simulator or the CLI."""
