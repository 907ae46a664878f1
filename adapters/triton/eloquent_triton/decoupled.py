"""Stream tokens from a Python (async) generator out of a decoupled Triton model.

Two front doors, one per way of writing a Triton model in Python:

* PyTriton: :func:`pytriton_streamer` turns ``fn(request) -> (async) iterator of str`` into a
  decoupled infer callable for ``Triton.bind(..., config=ModelConfig(decoupled=True, batching=False))``.
  PyTriton 0.7 never tells the model that a client went away (its proxy ignores Triton's cancel
  flag), so generation there runs to the end; nothing a helper can do about that.
* Triton's Python backend (``model.py`` with ``TritonPythonModel``; what the vLLM and TensorRT-LLM
  Python models use): :func:`stream_to_sender` / :class:`DecoupledTokenModel` send one response per
  token, poll ``response_sender.is_cancelled()`` while waiting for the next token, close the
  generator when the request was cancelled (so ``finally`` blocks in the model run and stop the
  work), and always end with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` as Triton requires.

Every response carries one BYTES output (``text_output`` by default), the shape the TensorRT-LLM
and vLLM backends use and the one :mod:`eloquent_triton.gateway` turns into SSE events. Only numpy
and the standard library are imported here, so the module loads inside the Python-backend stub
and in a PyTriton process alike.
"""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

TEXT_OUTPUT = "text_output"
TEXT_INPUT = "text_input"

Tokens = Iterable[str] | AsyncIterable[str]
"""What a model's token function returns: a (sync or async) iterator of text pieces."""


class _Sender(Protocol):
    """The part of Triton's ``InferenceResponseSender`` the helper uses."""

    def send(self, response: Any = None, flags: int = 0) -> None: ...

    def is_cancelled(self) -> bool: ...


# --------------------------------------------------------------------------- tensors


def text_tensor(text: str | bytes, *, batched: bool = False) -> np.ndarray:
    """One BYTES element holding ``text`` (shape ``[1]``, or ``[1, 1]`` for a batching model)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    array = np.array([data], dtype=np.object_)
    return array.reshape(1, 1) if batched else array


def token_response(
    text: str | bytes, *, output_name: str = TEXT_OUTPUT, batched: bool = False
) -> dict[str, np.ndarray]:
    """A PyTriton response dict with one token."""
    return {output_name: text_tensor(text, batched=batched)}


def _first(array: Any) -> Any:
    """First element of an input tensor, decoded if it is bytes."""
    value = np.asarray(array).reshape(-1)[0]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def input_value(inputs: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """Scalar value of an optional input (str for BYTES, int/float/bool otherwise).

    ``inputs`` is a PyTriton ``Request`` (a mapping of name to numpy array) or any mapping.
    """
    if name not in inputs:
        return default
    array = inputs[name]
    if np.asarray(array).size == 0:
        return default
    return _first(array)


# --------------------------------------------------------------------------- iteration


async def _aiter_tokens(tokens: Tokens) -> AsyncGenerator[str, None]:
    """Iterate a sync or async token source the same way (sync ones must not block for long)."""
    if isinstance(tokens, AsyncIterable):
        async for token in tokens:
            yield token
    else:
        for token in tokens:
            yield token
            await asyncio.sleep(0)


async def _close(tokens: Any) -> None:
    """Close a generator so its ``finally``/``GeneratorExit`` handlers run now."""
    aclose = getattr(tokens, "aclose", None)
    if aclose is not None:
        await aclose()
        return
    close = getattr(tokens, "close", None)
    if close is not None:
        close()


# --------------------------------------------------------------------------- PyTriton


def pytriton_streamer(
    fn: Callable[[Any], Tokens], *, output_name: str = TEXT_OUTPUT, batched: bool = False
) -> Callable[[list[Any]], AsyncIterator[list[dict[str, np.ndarray]]]]:
    """Wrap ``fn(request) -> tokens`` as a decoupled PyTriton infer callable.

    Bind the result with ``ModelConfig(decoupled=True, batching=False)``: then PyTriton passes one
    request per call. Each token becomes one response; an exception raised by ``fn`` becomes
    Triton's error response (in-band after the first token, HTTP 400 before it).
    """

    async def infer(requests: list[Any]) -> AsyncIterator[list[dict[str, np.ndarray]]]:
        if len(requests) != 1:
            raise ValueError(
                f"pytriton_streamer serves one request per call, got {len(requests)}: "
                "bind the model with ModelConfig(batching=False)"
            )
        tokens = fn(requests[0])
        stream = _aiter_tokens(tokens)
        try:
            async for token in stream:
                yield [token_response(token, output_name=output_name, batched=batched)]
        finally:
            await stream.aclose()
            await _close(tokens)

    infer.__name__ = getattr(fn, "__name__", "infer")
    infer.__doc__ = getattr(fn, "__doc__", None)
    return infer


# --------------------------------------------------------------------------- Python backend


@dataclass(frozen=True)
class StreamOutcome:
    """How one request ended; returned so models and tests can log it."""

    tokens_sent: int
    cancelled: bool
    error: str | None = None


async def _next_unless_cancelled(
    stream: AsyncIterator[str], is_cancelled: Callable[[], bool], poll_s: float
) -> tuple[bool, str | None]:
    """Wait for the next token while polling for cancellation.

    Returns ``(cancelled, token)``; ``token`` is None at the end of the stream.
    """
    if is_cancelled():  # checked for every token, however fast they come
        return True, None
    task = asyncio.ensure_future(stream.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                try:
                    return False, task.result()
                except StopAsyncIteration:
                    return False, None
            if is_cancelled():
                return True, None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def stream_to_sender(
    sender: _Sender,
    tokens: Tokens,
    *,
    pb_utils: Any,
    output_name: str = TEXT_OUTPUT,
    batched: bool = False,
    cancel_poll_s: float = 0.05,
) -> StreamOutcome:
    """Send each token of ``tokens`` as one response of a decoupled Python-backend model.

    ``pb_utils`` is ``triton_python_backend_utils`` (only importable inside Triton's stub, hence a
    parameter). Cancellation is checked while waiting for every token; when the request is
    cancelled the generator is closed and the final flag is sent. An exception from the generator
    becomes one error response carrying ``str(exc)`` (what Triton shows as ``{"error": ...}``).
    """
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    stream = _aiter_tokens(tokens)
    sent = 0
    outcome: StreamOutcome
    final_flags_sent = False
    try:
        while True:
            cancelled, token = await _next_unless_cancelled(stream, sender.is_cancelled, cancel_poll_s)
            if cancelled or token is None:
                outcome = StreamOutcome(tokens_sent=sent, cancelled=cancelled)
                break
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(output_name, text_tensor(token, batched=batched))]
            )
            try:
                sender.send(response)
            except Exception:
                if _cancelled(sender):  # the client left between the check and the send
                    outcome = StreamOutcome(tokens_sent=sent, cancelled=True)
                    break
                raise
            sent += 1
    except Exception as exc:  # the model's own failure: report it to the client, in-band
        message = str(exc) or type(exc).__name__
        outcome = StreamOutcome(tokens_sent=sent, cancelled=False, error=message)
        final_flags_sent = True
        _send_quietly(sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), final)
    finally:
        try:
            await stream.aclose()
            await _close(tokens)
        finally:
            if not final_flags_sent:
                # Triton needs the final flag even for a cancelled request.
                _send_quietly(sender, None, final)
    return outcome


def _cancelled(sender: _Sender) -> bool:
    try:
        return bool(sender.is_cancelled())
    except Exception:
        return False


def _send_quietly(sender: _Sender, response: Any, flags: int) -> None:
    """Send the last response; a request Triton already cancelled may refuse it, which is fine."""
    try:
        sender.send(response, flags=flags)
    except Exception:
        if not _cancelled(sender):
            raise


def backend_input_value(pb_utils: Any, request: Any, name: str, default: Any = None) -> Any:
    """Scalar value of an optional input of a Python-backend request."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return input_value({name: tensor.as_numpy()}, name, default)


