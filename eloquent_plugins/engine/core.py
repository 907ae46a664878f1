"""The token generator: deterministic corpus text at a configurable pace, no HTTP involved."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncGenerator, Iterator, Sequence

from eloquent_plugins.core.errors import InvalidArgument
from eloquent_plugins.engine.config import EngineConfig
from eloquent_plugins.engine.controls import EngineControls
from eloquent_plugins.engine.errors import EngineError
from eloquent_plugins.engine.stops import StopMatcher
from eloquent_plugins.engine.tokens import EngineStats, Token
from eloquent_plugins.engine.vocab import Corpus, default_corpus


def stable_hash(prompt: str, seed: int | None) -> int:
    """64-bit hash of prompt and seed that is the same in every process (unlike the builtin ``hash``)."""
    digest = hashlib.blake2b(f"{seed!r}\x00{prompt}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Engine:
    """Emits word pieces of the embedded prose, starting at a sentence picked by ``hash(prompt, seed)``.

    Pacing follows an absolute schedule (token ``i`` is due at ``start + ttft + i * tpot`` plus pauses), so a busy
    event loop delays tokens but never makes the pace drift. Counters live on the instance: ``running`` while a
    generator is active, then exactly one of ``completed``, ``aborted`` (cancelled or closed early) or ``failed``.
    """

    def __init__(self, config: EngineConfig | None = None, corpus: Corpus | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self.corpus = corpus if corpus is not None else default_corpus()
        self._running = 0
        self._completed = 0
        self._aborted = 0
        self._failed = 0

    @property
    def running(self) -> int:
        return self._running

    @property
    def completed(self) -> int:
        return self._completed

    @property
    def aborted(self) -> int:
        return self._aborted

    @property
    def failed(self) -> int:
        return self._failed

    def stats(self) -> EngineStats:
        return EngineStats(self._running, self._completed, self._aborted, self._failed)

    def tokens_for(self, prompt: str, *, max_tokens: int, seed: int | None) -> list[Token]:
        """The tokens ``generate`` would yield without stop strings, computed instantly (for tests/benchmarks)."""
        return list(self._plan(prompt, max_tokens, seed))

    def _plan(self, prompt: str, max_tokens: int, seed: int | None, skip: int = 0) -> Iterator[Token]:
        """The tokens of a generation, made one at a time: a server holding thousands of streams keeps one
        ``Token`` per stream alive instead of whole plans (fewer objects for every garbage collection to scan).
        ``skip``: the answer's first tokens are already out (a continuation); indices count from the next."""
        c = self.corpus
        size = len(c)
        start = c.sentence_starts[stable_hash(prompt, seed) % len(c.sentence_starts)]
        texts, ids = c.texts, c.ids
        last = max_tokens - 1
        for n in range(max_tokens):
            i = n + skip
            finish = "length" if n == last else None
            if i == 0:
                yield Token(c.bare_ids[start], c.bare_texts[start], 0, finish)
            else:
                j = (start + i) % size
                yield Token(ids[j], texts[j], n, finish)

    def continued(self, prompt: str, prefix: str, seed: int | None) -> tuple[str, int]:
        """Where the answer to ``prompt`` stands after ``prefix``: (the prompt to plan from, tokens to skip).
        A prefix this engine's own answer starts with continues that answer exactly (what greedy decoding does on
        a real model); any other prefix is part of the prompt of a new, still deterministic, answer."""
        if not prefix:
            return prompt, 0
        text, count = "", 0
        for token in self._plan(prompt, len(prefix) + 1, seed):
            if text == prefix or len(text) >= len(prefix):
                break
            text += token.text
            count += 1
        return (prompt, count) if text == prefix else (prompt + prefix, 0)

    async def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        seed: int | None,
        controls: EngineControls | None = None,
        stop: Sequence[str] = (),
        prefix: str = "",
    ) -> AsyncGenerator[Token, None]:
        """Yield ``max_tokens`` tokens (fewer if a ``stop`` string matches); the last carries finish_reason.
        ``prefix``: the start of the answer, already emitted; the tokens continue it (``continued``).

        Raises ``EngineError`` when ``controls.fail_after`` tokens have been produced.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        ctl = controls if controls is not None else EngineControls()
        cfg = self.config
        ttft = cfg.ttft if ctl.ttft is None else ctl.ttft
        tpot = cfg.tpot if ctl.tpot is None else ctl.tpot
        jitter = cfg.tpot_jitter
        rng = random.Random(stable_hash(prompt, seed)) if jitter > 0 and tpot > 0 else None
        pauses = ctl.pauses
        fail_after = ctl.fail_after
        prompt, skip = self.continued(prompt, prefix, seed)
        plan = self._plan(prompt, max_tokens, seed, skip)
        matcher = StopMatcher(stop) if stop else None
        loop = asyncio.get_running_loop()
        sleep = asyncio.sleep

        self._running += 1
        outcome = "aborted"  # anything that leaves early without finishing or failing is an abort
        try:
            deadline = loop.time() + ttft + pauses.get(0, 0.0)
            for token in plan:
                delay = deadline - loop.time()
                await sleep(max(0.0, delay))
                if fail_after is not None and token.index >= fail_after:
                    outcome = "failed"
                    raise EngineError(f"engine failed after {token.index} tokens (fail_after={fail_after})")
                if matcher is None:
                    if token.finish_reason is not None:
                        outcome = "completed"  # a consumer closing after the last token is not an abort
                    yield token
                else:
                    for out in matcher.push(token):
                        if out.finish_reason is not None:
                            outcome = "completed"
                        yield out
                    if outcome == "completed":
                        return
                step = tpot if rng is None else tpot * (1.0 + rng.uniform(-jitter, jitter))
                deadline += step + pauses.get(token.index + 1, 0.0)
        finally:
            self._running -= 1
            if outcome == "completed":
                self._completed += 1
            elif outcome == "failed":
                self._failed += 1
            else:
                self._aborted += 1
