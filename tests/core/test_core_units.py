"""Keep-alive policy, stall metrics, config, codecs, CLI options."""

from __future__ import annotations

import pytest

from eloquent_plugins import ConfigError, KeepAlivePolicy, KeepAliveTimer, StreamConfig, stall_metrics
from eloquent_plugins.cli.main import build_parser
from eloquent_plugins.core.codecs import OpenAICodec, TGICodec, TritonCodec
from eloquent_plugins.core.codecs.base import CodecError
from eloquent_plugins.core.stall import andes_qoe, percentile, stall_time
from eloquent_plugins.transports.upstream import parse_upstream


def test_keepalive_is_idle_based() -> None:
    timer = KeepAliveTimer(KeepAlivePolicy(15.0), now=0.0)
    assert timer.deadline() == 15.0 and not timer.due(14.9)
    timer.activity(10.0)  # bytes went out: the idle clock restarts
    assert not timer.due(15.0) and timer.due(25.0)
    assert KeepAliveTimer(KeepAlivePolicy(0), now=0.0).deadline() is None


def test_keepalive_frames_and_validation() -> None:
    assert KeepAlivePolicy().sse_frame == b": keep-alive\n"  # one line: see keepalive.SSE_COMMENT_FRAME
    assert KeepAlivePolicy(frame="newline").sse_frame == b"\n"
    for bad in (-1, float("nan"), float("inf")):  # NaN used to pass `< 0` and turn keep-alive off unseen
        with pytest.raises(ConfigError, match="keep-alive interval"):
            KeepAlivePolicy(bad)
    with pytest.raises(ConfigError):
        KeepAlivePolicy(frame="ping")  # type: ignore[arg-type]


def test_stall_definition_by_hand() -> None:
    # d = 0.1; token 1 late by 0.4 over [1.1, 1.5]; token 2 late by 0.2 over [2.1, 2.3] -> stall 0.6
    generated, rendered = [0.0, 1.0, 2.0], [0.1, 1.5, 2.3]
    report = stall_metrics(generated, rendered, 0.1)
    assert report.stall_time == pytest.approx(0.6)
    assert report.stall_ratio == pytest.approx(0.6 / 2.3)
    assert report.lateness_max == pytest.approx(0.4)


def test_overlapping_late_intervals_count_once() -> None:
    # One loss blocks three tokens until 1.0: the late intervals overlap and the union is [0.1, 1.0].
    assert stall_time([0.0, 0.1, 0.2], [1.0, 1.0, 1.0], 0.0) == pytest.approx(1.0)
    assert stall_time([0.0, 0.5], [0.0, 0.5], 0.0) == 0.0


def test_stall_requires_every_token_rendered() -> None:
    with pytest.raises(ValueError):
        stall_metrics([0.0, 1.0], [0.1], 0.0)


def test_percentile_and_qoe() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    on_time = [1.0 + 0.31 * i for i in range(50)]
    assert andes_qoe(on_time, 0.0) == pytest.approx(1.0)
    stalled = on_time[:25] + [t + 5.0 for t in on_time[25:]]
    assert andes_qoe(stalled, 0.0) < 0.9


def test_stream_config_from_env() -> None:
    cfg = StreamConfig.from_env({"ELOQUENT_KEEPALIVE": "5", "ELOQUENT_RESUME": "off",
                                 "ELOQUENT_RESUME_STORE": "redis://127.0.0.1:6379/0"})
    assert cfg.keepalive == 5.0 and cfg.resume is False and cfg.resume_store.startswith("redis://")
    with pytest.raises(ConfigError, match="ELOQUENT_KEEPALIVE"):
        StreamConfig.from_env({"ELOQUENT_KEEPALIVE": "soon"})
    for name in ("resume_ttl", "send_timeout", "header_timeout", "body_timeout"):
        for bad in ("-1", "nan", "inf"):
            with pytest.raises(ConfigError, match=f"{name} must be a finite number >= 0"):
                StreamConfig.from_env({f"ELOQUENT_{name.upper()}": bad})


