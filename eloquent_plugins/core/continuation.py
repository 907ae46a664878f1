# long: one rule set per engine format (OpenAI chat, completions, vLLM token ids, TGI, Triton text), kept side by
# side because the reader, the planner and the splice of one format must agree field for field.
"""Continuing a generation that another process started: what was emitted, the upstream request for the rest,
and how the rest is spliced into the stream the client already holds. Sans-I/O: the transports feed payloads in
and send the built request themselves.

Why per format: an engine continues an answer only when it is asked for "the continuation of this prompt plus
these tokens". vLLM takes the prompt as token ids (``/v1/completions`` with ``prompt`` a list of ids and
``return_token_ids``), which reproduces an uncut greedy run exactly, since nothing is re-tokenised; any
OpenAI-compatible server takes the chat plus a final assistant message (``continue_final_message``,
``add_generation_prompt: false``), a completions server the prompt plus the text, TGI ``inputs`` plus the text,
a Triton text model ``text_input`` plus the text. The splice then makes the rest look like the same stream:
no second role chunk, the first stream's ``id``/``created``/``model``, ``usage`` counting the whole answer once
(``completion_tokens`` = emitted + continuation, ``prompt_tokens`` the original's), ``finish_reason`` the
continuation's, TGI's ``index`` and ``generated_text`` over the whole answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_RECORD_BYTES = 256 << 10
"""The ceiling on the request a stream records for migration; a larger request is not recorded, so the stream
is not migrated and ends as honestly as without migration."""
MAX_MIGRATIONS = 3
"""How many times one stream may be continued somewhere else; past it, it ends uncompleted."""
DONE = b"[DONE]"
TOKEN_ID_ROUTE = "/v1/completions"
_SAMPLING = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
             "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
             "spaces_between_special_tokens", "include_stop_str_in_output", "min_tokens", "logit_bias", "user")
"""Request fields that mean the same on chat and completions (copied when a chat is continued as completions)."""


class CannotContinue(Exception):
    """This stream cannot be continued (its format, its request, what it emitted); it ends as it would have."""


@dataclass(slots=True)
class Emitted:
    """What the client holds of one answer, read back from its events."""

    text: str = ""
    tokens: int = 0
    """Completion tokens emitted: the token ids when the upstream sent them, else one per content event."""
    token_ids: list[int] | None = None
    """The emitted token ids, when every content event carried them (vLLM's ``return_token_ids``)."""
    held: int = 0
    """How many of the last token ids came in events without text: the upstream held their text back (the bytes
    of a character not complete yet), so the client has their ids but not their text."""
    prompt_token_ids: list[int] | None = None
    role_sent: bool = False
    finished: bool = False
    """A ``finish_reason``, ``[DONE]``, an error or a final TGI event is in: there is nothing to continue."""
    events: int = 0
    chunk_id: str | None = None
    created: int | None = None
    model: str | None = None
    obstacle: str | None = None
    """Why these events cannot be continued (several choices, a tool call, an unreadable event), or None."""
    _ids_complete: bool = field(default=True, repr=False)


def read_emitted(kind: str, payloads: Iterable[bytes]) -> Emitted:
    """Read the payloads of a stream's events (``kind``: ``openai``, ``tgi``, ``triton``)."""
    out = Emitted(token_ids=[])
    content_events = 0
    for payload in payloads:
        out.events += 1
        if out.finished or out.obstacle is not None:
            continue
        if payload.strip() == DONE:
            out.finished = True
            continue
        try:
            obj = json.loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            out.obstacle = "an event is not JSON"
            continue
        if not isinstance(obj, dict):
            out.obstacle = "an event is not a JSON object"
        elif "error" in obj:
            out.finished = True
        elif kind == "openai":
            content_events += _read_openai(out, obj)
        elif kind == "tgi":
            content_events += _read_tgi(out, obj)
        elif kind == "triton":
            text = obj.get("text_output")
            if not isinstance(text, str):
                out.obstacle = "a Triton event without text_output"
            else:
                out.text += text
                content_events += 1
                out._ids_complete = False
        else:
            out.obstacle = f"no continuation rules for the {kind!r} format"
    if not out._ids_complete or not out.token_ids:
        out.token_ids = None if (not out._ids_complete or content_events) else []
    out.tokens = len(out.token_ids) if out.token_ids is not None else content_events
    return out


def _read_openai(out: Emitted, obj: dict[str, Any]) -> int:
    """One chat or completions chunk; returns 1 when it carried generated text."""
    if out.chunk_id is None:
        out.chunk_id, out.created, out.model = obj.get("id"), obj.get("created"), obj.get("model")
    prompt_ids = obj.get("prompt_token_ids")
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        out.obstacle = "'choices' is not an array"
        return 0
    counted = 0
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            out.obstacle = "several choices (n > 1)"
            return 0
        if prompt_ids is None:
            prompt_ids = choice.get("prompt_token_ids")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("tool_calls") or delta.get("function_call"):
                out.obstacle = "a tool call"
                return 0
            if delta.get("role"):
                out.role_sent = True
            text = delta.get("content")
        else:
            text = choice.get("text")
        ids = choice.get("token_ids")
        if isinstance(ids, list) and out.token_ids is not None:
            out.token_ids.extend(int(i) for i in ids)
            if ids:
                out.held = 0 if isinstance(text, str) and text else out.held + len(ids)
        elif text:
            out._ids_complete = False
        if isinstance(text, str) and text:
            out.text += text
            counted = 1
        elif isinstance(ids, list) and ids:
            counted = 1
        if choice.get("finish_reason") is not None:
            out.finished = True
    if isinstance(prompt_ids, list) and out.prompt_token_ids is None:
        out.prompt_token_ids = [int(i) for i in prompt_ids]
    return counted


def _read_tgi(out: Emitted, obj: dict[str, Any]) -> int:
    token = obj.get("token")
    if not isinstance(token, dict):
        out.obstacle = "a TGI event without a token"
        return 0
    if not token.get("special") and isinstance(token.get("text"), str):
        out.text += token["text"]
    if isinstance(token.get("id"), int) and out.token_ids is not None:
        out.token_ids.append(token["id"])
    if obj.get("generated_text") is not None or obj.get("details") is not None:
        out.finished = True
    return 1


@dataclass(frozen=True, slots=True)
class Continuation:
    """The upstream request for the rest of an answer and how to splice its events."""

    route: str
    body: dict[str, Any]
    source: str
    """The format the continuation's events come in: ``chat``, ``completions``, ``tgi``, ``triton``."""
    target: str
    """The format the client's stream speaks (the same names)."""
    want_usage: bool
    """The client asked for a usage chunk (OpenAI ``stream_options.include_usage``)."""
    regenerate: int = 0
    """Emitted token ids the continuation generates again (``Emitted.held``): the splice drops them from its
    ``token_ids`` and counts them once in ``usage``."""

    def encoded(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":"), ensure_ascii=False).encode()


