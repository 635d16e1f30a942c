"""Generated tokens to streamed text, cut at stop strings.

A piece of text is sent only when no stop string could still begin in it: a tail that matches the start of
a stop string waits for the next token.  Shared by LLM's loop and the batch engine.
"""
from __future__ import annotations

from typing import Sequence

from . import tokenizer


class StopText:
    def __init__(self, tok, stops: Sequence[str]):
        self.detok = tokenizer.Detokenizer(tok)
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit = False  # a stop string was found: nothing more is sent

    def push(self, token: int) -> str:
        """The text that can be sent after this token ('' while a possible stop string is pending)."""
        self.pending += self.detok.push(token)
        cut = find_stop(self.pending, self.stops)
        if cut is not None:
            out, self.pending, self.hit = self.pending[:cut], "", True
            return out
        safe = safe_prefix(self.pending, self.stops)
        out, self.pending = self.pending[:safe], self.pending[safe:]
        return out

    def flush(self) -> str:
        """What is left at the end of the generation (cut at a stop string that the last bytes completed)."""
        if self.hit:
            return ""
        rest, self.pending = self.pending + self.detok.flush(), ""
        cut = find_stop(rest, self.stops)
        return rest[:cut] if cut is not None else rest


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def safe_prefix(text: str, stops: Sequence[str]) -> int:
    """How much of `text` can be sent: all but a tail that could start a stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold
