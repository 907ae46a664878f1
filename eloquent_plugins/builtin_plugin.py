"""Built-in hook implementations, registered like any third-party plugin."""

from __future__ import annotations

from typing import Any

from .codecs import BUILTIN_CODECS, Codec
from .hookspecs import hookimpl


@hookimpl
def eloquent_register_codecs() -> list[Codec]:
    return list(BUILTIN_CODECS)


@hookimpl
def eloquent_register_resume_stores() -> list[Any]:
    from .resume import BUILTIN_STORE_FACTORIES

    return list(BUILTIN_STORE_FACTORIES)
