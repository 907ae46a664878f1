"""The JavaScript client (eloquent_plugins/static/*.js, entry eloquent.js; client/js/eloquent.js re-exports it).

Its tests are node's (tests/js/*.test.mjs); they run from here so that CI's pytest covers them, and fail loudly
where node is missing. The wire vectors they check the JS port against are regenerated here from the Python core,
so a change on the Python side cannot leave the committed vectors (and the JS client) silently behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest

from tests.support.make_vectors import write_vectors
from tests.support.servers import eloquent_serve

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "vectors"
MIN_NODE = 20


def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail(f"node (>= {MIN_NODE}) is not installed; the JavaScript client's tests need it "
                    "(Debian/Ubuntu: apt-get install nodejs)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < MIN_NODE:
        pytest.fail(f"node {version} is too old; the JavaScript client's tests need node >= {MIN_NODE}")
    return path


def test_committed_vectors_match_the_python_core(tmp_path: Path) -> None:
    written = write_vectors(tmp_path)
    assert sorted(p.name for p in VECTORS.glob("*.json")) == sorted(p.name for p in written)
    stale = [p.name for p in written if p.read_bytes() != (VECTORS / p.name).read_bytes()]
    assert not stale, (f"tests/vectors/{', '.join(stale)} no longer match what the Python core produces: if the "
                       "change is intended, run `python tests/support/make_vectors.py` and make the JS client pass")
    assert sum(p.stat().st_size for p in written) < 200_000


def test_node_tests_pass_against_vectors_and_a_real_server() -> None:
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "js").glob("*.test.mjs"))
    assert tests
    with eloquent_serve("--stream-transport", "sse", "--tpot", "0.02", "--keepalive", "1") as port:
        env = {**os.environ, "ELOQUENT_TEST_ORIGIN": f"http://127.0.0.1:{port}"}
        result = subprocess.run([node(), "--test", "--test-reporter=tap", *tests], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-8000:]
    counts = {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", out, re.M)}
    assert counts.get("tests", 0) > 0, out[-3000:]
    assert counts["pass"] == counts["tests"] and counts.get("fail") == 0, counts
    assert counts.get("skipped", 0) == 0, "the tests against the real server did not run"


def test_the_package_ships_the_one_copy_of_the_client() -> None:
    static = files("eloquent_plugins") / "static"
    shipped = static / "eloquent.js"  # the entry: it re-exports the modules beside it (tests/js/modules.test.mjs)
    assert shipped.is_file() and 'from "./eloquent_client.js"' in shipped.read_text(encoding="utf-8")
    assert "export class EloquentClient" in (static / "eloquent_client.js").read_text(encoding="utf-8")
    entry = (static / "client.js").read_text(encoding="utf-8")  # /eloquent/client.js: the client and eloquentFetch
    assert 'from "./eloquent.js"' in entry and 'from "./fetch.js"' in entry
    assert "export function createEloquentFetch" in (static / "fetch.js").read_text(encoding="utf-8")
    assert 'from "../../eloquent_plugins/static/client.js"' in (ROOT / "client/js/eloquent.js").read_text()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "static/*.js" in package_data["eloquent_plugins"]
