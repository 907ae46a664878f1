"""Validation of OpenAI chat/completions request bodies into one typed ``GenerationRequest``.

Only what the built-in engine honours is checked strictly; sampling knobs (temperature, top_p, ...) are
type-checked and then ignored because generation is deterministic. Unknown fields are ignored, as vLLM does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.engine.controls import EngineControls
from eloquent_plugins.engine.errors import APIError, invalid
from eloquent_plugins.engine.vocab import count_pieces

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_NO_CONTENT_OK = frozenset({"assistant"})


@dataclass(frozen=True)
class GenerationRequest:
    """Everything the server needs to answer one chat or completions request."""

    chat: bool
    prompt: str
    prompt_tokens: int
    max_tokens: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    controls: EngineControls
    include_obfuscation: bool = False
    prefix: str = ""
    """With ``continue_final_message`` (vLLM's extension): the final assistant message, whose answer the engine
    continues (``Engine.generate``'s ``prefix``) instead of starting a new one."""


def parse_request(body: Any, *, chat: bool, config: EngineConfig) -> GenerationRequest:
    """Validate a decoded JSON body; raises ``APIError`` (400, or 404 for an unknown model)."""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object", None, "invalid_request_body")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string", "model")
    if model is not None and model != config.model:
        raise APIError(
            404,
            f"The model `{model}` does not exist. Available: `{config.model}`.",
            param="model",
            code="model_not_found",
        )
    prefix = _continued(body) if chat else ""
    prompt = _chat_prompt(body, drop_last=bool(prefix) or _optional_bool(body, "continue_final_message", False)) \
        if chat else _completion_prompt(body)
    stream = _optional_bool(body, "stream", False)
    include_usage = _stream_options(body, stream)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
        raise invalid("only 'n': 1 is supported", "n")
    for name, hi in (("temperature", 2.0), ("top_p", 1.0), ("presence_penalty", 2.0), ("frequency_penalty", 2.0)):
        _optional_number(body, name, -2.0 if name.endswith("penalty") else 0.0, hi)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63):
        raise invalid("'seed' must be a 64-bit integer", "seed")
    return GenerationRequest(
        chat=chat,
        prompt=prompt,
        prompt_tokens=count_pieces(prompt),
        max_tokens=_max_tokens(body, chat, config),
        seed=seed,
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        include_obfuscation=_obfuscation(body),
        controls=EngineControls.from_json(body.get("eloquent_engine")),
        prefix=prefix,
    )


def _continued(body: dict[str, Any]) -> str:
    """The assistant prefix to continue (``continue_final_message: true``), or "" (a new answer)."""
    if not _optional_bool(body, "continue_final_message", False):
        return ""
    if _optional_bool(body, "add_generation_prompt", True):
        raise invalid("'continue_final_message' needs 'add_generation_prompt': false", "add_generation_prompt")
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        raise invalid("'continue_final_message' needs a final assistant message with string content", "messages")
    return last["content"]


def _chat_prompt(body: dict[str, Any], *, drop_last: bool = False) -> str:
    """The prompt the answer depends on; ``drop_last``: without the final (continued) assistant message."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty array", "messages")
    parts: list[str] = []
    for i, msg in enumerate(messages[:-1] if drop_last and len(messages) > 1 else messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(f"'{where}' must be an object", where)
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise invalid(f"'{where}.role' must be one of {sorted(_ROLES)}", f"{where}.role")
        content = msg.get("content")
        if content is None and role in _NO_CONTENT_OK:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = _content_parts(content, f"{where}.content")
        else:
            raise invalid(f"'{where}.content' must be a string or an array of text parts", f"{where}.content")
        parts.append(f"<|{role}|>\n{text}\n")
    return "".join(parts)


def _content_parts(content: list[Any], where: str) -> str:
    texts: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(f'\'{where}[{j}]\' must be {{"type": "text", "text": string}}', f"{where}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _completion_prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("'prompt' must not be empty", "prompt")
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return " ".join(map(str, prompt))  # token ids: hash their decimal form
    raise invalid("'prompt' must be a non-empty string, a one-string array or an array of token ids", "prompt")


def _optional_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean", name)
    return value


def _optional_number(body: dict[str, Any], name: str, lo: float, hi: float) -> None:
    value = body.get(name)
    if value is None:
        return
    # isfinite only on floats: a JSON integer of hundreds of digits overflows it, and ints are always finite.
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise invalid(f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise invalid(f"'{name}' must be between {lo:g} and {hi:g}", name)


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    for name in ("include_usage", "include_obfuscation"):
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise invalid(f"'stream_options.{name}' must be a boolean", f"stream_options.{name}")
    return bool(options.get("include_usage"))


def _obfuscation(body: dict[str, Any]) -> bool:
    """``stream_options.include_obfuscation: true`` (checked by ``_stream_options``): OpenAI's padding field."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_obfuscation") is True


def _max_tokens(body: dict[str, Any], chat: bool, config: EngineConfig) -> int:
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return config.max_tokens_default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer", name)
    if not 1 <= value <= config.max_tokens_limit:
        raise invalid(f"'{name}' must be between 1 and {config.max_tokens_limit}, got {value}", name)
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("'stop' must be a string or an array of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"'stop' may hold at most {MAX_STOP_STRINGS} strings", "stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise invalid(f"each 'stop' string must have 1 to {MAX_STOP_CHARS} characters", "stop")
    return tuple(dict.fromkeys(stops))
