"""Range checks for settings, defined once so every setting refuses NaN and infinity the same way.

``not 0 <= x < inf`` and not ``x < 0``: NaN passes every comparison, so ``x < 0`` would take it silently (a NaN
keep-alive interval turned keep-alives off, a NaN delay poisoned the simulator's clock). "Off" is spelled 0,
never infinity.
"""

from __future__ import annotations

import math

from eloquent_plugins.core.errors import ConfigError


def require_finite(name: str, value: object, *, minimum: float = 0.0, strict: bool = False,
                   error: type[ConfigError] = ConfigError) -> float:
    """``value`` unchanged if it is a real number (not a bool), finite and ``>= minimum`` (``> minimum`` when
    ``strict``); else ``error`` naming ``name``: "NAME must be a finite number >= MINIMUM, got VALUE"."""
    bound = f"{'>' if strict else '>='} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{name} must be a finite number {bound}, got {value!r}")
    above = value > minimum if strict else value >= minimum
    finite = not isinstance(value, float) or math.isfinite(value)  # an int is finite (and may overflow a float)
    if not (above and finite):
        raise error(f"{name} must be a finite number {bound}, got {value!r}")
    return value
