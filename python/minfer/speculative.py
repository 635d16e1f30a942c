"""Speculative decoding: how many tokens to draft, and the check of a draft against the target's logits.

A proposer (minfer.lookup: n-grams of the text itself; minfer.draft: a small model with the same vocabulary)
guesses the next tokens d1..dk.  The target evaluates its last token and the guesses in one step of k + 1
rows, which costs about one decode step while decode is bound by reading the weights.  Row i holds the
target's logits for the slot d(i+1) was guessed for; the sampler keeps each guess in turn (Sampler.verify:
greedy keeps it iff it is the argmax, sampling keeps it with probability min(1, p/q) and otherwise draws from
max(0, p - q), which leaves the output distributed exactly as without speculation).  The first guess not kept
is replaced by the token the sampler drew instead; if all are kept, the last row gives one more token.  The KV
entries past the last kept token are overwritten by the next step, which starts at its position.
"""
from __future__ import annotations

import time


# Drafts of at most 7 tokens: a check of 8 rows, a whole pass of the CPU's multi-token kernels (9 rows cost
# ~25 % more than 8; measured in benchmarks/NOTES.md, Speculative decoding).
MAX_DRAFT = 7


class DraftLength:
    """The adaptive draft length and pauses of one proposer.  The length grows by 2 after a draft kept whole and
    falls to just past the kept prefix after a rejection.  Drafting pauses where it does not pay, measured in
    the decode's own seconds: after a draft rejected outright (for 1, 2, 4 .. 16 tokens, and from the second
    failure in a row at least as many as keep a failed attempt's cost beyond a plain step under 5 % of the
    plain steps it is spread over), after a proposal that took time and proposed nothing (a draft model unsure
    of every token) by the same rule, and
    when speculative steps' seconds per token exceed a plain step's (8, 16 .. 64 tokens; measured afresh
    after)."""

    MAX_PAUSE = 256  # tokens
    SHARE = 0.05  # what a failed attempt may add to the plain steps after it

    def __init__(self, max_draft: int, timed: bool = True):
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.timed = timed  # False: pauses by rejections alone, the same on any machine (tests)
        self.max_draft = self.length = max_draft
        self.pause = self.skip = 0  # the last pause after a failure, and the tokens still to go without drafts
        self.slow = 0               # the last pause for speculation that did not pay
        self.plain_s = self.spec_s = None  # seconds per token of plain and speculative steps (moving averages)
        self.drafted = self.accepted = 0

    def limit(self, room: int) -> int:
        """How many tokens to draft now (0 while paused), at most `room`."""
        if self.skip > 0:
            self.skip -= 1
            return 0
        return max(0, min(room, self.length))

    def paused(self) -> int:
        """Tokens still to go without drafts."""
        return self.skip

    def skip_tokens(self, n: int) -> None:
        """`n` tokens were decoded without asking for drafts (a device's chained greedy steps)."""
        self.skip = max(0, self.skip - n)

    def plain_step(self, seconds: float) -> None:
        """A step without a draft took `seconds` for its one token."""
        if not self.timed:
            return
        self.plain_s = seconds if self.plain_s is None else 0.7 * self.plain_s + 0.3 * seconds

    def _failed(self, extra_s: float) -> None:
        """An attempt that gained nothing and cost `extra_s` beyond a plain step."""
        self.pause = min(16, max(1, 2 * self.pause))
        need = 0
        if self.pause > 1 and self.plain_s and extra_s > 0:  # failures in a row: their cost sets the pause too
            need = int(extra_s / (self.SHARE * self.plain_s)) + 1
        self.skip = max(self.skip, min(self.MAX_PAUSE, max(self.pause, need)))

    def nothing_proposed(self, seconds: float) -> None:
        """A proposal came back empty after `seconds` (free for prompt lookup, a model step for a draft)."""
        if self.plain_s is not None and seconds > self.SHARE * self.plain_s:
            self._failed(seconds)

    def verified(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        """A draft of `drafted` tokens had its first `accepted` kept; proposing and checking it took `seconds`
        (for accepted + 1 tokens)."""
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.length = min(self.max_draft, self.length + 2)
        else:
            self.length = max(2, accepted + 1)
        if accepted:
            self.pause = 0
        else:
            self._failed(seconds - self.plain_s if seconds is not None and self.plain_s else 0.0)
        if seconds is None:
            return
        per = seconds / (accepted + 1)
        self.spec_s = per if self.spec_s is None else 0.7 * self.spec_s + 0.3 * per
        if self.plain_s is not None and self.spec_s > self.plain_s:
            self.slow = min(64, max(8, 2 * self.slow))
            self.skip = max(self.skip, self.slow)
            self.spec_s = None  # measured afresh when drafting resumes
        elif self.plain_s is not None:
            self.slow = 0


class StepJudge:
    """Whether speculation pays in the batch engine, judged per step, engine-wide (a step's draft rows and the
    draft model's steps delay every sequence in it): seconds per generated token of a step with drafts against
    one without; where they cost more, no sequence drafts for 8, 16 .. 64 steps.  A rest does not spare the
    draft model the tokens it did not see (it reads them when it drafts again), so after two such steps of its
    drafts in a row the running sequences stop using it (new requests try again)."""

    def __init__(self):
        self.plain_s: float | None = None      # a plain decode step's seconds (moving average)
        self.plain_tok_s: float | None = None  # ... and per sequence in it
        self.rest = self.rested = self.losses = 0  # steps still to rest, the last rest, draft-model losses in a row

    def resting(self) -> bool:
        """Whether this step goes without drafts (counts the rest down)."""
        if not self.rest:
            return False
        self.rest -= 1
        return True

    def plain_step(self, seconds: float, n_seqs: int) -> None:
        self.plain_s = seconds if self.plain_s is None else 0.7 * self.plain_s + 0.3 * seconds
        per = seconds / n_seqs
        self.plain_tok_s = per if self.plain_tok_s is None else 0.7 * self.plain_tok_s + 0.3 * per

    def spec_step(self, seconds: float, made: int, drafted_by_model: bool) -> bool:
        """A decode step with drafts took `seconds` (the draft model's included) for `made` tokens; returns whether
        the running sequences should stop using the draft model."""
        if seconds / max(made, 1) <= self.plain_tok_s:
            self.rested = self.losses = 0
            return False
        self.rested = min(64, max(8, 2 * self.rested))
        self.rest = self.rested
        self.losses = self.losses + 1 if drafted_by_model else 0
        if self.losses < 2:
            return False
        self.losses = 0
        return True


class Verification:
    """The target's rows for [last token, d1..dk], checked one draft token at a time as the decode loop asks
    for tokens: the sampler's penalty window then holds every token before the one being checked."""

    def __init__(self, rows, draft: list[int], qs: list | None, policy: DraftLength, seconds: float):
        self.rows, self.draft, self.qs, self.policy, self.seconds = rows, draft, qs, policy, seconds
        self.i = 0          # draft tokens kept so far
        self.done = False   # the last token taken was the sampler's own (a replacement or the one after all)

    def next_token(self, sampler, allow=None) -> int:
        """allow: a constraint's token mask for this position (minfer.constrain), or None."""
        if self.i == len(self.draft):  # all kept: the last row's token
            self.done = True
            self.policy.verified(len(self.draft), self.i, self.seconds)
            return sampler.sample(self.rows[self.i], allow)
        d = self.draft[self.i]
        tok = sampler.verify(self.rows[self.i], d, self.qs[self.i] if self.qs else None, allow)
        if tok == d:
            self.i += 1
        else:
            self.done = True
            self.policy.verified(len(self.draft), self.i, self.seconds)
        return tok

    def close(self) -> None:
        """The generation ended inside this draft: count what was checked of it."""
        if not self.done:
            self.done = True
            self.policy.drafted += len(self.draft)
            self.policy.accepted += self.i


class Proposer:
    """What the decode loop needs of a proposer: extend() with each token taken, propose(room) -> draft, the
    distributions the draft was drawn from (last_q; None: deterministic) and its DraftLength (policy).
    Subclasses write guess(room); propose() times it and tells the policy of time spent on nothing."""

    policy: DraftLength
    last_q: list | None = None

    def prime(self) -> None:
        """Work to do with the prompt before the first token (a draft model's prefill)."""

    def extend(self, tokens: list[int]) -> None:
        raise NotImplementedError

    def guess(self, room: int) -> list[int]:
        raise NotImplementedError

    def propose(self, room: int) -> list[int]:
        t0 = time.perf_counter()
        out = self.guess(room)
        if not out:
            self.policy.nothing_proposed(time.perf_counter() - t0)
        return out

    def plain_step(self, seconds: float) -> None:
        self.policy.plain_step(seconds)

    def paused(self) -> int:
        return self.policy.paused()

    def skip_tokens(self, n: int) -> None:
        self.policy.skip_tokens(n)

    def _count_from_here(self) -> None:
        """The policy may outlive this proposer (it carries over between calls): count this call's drafts."""
        self._counted = (self.policy.drafted, self.policy.accepted)

    @property
    def drafted(self) -> int:
        return self.policy.drafted - self._counted[0]

    @property
    def accepted(self) -> int:
        return self.policy.accepted - self._counted[1]


class FirstOf(Proposer):
    """The first proposer with a draft, in order (prompt lookup, free, before a draft model); each keeps its
    own adaptive length."""

    def __init__(self, proposers: list[Proposer]):
        self.proposers = proposers
        self.policy = proposers[0].policy

    def prime(self) -> None:
        for p in self.proposers:
            p.prime()

    def extend(self, tokens: list[int]) -> None:
        for p in self.proposers:
            p.extend(tokens)

    def plain_step(self, seconds: float) -> None:
        for p in self.proposers:
            p.plain_step(seconds)

    def paused(self) -> int:
        return min(p.paused() for p in self.proposers)

    def skip_tokens(self, n: int) -> None:
        for p in self.proposers:
            p.skip_tokens(n)

    def propose(self, room: int) -> list[int]:
        for p in self.proposers:
            draft = p.propose(room)
            if draft:
                self.policy, self.last_q = p.policy, p.last_q
                return draft
        return []

    @property
    def drafted(self) -> int:
        return sum(p.drafted for p in self.proposers)

    @property
    def accepted(self) -> int:
        return sum(p.accepted for p in self.proposers)
