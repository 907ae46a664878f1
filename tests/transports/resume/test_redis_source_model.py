"""RedisSource against a simple model (no Redis): whatever order, gaps, duplicates, pauses, trims and connection
resets its feed brings, a reader gets exactly the events in order, once each, or an honest end (``EventsGone``
before the body, a cut after) -- never a silent gap and never a complete-looking end of an incomplete stream."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.log import EventsGone
from eloquent_plugins.transports.resume.redis_store import RedisSource

META = StreamMeta("s-1", "owner", 200, (), "/v1/chat/completions", "openai")


def frame(i: int) -> bytes:
    return b"event %d" % i


def eid(i: int) -> bytes:
    return b"%d-1" % i


class Reset(ConnectionResetError):
    """What a killed Redis connection looks like to the reader (an OSError, as redis-py's own are retried too)."""


@dataclass
class FakeRedis:
    """One Redis stream as the producer leaves it: events ``lo..hi-1`` kept (older ones trimmed), then the end."""

    total: int
    hi: int = 0
    lo: int = 0
    ended: bool = False
    faults: int = 0
    """The next this many calls fail as a connection reset does."""
    perturb: list[str] = field(default_factory=list)
    """How the next XREAD replies are mangled: ``dup`` (older entries first), ``gap`` (one entry left out),
    ``shuffle`` (out of order)."""
    lost: bool = False
    """Ground truth: some reply could not continue where it was asked to (the entries were trimmed)."""
    mangled: bool = False
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def _entries(self, start: int, count: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        if start < self.lo and self.hi > self.lo:
            self.lost = True
        out: list[tuple[bytes, dict[bytes, bytes]]] = [
            (eid(i), {b"f": frame(i)}) for i in range(max(start, self.lo), self.hi)][:count]
        if self.ended and len(out) < count and start <= self.hi:
            out.append((eid(self.hi), {b"end": b"complete"}))
        return out

    def _fault(self) -> None:
        if self.faults:
            self.faults -= 1
            raise Reset("connection reset by peer")

    async def xrange(self, key: str, min: str, max: str, count: int) -> list[Any]:  # noqa: A002 - redis-py's
        self._fault()
        return self._entries(int(min.partition("-")[0]), count)

    async def xrevrange(self, key: str, max: str, min: str, count: int) -> list[Any]:  # noqa: A002
        self._fault()
        if self.ended:
            return [(eid(self.hi), {b"end": b"complete"})]
        return [(eid(self.hi - 1), {b"f": frame(self.hi - 1)})] if self.hi else []

    async def xread(self, streams: dict[str, str], count: int, block: int) -> list[Any]:
        self._fault()
        (key, after), = streams.items()
        start = 0 if after == "0-0" else int(after.partition("-")[0]) + 1
        entries = self._entries(start, count)
        if self.perturb and entries:
            how = self.perturb.pop(0)
            if how == "dup" and self.lo < start:
                entries = [(eid(i), {b"f": frame(i)}) for i in range(max(self.lo, start - 3), start)] + entries
            elif how == "gap" and len(entries) > 1:
                del entries[self.rng.randrange(len(entries) - 1)]
                self.mangled = True
            elif how == "shuffle" and len(entries) > 1:
                self.rng.shuffle(entries)
                self.mangled = entries != sorted(entries, key=lambda e: int(e[0].partition(b"-")[0]))
        return [(key, entries)] if entries else []

    def pipeline(self, transaction: bool = False) -> FakePipe:
        return FakePipe(self)


class FakePipe:
    def __init__(self, redis: FakeRedis) -> None:
        self.redis, self.calls = redis, 0

    def exists(self, key: str) -> None:
        self.calls += 1

    async def execute(self) -> list[int]:
        self.redis._fault()
        return [1] * self.calls  # the stream and the producer's heartbeat are there


class FakeStore:
    def __init__(self, redis: FakeRedis, read_retry_for: float) -> None:
        self.redis = redis
        self.retry_first = self.retry_max = 0.0
        self.read_retry_for = read_retry_for

    def key(self, kind: str, token: str) -> str:
        return f"t:{kind}:{token}"


steps = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.integers(1, 40)),
    st.tuples(st.just("trim"), st.integers(1, 30)),  # keep only the last n entries (XADD MAXLEN)
    st.tuples(st.just("read"), st.integers(1, 6)),  # reader loop turns; no "read" for a while is a pause
    st.tuples(st.just("fault"), st.integers(1, 3)),  # connection resets
    st.tuples(st.just("perturb"), st.sampled_from(["dup", "gap", "shuffle"])),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(0, 120), first=st.integers(0, 40), start_frac=st.floats(0, 1), plan=steps,
       patient=st.booleans())
