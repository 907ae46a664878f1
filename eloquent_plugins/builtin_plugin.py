"""Built-in hook implementations, registered like any third-party plugin."""

from __future__ import annotations

from .codecs import BUILTIN_CODECS, Codec
from .hookspecs import hookimpl


@hookimpl
def eloquent_register_codecs() -> list[Codec]:
    return list(BUILTIN_CODECS)
