"""Triton over HTTP: ``generate_stream`` read with httpx, one parsed JSON payload per SSE event.

Closing the stream closes the upstream connection, which makes Triton cancel the request
(``RequestFiniHook`` -> ``TRITONSERVER_InferenceRequestCancel``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from eloquent_plugins.core.codecs.triton import triton_error
from eloquent_plugins.core.sse_reader import SSEParser

from eloquent_triton.errors import TritonGatewayError, UpstreamError
from eloquent_triton.model_cache import ModelCache
from eloquent_triton.payload import is_error


def model_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


def _error_text(body: bytes, fallback: str) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace").strip() or fallback
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return parsed["error"]
    return fallback


class HttpUpstream:
    """One Triton HTTP endpoint (``http://host:port``); owns its httpx client unless given one."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        connect_timeout_s: float = 10.0,
        model_cache_ttl_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # No read timeout: a model may think for minutes before its first token.
        timeout = httpx.Timeout(None, connect=connect_timeout_s)
        self._client = client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout)
        self._owns_client = client is None
        self._models: ModelCache[model_config_pb2.ModelConfig | None] = ModelCache(
            self._fetch_config, ttl_s=model_cache_ttl_s
        )

    def _url(self, path: str) -> str:
        return path if self._owns_client else self.base_url + path

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._client.get(self._url(path))
        except httpx.HTTPError as exc:
            raise TritonGatewayError(502, f"Triton upstream unreachable: {exc!r}") from exc

    async def _fetch_config(self, model: str, version: str) -> model_config_pb2.ModelConfig | None:
        response = await self._get(model_path(model, version) + "/config")
        if response.status_code == 200:
            return json_format.ParseDict(response.json(), model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
        # The config endpoint may be restricted: fall back to plain metadata, i.e. "does it exist".
        if response.status_code not in (400, 404):
            response = await self._get(model_path(model, version))
            if response.status_code == 200:
                return None
        status = 404 if response.status_code in (400, 404) else 502
        raise TritonGatewayError(status, _error_text(response.content, f"model {model!r} unavailable"))

    async def model_config(self, model: str, version: str) -> model_config_pb2.ModelConfig | None:
        """The model's config (None if Triton will not show it); 404 for a model Triton does not serve."""
        return await self._models.get(model, version)

    async def stream(self, model: str, version: str, raw: bytes) -> AsyncGenerator[dict[str, Any], None]:
        """Yield each event's payload; an error payload is the last one."""
        request = self._client.build_request(
            "POST",
            self._url(model_path(model, version) + "/generate_stream"),
            content=raw,
            headers={"content-type": "application/json"},
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"Triton upstream unreachable: {exc!r}") from exc
        try:
            media_type = response.headers.get("content-type", "")
            if not media_type.startswith("text/event-stream"):
                # Rejected before inference began: a plain JSON error body.
                body_bytes = await response.aread()
                yield triton_error(_error_text(body_bytes, f"Triton answered HTTP {response.status_code}"))
                return
            parser = SSEParser()
            async for chunk in response.aiter_raw():
                for message in parser.feed(chunk):
                    try:
                        payload = json.loads(message.data)
                    except ValueError as exc:
                        raise UpstreamError(f"Triton sent an event that is not JSON: {message.data[:200]!r}") from exc
                    yield payload
                    if is_error(payload):
                        return
        except httpx.HTTPError as exc:
            raise UpstreamError(f"Triton upstream connection lost: {exc!r}") from exc
        finally:
            with anyio.CancelScope(shield=True):  # closing is what cancels the request upstream
                await response.aclose()

    async def generate(self, model: str, version: str, raw: bytes) -> tuple[int, bytes, str]:
        """Non-streaming ``/generate``: Triton's status, body and content type, passed through."""
        try:
            response = await self._client.post(
                self._url(model_path(model, version) + "/generate"),
                content=raw,
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise TritonGatewayError(502, f"Triton upstream unreachable: {exc!r}") from exc
        return response.status_code, response.content, response.headers.get("content-type", "application/json")

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
