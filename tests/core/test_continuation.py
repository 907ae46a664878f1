"""``core.continuation`` (issue 25, item 2): what a stream emitted, the continuation request per engine format,
the splice (no repeated role, one chunk id, usage over the whole answer, the continuation's finish_reason), the
bounds, and ``--migrate off``; plus the built-in engine continuing an assistant prefix."""

from __future__ import annotations

import asyncio
import json

import pytest

from eloquent_plugins.cli.main import build_parser
from eloquent_plugins.cli.commands.common import stream_config
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.continuation import (MAX_RECORD_BYTES, TOKEN_ID_ROUTE, CannotContinue, Splice,
                                                plan, read_emitted)
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.engine.core import Engine
from eloquent_plugins.transports.sse.receive import ReceiveRelay

CHAT = "/v1/chat/completions"


def chunk(content: str | None = None, *, role: bool = False, finish: str | None = None, ids: list[int] | None = None,
          prompt_ids: list[int] | None = None, cid: str = "chatcmpl-1") -> bytes:
    delta: dict = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    obj: dict = {"id": cid, "object": "chat.completion.chunk", "created": 7, "model": "m", "choices": [choice]}
    if prompt_ids is not None:
        obj["prompt_token_ids"] = prompt_ids
    return json.dumps(obj).encode()


def usage_chunk(prompt: int, completion: int, cid: str = "chatcmpl-2") -> bytes:
    return json.dumps({"id": cid, "object": "chat.completion.chunk", "created": 9, "model": "m", "choices": [],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}}).encode()


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 10,
        "temperature": 0, "stream_options": {"include_usage": True}}


def test_read_emitted_chat_text_tokens_and_role():
    em = read_emitted("openai", [chunk("", role=True), chunk("Hel"), chunk("lo"), chunk(" you")])
    assert (em.text, em.tokens, em.role_sent, em.finished, em.chunk_id) == ("Hello you", 3, True, False, "chatcmpl-1")
    assert em.token_ids is None and em.prompt_token_ids is None


def test_read_emitted_keeps_vllm_token_ids():
    em = read_emitted("openai", [chunk("", role=True, ids=[], prompt_ids=[1, 2, 3]), chunk("ab", ids=[5, 6]),
                                 chunk("c", ids=[7])])
    assert em.token_ids == [5, 6, 7] and em.prompt_token_ids == [1, 2, 3] and em.tokens == 3


def test_read_emitted_sees_the_end_and_obstacles():
    assert read_emitted("openai", [chunk("a"), chunk(finish="stop")]).finished
    assert read_emitted("openai", [chunk("a"), b"[DONE]"]).finished
    assert read_emitted("openai", [b'{"error": {"message": "x"}}']).finished
    tool = json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}).encode()
    assert read_emitted("openai", [tool]).obstacle == "a tool call"
    two = json.dumps({"choices": [{"index": 1, "delta": {"content": "x"}}]}).encode()
    assert "several choices" in (read_emitted("openai", [two]).obstacle or "")
    assert read_emitted("openai", [b"not json"]).obstacle


def test_plan_chat_continues_the_final_assistant_message():
    em = read_emitted("openai", [chunk("", role=True), chunk("Hel"), chunk("lo")])
    cont = plan(CHAT, "openai", BODY, em)
    assert cont.route == CHAT and cont.source == cont.target == "chat" and cont.want_usage
    assert cont.body["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert cont.body["continue_final_message"] is True and cont.body["add_generation_prompt"] is False
    assert cont.body["max_tokens"] == 8 and cont.body["temperature"] == 0
    assert BODY["max_tokens"] == 10 and len(BODY["messages"]) == 1, "the original request is not changed"


def test_plan_extends_a_prefill_the_caller_gave():
    body = {**BODY, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}],
            "continue_final_message": True, "add_generation_prompt": False}
    cont = plan(CHAT, "openai", body, read_emitted("openai", [chunk("yes")]))
    assert cont.body["messages"][-1]["content"] == "Sure: yes" and len(cont.body["messages"]) == 2


def test_plan_with_token_ids_is_a_token_prompt_on_completions():
    em = read_emitted("openai", [chunk("", role=True, ids=[], prompt_ids=[1, 2]), chunk("ab", ids=[5, 6])])
    cont = plan(CHAT, "openai", {**BODY, "max_completion_tokens": 10, "max_tokens": None}, em, token_ids=True)
    assert cont.route == TOKEN_ID_ROUTE and cont.source == "completions" and cont.target == "chat"
    assert cont.body["prompt"] == [1, 2, 5, 6] and cont.body["max_tokens"] == 8
    assert cont.body["return_token_ids"] is True and "messages" not in cont.body
    # without the upstream's support (token_ids False) the same stream continues as a chat
    assert plan(CHAT, "openai", BODY, em).route == CHAT


