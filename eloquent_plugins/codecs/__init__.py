"""Codecs translate an engine's event payloads to the common view (text, token ids, finish, usage, error)."""

from .base import Codec, EventView
from .openai import OpenAICodec
from .tgi import TGICodec
from .triton import TritonCodec

BUILTIN_CODECS: tuple[Codec, ...] = (OpenAICodec(), TGICodec(), TritonCodec())

__all__ = ["BUILTIN_CODECS", "Codec", "EventView", "OpenAICodec", "TGICodec", "TritonCodec"]
