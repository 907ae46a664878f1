"""Two app replicas (separate processes) sharing a real redis-server: 200 streams cut 5 times each, every
reconnect going to the *other* replica; every client still gets exactly the uncut text, and each engine request
runs once, to completion."""

from __future__ import annotations

import httpx
import pytest

from eloquent_plugins.engine import Engine
from tests.support.chaos import CUTS, STREAMS, expected_texts, run_chaos
from tests.support.cutproxy import CutPlan, CutProxy
from tests.support.servers import UvicornProcess, redis_server


@pytest.fixture(scope="module")
def replicas():
    with redis_server() as url:
        # A generous grace: on a busy CI machine a client may take seconds to reconnect; what is tested here is
        # exactly-once delivery across replicas (the grace itself is tested in test_sse_middleware.py).
        env = {"ELOQUENT_RESUME_STORE": url, "ELOQUENT_KEEPALIVE": "1", "ELOQUENT_RESUME_GRACE": "30"}
        with UvicornProcess("tests.support.servers:engine_behind_middleware", env=env, factory=True) as a, \
                UvicornProcess("tests.support.servers:engine_behind_middleware", env=env, factory=True) as b:
            yield [a, b]


async def test_streams_resume_on_the_other_replica(replicas):
    ports = [r.port for r in replicas]
    plan = CutPlan(cuts={str(i): CUTS for i in range(STREAMS)}, cut_range=(1, 2500), seed=9)

    def other_replica_each_time(key: str, attempt: int) -> int:
        return ports[(int(key or 0) + attempt) % 2]

    with CutProxy(ports, plan, other_replica_each_time) as proxy:
        await run_chaos(proxy.url, plan, expected_texts(Engine()))
    assert all(plan.attempts[str(i)] >= CUTS + 1 for i in range(STREAMS))
    stats = [httpx.get(r.url + "/v1/engine/stats").json() for r in replicas]
    assert sum(s["completed"] for s in stats) == STREAMS and all(s["completed"] > 0 for s in stats)
    assert sum(s["aborted"] for s in stats) == 0 and sum(s["running"] for s in stats) == 0
