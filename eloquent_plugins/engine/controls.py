"""Per-request test/benchmark controls, read from the optional ``eloquent_engine`` body field.

Example: ``{"ttft": 0, "tpot": 0.01, "pauses": {"0": 10, "5": 10}, "fail_after": 20}`` -- no first-token
delay, 10 ms per token, 10 s of silence before token 0 and before token 5, and an ``EngineError`` when
token 20 is due. Keep-alive, resume and failure tests build their scenarios from these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.engine.errors import invalid

#: No single delay may exceed this (seconds), so a typo cannot park a request for days.
MAX_DELAY_S = 3600.0
#: At most this many pause entries per request.
MAX_PAUSES = 1024
_PARAM = "eloquent_engine"
_KEYS = frozenset({"ttft", "tpot", "pauses", "fail_after"})


@dataclass(frozen=True)
class EngineControls:
    """Overrides for one generation; ``None`` means "use the engine's configuration"."""

    ttft: float | None = None
    tpot: float | None = None
    #: Extra silence (seconds) inserted before the token with this index.
    pauses: Mapping[int, float] = field(default_factory=dict)
    #: Raise ``EngineError`` when this many tokens have been produced.
    fail_after: int | None = None

    @classmethod
    def from_json(cls, obj: Any) -> EngineControls:
        """Validate the JSON value of ``eloquent_engine``; raises a 400 ``APIError`` on bad input."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise invalid(f"'{_PARAM}' must be an object", _PARAM)
        unknown = sorted(set(obj) - _KEYS)
        if unknown:
            raise invalid(f"'{_PARAM}' has unknown keys {unknown}; allowed: {sorted(_KEYS)}", _PARAM)
        pauses_raw = obj.get("pauses")
        pauses: dict[int, float] = {}
        if pauses_raw is not None:
            if not isinstance(pauses_raw, dict):
                raise invalid(f"'{_PARAM}.pauses' must be an object of token index -> seconds", f"{_PARAM}.pauses")
            if len(pauses_raw) > MAX_PAUSES:
                raise invalid(f"'{_PARAM}.pauses' has more than {MAX_PAUSES} entries", f"{_PARAM}.pauses")
            for key, value in pauses_raw.items():
                if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
                    raise invalid(
                        f"'{_PARAM}.pauses' keys must be token indices (decimal digits), got {key!r}",
                        f"{_PARAM}.pauses",
                    )
                pauses[int(key)] = _delay(value, f"{_PARAM}.pauses.{key}")
        fail_after = obj.get("fail_after")
        if fail_after is not None and (
            isinstance(fail_after, bool) or not isinstance(fail_after, int) or fail_after < 0
        ):
            raise invalid(f"'{_PARAM}.fail_after' must be an integer >= 0", f"{_PARAM}.fail_after")
        ttft, tpot = obj.get("ttft"), obj.get("tpot")
        return cls(
            ttft=None if ttft is None else _delay(ttft, f"{_PARAM}.ttft"),
            tpot=None if tpot is None else _delay(tpot, f"{_PARAM}.tpot"),
            pauses=pauses,
            fail_after=fail_after,
        )


def _delay(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise invalid(f"'{param}' must be a number of seconds", param)
    if not 0 <= value <= MAX_DELAY_S:
        raise invalid(f"'{param}' must be between 0 and {MAX_DELAY_S:g} seconds", param)
    return float(value)
