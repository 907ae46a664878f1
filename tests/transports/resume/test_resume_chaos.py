"""200 streams, each cut 5 times at random points by a TCP proxy: every client ends with exactly the text of the
uncut stream (no event lost or repeated), and no engine request is repeated or aborted."""

from __future__ import annotations

import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.chaos import CUTS, STREAMS, expected_texts, run_chaos
from tests.support.cutproxy import CutPlan, CutProxy
from tests.support.servers import UvicornThread


@pytest.fixture(scope="module")
def replica():
    engine = create_engine_app(EngineConfig())
    app = EloquentMiddleware(engine, StreamConfig(keepalive=1.0, resume_grace=30.0))
    with UvicornThread(app, backlog=2048) as srv:
        srv.engine = engine.state.engine
        yield srv


async def test_200_streams_cut_5_times_each_arrive_exactly_once(replica):
    plan = CutPlan(cuts={str(i): CUTS for i in range(STREAMS)}, cut_range=(1, 2500), seed=5)
    with CutProxy([replica.port], plan) as proxy:
        await run_chaos(proxy.url, plan, expected_texts(replica.engine))
    stats = replica.engine.stats()
    assert (stats.completed, stats.aborted, stats.running) == (STREAMS, 0, 0)  # no request repeated or aborted
