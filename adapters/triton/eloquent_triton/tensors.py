"""JSON <-> Triton gRPC tensors, following the HTTP generate extension's mapping.

Why: Triton's ``generate_stream`` maps a flat JSON object onto the model (keys that name an input
become tensors, ``id`` the request id, every other key a request parameter) and writes each response
as ``{"id"?, "model_name", "model_version", <outputs>, <response parameters>}``. The gRPC upstream has
to do that mapping itself, the same way, so both upstreams give the client the same events.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import InferResult, model_config_pb2, service_pb2
from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype

from eloquent_triton.errors import TritonGatewayError

EMPTY_FINAL_PARAM = "triton_enable_empty_final_response"
FINAL_PARAM = "triton_final_response"
_RESERVED_PREFIX = "triton_"


def config_datatype(data_type: int) -> str:
    """``TYPE_STRING`` -> ``BYTES``, ``TYPE_FP32`` -> ``FP32`` (protocol datatype names)."""
    name = model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [value]


def _shape(dims: list[int], count: int, batched: bool) -> list[int]:
    """Fill ``-1`` dims from the element count (leading ones become 1), as Triton does."""
    shape = list(dims) or [count]
    if -1 in shape:
        last_variable = max(i for i, d in enumerate(shape) if d == -1)
        shape = [1 if d == -1 and i != last_variable else d for i, d in enumerate(shape)]
        fixed = math.prod(d for d in shape if d != -1)
        shape[last_variable] = count // fixed if fixed and count % fixed == 0 else -1
    if -1 in shape or math.prod(shape) != count:
        raise ValueError(f"{count} element(s) do not fit the input dims {list(dims)}")
    return [1, *shape] if batched else shape


def _raw_contents(name: str, datatype: str, values: list[Any]) -> bytes:
    if datatype == "BYTES":
        items = []
        for value in values:
            if not isinstance(value, str):
                raise ValueError(f"input '{name}': expected a string, got {type(value).__name__}")
            items.append(value.encode("utf-8"))
        serialized = serialize_byte_tensor(np.array(items, dtype=np.object_))
        return serialized.item() if serialized.size else b""
    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise ValueError(f"input '{name}': datatype {datatype} cannot be given as JSON")
    if any(isinstance(v, (str, dict, type(None))) for v in values):
        raise ValueError(f"input '{name}': expected {datatype} numbers")
    return np.asarray(values, dtype=dtype).tobytes()


def _set_parameter(request: service_pb2.ModelInferRequest, key: str, value: Any) -> None:
    if key.startswith(_RESERVED_PREFIX):
        raise ValueError(f"parameter '{key}' is reserved for Triton")
    param = request.parameters[key]
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    elif isinstance(value, str):
        param.string_param = value
    else:
        raise ValueError(f"parameter '{key}' must be a string, number or boolean")


def build_request(
    config: model_config_pb2.ModelConfig, model: str, version: str, body: Mapping[str, Any]
) -> service_pb2.ModelInferRequest:
    """Map a generate-extension JSON body onto a gRPC request; a bad body is a 400."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    inputs = {tensor.name: tensor for tensor in config.input}
    batched = config.max_batch_size > 0
    try:
        for key, value in body.items():
            if key == "id":
                request.id = value if isinstance(value, str) else str(value)
            elif key in inputs:
                spec = inputs[key]
                datatype = config_datatype(spec.data_type)
                values = _flatten(value)
                tensor = request.inputs.add(name=key, datatype=datatype)
                tensor.shape.extend(_shape(list(spec.dims), len(values), batched))
                request.raw_input_contents.append(_raw_contents(key, datatype, values))
            else:
                _set_parameter(request, key, value)
        missing = [t.name for t in config.input if not t.optional and t.name not in body]
        if missing:
            raise ValueError(f"missing required input(s): {', '.join(missing)}")
    except (ValueError, TypeError, OverflowError) as exc:
        raise TritonGatewayError(400, str(exc)) from exc
    # Without this Triton sends nothing when a decoupled request ends, and the gateway never
    # learns the stream is over (tritonclient.grpc.aio cannot set it: "triton_" is reserved there).
    request.parameters[EMPTY_FINAL_PARAM].bool_param = True
    return request


def _json_value(array: np.ndarray) -> Any:
    values = [
        bytes(v).decode("utf-8", errors="replace") if isinstance(v, (bytes, np.bytes_)) else v
        for v in array.reshape(-1).tolist()
    ]
    return values[0] if len(values) == 1 else values


def _parameter_value(param: service_pb2.InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def response_payload(response: service_pb2.ModelInferResponse) -> tuple[dict[str, Any] | None, bool]:
    """The event payload for one streamed response (None for an empty final) and whether it is final."""
    final = response.parameters[FINAL_PARAM].bool_param if FINAL_PARAM in response.parameters else False
    if not response.outputs:
        return None, final
    result = InferResult(response)
    payload: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        payload["id"] = response.id
    for output in response.outputs:
        payload[output.name] = _json_value(result.as_numpy(output.name))
    for key, param in response.parameters.items():
        if not key.startswith(_RESERVED_PREFIX):
            payload.setdefault(key, _parameter_value(param))
    return payload, final
