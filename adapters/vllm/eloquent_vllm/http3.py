"""Lifecycle of the HTTP/3 front end inside a vLLM API server process.

Kept apart from the middleware so the start/close contract (``start_http3_server(app, *, host, port, config)``
returning a handle with ``async close()``) is checked in one place, with errors that name the port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eloquent_vllm.compat import logger
from eloquent_vllm.errors import Http3StartError
from eloquent_vllm.implementations import http3_server_starter

if TYPE_CHECKING:
    from eloquent_plugins.transports.config import StreamConfig


@dataclass
class Http3Frontend:
    handle: Any
    host: str
    port: int

    @classmethod
    async def start(cls, app: Any, *, host: str, port: int, config: StreamConfig, drain: Any = None,
                    bodies: Any = None) -> Http3Frontend:
        """``drain``: the stream middleware's (GOAWAY when it begins, connections closed when it is done);
        ``bodies``: its ledger of incomplete request bodies (both transports count against the same ceilings).
        Each passed only when given, so a replacement starter without the parameter keeps working."""
        starter = http3_server_starter()
        extra = {name: value for name, value in (("drain", drain), ("bodies", bodies)) if value is not None}
        try:
            handle = await starter(app, host=host, port=port, config=config, **extra)
        except Exception as exc:  # OSError (port in use), ConfigError (certificate), ...: re-raised, typed
            raise Http3StartError(f"cannot start HTTP/3 on udp {host}:{port}: {exc}") from exc
        if not callable(getattr(handle, "close", None)):
            raise Http3StartError(f"{starter!r} returned {handle!r}, which has no close()")
        logger.info("eloquent-plugins: HTTP/3 front end listening on udp %s:%d", host, port)
        return cls(handle, host, port)

    async def close(self) -> None:
        try:
            await self.handle.close()
        except Exception:  # noqa: BLE001 - shutdown must go on; say what failed
            logger.exception("eloquent-plugins: closing HTTP/3 on udp %s:%d failed", self.host, self.port)
