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


class DraftLength:
    """The adaptive draft length shared by the proposers: it grows by 2 after a draft kept whole and falls to
    just past the kept prefix after a rejection; a draft rejected outright pauses drafting for 1, 2, 4 .. 16
    tokens, so text the proposer cannot predict pays for little more than the proposals.  Speculation must also
    pay in time: when a speculative step's seconds per token (proposal and check together) exceed a plain
    step's, drafting pauses for 8, 16 .. 64 tokens (a proposer about as slow as the target, a device where
    checking several rows costs several steps), and is measured again after."""

    def __init__(self, max_draft: int):
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.max_draft = self.length = max_draft
        self.pause = self.skip = 0  # tokens to go without drafts after rejections, and how many are left
        self.slow = 0               # the last pause for speculation that did not pay
        self.plain_s = self.spec_s = None  # seconds per token of plain and speculative steps (moving averages)
        self.drafted = self.accepted = 0

    def limit(self, room: int) -> int:
        """How many tokens to draft now (0 while paused), at most `room`."""
        if self.skip > 0:
            self.skip -= 1
            return 0
        return max(0, min(room, self.length))

    def plain_step(self, seconds: float) -> None:
        """A step without a draft took `seconds` for its one token."""
        self.plain_s = seconds if self.plain_s is None else 0.7 * self.plain_s + 0.3 * seconds

    def verified(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        """A draft of `drafted` tokens had its first `accepted` kept; proposing and checking it took `seconds`
        (for accepted + 1 tokens)."""
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.length = min(self.max_draft, self.length + 2)
        else:
            self.length = max(2, accepted + 1)
        self.pause = 0 if accepted else min(16, max(1, 2 * self.pause))
        self.skip = self.pause
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


class Verification:
    """The target's rows for [last token, d1..dk], checked one draft token at a time as the decode loop asks
    for tokens: the sampler's penalty window then holds every token before the one being checked."""

    def __init__(self, rows, draft: list[int], qs: list | None, policy: DraftLength, seconds: float):
        self.rows, self.draft, self.qs, self.policy, self.seconds = rows, draft, qs, policy, seconds
        self.i = 0          # draft tokens kept so far
        self.done = False   # the last token taken was the sampler's own (a replacement or the one after all)

    def next_token(self, sampler) -> int:
        if self.i == len(self.draft):  # all kept: the last row's token
            self.done = True
            self.policy.verified(len(self.draft), self.i, self.seconds)
            return sampler.sample(self.rows[self.i])
        d = self.draft[self.i]
        tok = sampler.verify(self.rows[self.i], d, self.qs[self.i] if self.qs else None)
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
    distributions the draft was drawn from (last_q; None: deterministic) and its DraftLength (policy)."""

    policy: DraftLength
    last_q: list | None = None

    def prime(self) -> None:
        """Work to do with the prompt before the first token (a draft model's prefill)."""

    def extend(self, tokens: list[int]) -> None:
        raise NotImplementedError

    def plain_step(self, seconds: float) -> None:
        self.policy.plain_step(seconds)

    def propose(self, room: int) -> list[int]:
        raise NotImplementedError

    @property
    def drafted(self) -> int:
        return self.policy.drafted

    @property
    def accepted(self) -> int:
        return self.policy.accepted


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
