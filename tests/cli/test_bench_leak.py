"""``bench leak`` (issue 29), run tiny: the attacker's figures come out for each path and mode, and they say what
they should: without padding the sizes name the answer and the token lengths, with ``bucket`` every write takes
one of the classes and the sizes name nothing (the tiny run's answers all fit the smallest classes)."""

from __future__ import annotations

import json
from pathlib import Path

from eloquent_plugins.cli.bench.leak_vllm import Take, load, prompts_for, save, take_timeline
from eloquent_plugins.cli.main import main


def test_tiny_run_writes_each_variants_figures(tmp_path: Path) -> None:
    out = tmp_path / "leak.json"
    assert main(["bench", "leak", "--answers", "4", "--runs", "2", "--tokens", "12", "--sse-tpot", "0.001",
                 "--tpot", "0.01", "--modes", "off,bucket", "--no-progress", "--json", str(out)]) == 0
    rows = {(r["path"], r["mode"]): r for r in json.loads(out.read_text())["variants"]}
    assert set(rows) == {("sse", "off"), ("sse", "bucket"), ("datagram", "off"), ("datagram", "bucket")}
    for path in ("sse", "datagram"):
        off, bucket = rows[path, "off"], rows[path, "bucket"]
        assert off["bytes_ratio"] == 1.0 and bucket["bytes_ratio"] > 1.0
        assert bucket["sizes_seen"] < off["sizes_seen"]
        assert off["identification_sizes"] > bucket["identification_sizes"]
        assert off["token_length_recovery"] > off["token_length_baseline"]
        assert bucket["chance"] == 0.25
    assert rows["sse", "bucket"]["sizes_seen"] <= 2


def test_send_tick_rows_pace_both_paths(tmp_path: Path) -> None:
    """With ``--send-tick`` each path gets one more row, paced: the simulated datagram sender's first send of each
    token comes at most one tick after it (a simulated clock: exact), and writes and datagrams are fewer."""
    out = tmp_path / "leak.json"
    assert main(["bench", "leak", "--answers", "4", "--runs", "2", "--tokens", "12", "--sse-tpot", "0.001",
                 "--tpot", "0.01", "--modes", "off,bucket", "--send-tick", "0.02", "--no-progress",
                 "--json", str(out)]) == 0
    rows = {(r["path"], r["mode"]): r for r in json.loads(out.read_text())["variants"]}
    assert ("sse", "constant+tick 20ms") in rows
    plain, paced = rows["datagram", "bucket"], rows["datagram", "bucket+tick 20ms"]
    assert plain["latency_ms_p95"] == 0.0  # unpaced, the sender sends each token as it comes
    assert 0.0 < paced["latency_ms_mean"] <= paced["latency_ms_p95"] <= 20.0
    assert paced["bytes_ratio"] < plain["bytes_ratio"]  # two tokens a tick: one datagram where there were two


def _take(answer: int, run: int) -> Take:
    """A recorded answer as vLLM streams it: a role chunk, content chunks, the finish chunk and ``[DONE]``."""
    def event(delta: str, finish: str = "null") -> bytes:
        return ('data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
                + delta + ',"finish_reason":' + finish + '}]}\n\n').encode()

    words = [("x" * (1 + (answer * 7 + i * 3) % 9)) for i in range(10)]
    events = [event('{"role":"assistant","content":""}')] + [event(json.dumps({"content": w})) for w in words]
    events += [event("{}", '"stop"'), b"data: [DONE]\n\n"]
    texts = [None] + words + [None, None]
    return Take(tuple(events), tuple(0.002 * i + 0.0005 * run for i in range(len(events))), tuple(texts))


def test_a_recorded_vllm_answer_set_is_replayed_on_both_paths(tmp_path: Path) -> None:
    recording = tmp_path / "answers.json"
    prompts = prompts_for(4)
    save(str(recording), {"temperature": 0.0}, prompts, [[_take(a, r) for r in range(2)] for a in range(4)])
    meta, loaded_prompts, takes = load(str(recording))
    assert loaded_prompts == prompts and takes[3][1] == _take(3, 1)
    timeline = take_timeline(takes[0][0])
    assert len(timeline.times) == 11 and timeline.texts[0] == "" and timeline.end_payload.endswith(b"[DONE]\n\n")
    out = tmp_path / "leak.json"
    assert main(["bench", "leak", "--vllm-answers", str(recording), "--no-builtin", "--runs", "2", "--tokens", "10",
                 "--modes", "off,bucket", "--no-progress", "--json", str(out)]) == 0
    rows = {(r["path"], r["mode"]): r for r in json.loads(out.read_text())["variants"]}
    assert {r["source"] for r in rows.values()} == {"vllm (T=0, 4 different texts)"}
    assert rows["sse", "off"]["streams"] == rows["datagram", "off"]["streams"] == 8
    assert rows["sse", "off"]["token_length_recovery"] == 1.0  # one content event per write: the length is read
    assert rows["sse", "bucket"]["sizes_seen"] <= 2 and rows["sse", "bucket"]["identification_sizes"] == 0.25
