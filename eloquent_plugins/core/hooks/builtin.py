"""Built-in hook implementations, registered like any third-party plugin."""

from __future__ import annotations

from eloquent_plugins.core.codecs import BUILTIN_CODECS, Codec
from eloquent_plugins.core.hooks.specs import hookimpl


@hookimpl
def eloquent_register_codecs() -> list[Codec]:
    return list(BUILTIN_CODECS)
