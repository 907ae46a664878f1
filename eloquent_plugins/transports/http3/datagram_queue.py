"""Per-connection datagram admission (sans-I/O): what may enter aioquic's DATAGRAM queue, and when.

aioquic queues datagrams without bound or expiry, so under loss a stale backlog builds up. The front end
therefore pulls a stream's packets only when the congestion controller has room, and parks what does not
fit here: at most one pending run per stream. For Eloquent a newer run *replaces* the parked one (it carries
every unacked event, so the older packets are superseded, never queued behind); for duplication, whose
packets carry only new events, runs are appended up to ``max_pending`` datagrams and the oldest dropped
beyond that (the sender's tail probe resends the run). Streams are served round-robin.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(slots=True)
class QueueStats:
    queued: int = 0
    superseded: int = 0
    """Parked datagrams replaced by a newer run before they could leave."""
    dropped: int = 0
    """Parked datagrams dropped over ``max_pending`` (duplication only)."""
    released: int = 0


class DatagramQueue:
    def __init__(self, *, max_pending: int = 64) -> None:
        self.max_pending = max_pending
        self.stats = QueueStats()
        self._runs: OrderedDict[int, deque[bytes]] = OrderedDict()

    def put(self, stream_id: int, datagrams: list[bytes], *, supersede: bool) -> None:
        if not datagrams:
            return
        run = self._runs.get(stream_id)
        if run is None or supersede:
            if run:
                self.stats.superseded += len(run)
            run = self._runs[stream_id] = deque()
        run.extend(datagrams)
        self.stats.queued += len(datagrams)
        while len(run) > self.max_pending:
            run.popleft()
            self.stats.dropped += 1

    def take(self, budget: int) -> list[tuple[int, bytes]]:
        """Datagrams that fit in ``budget`` bytes, one per stream per round, oldest first within a stream.
        The first datagram is released even if larger than the budget, so a stream can never starve."""
        out: list[tuple[int, bytes]] = []
        spent = 0
        while self._runs:
            progressed = False
            for stream_id in list(self._runs):
                run = self._runs[stream_id]
                if out and spent + len(run[0]) > budget:
                    continue
                datagram = run.popleft()
                out.append((stream_id, datagram))
                spent += len(datagram)
                progressed = True
                if not run:
                    del self._runs[stream_id]
                else:
                    self._runs.move_to_end(stream_id)
            if not progressed or spent >= budget:
                break
        self.stats.released += len(out)
        return out

    def discard(self, stream_id: int) -> None:
        self._runs.pop(stream_id, None)

    def pending(self, stream_id: int | None = None) -> int:
        if stream_id is not None:
            run = self._runs.get(stream_id)
            return len(run) if run else 0
        return sum(len(r) for r in self._runs.values())

    def __bool__(self) -> bool:
        return bool(self._runs)
