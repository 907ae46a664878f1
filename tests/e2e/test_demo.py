"""The CLI entry points of issue 4: ``eloquent demo`` (the README's first command), ``eloquent bench e2e``
and ``eloquent chat`` run to completion on their own and print what they promise."""

from __future__ import annotations

import json

from eloquent_plugins.cli.main import main


def test_demo_finishes_on_its_own_and_prints_the_stall_table(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["demo", "--quick", "--tpot-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a TTY: no ANSI, progress lines instead
    for label in ("Eloquent (datagrams)", "HTTP/3 stream (retransmission)", "duplication (datagrams x2)"):
        assert label in out
    assert out.count("identical") >= 3 and "text identical: True" in out


def test_bench_e2e_writes_the_summary(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "--requests", "1", "--tokens", "20", "--tpot-ms", "10", "--ttft-ms", "20",
                 "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    summary = data["summary"]
    assert summary["text_identical"] is True
    assert set(data["schemes"]) == {"eloquent", "stream", "duplicate"}
    assert {"stall_reduction_vs_retransmission", "stall_reduction_vs_duplication"} <= set(summary)
    assert "stall ratio" in capsys.readouterr().out


def test_chat_in_process_renders_and_reports(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["chat", "hello there", "--max-tokens", "15", "--loss", "0.1", "--rtt-ms", "40"]) == 0
    out = capsys.readouterr().out
    assert "events via eloquent" in out and "stall ratio" in out


def test_chat_reports_an_unreachable_server(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["chat", "hi", "--url", "https://127.0.0.1:9", "--insecure", "--timeout", "1"]) == 2
    assert "error" in capsys.readouterr().err
