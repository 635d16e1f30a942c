"""Prompt lookup: draft tokens for speculative decoding (minfer.speculative) taken from the text itself.

Code edits, summaries and answers over a document repeat their input; when the last few tokens of the
sequence occurred before, the tokens that followed them then are a good guess for what follows now.  Free to
propose, strong where the text repeats, and exact like every draft (tests/test_lookup.py).
"""
from __future__ import annotations

from .speculative import MAX_DRAFT, DraftLength, Proposer


class PromptLookup(Proposer):
    """Drafts from the latest earlier occurrence of the sequence's last n tokens, n from `max_ngram` down to
    `min_ngram`, as long as the adaptive length (DraftLength; `policy`: one carried over from earlier calls)
    allows."""

    def __init__(self, tokens: list[int], max_ngram: int = 4, min_ngram: int = 3, max_draft: int = MAX_DRAFT,
                 policy: DraftLength | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.policy = policy or DraftLength(max_draft)
        self._count_from_here()
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.tokens: list[int] = []
        # n-gram -> the latest position where it starts and a token follows it
        self.index: dict[tuple[int, ...], int] = {}
        self.last_q = None  # drafts are deterministic: each is a point mass for Sampler.verify
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            j = len(self.tokens)  # t's position: the n-grams ending just before it now have a follower
            for n in self.sizes:
                if j >= n:
                    self.index[tuple(self.tokens[j - n:j])] = j - n
            self.tokens.append(t)

    def guess(self, room: int) -> list[int]:
        """Up to min(room, the adaptive length) tokens that followed the last match, or [] (no match)."""
        limit = self.policy.limit(room)
        if limit <= 0:
            return []
        ts = self.tokens
        for n in self.sizes:
            if len(ts) > n:
                i = self.index.get(tuple(ts[-n:]))
                if i is not None:
                    return ts[i + n:i + n + limit]
        return []
