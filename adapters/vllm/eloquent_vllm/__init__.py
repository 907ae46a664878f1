"""vLLM adapter: ``--stream-transport sse|eloquent`` for ``vllm serve`` and ``python -m eloquent_vllm.serve``.

How it plugs in (see docs/VLLM.md): a ``vllm.general_plugins`` entry point (:func:`eloquent_vllm.plugin.register`)
teaches vLLM's serve parser our flags; when a transport is chosen the parser hook appends
:class:`eloquent_vllm.middleware.VllmStreamMiddleware` to ``--middleware`` (vLLM's supported hook), and that
middleware starts the HTTP/3 front end from the app's lifespan on the API server's own event loop.
Nothing here imports vLLM at import time, so the core package stays usable without it.
"""

from eloquent_vllm.errors import EloquentVllmError, UnsupportedVllmVersion
from eloquent_vllm.options import MIDDLEWARE_PATH, EloquentVllmSettings

__all__ = ["MIDDLEWARE_PATH", "EloquentVllmError", "EloquentVllmSettings", "UnsupportedVllmVersion"]
