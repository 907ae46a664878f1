"""``eloquent bench load --restart-every S`` (issue 25), a short real run: two ``eloquent serve`` replicas sharing
a redis-server behind nginx (TCP and UDP), each SIGTERMed once with a 1 s drain while SSE and HTTP/3 streams run.
Every started stream is counted once (completed, lost, refused or cut at the end), none is lost or refused, and
the restarts really handed streams over: some completed only by migrating to the other replica."""

from __future__ import annotations

import json

from eloquent_plugins.cli.bench import load


def test_rolling_restarts_lose_no_stream(tmp_path, capsys) -> None:
    out = tmp_path / "load.json"
    # Streams of ~3 s (30 tokens at 0.1 s): each slot is mid-stream whenever a 1 s drain ends.
    rc = load.main(["--sse", "8", "--h3", "4", "--h3-connections", "2", "--duration", "14", "--ramp", "1",
                    "--tpot", "0.1", "--ttft", "0.05", "--max-tokens", "30", "--resume-ttl", "10",
                    "--sample-interval", "1", "--restart-every", "5", "--drain-timeout", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    fleet = result["fleet"]
    print(printed)
    assert rc == 0 and result["errors"] == 0, (result["sse"]["examples"], result["h3"]["examples"])
    assert [r["replica"] for r in fleet["restarts"]][:2] == ["r0", "r1"], "each replica restarted in turn"
    migrated = 0
    for kind in ("sse", "h3"):
        r = result[kind]
        assert r["started"] == r["completed"] + r["lost"] + r["refused"] + r["cancelled"], r
        assert r["lost"] == 0 and r["refused"] == 0, r["examples"]
        assert r["completed"] >= 8 and 0 <= r["migrated"] <= r["completed"], r
        assert r["migration"]["splices"] >= r["migrated"], r["migration"]
        migrated += r["migrated"]
    assert sum(r["handed_over"] for r in fleet["restarts"]) > 0, "a drain deadline landed mid-stream"
    assert migrated > 0, "a handed-over stream completed on the other replica"
    assert fleet["server_migrated"] > 0, "the replicas counted the streams they continued"
    assert "rolling restarts: 2 replicas behind nginx" in printed
    assert all(r["ready_s"] > r["exit_s"] > 0 for r in fleet["restarts"])
