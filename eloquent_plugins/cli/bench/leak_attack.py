"""``bench leak``'s attacker: from the sizes and times of one stream's writes or datagrams (what a TLS or QUIC
observer sees), (a) each token's byte length and (b) which of the known answers was streamed.

(a) a table from what it sees (write size; datagram size and the size change since the previous datagram) to the
token length most often seen with it in the training runs; (b) 1-nearest-neighbour over three feature sets (the
size sequence, the histogram of sizes; the sequence of gaps between writes). Both leave one run out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Observed:
    """One stream as the observer sees it, and the truth it is scored against."""

    answer: int
    sizes: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    token_lengths: list[int | None] = field(default_factory=list)
    """Per write/datagram: the byte length of the one new token it carries (None: none, or several)."""
    raw_bytes: int = 0
    """The same writes' bytes without padding."""
    stall: float = 0.0
    latency: list[float] = field(default_factory=list)
    """Per token: from its generation to the first write/datagram that carries it."""
    generated: list[float] = field(default_factory=list)
    """SSE: when each token left the engine (loop time)."""


def _folds(observed: list[Observed], runs: int, answers: int) -> list[tuple[list[Observed], list[Observed]]]:
    """Leave one run out: stream ``k`` of each answer is run ``k // answers`` (``observe_*`` order them so)."""
    by_run: list[list[Observed]] = [[] for _ in range(runs)]
    counts: Counter[int] = Counter()
    for obs in observed:
        by_run[counts[obs.answer] % runs].append(obs)
        counts[obs.answer] += 1
    return [([o for j, r in enumerate(by_run) if j != k for o in r], by_run[k]) for k in range(runs)]


def token_length_recovery(observed: list[Observed], runs: int, answers: int, datagram: bool) -> tuple[float, float]:
    """The attacker's hit rate on single-token writes, and the baseline (always the most common length)."""
    hits = base_hits = total = 0
    for train, test in _folds(observed, runs, answers):
        fine: dict[tuple[int, int], Counter[int]] = {}
        coarse: dict[int, Counter[int]] = {}
        overall: Counter[int] = Counter()
        for obs in train:
            for key, n in _length_keys(obs, datagram):
                fine.setdefault(key, Counter())[n] += 1
                coarse.setdefault(key[0], Counter())[n] += 1
                overall[n] += 1
        mode = overall.most_common(1)[0][0] if overall else 0
        for obs in test:
            for key, n in _length_keys(obs, datagram):
                table = fine.get(key) or coarse.get(key[0])
                guess = table.most_common(1)[0][0] if table else mode
                hits += guess == n
                base_hits += mode == n
                total += 1
    return hits / max(1, total), base_hits / max(1, total)


def _length_keys(obs: Observed, datagram: bool) -> list[tuple[tuple[int, int], int]]:
    keys = []
    previous = 0
    for size, n in zip(obs.sizes, obs.token_lengths):
        if n is not None:
            keys.append(((size, size - previous if datagram else 0), n))
        previous = size
    return keys


def _features(obs: Observed, kind: str, length: int, classes: Sequence[int]) -> list[float]:
    sizes = [s / 64 for s in obs.sizes[:length]] + [0.0] * max(0, length - len(obs.sizes))
    if kind == "sizes":
        return sizes
    if kind == "gaps":
        t = obs.times
        return [(b - a) * 100 for a, b in zip(t, t[1:length])] + [0.0] * max(0, length - len(t))
    counts = Counter(obs.sizes)
    return [counts.get(c, 0) / 4 for c in classes]


def identification(observed: list[Observed], runs: int, answers: int, tokens: int) -> dict[str, float]:
    """1-NN accuracy per feature set (``sizes``, ``histogram``: the sizes; ``gaps``: the timing)."""
    classes = sorted({s for o in observed for s in o.sizes})
    out = {}
    for kind in ("sizes", "histogram", "gaps"):
        right = count = 0
        for train, test in _folds(observed, runs, answers):
            train_x = [(_features(o, kind, tokens + 4, classes), o.answer) for o in train]
            for obs in test:
                x = _features(obs, kind, tokens + 4, classes)
                guess = min(train_x, key=lambda t: math.dist(t[0], x))[1]
                right += guess == obs.answer
                count += 1
        out[kind] = right / max(1, count)
    return out
