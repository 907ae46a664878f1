"""Gilbert-Elliott bursty loss, parameterised the way people quote it: long-run loss rate and mean burst length.

Two states: Good (nothing lost) and Bad (everything lost). A loss burst is a stay in Bad, so its length is
geometric with mean ``burst`` = 1 / r (r: Bad->Good per packet); the Good->Bad probability p then follows from
the stationary loss rate p / (p + r) = ``loss``. ``burst=1`` is independent (Bernoulli) loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum, auto

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GilbertElliott:
    loss: float = 0.0
    """Long-run fraction of packets lost, in [0, 1)."""
    burst: float = 1.0
    """Mean number of consecutive packets lost per loss episode, >= 1."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ConfigError(f"loss rate must be in [0, 1), got {self.loss}")
        require_finite("mean burst length (packets)", self.burst, minimum=1.0)
        if self.p_good_to_bad > 1.0:
            raise ConfigError(f"loss {self.loss} is unreachable with mean burst {self.burst}: "
                              f"it needs loss <= burst / (burst + 1) = {self.burst / (self.burst + 1):.3f}")

    @property
    def p_bad_to_good(self) -> float:
        return 1.0 / self.burst

    @property
    def p_good_to_bad(self) -> float:
        return self.loss * self.p_bad_to_good / (1.0 - self.loss)


class ChainState(Enum):
    """Where one walk of the chain stands: one state at a time (was two booleans, ``bad`` and ``_started``)."""

    UNSTARTED = auto()
    """No packet yet: the first one draws from the stationary distribution."""
    GOOD = auto()
    BAD = auto()


class LossProcess:
    """One packet stream's walk through the Gilbert-Elliott chain; the parameters may change mid-stream
    (a loss schedule) while the state carries on. Owns no randomness: the caller's seeded ``rng`` drives it."""

    __slots__ = ("model", "state", "_rng")

    def __init__(self, model: GilbertElliott, rng: random.Random) -> None:
        self.model = model
        self._rng = rng
        self.state = ChainState.UNSTARTED

    @property
    def bad(self) -> bool:
        return self.state is ChainState.BAD

    @bad.setter
    def bad(self, bad: bool) -> None:
        """Put the walk in Bad or Good (it counts as started)."""
        self.state = ChainState.BAD if bad else ChainState.GOOD

    def resume(self, bad: bool) -> None:
        """Continue from a known state instead of a stationary draw (a chain branching off another one)."""
        self.bad = bad

    def lost(self, steps: int = 1) -> bool:
        """Advance ``steps`` packet slots (1 per packet; more after a silence) and say whether this one is lost."""
        model = self.model
        if model.loss <= 0.0:
            self.state = ChainState.GOOD
            return False
        if self.state is ChainState.UNSTARTED:
            bad = self._rng.random() < model.loss  # start in the stationary distribution
        else:
            # n-step transition of the two-state chain: the memory term (1 - p - r)^n fades towards the loss rate.
            memory = (1.0 - model.p_good_to_bad - model.p_bad_to_good) ** max(1, steps)
            p_bad = (model.loss + (1.0 - model.loss) * memory if self.state is ChainState.BAD
                     else model.loss * (1.0 - memory))
            bad = self._rng.random() < p_bad
        self.state = ChainState.BAD if bad else ChainState.GOOD
        return bad
