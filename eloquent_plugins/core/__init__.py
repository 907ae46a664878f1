"""The sans-I/O core: wire format, sender and receiver state machines, the stream model, codecs, hooks and
settings. Bytes, events and a clock in; bytes and events out; no sockets, asyncio or third-party imports (pluggy
in ``hooks/`` only), so the transports, the simulator, the client and the tests all drive the same code."""
