"""eloquent_triton.decoupled with stand-ins for Triton's Python-backend objects (no server needed).

The real thing is covered in test_triton_gateway.py: every test model there is built with this helper.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from eloquent_triton.decoupled import (
    DecoupledTokenModel,
    StreamOutcome,
    input_value,
    pytriton_streamer,
    stream_to_sender,
    token_response,
)

FINAL = 1


@dataclass
class FakeTensor:
    name: str
    array: np.ndarray

    def as_numpy(self) -> np.ndarray:
        return self.array


@dataclass
class FakeResponse:
    output_tensors: list[FakeTensor] = field(default_factory=list)
    error: Any = None


class FakeError:
    def __init__(self, message: str) -> None:
        self.message = message


pb_utils = SimpleNamespace(
    TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
    InferenceResponse=FakeResponse,
    Tensor=FakeTensor,
    TritonError=FakeError,
    get_input_tensor_by_name=lambda request, name: request.inputs.get(name),
)


@dataclass
class FakeSender:
    """Records what was sent; reports cancelled once ``cancel_after`` tokens were sent."""

    cancel_after: int | None = None
    sent: list[tuple[Any, int]] = field(default_factory=list)
    cancelled: bool = False

    def send(self, response: Any = None, flags: int = 0) -> None:
        self.sent.append((response, flags))
        tokens = sum(1 for r, _ in self.sent if r is not None and r.output_tensors)
        if self.cancel_after is not None and tokens >= self.cancel_after:
            self.cancelled = True

    def is_cancelled(self) -> bool:
        return self.cancelled

    def texts(self) -> list[str]:
        return [r.output_tensors[0].array[0].decode() for r, _ in self.sent if r is not None and r.output_tensors]


async def test_each_token_is_one_response_then_a_flags_only_final() -> None:
    sender = FakeSender()
    outcome = await stream_to_sender(sender, iter(["a", "b", "ç"]), pb_utils=pb_utils)
    assert outcome == StreamOutcome(tokens_sent=3, cancelled=False)
    assert sender.texts() == ["a", "b", "ç"]
    assert [flags for _, flags in sender.sent] == [0, 0, 0, FINAL]
    assert sender.sent[-1][0] is None
    tensor = sender.sent[0][0].output_tensors[0]
    assert tensor.name == "text_output" and tensor.array.dtype == np.object_ and tensor.array.shape == (1,)


async def test_cancellation_closes_the_generator_and_still_sends_the_final_flag() -> None:
    closed: list[int] = []

    async def tokens() -> AsyncIterator[str]:
        produced = 0
        try:
            while True:
                yield f"t{produced}"
                produced += 1
        finally:
            closed.append(produced)

    sender = FakeSender(cancel_after=2)
    outcome = await stream_to_sender(sender, tokens(), pb_utils=pb_utils)
    assert outcome == StreamOutcome(tokens_sent=2, cancelled=True)
    assert sender.texts() == ["t0", "t1"]
    assert closed == [1]  # closed while suspended at its second yield: no third token was made
    assert sender.sent[-1] == (None, FINAL)


async def test_cancellation_is_seen_while_the_generator_waits_for_its_next_token() -> None:
    never = asyncio.Event()
    finally_ran = asyncio.Event()

    async def tokens() -> AsyncIterator[str]:
        try:
            yield "first"
            await never.wait()  # a model stuck thinking: only polling can notice the cancel
            yield "never sent"
        finally:
            finally_ran.set()

    sender = FakeSender(cancel_after=1)
    outcome = await stream_to_sender(sender, tokens(), pb_utils=pb_utils, cancel_poll_s=0.01)
    assert outcome.cancelled and outcome.tokens_sent == 1
    assert finally_ran.is_set()
    assert sender.sent[-1] == (None, FINAL)


async def test_a_failing_generator_sends_one_error_response_carrying_the_final_flag() -> None:
    def tokens() -> Iterator[str]:
        yield "ok"
        raise ValueError("model broke")

    sender = FakeSender()
    outcome = await stream_to_sender(sender, tokens(), pb_utils=pb_utils)
    assert outcome == StreamOutcome(tokens_sent=1, cancelled=False, error="model broke")
    error_response, flags = sender.sent[-1]
    assert flags == FINAL and error_response.error.message == "model broke"
    assert len(sender.sent) == 2


async def test_a_send_refused_because_of_cancellation_is_not_reported_as_an_error() -> None:
    class RefusingSender(FakeSender):
        def send(self, response: Any = None, flags: int = 0) -> None:
            if self.cancelled:
                raise RuntimeError("request cancelled")
            super().send(response, flags)
            self.cancelled = True  # cancelled right after the first token, before the next check

        def is_cancelled(self) -> bool:
            return False if not self.sent else self.cancelled

    sender = RefusingSender()
    outcome = await stream_to_sender(sender, iter(["a", "b", "c"]), pb_utils=pb_utils)
    assert outcome.cancelled and outcome.error is None


async def test_decoupled_token_model_serves_requests_concurrently() -> None:
    started = 0
    both_started = asyncio.Event()

    class Model(DecoupledTokenModel):
        def generate(self, request: Any) -> AsyncIterator[str]:
            return self._tokens(request)

        async def _tokens(self, request: Any) -> AsyncIterator[str]:
            nonlocal started
            started += 1
            if started == 2:
                both_started.set()
            await both_started.wait()  # deadlocks unless both requests run at once
            yield input_value({"x": request.inputs["text_input"].as_numpy()}, "x")

    Model.pb_utils = pb_utils
    outcomes: list[StreamOutcome] = []
    Model.on_outcome = lambda self, request, outcome: outcomes.append(outcome)  # type: ignore[method-assign]
    requests = []
    for text in ("one", "two"):
        sender = FakeSender()
        requests.append(
            SimpleNamespace(
                inputs={"text_input": FakeTensor("text_input", np.array([text.encode()], dtype=np.object_))},
                get_response_sender=lambda sender=sender: sender,
                sender=sender,
            )
        )
    assert await Model().execute(requests) is None
    assert [r.sender.texts() for r in requests] == [["one"], ["two"]]
    assert outcomes == [StreamOutcome(1, False), StreamOutcome(1, False)]


async def test_decoupled_token_model_reports_a_failure_before_the_first_token() -> None:
    class Model(DecoupledTokenModel):
        def generate(self, request: Any) -> Iterator[str]:
            raise KeyError("text_input")

    Model.pb_utils = pb_utils
    sender = FakeSender()
    await Model().execute([SimpleNamespace(get_response_sender=lambda: sender)])
    assert len(sender.sent) == 1
    response, flags = sender.sent[0]
    assert flags == FINAL and "text_input" in response.error.message


async def test_pytriton_streamer_yields_one_response_list_per_token() -> None:
    def fn(request: Any) -> Iterator[str]:
        text = input_value(request, "text_input")
        yield from text.split()

    infer = pytriton_streamer(fn)
    request = {"text_input": np.array([b"a b"], dtype=np.object_)}
    responses = [r async for r in infer([request])]
    assert len(responses) == 2
    assert all(len(r) == 1 and set(r[0]) == {"text_output"} for r in responses)
    assert [r[0]["text_output"][0] for r in responses] == [b"a", b"b"]
    assert infer.__name__ == "fn"


async def test_pytriton_streamer_refuses_batches_and_propagates_model_errors() -> None:
    def boom(request: Any) -> Iterator[str]:
        raise ValueError("nope")
        yield ""

    infer = pytriton_streamer(boom)
    with pytest.raises(ValueError, match="one request per call"):
        [r async for r in infer([{}, {}])]
    with pytest.raises(ValueError, match="nope"):
        [r async for r in infer([{}])]


def test_inputs_and_responses_have_tritons_shapes() -> None:
    assert token_response("x")["text_output"].shape == (1,)
    assert token_response("x", batched=True)["text_output"].shape == (1, 1)
    request = {
        "s": np.array([b"caf\xc3\xa9"], dtype=np.object_),
        "i": np.array([3], dtype=np.int32),
        "f": np.array([[0.5]], dtype=np.float32),
        "empty": np.array([], dtype=np.int32),
    }
    assert input_value(request, "s") == "café"
    assert input_value(request, "i") == 3 and isinstance(input_value(request, "i"), int)
    assert input_value(request, "f") == 0.5
    assert input_value(request, "empty", 9) == 9
    assert input_value(request, "absent", "d") == "d"
