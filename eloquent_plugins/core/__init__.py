"""The sans-I/O core: wire format, sender and receiver state machines, the stream model, codecs and hooks.

Bytes, events and a clock in; bytes and events out; no sockets, asyncio or third-party imports (pluggy in
``hooks/`` only), so the transports, the simulator, the client and the tests all drive the same code. Each
machine takes its own small config (``Limits``, ``KeepAlivePolicy``, ``SenderConfig``, ``ReceiverConfig``); the
deployment settings read from ``ELOQUENT_*`` variables (``StreamConfig``) belong to the transports
(``transports/config.py``)."""
