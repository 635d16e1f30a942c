"""Prompt lookup: draft tokens for speculative decoding taken from the text itself.

Code edits, summaries and answers over a document repeat their input; when the last few tokens of the
sequence occurred before, the tokens that followed them then are a good guess for what follows now. The
model checks a draft of d tokens in one evaluation of d + 1 rows (about the cost of one decode step while
decode is bound by reading the weights) and keeps the longest prefix it agrees with, plus its own next
token, so a step yields 1 to d + 1 tokens and greedy output is unchanged (tests/test_lookup.py).
"""
from __future__ import annotations


class PromptLookup:
    """Drafts from the latest earlier occurrence of the sequence's last n tokens, n from `max_ngram` down to
    `min_ngram`; the draft length adapts: it grows after a fully accepted draft and falls to just past the
    accepted prefix after a rejection; a draft rejected outright pauses drafting for 1, 2, 4 .. 16 tokens (text
    that does not repeat its input pays for nothing but the lookups)."""

    def __init__(self, tokens: list[int], max_ngram: int = 4, min_ngram: int = 3, max_draft: int = 10):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.max_draft = self.draft_len = max_draft
        self.tokens: list[int] = []
        # n-gram -> the latest position where it starts and a token follows it
        self.index: dict[tuple[int, ...], int] = {}
        self.drafted = self.accepted = 0
        self.pause = self.skip = 0  # tokens to go without drafts after rejections, and how many are left
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            j = len(self.tokens)  # t's position: the n-grams ending just before it now have a follower
            for n in self.sizes:
                if j >= n:
                    self.index[tuple(self.tokens[j - n:j])] = j - n
            self.tokens.append(t)

    def propose(self, limit: int) -> list[int]:
        """Up to min(limit, the adaptive length) tokens that followed the last match, or [] (no match)."""
        limit = min(limit, self.draft_len)
        if self.skip > 0:
            self.skip -= 1
            return []
        if limit <= 0:
            return []
        ts = self.tokens
        for n in self.sizes:
            if len(ts) > n:
                i = self.index.get(tuple(ts[-n:]))
                if i is not None:
                    return ts[i + n:i + n + limit]
        return []

    def verified(self, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens had its first `accepted` confirmed."""
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.draft_len = min(self.max_draft, self.draft_len + 2)
        else:
            self.draft_len = max(2, accepted + 1)
        self.pause = 0 if accepted else min(16, max(1, 2 * self.pause))
        self.skip = self.pause
