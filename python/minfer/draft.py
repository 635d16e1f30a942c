"""A draft model for speculative decoding (minfer.speculative): a small model with the target's vocabulary
guesses the next tokens, one cheap decode step each.

    with LLM("qwen2.5-coder-1.5b", draft_model="qwen2.5-coder-0.5b") as llm:
        out = llm.generate("def quicksort(xs):", max_tokens=128)
        print(out.metrics.acceptance)

The draft keeps its own KV cache on the target's device.  Before each proposal it evaluates, in one call, the
tokens of the sequence its cache does not hold yet (after a draft: the replacement token, or the last draft
token and the one after it), then drafts greedily (temperature 0) or by sampling with the call's temperature,
top-k, top-p and min-p (its own generator), and stops early where it is unsure: the top probability below
`p_min`.  Ids must mean the same text in both models, so a draft whose vocabulary or special tokens differ
from the target's is refused at load.
"""
from __future__ import annotations

import os

import numpy as np

from . import _minfer, engine, gguf, tokenizer
from .generation import reusable_prefix
from .speculative import MAX_DRAFT, DraftLength, Proposer


class VocabularyMismatch(ValueError):
    """A draft model whose token ids do not mean what the target's do."""


def check_vocabulary(target, draft, target_name: str, draft_name: str) -> None:
    """VocabularyMismatch naming the first difference between two tokenizers' vocabularies."""
    where = f"draft model {draft_name} does not share the vocabulary of {target_name}"
    if len(target.tokens) != len(draft.tokens):
        raise VocabularyMismatch(f"{where}: {len(draft.tokens)} tokens against {len(target.tokens)}")
    for i, (a, b) in enumerate(zip(target.tokens, draft.tokens)):
        if a != b:
            raise VocabularyMismatch(f"{where}: token {i} is {b!r} in the draft and {a!r} in the target")
    for field in ("bos", "eos", "eog", "add_bos", "add_eos"):
        a, b = getattr(target.special, field), getattr(draft.special, field)
        if a != b:
            if isinstance(a, frozenset):
                a, b = sorted(a), sorted(b)
            raise VocabularyMismatch(f"{where}: special {field} is {b} in the draft and {a} in the target")


def load(model: str | os.PathLike, target_tokenizer, target_name: str):
    """(path, engine.Model) of a draft model whose vocabulary is the target's (VocabularyMismatch otherwise)."""
    path = engine.resolve(model)
    with gguf.open(path) as f:
        tok = tokenizer.from_gguf(f)
    check_vocabulary(target_tokenizer, tok, target_name, os.path.basename(path))
    m = engine.Model(path)
    if m.config["n_vocab"] != len(tok.tokens):
        raise VocabularyMismatch(f"draft model {path}: {m.config['n_vocab']} logits for {len(tok.tokens)} tokens")
    return path, m


class DraftModel:
    """The loaded draft (its weights and one session); `run()` makes the proposer for one generation."""

    def __init__(self, model: str | os.PathLike, target_tokenizer, target_name: str, n_ctx: int,
                 threads: int | None, backend: str, kv_type: str, max_draft: int = MAX_DRAFT, p_min: float = 0.5):
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {p_min}")
        DraftLength(max_draft)  # ValueError for a bad max_draft, before the load
        self.path, self.model = load(model, target_tokenizer, target_name)
        self.session = engine.Session(self.model, n_ctx=n_ctx, threads=threads or 0, kv_type=kv_type,
                                      device="" if backend == "auto" else backend)
        self.max_draft, self.p_min = max_draft, p_min
        self.cached: list[int] = []  # tokens whose K/V sit in the draft's cache at positions 0..len-1
        # the draft length and pauses carry over from call to call: what a step costs is the machine's
        self.policy = DraftLength(max_draft)

    def run(self, tokens: list[int], sampling: dict | None) -> "DraftRun":
        """The proposer for a generation after `tokens`; `sampling`: the call's parameters (None: greedy)."""
        return DraftRun(self, tokens, sampling)


class DraftRun(Proposer):
    """One generation's proposer: extend() with each token the generation takes, propose() before a step."""

    def __init__(self, draft: DraftModel, tokens: list[int], sampling: dict | None):
        self.draft = draft
        self.tokens = list(tokens)
        self.policy = draft.policy
        self._count_from_here()
        self.sampler = None
        self.last_q: list | None = None  # what each token of the last draft was drawn from (None: greedy)
        if sampling and float(sampling.get("temperature") or 0.0) > 0.0:
            keys = ("temperature", "top_k", "top_p", "min_p")
            bias = {int(k): float(v) for k, v in (sampling.get("logit_bias") or {}).items()}
            seed = (int(sampling["seed"]) ^ 0x5DEECE66D) & (2**64 - 1)
            self.sampler = _minfer.Sampler(draft.model.config["n_vocab"], logit_bias=bias, seed=seed,
                                           **{k: sampling[k] for k in keys if k in sampling})

    def prime(self) -> None:
        self._catch_up()

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)

    def _catch_up(self):
        """Evaluates the sequence's tokens the draft's cache lacks (at least the last); its next logits."""
        d, ts = self.draft, self.tokens
        keep = reusable_prefix(d.cached, ts, d.session.rewind_floor)
        d.cached = d.cached[:keep]
        logits = d.session.eval(_ids(ts[keep:]), keep)
        d.cached = list(ts)
        return logits

    def guess(self, room: int) -> list[int]:
        limit = self.policy.limit(min(room, self.draft.session.n_ctx - len(self.tokens)))
        self.last_q = [] if self.sampler else None
        if limit <= 0:
            return []
        d, sess = self.draft, self.draft.session
        logits = self._catch_up()
        out: list[int] = []
        while True:
            if self.sampler is None:
                tok, sure = _minfer.top_token(logits[-1], d.p_min)
            else:
                tok, q = self.sampler.sample_with_distribution(logits[-1])
                sure = q.top_prob
            if sure < d.p_min:
                break
            out.append(tok)
            if self.sampler is not None:
                self.last_q.append(q)
            if len(out) == limit:
                break
            logits = sess.eval(_ids([tok]), len(d.cached))
            d.cached.append(tok)
        return out


def _ids(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, np.int32)
