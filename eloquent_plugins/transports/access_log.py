"""One log format for every request and stream, whatever carries it.

Why: uvicorn writes an access line for each HTTP/1.1 request, the HTTP/3 front end wrote none, and ``eloquent
serve`` printed uvicorn's lines, uvicorn's access lines and our own lines in three formats. Now the HTTP/3 front end
writes its access line through uvicorn's own logger (``uvicorn.access``) with uvicorn's own message and arguments,
so a host that formats uvicorn's access log (vLLM, ``eloquent serve``, a user's ``log_config``) formats HTTP/3
requests the same way, and ``log_config`` gives ``eloquent serve`` one formatter for all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

ACCESS_LOGGER = "uvicorn.access"
ACCESS_FORMAT = '%s - "%s %s HTTP/%s" %d'
"""uvicorn's access message and its arguments: client, method, path with query, HTTP version, status."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

access_log = logging.getLogger(ACCESS_LOGGER)


def client_addr(scope: Mapping[str, Any]) -> str:
    """``host:port`` of the peer, as uvicorn prints it (empty when unknown)."""
    client = scope.get("client")
    if not client:
        return ""
    return "%s:%d" % (client[0], client[1])


def path_with_query(scope: Mapping[str, Any]) -> str:
    path = scope.get("root_path", "") + scope.get("path", "")
    query = scope.get("query_string", b"")
    return f"{path}?{query.decode('ascii', errors='replace')}" if query else path


def request_line(scope: Mapping[str, Any], status: int) -> None:
    """The access line of one request whose response started with ``status`` (uvicorn's, for HTTP/3 too)."""
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(ACCESS_FORMAT, client_addr(scope), scope.get("method", ""), path_with_query(scope),
                        scope.get("http_version", "1.1"), status)


def log_config(level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` (uvicorn's ``log_config``) with one formatter for the root, uvicorn's
    loggers and its access log, so every line ``eloquent serve`` prints has the same shape."""
    handler = {"class": "logging.StreamHandler", "formatter": "one", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"one": {"format": LOG_FORMAT}},
        "handlers": {"default": handler},
        "root": {"handlers": ["default"], "level": level.upper()},
        "loggers": {name: {"handlers": [], "level": level.upper(), "propagate": True}
                    for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
    }
