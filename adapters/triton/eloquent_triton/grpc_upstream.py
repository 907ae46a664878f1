"""Triton over gRPC: one ``ModelStreamInfer`` stream per client request.

Why not ``tritonclient.grpc.aio.InferenceServerClient.stream_infer`` itself: in tritonclient 2.73 it
cannot ask for empty final responses (no ``enable_empty_final_response`` argument, and every
``triton_``-prefixed parameter is rejected), and without them a decoupled request never visibly
ends. So this module calls the same RPC through tritonclient's generated stub, with
``triton_enable_empty_final_response`` set, and reads the results with tritonclient's ``InferResult``.
Cancelling the call (client gone) makes Triton cancel the in-flight request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from eloquent_plugins.core.codecs.triton import triton_error

from eloquent_triton.errors import TritonGatewayError, UpstreamError
from eloquent_triton.model_cache import ModelCache
from eloquent_triton.tensors import build_request, response_payload

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


def _status_for(code: grpc.StatusCode) -> int:
    return 400 if code == grpc.StatusCode.INVALID_ARGUMENT else 502


class GrpcUpstream:
    """One Triton gRPC endpoint (``grpc://host:port``); the channel is opened on first use."""

    def __init__(self, target: str, *, model_cache_ttl_s: float = 30.0, connect_timeout_s: float = 10.0) -> None:
        self.target = target
        self._connect_timeout_s = connect_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._configs: ModelCache[model_config_pb2.ModelConfig] = ModelCache(
            self._fetch_config, ttl_s=model_cache_ttl_s
        )

    def _get_stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        # grpc.aio channels belong to the running event loop, so they are made inside it.
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def _fetch_config(self, model: str, version: str) -> model_config_pb2.ModelConfig:
        stub = self._get_stub()
        try:
            response = await stub.ModelConfig(
                service_pb2.ModelConfigRequest(name=model, version=version),
                timeout=self._connect_timeout_s,
                wait_for_ready=False,
            )
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or str(exc.code())
            if "unknown model" in details or exc.code() == grpc.StatusCode.NOT_FOUND:
                raise TritonGatewayError(404, details) from exc
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise TritonGatewayError(502, f"Triton upstream unreachable: {details}") from exc
            raise TritonGatewayError(_status_for(exc.code()), details) from exc
        return response.config

    async def model_config(self, model: str, version: str) -> model_config_pb2.ModelConfig:
        return await self._configs.get(model, version)

    async def prepare(self, model: str, version: str, body: dict[str, Any]) -> service_pb2.ModelInferRequest:
        """Validate and build the request before any header is sent (bad input -> 400)."""
        config = await self._configs.get(model, version)
        return build_request(config, model, version, body)

    async def stream(self, request: service_pb2.ModelInferRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Yield each event's payload until Triton's final response; an error payload is the last one."""
        stub = self._get_stub()
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            await finished.wait()  # keep our half open until the request is over

        call = stub.ModelStreamInfer(requests())
        try:
            async for message in call:
                if message.error_message:
                    yield triton_error(message.error_message)
                    return
                payload, final = response_payload(message.infer_response)
                if payload is not None:
                    yield payload
                if final:
                    return
            raise UpstreamError("Triton closed the gRPC stream before the final response")
        except grpc.aio.AioRpcError as exc:
            raise UpstreamError(f"Triton gRPC stream failed: {exc.code().name}: {exc.details()}") from exc
        finally:
            finished.set()
            if not call.done():
                call.cancel()

    async def generate(self, request: service_pb2.ModelInferRequest) -> tuple[int, dict[str, Any]]:
        """Non-streaming generate: exactly one response, as Triton's ``/generate`` demands."""
        payloads: list[dict[str, Any]] = []
        stream = self.stream(request)
        try:
            async for payload in stream:
                if "error" in payload:
                    return 400, payload
                payloads.append(payload)
        except UpstreamError as exc:
            return 502, triton_error(str(exc))
        finally:
            await stream.aclose()
        if len(payloads) != 1:
            return 400, triton_error(_ONE_RESPONSE)
        return 200, payloads[0]

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None
