"""JSON <-> gRPC mapping of the gateway's gRPC upstream, for shapes the live test models do not cover."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import deserialize_bytes_tensor

from eloquent_triton.errors import TritonGatewayError
from eloquent_triton.tensors import EMPTY_FINAL_PARAM, FINAL_PARAM, build_request, response_payload


def config(max_batch_size: int = 0) -> model_config_pb2.ModelConfig:
    return json_format.ParseDict(
        {
            "name": "m",
            "max_batch_size": max_batch_size,
            "input": [
                {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1]},
                {"name": "ids", "data_type": "TYPE_INT64", "dims": [2, -1], "optional": True},
                {"name": "temperature", "data_type": "TYPE_FP32", "dims": [1], "optional": True},
            ],
        },
        model_config_pb2.ModelConfig(),
    )


def test_inputs_parameters_and_id_are_mapped_like_tritons_generate() -> None:
    body = {"id": "r1", "text_input": ["a", "é"], "ids": [[1, 2], [3, 4]], "temperature": 0.5, "stream": True,
            "top_k": 3, "mode": "fast", "scale": 1.5}
    request = build_request(config(), "m", "2", body)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r1")
    shapes = {t.name: list(t.shape) for t in request.inputs}
    assert shapes == {"text_input": [2], "ids": [2, 2], "temperature": [1]}
    raw = dict(zip([t.name for t in request.inputs], request.raw_input_contents, strict=True))
    assert deserialize_bytes_tensor(raw["text_input"]).tolist() == [b"a", "é".encode()]
    assert np.frombuffer(raw["ids"], dtype=np.int64).tolist() == [1, 2, 3, 4]
    assert np.frombuffer(raw["temperature"], dtype=np.float32).tolist() == [0.5]
    params = request.parameters
    assert params["stream"].bool_param is True and params["top_k"].int64_param == 3
    assert params["mode"].string_param == "fast" and params["scale"].double_param == 1.5
    assert params[EMPTY_FINAL_PARAM].bool_param is True


def test_batching_models_get_a_batch_dimension() -> None:
    request = build_request(config(max_batch_size=8), "m", "", {"text_input": "x"})
    assert list(request.inputs[0].shape) == [1, 1]


@pytest.mark.parametrize(
    "body",
    [
        {"text_input": "x", "ids": [1, 2, 3]},  # 3 elements do not fit [2, -1]
        {"text_input": "x", "triton_enable_empty_final_response": False},  # reserved
        {"text_input": "x", "nested": {"a": 1}},
        {"text_input": None},
        {"ids": [1, 2]},  # text_input is required
    ],
)
def test_bodies_that_do_not_fit_the_model_are_400s(body: dict) -> None:
    with pytest.raises(TritonGatewayError) as info:
        build_request(config(), "m", "", body)
    assert info.value.status == 400


def test_response_payload_reads_outputs_and_skips_tritons_own_parameters() -> None:
    response = service_pb2.ModelInferResponse(model_name="m", model_version="1", id="r1")
    out = response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    from tritonclient.utils import serialize_byte_tensor

    response.raw_output_contents.append(serialize_byte_tensor(np.array([b" hi"], dtype=np.object_)).item())
    response.outputs.add(name="logits", datatype="FP32", shape=[2])
    response.raw_output_contents.append(np.array([0.5, 1.5], dtype=np.float32).tobytes())
    response.parameters["score"].int64_param = 7
    response.parameters[FINAL_PARAM].bool_param = False
    payload, final = response_payload(response)
    assert out.name == "text_output" and final is False
    assert payload == {"id": "r1", "model_name": "m", "model_version": "1", "text_output": " hi",
                       "logits": [0.5, 1.5], "score": 7}

    empty_final = service_pb2.ModelInferResponse(model_name="m", model_version="1")
    empty_final.parameters[FINAL_PARAM].bool_param = True
    assert response_payload(empty_final) == (None, True)