def test_plan_completions_tgi_and_triton_append_the_text():
    em = read_emitted("openai", [json.dumps({"choices": [{"index": 0, "text": " upon"}]}).encode()])
    cont = plan("/v1/completions", "openai", {"prompt": "once", "stream": True, "max_tokens": 5}, em)
    assert cont.body["prompt"] == "once upon" and cont.body["max_tokens"] == 4
    tgi = [json.dumps({"index": i + 1, "token": {"id": 10 + i, "text": t, "special": False},
                       "generated_text": None}).encode() for i, t in enumerate(["a", "b"])]
    em = read_emitted("tgi", tgi)
    assert em.tokens == 2 and em.token_ids == [10, 11]
    cont = plan("/generate_stream", "tgi", {"inputs": "x", "parameters": {"max_new_tokens": 5}}, em)
    assert cont.body == {"inputs": "xab", "parameters": {"max_new_tokens": 3}}
    em = read_emitted("triton", [b'{"text_output": "ab"}'])
    cont = plan("/v2/models/m/generate_stream", "triton", {"text_input": "x", "max_tokens": 4}, em)
    assert cont.body == {"text_input": "xab", "max_tokens": 3}


@pytest.mark.parametrize("body, events, why", [
    (BODY, [chunk(str(i)) for i in range(10)], "token limit"),
    (BODY, [chunk("a"), chunk(finish="length")], "complete"),
    ({**BODY, "n": 2}, [chunk("a")], "several choices"),
    ({**BODY, "stream": False}, [chunk("a")], "not a streaming"),
    ({"prompt": "x", "stream": True, "echo": True}, [chunk("a")], "echo"),
    ({"prompt": [[1], [2]], "stream": True}, [chunk("a")], "not one string"),
])
def test_what_cannot_be_continued(body, events, why):
    route = CHAT if "messages" in body else "/v1/completions"
    with pytest.raises(CannotContinue, match=why):
        plan(route, "openai", body, read_emitted("openai", events))