class DecoupledTokenModel(ABC):
    """Base class for a decoupled Python-backend ``TritonPythonModel`` that streams tokens.

    Subclass it in ``model.py``, set ``pb_utils`` to the imported ``triton_python_backend_utils``
    and implement :meth:`generate`. Requests are served concurrently (``async execute``, Triton
    24.04+), each with :func:`stream_to_sender`; :meth:`on_outcome` sees how each one ended.
    """

    pb_utils: Any = None
    output_name: str = TEXT_OUTPUT
    batched: bool = False
    cancel_poll_s: float = 0.05

    @abstractmethod
    def generate(self, request: Any) -> Tokens:
        """Return the tokens for one request (sync or async iterator of str)."""

    def on_outcome(self, request: Any, outcome: StreamOutcome) -> None:
        """Called once per request after its final response was sent."""

    async def execute(self, requests: list[Any]) -> None:
        """Triton entry point: stream every request; decoupled models return None."""
        await asyncio.gather(*(self._serve(request) for request in requests))
        return None

    async def _serve(self, request: Any) -> None:
        pb = self.pb_utils
        if pb is None:
            raise RuntimeError("set DecoupledTokenModel.pb_utils = triton_python_backend_utils")
        sender = request.get_response_sender()
        try:
            tokens = self.generate(request)
            if inspect.isawaitable(tokens):
                tokens = await tokens
        except Exception as exc:  # bad input or model failure before the first token
            message = str(exc) or type(exc).__name__
            sender.send(
                pb.InferenceResponse(error=pb.TritonError(message)),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            self.on_outcome(request, StreamOutcome(tokens_sent=0, cancelled=False, error=message))
            return
        outcome = await stream_to_sender(
            sender,
            tokens,
            pb_utils=pb,
            output_name=self.output_name,
            batched=self.batched,
            cancel_poll_s=self.cancel_poll_s,
        )
        self.on_outcome(request, outcome)