def test_codecs_read_their_formats() -> None:
    openai = OpenAICodec().parse(b'{"choices":[{"delta":{"content":"Hi"},"finish_reason":"stop"}]}')
    assert (openai.text, openai.finish_reason) == ("Hi", "stop")
    assert OpenAICodec().parse(b"[DONE]").terminal
    assert OpenAICodec().parse(OpenAICodec().error_payload("boom")).error == "boom"
    tgi = TGICodec().parse(b'{"index":1,"token":{"id":7,"text":" a","logprob":-1,"special":false},'
                           b'"generated_text":null,"details":null}')
    assert (tgi.text, tgi.token_ids) == (" a", (7,))
    assert TGICodec().parse(TGICodec().error_payload("x", error_type="overloaded")).error_type == "overloaded"
    assert TritonCodec().parse(b'{"model_name":"m","model_version":"1","text_output":"yo"}').text == "yo"
    with pytest.raises(CodecError):
        TGICodec().parse(b"not json")


def test_upstream_spec() -> None:
    assert parse_upstream("tgi=http://127.0.0.1:3000") == ("tgi", "http://127.0.0.1:3000")
    for bad in ("tgi", "=http://x", "tgi=localhost:3000"):
        with pytest.raises(ConfigError):
            parse_upstream(bad)


def test_cli_lists_subcommands() -> None:
    parser = build_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--version"])
    assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["no-such-command"])
    assert exc.value.code == 2



def test_response_stream_fast_path_cuts_the_same_events_as_the_parser() -> None:
    """``feed_body`` takes a one-line ASCII ``data:`` chunk without the SSE parser; on any body, in any split, the
    events (payloads, kinds, order) and the digest must be those the parser alone gives."""
    import random

    from eloquent_plugins.core.response_stream import EloquentResponseStream
    from eloquent_plugins.core.sender import SenderConfig
    from eloquent_plugins.core.sse_reader import SSEParser

    class ParserOnly(SSEParser):
        @property
        def idle(self) -> bool:
            return False

    pieces = [b"data: tok\n\n", b"data:tok\n\n", b"data:  two spaces\n\n", b"data: caf\xc3\xa9\n\n",
              b"data: a\ndata: b\n\n", b"data: crlf\r\n\r\n", b": comment\n\n", b"event: x\ndata: y\n\n",
              b"id: 7\ndata: z\n\n", b"\xef\xbb\xbfdata: bom\n\n", b"data: [DONE]\n\n", b"retry: 5\n\n",
              b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: cr\r\r", b"data: \n\n", b"data: bad\xff\n\n"]
    rng = random.Random(5)
    fast_hits = 0
    for _ in range(400):
        body = b"".join(rng.choice(pieces[:9] + pieces[10:]) for _ in range(rng.randint(1, 12)))
        if rng.random() < 0.1:
            body = pieces[9] + body  # a BOM is only one at the very start
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 6))))
        chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
        if rng.random() < 0.5:  # also chunk exactly at message ends, as an engine sends
            chunks = [m + b"\n\n" for m in body.split(b"\n\n")[:-1]] or chunks
        fast = EloquentResponseStream(0, SenderConfig(), now=0.0)
        slow = EloquentResponseStream(0, SenderConfig(), now=0.0)
        slow._parser = ParserOnly()
        for chunk in chunks:
            fast_hits += fast._parser.idle and chunk.startswith(b"data: ")
            assert fast.feed_body(chunk, 0.0) == slow.feed_body(chunk, 0.0)
        assert [(e.index, e.kind, e.payload) for e in fast._log] == [(e.index, e.kind, e.payload) for e in slow._log]
        assert fast.finish(0.0) == slow.finish(0.0)  # the trailer carries the digest of every payload
    assert fast_hits > 100  # the fast path was taken