def route_format(route: str, codec: str) -> str:
    """The continuation format of a stream's route: ``chat``, ``completions``, ``tgi`` or ``triton``."""
    if codec == "openai":
        return "chat" if route.rstrip("/").endswith("chat/completions") else "completions"
    if codec in ("tgi", "triton"):
        return codec
    raise CannotContinue(f"no continuation rules for the {codec!r} format")


def _max_key(body: dict[str, Any]) -> str:
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def _remaining(limit: Any, emitted: Emitted) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise CannotContinue("the token limit is not an integer")
    left = limit - emitted.tokens
    if left <= 0:
        raise CannotContinue("the answer already used its token limit")
    return left


def plan(route: str, codec: str, body: Any, emitted: Emitted, *, token_ids: bool = False) -> Continuation:
    """The continuation of the answer to ``body`` (sent to ``route``) after ``emitted``.

    ``token_ids``: the upstream is vLLM, which continues a token-id prompt on ``/v1/completions`` (exact under
    greedy decoding); without it a chat is continued with ``continue_final_message``. Raises ``CannotContinue``.
    """
    if emitted.obstacle is not None:
        raise CannotContinue(emitted.obstacle)
    if emitted.finished:
        raise CannotContinue("the answer is complete")
    if not isinstance(body, dict):
        raise CannotContinue("the request is not a JSON object")
    fmt = route_format(route, codec)
    if fmt in ("chat", "completions"):
        return _plan_openai(route, fmt, body, emitted, token_ids)
    if fmt == "tgi":
        params = dict(body.get("parameters") or {})
        left = _remaining(params.get("max_new_tokens"), emitted)
        if left is not None:
            params["max_new_tokens"] = left
        inputs = body.get("inputs")
        if not isinstance(inputs, str) or params.get("best_of") not in (None, 1):
            raise CannotContinue("TGI continues a single text input only")
        return Continuation(route, {**body, "inputs": inputs + emitted.text, "parameters": params}, "tgi", "tgi",
                            False)
    text = body.get("text_input")
    if not isinstance(text, str):
        raise CannotContinue("this Triton model takes no text_input")
    out = {**body, "text_input": text + emitted.text}
    params = dict(body.get("parameters") or {})
    for holder in (out, params):
        if "max_tokens" in holder:
            holder["max_tokens"] = _remaining(holder["max_tokens"], emitted)
    if params:
        out["parameters"] = params
    return Continuation(route, out, "triton", "triton", False)