def test_splice_chat_into_chat():
    em = read_emitted("openai", [chunk("", role=True), chunk("Hel"), chunk("lo")])
    splice = Splice(plan(CHAT, "openai", BODY, em), em)
    assert splice.payloads(chunk("", role=True, cid="chatcmpl-2")) == [], "no second role chunk"
    (out,) = splice.payloads(chunk(" there", cid="chatcmpl-2"))
    obj = json.loads(out)
    assert obj["id"] == "chatcmpl-1" and obj["created"] == 7 and obj["choices"][0]["delta"] == {"content": " there"}
    (fin,) = splice.payloads(chunk(finish="length", cid="chatcmpl-2"))
    assert json.loads(fin)["choices"][0]["finish_reason"] == "length" and splice.finished
    # the continuation's prompt held the 2 emitted tokens; its completion is the 8 new ones
    (use,) = splice.payloads(usage_chunk(4 + 2, 8))
    assert json.loads(use)["usage"] == {"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 14}
    assert splice.payloads(b"[DONE]") == [b"[DONE]"]


def test_splice_drops_usage_the_client_did_not_ask_for():
    body = {k: v for k, v in BODY.items() if k != "stream_options"}
    em = read_emitted("openai", [chunk("a")])
    cont = plan(CHAT, "openai", body, em)
    assert cont.body["stream_options"] == {"include_usage": True} and not cont.want_usage
    splice = Splice(cont, em)
    assert splice.payloads(usage_chunk(3, 2)) == []
    with_null = json.loads(chunk("b"))
    with_null["usage"] = None
    (out,) = splice.payloads(json.dumps(with_null).encode())
    assert "usage" not in json.loads(out)


def test_splice_completions_tokens_into_chat_counts_by_prompt_ids():
    em = read_emitted("openai", [chunk("", role=True, ids=[], prompt_ids=[1, 2, 3]), chunk("ab", ids=[5, 6])])
    cont = plan(CHAT, "openai", BODY, em, token_ids=True)
    splice = Splice(cont, em)
    part = {"id": "cmpl-9", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": "c", "finish_reason": None, "token_ids": [7], "prompt_token_ids": [1]}],
            "prompt_token_ids": None}
    (out,) = splice.payloads(json.dumps(part).encode())
    obj = json.loads(out)
    assert obj["object"] == "chat.completion.chunk" and obj["id"] == "chatcmpl-1"
    assert obj["choices"][0]["delta"] == {"content": "c"} and obj["choices"][0]["token_ids"] == [7]
    (use,) = splice.payloads(json.dumps({"id": "cmpl-9", "choices": [], "usage": {
        "prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}}).encode())
    assert json.loads(use)["usage"] == {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}


def test_ids_whose_text_was_held_back_are_generated_again_and_counted_once():
    """A cut between the bytes of one character: the last two ids came with no text (vLLM holds an incomplete
    UTF-8 sequence back). The prompt ends where the text does; the two are generated again, their ids dropped
    from what the client gets (it has them), the character's text delivered once, usage counting each id once."""
    em = read_emitted("openai", [chunk("", role=True, ids=[], prompt_ids=[1, 2, 3]), chunk("ab", ids=[5, 6]),
                                 chunk("", ids=[240]), chunk("", ids=[159])])
    assert em.tokens == 4 and em.held == 2
    cont = plan(CHAT, "openai", BODY, em, token_ids=True)
    assert cont.body["prompt"] == [1, 2, 3, 5, 6] and cont.body["max_tokens"] == 10 - 4 + 2
    assert cont.regenerate == 2
    splice = Splice(cont, em)

    def part(text: str, ids: list[int], finish: str | None = None) -> bytes:
        return json.dumps({"id": "cmpl-9", "object": "text_completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "text": text, "finish_reason": finish, "token_ids": ids}]}).encode()

    assert splice.payloads(part("", [240])) == [] and splice.payloads(part("", [159])) == []
    (out,) = splice.payloads(part("\U0001f600", [152]))
    choice = json.loads(out)["choices"][0]
    assert choice["delta"] == {"content": "\U0001f600"} and choice["token_ids"] == [152]
    (out,) = splice.payloads(part(" ok", [7], "length"))
    assert json.loads(out)["choices"][0]["token_ids"] == [7]
    (use,) = splice.payloads(json.dumps({"id": "cmpl-9", "choices": [], "usage": {
        "prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}).encode())
    assert json.loads(use)["usage"]["completion_tokens"] == 6, "2 emitted with text + 4 generated (2 again)"
    again = read_emitted("openai", [chunk("", role=True, ids=[], prompt_ids=[1]), chunk("", ids=[240]),
                                    chunk("x", ids=[159, 7])])
    assert again.held == 0, "text came after the held ids: nothing is held any more"


def test_splice_tgi_continues_index_and_generated_text():
    tgi = [json.dumps({"index": 1, "token": {"id": 1, "text": "a", "special": False}}).encode()]
    em = read_emitted("tgi", tgi)
    splice = Splice(plan("/generate_stream", "tgi", {"inputs": "x"}, em), em)
    (mid,) = splice.payloads(json.dumps({"index": 1, "token": {"id": 2, "text": "b"}, "generated_text": None}).encode())
    (last,) = splice.payloads(json.dumps({"index": 2, "token": {"id": 3, "text": "c"}, "generated_text": "bc",
                                          "details": {"generated_tokens": 2}}).encode())
    assert json.loads(mid)["index"] == 2
    assert json.loads(last)["index"] == 3 and json.loads(last)["generated_text"] == "abc"
    assert json.loads(last)["details"]["generated_tokens"] == 3 and splice.finished


def test_an_error_in_the_continuation_passes_and_ends_it():
    em = read_emitted("openai", [chunk("a")])
    splice = Splice(plan(CHAT, "openai", BODY, em), em)
    error = b'{"error": {"message": "boom"}}'
    assert splice.payloads(error) == [error] and splice.finished


def test_the_record_has_a_ceiling():
    async def run(size: int) -> bytes | None:
        messages = [{"type": "http.request", "body": b"x" * size, "more_body": False}]

        async def receive():
            return messages.pop(0)

        relay = ReceiveRelay(receive)
        relay.record(MAX_RECORD_BYTES)
        await relay.receive()
        return None if relay.recorded is None else bytes(relay.recorded)

    assert asyncio.run(run(100)) == b"x" * 100
    assert asyncio.run(run(MAX_RECORD_BYTES + 1)) is None, "over the ceiling nothing is recorded: no migration"


def test_migrate_off_cli_over_env_over_default():
    assert StreamConfig().migrate is True
    assert StreamConfig.from_env({"ELOQUENT_MIGRATE": "off"}).migrate is False
    parser = build_parser()
    args = parser.parse_args(["serve", "--migrate", "off"])
    assert stream_config(args).migrate is False
    args = parser.parse_args(["serve", "--migrate", "on"])
    assert stream_config(args).migrate is True


def test_engine_continues_its_own_prefix_exactly():
    engine = Engine(EngineConfig(ttft=0, tpot=0))
    prompt = "<|user|>\nhi\n"
    whole = engine.tokens_for(prompt, max_tokens=30, seed=None)
    prefix = "".join(t.text for t in whole[:12])
    assert engine.continued(prompt, prefix, None) == (prompt, 12)
    assert engine.continued(prompt, "not its answer", None) == (prompt + "not its answer", 0)

    async def rest() -> list:
        return [t async for t in engine.generate(prompt, max_tokens=18, seed=None, prefix=prefix)]

    tokens = asyncio.run(rest())
    assert prefix + "".join(t.text for t in tokens) == "".join(t.text for t in whole)
    assert tokens[-1].finish_reason == "length" and tokens[-1].index == 17
