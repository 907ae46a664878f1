"""Built-in hook implementations, registered like any third-party plugin."""

from __future__ import annotations

from typing import Any

from eloquent_plugins.core.codecs import BUILTIN_CODECS, Codec
from eloquent_plugins.core.hooks.specs import hookimpl


@hookimpl
def eloquent_register_codecs() -> list[Codec]:
    return list(BUILTIN_CODECS)


@hookimpl
def eloquent_register_resume_stores() -> list[Any]:
    from eloquent_plugins.transports.resume import BUILTIN_STORE_FACTORIES

    return list(BUILTIN_STORE_FACTORIES)
