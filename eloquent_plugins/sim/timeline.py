"""The token timeline every scheme streams: when each token is generated and the bytes an SSE chatbot sends.

Time per output token: steady decode (mean ``tpot``) with log-normal jitter, plus occasional long gaps (another
request's prefill, a preemption) of ``gap_min``..``gap_max`` times ``tpot``. Token texts follow English subword
statistics (about 4 characters, a leading space on most, some punctuation, line breaks and non-ASCII), each
wrapped in the OpenAI chat chunk that vLLM and TGI's chat route stream (``data: {...}\\n\\n``, ~200 bytes).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError

_WORDS = ("the of and to in is that it for as with was on be by this are or from at an which have not but "
          "model token stream network packet loss latency server client request response language people time "
          "however because between through important different example following information performance "
          "system results approach design each other into more about can will would should could when where "
          "while these those their there here first second also only very much many such data value").split()
_PIECES = ("ing", "ed", "ly", "tion", "er", "s", "al", "ment", "ness", "able", "ize", "ous")
_PUNCT = (".", ",", ":", ";", "?", "!", ")", " (", "\n\n", "\n", " -", "**")
_NON_ASCII = (" café", "é", " —", " naïve", "’s", " 😀")

_PREFIX_TEMPLATE = ('data: {{"id":"chatcmpl-{rid}","object":"chat.completion.chunk","created":{created},'
                    '"model":"Llama-3.1-8B-Instruct","choices":[{{"index":0,"delta":{{"content":')
_SUFFIX = '},"finish_reason":null}]}\n\n'


@dataclass(frozen=True, slots=True)
class TokenModel:
    tokens: int = 300
    tpot: float = 0.030
    """Mean seconds per output token in steady decode."""
    tpot_sigma: float = 0.25
    """Log-normal shape of steady decode gaps (coefficient of variation about 0.25)."""
    gap_probability: float = 0.02
    """Chance that a gap is a long one."""
    gap_min: float = 4.0
    gap_max: float = 12.0
    """Long gaps last gap_min..gap_max times ``tpot``."""

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ConfigError(f"a stream needs at least one token, got {self.tokens}")
        require_finite("tpot (seconds)", self.tpot, strict=True)
        require_finite("tpot_sigma", self.tpot_sigma)
        require_finite("gap_min", self.gap_min, strict=True)
        require_finite("gap_max", self.gap_max, strict=True)
        if not 0 <= self.gap_probability <= 1 or not self.gap_min <= self.gap_max:
            raise ConfigError("bad long-gap or jitter parameters in the token model")


DECODES = ("jittered", "steady")
"""How decode times are drawn: ``jittered`` (``TokenModel``'s log-normal jitter and long gaps, the default) or
``steady`` (every token exactly ``tpot`` after the one before, as the built-in engine ``bench e2e`` streams)."""


def token_model(tokens: int, tpot: float, decode: str = "jittered") -> TokenModel:
    """The scenario's token model; ``steady`` compares a simulated stream token for token with an end-to-end one
    (docs/results/real-links.md, point 10)."""
    if decode not in DECODES:
        raise ConfigError(f"decode must be one of {', '.join(DECODES)}, got {decode!r}")
    model = TokenModel(tokens=tokens, tpot=tpot)
    return model if decode == "jittered" else replace(model, tpot_sigma=0.0, gap_probability=0.0)


@dataclass(frozen=True, slots=True)
class Timeline:
    times: tuple[float, ...]
    """Generation time of each token, seconds from the stream start; the first is 0."""
    texts: tuple[str, ...]
    payloads: tuple[bytes, ...]
    """Each token's SSE event as sent on the wire."""
    end_payload: bytes
    """What follows the last token: the finish chunk and ``data: [DONE]``."""

    @property
    def mean_gap(self) -> float:
        return (self.times[-1] - self.times[0]) / max(1, len(self.times) - 1)


def _token_text(rng: random.Random) -> str:
    u = rng.random()
    if u < 0.62:
        return " " + rng.choice(_WORDS)
    if u < 0.80:
        return rng.choice(_PIECES)
    if u < 0.95:
        return rng.choice(_PUNCT)
    if u < 0.98:
        return rng.choice(_NON_ASCII)
    return " " + str(rng.randrange(0, 2000))


def sse_chunk(prefix: str, text: str) -> bytes:
    return (prefix + json.dumps(text) + _SUFFIX).encode()


def generate_timeline(model: TokenModel, rng: random.Random) -> Timeline:
    rid = "%024x" % rng.getrandbits(96)
    prefix = _PREFIX_TEMPLATE.format(rid=rid, created=1764400000 + rng.randrange(100000))
    mu = -model.tpot_sigma ** 2 / 2  # so the log-normal factor has mean 1
    times: list[float] = []
    t = 0.0
    for i in range(model.tokens):
        if i:
            if rng.random() < model.gap_probability:
                t += model.tpot * rng.uniform(model.gap_min, model.gap_max)
            else:
                t += model.tpot * math.exp(rng.gauss(mu, model.tpot_sigma))
        times.append(t)
    texts = tuple(_token_text(rng) for _ in range(model.tokens))
    finish = prefix.replace('"delta":{"content":', '"delta":{') + "}" + \
        ',"finish_reason":"stop"}]}\n\n'
    end = (finish + "data: [DONE]\n\n").encode()
    return Timeline(tuple(times), texts, tuple(sse_chunk(prefix, x) for x in texts), end)
