"""Keep the atheris fuzz targets runnable, and replay every crash they found.

Each target in ``fuzz/`` runs a short, fixed-seed session (a few thousand inputs) in a subprocess and must exit
0; the long runs are ``fuzz/run.sh`` (see docs/SECURITY.md). The findings are replayed as plain regression
tests: the fixed ones must stay fixed, the open ones fail here until their module is fixed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.receiver import EloquentReceiver
from eloquent_plugins.core.sender import EloquentSender
from eloquent_plugins.core.sse_reader import SSEParser

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
CRASHES = FUZZ / "crashes"
TARGETS = ["wire", "sender_acks", "receiver", "sse_parser", "requests", "resume_ids"]
SMOKE_RUNS = 3000


def run_target(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FUZZ / f"fuzz_{target}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("target", TARGETS)
def test_target_runs_clean(target: str, tmp_path: Path) -> None:
    corpus = FUZZ / "corpus" / target
    assert corpus.is_dir() and any(corpus.iterdir()), f"no seed corpus for {target}"
    work = tmp_path / "corpus"
    work.mkdir()
    proc = run_target(target, f"-atheris_runs={SMOKE_RUNS}", "-seed=1", "-max_len=512",
                      f"-artifact_prefix={tmp_path}/", str(work), str(corpus))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"Done {SMOKE_RUNS} " in proc.stderr


@pytest.mark.parametrize("artifact", sorted(p.name for p in CRASHES.glob("*-crash-*")) or ["(none)"])
def test_libfuzzer_artifacts_replay_clean(artifact: str) -> None:
    """Crash files the runner saved (``fuzz/crashes/<target>-crash-*``) pass, strictly, once their bug is fixed."""
    if artifact == "(none)":
        return
    target = artifact.split("-crash-")[0]
    proc = run_target(target, str(CRASHES / artifact))
    assert proc.returncode == 0, proc.stderr[-4000:]


# ---- fixed findings ------------------------------------------------------------------------------------------

def test_sse_raw_keeps_a_crlf_split_across_feeds() -> None:
    """The LF of a CRLF cut between two ``feed`` calls was dropped from ``SSEMessage.raw``."""
    stream = (CRASHES / "sse-split-crlf.bin").read_bytes()
    whole = SSEParser().feed(stream)
    parser = SSEParser()
    split = parser.feed(stream[:8]) + parser.feed(stream[8:])
    assert [m.raw for m in split] == [m.raw for m in whole] == [b"data: a\r\n\r\n", b"data: b\r\n\r\n"]
    parser = SSEParser()
    cut_mid_message = parser.feed(b"data: a\r") + parser.feed(b"\ndata: b\n\n")
    assert cut_mid_message[0].raw == b"data: a\r\ndata: b\n\n"


def test_sse_parser_many_lines_in_one_chunk() -> None:
    """A chunk of many short lines (a replay burst, or a hostile upstream) parses in one linear pass."""
    n = 50_000
    parser = SSEParser()
    assert parser.feed(b"\n" * n) == []
    messages = parser.feed(b"data: x\r\n\r\n" * n)
    assert len(messages) == n and messages[-1].data == "x"


def test_receiver_drops_stale_duplicates() -> None:
    """A datagram reordered behind hundreds of acks must not re-enter the out-of-order buffer."""
    sender, receiver = EloquentSender(0), EloquentReceiver(0)
    now = 0.0

    def exchange(datagrams: list[bytes]) -> None:
        for datagram in datagrams:
            receiver.receive_datagram(datagram, now)
        for ack in receiver.datagrams_to_send(now):
            sender.receive_datagram(ack, now)

    sender.push(b"first-event-payload", now)
    exchange(sender.datagrams_to_send(now))
    sender.push(b"aaaa", now)
    sender.push(b"bbbb", now)
    late = sender.datagrams_to_send(now)
    exchange(late)
    for i in range(600):
        now += 0.01
        sender.push(b"event %d" % i, now)
        exchange(sender.datagrams_to_send(now))
    before = receiver.stats.duplicate_entries
    for datagram in late:
        assert receiver.receive_datagram(datagram, now) == []
    assert receiver.next_expected == 603
    assert receiver._buffer == {} and receiver._buffered_bytes == 0
    assert receiver.stats.duplicate_entries == before + 2


# ---- open findings (docs/SECURITY.md): a hostile request must get a 4xx, never a 500 -------------------------

async def post(headers: list[tuple[bytes, bytes]], body: bytes, path: str = "/v1/completions") -> tuple[int, Any]:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body_out)


@pytest.mark.parametrize("name", ["requests-overflow-temperature.json", "requests-overflow-ttft.json"])
async def test_fixed_findings_huge_json_integer_is_a_400(name: str) -> None:
    body = (CRASHES / name).read_bytes()
    status, answer = await post([(b"content-type", b"application/json")], body)
    assert status == 400, answer


async def test_fixed_findings_unhashable_role_is_a_400() -> None:
    body = (CRASHES / "requests-unhashable-role.json").read_bytes()
    status, answer = await post([(b"content-type", b"application/json")], body, "/v1/chat/completions")
    assert status == 400, answer


async def test_fixed_findings_unicode_digit_content_length_is_a_400() -> None:
    raw = (CRASHES / "requests-content-length-superscript.http").read_bytes()
    head, _, body = raw.partition(b"\r\n\r\n")
    headers = [tuple(line.split(b": ", 1)) for line in head.split(b"\r\n")[1:]]
    headers = [(k.lower(), v) for k, v in headers]
    status, answer = await post(headers, body)
    assert status == 400, answer