def _plan_openai(route: str, fmt: str, body: dict[str, Any], emitted: Emitted, token_ids: bool) -> Continuation:
    if body.get("stream") is not True:
        raise CannotContinue("not a streaming request")
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        raise CannotContinue("several choices (n > 1)")
    if body.get("echo"):
        raise CannotContinue("echo repeats the prompt")
    options = body.get("stream_options")
    want_usage = isinstance(options, dict) and options.get("include_usage") is True
    key = _max_key(body)
    left = _remaining(body.get(key), emitted)
    usage = {"include_usage": True}
    if token_ids and emitted.prompt_token_ids is not None and emitted.token_ids is not None:
        # The prompt ends where the emitted text does. Ids whose text the upstream still held back (a character
        # cut between its bytes) are left out and generated again: a prompt that ends inside a character makes
        # vLLM's detokenizer start from the prompt's first token, and the client would get the prompt as text.
        held = emitted.held
        resolved = emitted.token_ids[:len(emitted.token_ids) - held]
        out = {k: body[k] for k in _SAMPLING if k in body}
        out.update(prompt=emitted.prompt_token_ids + resolved, stream=True, stream_options=usage,
                   return_token_ids=True)
        if left is not None:
            out["max_tokens"] = left + held
        return Continuation(TOKEN_ID_ROUTE, out, "completions", fmt, want_usage, held)
    out = {**body, "stream": True, "stream_options": usage}
    if left is not None:
        out[key] = left
    if fmt == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise CannotContinue("a completions prompt that is not one string (and no token ids)")
        out["prompt"] = prompt + emitted.text
        return Continuation(route, out, "completions", fmt, want_usage)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise CannotContinue("no messages")
    messages = list(messages)
    last = messages[-1]
    if body.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant" \
            and isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": last["content"] + emitted.text}  # the caller's own prefix, extended
    else:
        messages.append({"role": "assistant", "content": emitted.text})
    out.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    return Continuation(route, out, "chat", fmt, want_usage)


class Splice:
    """Rewrites the continuation's event payloads into the client's stream (one instance per continuation)."""

    def __init__(self, cont: Continuation, emitted: Emitted) -> None:
        self.cont = cont
        self.emitted = emitted
        self.index = emitted.tokens
        """TGI: the ``index`` the next token event gets."""
        self.skip = cont.regenerate
        """Token ids still to drop from the continuation's chunks (the client has them already)."""
        self.finished = False
        """The continuation's own end came through (``[DONE]``, a finish, an error, TGI's last event)."""

    def payloads(self, payload: bytes) -> list[bytes]:
        """The client's payloads for one continuation payload (none, when it is dropped)."""
        if payload.strip() == DONE:
            self.finished = True
            return [payload.strip()] if self.cont.target in ("chat", "completions") else []
        try:
            obj = json.loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return [payload]
        if not isinstance(obj, dict):
            return [payload]
        if "error" in obj:
            self.finished = True
            return [payload]
        source = self.cont.source
        if source == "tgi":
            return [self._tgi(obj)]
        if source == "triton":
            return [payload]
        return self._openai(obj)

    def _openai(self, obj: dict[str, Any]) -> list[bytes]:
        em, cont = self.emitted, self.cont
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        if isinstance(usage, dict):
            if not choices:  # the usage chunk
                if not cont.want_usage:
                    return []
                obj["usage"] = self.usage(usage)
            else:
                obj["usage"] = self.usage(usage) if cont.want_usage else None
        elif "usage" in obj and not cont.want_usage:
            del obj["usage"]
        out_choices = []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason") is not None:
                self.finished = True
            if self.skip and isinstance(choice.get("token_ids"), list):
                ids = choice["token_ids"]
                drop = min(self.skip, len(ids))
                self.skip -= drop
                choice = {**choice, "token_ids": ids[drop:]}
                if not ids[drop:] and not choice.get("text") and choice.get("finish_reason") is None:
                    continue  # a regenerated id whose text is still held back: the client has this event
            if cont.target == "chat":
                if cont.source == "completions":
                    choice = {"index": 0, "delta": {"content": choice.get("text") or ""},
                              "logprobs": choice.get("logprobs"), "finish_reason": choice.get("finish_reason"),
                              **{k: choice[k] for k in ("stop_reason", "token_ids") if k in choice}}
                delta = choice.get("delta")
                if isinstance(delta, dict) and delta.get("role") and em.role_sent:
                    delta = {k: v for k, v in delta.items() if k != "role"}
                    if not delta.get("content") and choice.get("finish_reason") is None \
                            and not choice.get("token_ids"):
                        continue  # the continuation's own role chunk: the client had one
                    choice = {**choice, "delta": delta}
            out_choices.append(choice)
        if choices and not out_choices:
            return []
        obj["choices"] = out_choices
        obj.pop("prompt_token_ids", None)
        for name, value in (("id", em.chunk_id), ("created", em.created), ("model", em.model)):
            if value is not None:
                obj[name] = value
        if cont.target == "chat":
            obj["object"] = "chat.completion.chunk"
        return [json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()]

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The whole answer's usage from the continuation's: its prompt held the emitted tokens."""
        em = self.emitted
        completion = em.tokens - self.cont.regenerate + _int(usage.get("completion_tokens"))
        if em.prompt_token_ids is not None:
            prompt = len(em.prompt_token_ids)
        else:
            prompt = max(0, _int(usage.get("prompt_tokens")) - em.tokens)
        return {**usage, "prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def _tgi(self, obj: dict[str, Any]) -> bytes:
        em = self.emitted
        self.index += 1
        obj["index"] = self.index
        if obj.get("generated_text") is not None:
            self.finished = True
            obj["generated_text"] = em.text + str(obj["generated_text"])
        details = obj.get("details")
        if isinstance(details, dict) and isinstance(details.get("generated_tokens"), int):
            obj["details"] = {**details, "generated_tokens": details["generated_tokens"] + em.tokens}
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
