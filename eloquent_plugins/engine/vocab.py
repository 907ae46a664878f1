"""Word-piece tokenization of the embedded corpus, done once and shared read-only.

Pieces are "a word with its leading space" or "one punctuation mark (with its leading space)", which is close
enough to what a real BPE tokenizer emits for streaming to look realistic. Ids come from the sorted piece set,
so they are stable across processes and Python versions (no randomized ``hash()``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.engine.corpus_text import CORPUS_TEXT

#: A word (letters/digits with inner apostrophes or hyphens) or a single other non-space character, each with
#: at most one leading space (whitespace is normalised to single spaces first).
_PIECE_RE = re.compile(r" ?[A-Za-z0-9]+(?:['-][A-Za-z0-9]+)*| ?[^A-Za-z0-9 ]")
_SPACE_RE = re.compile(r"\s+")
_SENTENCE_END = frozenset({".", "!", "?"})


def count_pieces(text: str) -> int:
    """Number of pieces in ``text``: the built-in engine's notion of "prompt tokens"."""
    return sum(1 for _ in _PIECE_RE.finditer(_SPACE_RE.sub(" ", text)))


@dataclass(frozen=True, slots=True)
class Corpus:
    """The corpus as parallel tuples of piece texts and ids, plus where sentences start."""

    texts: tuple[str, ...]
    ids: tuple[int, ...]
    #: The same piece without its leading space (used for the first token of a reply), and its id.
    bare_texts: tuple[str, ...]
    bare_ids: tuple[int, ...]
    #: Indices into ``texts`` of pieces that begin a sentence: generation starts at one of these.
    sentence_starts: tuple[int, ...]
    vocab_size: int

    def __len__(self) -> int:
        return len(self.texts)


def build_corpus(text: str) -> Corpus:
    """Tokenize ``text`` and assign stable ids (sorted order of every piece and its bare form)."""
    # A leading space makes every word piece space-prefixed, so wrapping from the end back to the start reads
    # "... news. Alice" rather than "... news.Alice".
    pieces = _PIECE_RE.findall(" " + _SPACE_RE.sub(" ", text).strip())
    if not pieces:
        raise ConfigError("corpus text has no tokens")
    bare = [p.lstrip(" ") for p in pieces]
    vocab = {p: i for i, p in enumerate(sorted(set(pieces) | set(bare)))}
    starts = [0] + [i + 1 for i, p in enumerate(pieces[:-1]) if p.strip() in _SENTENCE_END and pieces[i + 1][0] == " "]
    return Corpus(
        texts=tuple(pieces),
        ids=tuple(vocab[p] for p in pieces),
        bare_texts=tuple(bare),
        bare_ids=tuple(vocab[b] for b in bare),
        sentence_starts=tuple(starts),
        vocab_size=len(vocab),
    )


@cache
def default_corpus() -> Corpus:
    """The embedded prose, tokenized once per process (immutable, so sharing it is safe)."""
    return build_corpus(CORPUS_TEXT)
