"""Optional dependencies: a feature whose package is not installed says, in one line, which extra to install.

A plain ``pip install eloquent-plugins`` has only the required dependencies; Redis, Triton, the benchmark
baselines and plots come with extras. Without this, ``eloquent serve --resume-store redis://...`` ended in a
``ModuleNotFoundError`` traceback that named a module, not the extra that provides it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from eloquent_plugins.core.errors import ConfigError

DISTRIBUTION = "eloquent-plugins"

EXTRAS: dict[str, str] = {
    "redis": "redis",
    "numpy": "triton",
    "tritonclient": "triton",
    "grpc": "triton",
    "sse_starlette": "bench",
    "matplotlib": "bench",
    "text_generation": "tgi",
    "opentelemetry": "otel",
    "vllm": "vllm",
    "atheris": "fuzz",
}
"""Top-level module -> the extra of this distribution that installs it."""


class MissingExtra(ConfigError):
    """An optional dependency of the feature asked for is not installed (a ``ConfigError``: the CLI prints it as
    one line and exits 2)."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        super().__init__(f"{what} needs the [{extra}] extra (no module named {module!r}): {install_hint(extra)}")
        self.extra = extra
        self.module = module


def install_hint(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name is looked up by its top-level package), else None."""
    return EXTRAS.get((module or "").partition(".")[0])


def missing_extra(exc: ModuleNotFoundError, what: str) -> MissingExtra | None:
    """``exc`` as a ``MissingExtra`` for ``what``, or None when the missing module is no optional dependency
    (then it is a bug or a broken installation, and its traceback is the useful report)."""
    extra = extra_for(exc.name)
    return MissingExtra(what, extra, exc.name or "?") if extra is not None else None


@contextlib.contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Run the block; a missing optional dependency in it becomes a ``MissingExtra`` naming ``what``."""
    try:
        yield
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, what)
        if error is None:
            raise
        raise error from None
