"""The simulator's path: the same loss, trace, schedule and link models as ``PathModel``, sampled per time slot
so that every scheme meets the same network at the same moment.

Slots are the instants a one-packet-per-token-interval sender would send (each token's generation, plus one per
mean token interval through silences and after the end). The Gilbert-Elliott chain steps once per slot: a burst of
``burst`` means about that many token intervals in a row. The first packet any scheme sends in a slot gets the
slot's fate and delay draw, so schemes that send one packet per slot see exactly the same losses; further packets
in the same slot (duplicates, retransmissions, probes) continue the chain packet by packet from the slot's state
with draws of their own, the same for every scheme (seeded by the slot). This makes comparisons paired and the
oracle, which sends exactly the first packet of each slot, a bound for any scheme that does too.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.sim.netem.gilbert import GilbertElliott, LossProcess
from eloquent_plugins.sim.netem.path import Link, PathConfig, PathStats, deliver


@dataclass(frozen=True, slots=True)
class _Draw:
    lost: bool
    trace_u: float
    jitter_u: float


class SlottedPath:
    def __init__(self, config: PathConfig, seed: int, slots: Sequence[float], tail_step: float) -> None:
        if not slots or list(slots) != sorted(slots) or tail_step <= 0:
            raise ConfigError("slots must be a non-empty increasing sequence and tail_step > 0")
        self.config = config
        self.stats = PathStats()
        self._seed = seed
        self._starts = list(slots)
        self._tail_step = tail_step
        base = random.Random(seed)
        self._main = LossProcess(GilbertElliott(config.loss, config.burst), random.Random(base.getrandbits(64)))
        self._states: list[bool] = []
        self._draws: dict[int, list[_Draw]] = {}
        self._chains: dict[int, LossProcess] = {}
        self._rngs: dict[int, random.Random] = {}
        self._used: dict[int, int] = {}
        self._link = Link(config)

    @property
    def link(self) -> Link:
        """The bottleneck and delay, where cross traffic joins this path (``Link.through``)."""
        return self._link

    def slot_of(self, t: float) -> int:
        last = len(self._starts) - 1
        if t < self._starts[last]:
            return max(0, bisect.bisect_right(self._starts, t) - 1)
        return last + int((t - self._starts[last]) / self._tail_step)

    def slot_start(self, j: int) -> float:
        last = len(self._starts) - 1
        return self._starts[j] if j <= last else self._starts[last] + (j - last) * self._tail_step

    def _model(self, t: float) -> GilbertElliott:
        loss = self.config.config_loss(t)
        model = self._main.model
        return model if model.loss == loss else GilbertElliott(loss, self.config.burst)

    def _state(self, j: int) -> bool:
        while len(self._states) <= j:
            self._main.model = self._model(self.slot_start(len(self._states)))
            self._states.append(self._main.lost())
        return self._states[j]

    def _draw(self, j: int, c: int) -> _Draw:
        draws = self._draws.setdefault(j, [])
        while len(draws) <= c:
            rng = self._rngs.get(j)
            if rng is None:
                rng = self._rngs[j] = random.Random(f"{self._seed}/{j}")
            if not draws:
                lost = self._state(j)
                chain = LossProcess(self._model(self.slot_start(j)), rng)
                chain.resume(lost)  # extra packets continue from the slot's state
                self._chains[j] = chain
            else:
                lost = self._chains[j].lost()
            draws.append(_Draw(lost, rng.random(), rng.random()))
        return draws[c]

    def transmit(self, now: float, size: int) -> float | None:
        j = self.slot_of(now)
        c = self._used.get(j, 0)
        self._used[j] = c + 1
        draw = self._draw(j, c)
        return deliver(self.config, self._link, self.stats, now, size, lost=draw.lost, trace_u=draw.trace_u,
                       jitter_u=draw.jitter_u)
