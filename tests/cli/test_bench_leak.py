"""``bench leak`` (issue 29), run tiny: the attacker's figures come out for each path and mode, and they say what
they should: without padding the sizes name the answer and the token lengths, with ``bucket`` every write takes
one of the classes and the sizes name nothing (the tiny run's answers all fit the smallest classes)."""

from __future__ import annotations

import json
from pathlib import Path

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
