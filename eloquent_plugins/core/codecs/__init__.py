"""Codecs translate an engine's event payloads to the common view (text, token ids, finish, usage, error)."""

from typing import Any

from eloquent_plugins.core.codecs.base import Codec, EventView
from eloquent_plugins.core.codecs.openai import OpenAICodec
from eloquent_plugins.core.codecs.tgi import TGICodec
from eloquent_plugins.core.codecs.triton import TEXT_OUTPUTS, TritonCodec

BUILTIN_CODECS: tuple[Codec, ...] = (OpenAICodec(), TGICodec(), TritonCodec())


def sniff_codec(obj: Any) -> Codec | None:
    """The built-in codec whose format a decoded event has (for clients that do not know the route)."""
    if not isinstance(obj, dict):
        return None
    if "choices" in obj:
        return BUILTIN_CODECS[0]
    if "token" in obj:
        return BUILTIN_CODECS[1]
    if "model_name" in obj or any(key in obj for key in TEXT_OUTPUTS):
        return BUILTIN_CODECS[2]
    return None

__all__ = ["BUILTIN_CODECS", "sniff_codec", "Codec", "EventView", "OpenAICodec", "TGICodec", "TritonCodec"]