def test_a_redis_reader_gets_every_event_once_in_order_or_an_honest_end(total: int, first: int, start_frac: float,
                                                                     plan: list[tuple[str, Any]],
                                                                     patient: bool) -> None:
    asyncio.run(scenario(total, first, start_frac, plan, patient))


async def scenario(total: int, first: int, start_frac: float, plan: list[tuple[str, Any]], patient: bool) -> None:
    redis = FakeRedis(total)
    redis.hi = min(first, total)
    start = int(start_frac * redis.hi)
    source = RedisSource(FakeStore(redis, 1e9 if patient else 0.0), "tok", META)  # type: ignore[arg-type]
    try:
        await source.check(start)
    except EventsGone:
        assert redis.lo > start, "EventsGone before the body although the events were kept"
        return
    assert redis.lo <= start
    out: list[bytes] = []
    cursor = start
    wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    benign = True

    async def turn() -> bool:
        nonlocal cursor
        frames = source.take(cursor)
        if frames:
            out.extend(frames)
            cursor += len(frames)
            return False
        if source.ended(cursor):
            return True
        await source.wait(cursor, 0.01, wake)
        return False

    def produce(n: int) -> None:
        redis.hi = min(redis.total, redis.hi + n)
        if redis.hi == redis.total:
            redis.ended = True

    done = False
    for op, arg in plan:
        if done:
            break
        if op == "produce":
            produce(arg)
        elif op == "trim":
            redis.lo = max(redis.lo, redis.hi - arg)
        elif op == "fault":
            redis.faults += arg
            benign = benign and patient
        elif op == "perturb":
            redis.perturb.append(arg)
        else:
            for _ in range(arg):
                if done := await turn():
                    break
    # The producer finishes and nothing else goes wrong: the reader must reach an end.
    produce(total)
    for _ in range(4 * total + 400):
        if done or (done := await turn()):
            break
    assert done, "the reader never reached an end"
    # Safety, always: what came out is exactly the events from the resume point on, in order, each once.
    assert out == [frame(i) for i in range(start, start + len(out))], "a silent gap or a repeat"
    if source.end_reason == "complete":
        assert start + len(out) == total, "complete-looking end of an incomplete stream"
    else:
        assert source.end_reason == "disconnected" and source.gone
        # Honest: a cut only when something really was missing (trimmed, mangled) or Redis kept failing.
        assert redis.lost or redis.mangled or not benign, f"cut without cause: {source.gone}"


def test_absorb_never_rebases_over_a_gap() -> None:
    """The defect of issue 18: an empty buffer took whatever index arrived next (here 300 after 49)."""
    source = RedisSource(FakeStore(FakeRedis(0), 0.0), "tok", META)  # type: ignore[arg-type]
    source._absorb([(eid(i), {b"f": frame(i)}) for i in range(50)])
    assert source.take(0) == [frame(i) for i in range(50)]
    assert source.take(50) == []
    try:
        source._absorb([(eid(i), {b"f": frame(i)}) for i in range(300, 310)])
    except EventsGone:
        pass
    else:
        raise AssertionError("a gap was absorbed")
    source._cut(50, "test")
    assert source.take(50) == [] and source.ended(50) and source.end_reason == "disconnected"
