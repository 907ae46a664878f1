"""A decoupled (streaming) PyTriton model written as a plain async generator, with ``pytriton_streamer``.

PyTriton needs numpy<2, so it usually lives in its own venv (in this repo: ``.ci/install-triton.sh`` makes
``.venv-triton``; eloquent_triton is taken from the checkout through PYTHONPATH):

    PYTHONPATH=adapters/triton .venv-triton/bin/python examples/triton_decoupled_model.py --grpc-port 8001
    python examples/triton_gateway.py --triton grpc://127.0.0.1:8001 --ask "streams of words"   # main venv

What it shows: the model is a generator of text pieces; the helper turns each piece into one Triton response
(``text_output``), sends Triton's final flag at the end, and turns an exception into Triton's error response.
Serves until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from eloquent_triton.decoupled import input_value, pytriton_streamer
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

MODEL = "echo_stream"


async def echo_words(request: Any) -> AsyncIterator[str]:
    """Stand-in for an LLM's decode loop: the prompt's words back, one token at a time."""
    prompt = str(input_value(request, "text_input", ""))
    max_tokens = int(input_value(request, "max_tokens", 16))
    for word in prompt.split()[:max_tokens]:
        await asyncio.sleep(0.02)  # "compute" the next token without blocking other requests
        yield " " + word


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    args = parser.parse_args(argv)

    config = TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=pytriton_streamer(echo_words),
            inputs=[
                Tensor(name="text_input", dtype=bytes, shape=(1,)),
                Tensor(name="max_tokens", dtype=np.int32, shape=(1,), optional=True),
            ],
            outputs=[Tensor(name="text_output", dtype=bytes, shape=(1,))],
            # decoupled: many responses per request; batching=False: one request per call, as the helper wants
            config=ModelConfig(decoupled=True, batching=False),
        )
        triton.serve()


if __name__ == "__main__":
    main()
