"""Stop-string matching over a token stream, holding back text that might still become a stop string.

Like vLLM's detokenizer: text is released only once it cannot be the start of a stop string, so the streamed
text never contains (part of) a stop string and equals the non-streamed text.
"""

from __future__ import annotations

from collections.abc import Sequence

from eloquent_plugins.core.errors import InvalidArgument
from eloquent_plugins.engine.tokens import Token


class StopMatcher:
    """Feed tokens in order with :meth:`push`; it returns the tokens that are safe to emit now."""

    def __init__(self, stops: Sequence[str]) -> None:
        if not stops or any(not s for s in stops):
            raise InvalidArgument("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._max_hold = max(len(s) for s in stops) - 1
        self._pending: list[Token] = []
        self._buf = ""

    def push(self, token: Token) -> list[Token]:
        """Add ``token``; the result's last token carries ``finish_reason`` once the stream is over."""
        self._pending.append(token)
        self._buf += token.text
        buf = self._buf
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            return self._finish_at(min(hits), token)
        if token.finish_reason is not None:
            rest, self._pending, self._buf = self._pending, [], ""
            return rest
        safe = len(buf) - self._held_suffix(buf)
        out: list[Token] = []
        used = 0
        while self._pending and used + len(self._pending[0].text) <= safe:
            first = self._pending.pop(0)
            used += len(first.text)
            out.append(first)
        self._buf = buf[used:]
        return out

    def _held_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a prefix of some stop string."""
        for k in range(min(self._max_hold, len(buf)), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0

    def _finish_at(self, cut: int, last: Token) -> list[Token]:
        out: list[Token] = []
        used = 0
        for tok in self._pending:
            if used + len(tok.text) > cut or tok is last:
                break
            out.append(tok)
            used += len(tok.text)
        out.append(Token(last.id, self._buf[used:cut], last.index, "stop"))
        self._pending, self._buf = [], ""
        return out
