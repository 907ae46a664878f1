"""The stream metrics in vLLM's own ``/metrics``.

Why: vLLM serves ``/metrics`` itself, so the SSE middleware's metrics route never answers there (the app's route
wins); ``/eloquent/metrics`` always does. This adds the middleware's collector to the registry vLLM's ``/metrics``
reads, so one scrape gets both. In vLLM's multi-process mode (``PROMETHEUS_MULTIPROC_DIR``, several API servers)
that registry is rebuilt from files per scrape and cannot hold a live collector: there ``/eloquent/metrics`` it is.
"""

from __future__ import annotations

import importlib
from typing import Any

from eloquent_vllm.compat import logger

_REGISTRY_GETTERS = (("vllm.v1.metrics.prometheus", "get_prometheus_registry"),)


def vllm_registry() -> Any:
    """The registry vLLM's ``/metrics`` exposes: vLLM's getter where it has one, else prometheus' default."""
    for module_name, attr in _REGISTRY_GETTERS:
        try:
            getter = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            continue
        return getter()
    from prometheus_client import REGISTRY

    return REGISTRY


def register_stream_metrics(middleware: Any, registry: Any = None) -> bool:
    """Add ``middleware.metrics`` (a prometheus collector) to ``registry`` (default: vLLM's); False, with one
    log line, when it has none or the registry refuses it (names taken by another middleware in this process)."""
    collector = getattr(middleware, "metrics", None)
    if collector is None or not callable(getattr(collector, "collect", None)):
        return False
    registry = vllm_registry() if registry is None else registry
    try:
        registry.register(collector)
    except ValueError as exc:
        logger.warning("eloquent-plugins: stream metrics not in vLLM's /metrics (%s); see /eloquent/metrics", exc)
        return False
    return True
