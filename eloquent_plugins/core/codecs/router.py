"""Which codec a route speaks: every JSON error body and in-band error on every transport takes its shape from
the route's codec, so one route never answers in two formats (SSE, HTTP/3 stream, datagrams alike)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.errors import ConfigError

DEFAULT_CODEC_ROUTES: tuple[tuple[str, str], ...] = (
    (r"^/v2/models/[^/]+(/versions/[^/]+)?/generate_stream$", "triton"),
    (r"^/generate_stream$", "tgi"),
    (r"^/generate$", "tgi"),
    (r"^/$", "tgi"),
    (r"", "openai"),
)
"""(path regex, codec name), first match wins."""

_CACHE_ENTRIES = 1024


class CodecRouter:
    """Path -> codec, first matching regex wins, ``openai`` when none matches; a bounded cache of answers."""

    def __init__(self, codecs: Mapping[str, Codec], routes: Sequence[tuple[str, str]] | None = None) -> None:
        routes = DEFAULT_CODEC_ROUTES if routes is None else tuple(routes)
        for _pattern, name in routes:
            if name not in codecs:
                raise ConfigError(f"codec route names unknown codec {name!r} (known: {sorted(codecs)})")
        self.codecs = dict(codecs)
        self._routes = [(re.compile(pattern), codecs[name]) for pattern, name in routes]
        self._default = codecs["openai"] if "openai" in codecs else next(iter(codecs.values()))
        self._cache: dict[str, Codec] = {}

    def for_path(self, path: str) -> Codec:
        codec = self._cache.get(path)
        if codec is None:
            codec = next((c for pattern, c in self._routes if pattern.search(path)), self._default)
            if len(self._cache) < _CACHE_ENTRIES:
                self._cache[path] = codec
        return codec

    def error_body(self, path: str, message: str, *, error_type: str, status: int,
                   code: str | int | None = None) -> bytes:
        """The JSON body of an error response (or in-band error event) on ``path``, in its codec's shape."""
        return self.for_path(path).error_payload(message, error_type=error_type, status=status, code=code)
