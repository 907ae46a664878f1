"""The ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` once in every process it starts (CLI, API servers, engine core, workers), in the CLI
process while the ``serve`` parser is being built. All it does is install the parser hook (cheap, idempotent).
It never raises: a plugin error would break ``vllm serve`` even for users who did not ask for our flags, so a
failure is logged and vLLM runs unchanged (our flags are then unknown to it, which it reports itself).
"""

from __future__ import annotations

from eloquent_vllm.compat import flexible_argument_parser, logger
from eloquent_vllm.errors import EloquentVllmError


def register() -> None:
    try:
        from eloquent_vllm.cli_hook import install_parser_hook

        install_parser_hook(flexible_argument_parser())
    except (EloquentVllmError, ImportError, AttributeError) as exc:
        logger.error("eloquent-plugins: --stream-transport is unavailable: %s", exc)
