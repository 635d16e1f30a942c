"""Prompt-lookup speculative decoding (minfer.lookup, LLM(...).generate(lookup=True)): the drafts, and the
exactness that makes it safe -- greedy output token for token the output without it, on the CPU, whose kernels
compute each row of a several-token evaluation as they compute a lone one."""
import numpy as np
import pytest

from conftest import real_model, synthetic_model
from minfer import LLM
from minfer.lookup import PromptLookup
from minfer.speculative import MAX_DRAFT, DraftLength


def test_drafts_follow_the_latest_match():
    p = PromptLookup([5, 6, 7, 8, 9, 5, 6, 7, 1, 2], max_ngram=3, min_ngram=2, max_draft=4)
    assert p.propose(4) == []  # "1 2" never occurred before
    p.extend([5, 6, 7])  # now "6 7" ... the 3-gram "5 6 7" last occurred at 5, followed by 1 2 5 6
    assert p.propose(4) == [1, 2, 5, 6]
    assert p.propose(2) == [1, 2]
    p.policy.verified(4, 1)  # a rejection: the next drafts are at most 2 long
    assert p.propose(4) == [1, 2]
    p.policy.verified(2, 2)
    assert p.propose(8) == [1, 2, 5, 6] and (p.policy.drafted, p.policy.accepted) == (6, 3)
    p.policy.verified(4, 0)  # rejected outright: no draft for one token, then two after another such
    assert p.propose(8) == [] and p.propose(8) == [1, 2]
    p.policy.verified(2, 0)
    assert p.propose(8) == [] and p.propose(8) == [] and p.propose(8) == [1, 2]
    with pytest.raises(ValueError):
        PromptLookup([], max_ngram=1, min_ngram=2)


PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "one two three one two three one two",
           "The quick brown fox jumps over the lazy dog. The quick brown", "x = [1, 2, 3, 4]\ny = [1, 2,"]


@pytest.mark.parametrize("model", ["qwen2-tiny-q8_0", "llama-tiny-q8_0", "qwen2.5-coder-0.5b"])
def test_greedy_lookup_is_the_plain_output(model):
    """Over prompts that repeat themselves (drafts are made and kept), the generated tokens with lookup=True
    equal those without, on the tiny synthetic models and a real one (rejected drafts: test_speculative.py)."""
    path = str(synthetic_model(model)) if "tiny" in model else str(real_model(model))
    with LLM(path, threads=2, backend="cpu") as llm:
        llm._lookup_policy = DraftLength(MAX_DRAFT, timed=False)  # pauses by rejections alone, not by time
        drafted = accepted = 0
        for prompt in PROMPTS:
            plain = llm.generate(prompt, max_tokens=40).tokens
            spec = llm.generate(prompt, max_tokens=40, lookup=True)
            assert spec.tokens == plain, prompt
            drafted += spec.metrics.drafted_tokens
            accepted += spec.metrics.accepted_tokens
        assert drafted >= accepted > 0, (drafted, accepted)


def test_lookup_in_the_batch_engine_is_the_plain_output():
    """Several sequences in the batch engine at once, each checking its own drafts in its rows of the step
    (greedy and seeded sampling side by side): every sequence's tokens equal its solo run's without lookup."""
    from minfer.batch import Engine

    path = str(synthetic_model("qwen2-tiny-q8_0"))
    prompts = PROMPTS + [p + " again" for p in PROMPTS]
    with Engine(path, threads=2, backend="cpu", max_sequences=8, block_size=16) as eng:
        hs = [eng.submit(p, max_tokens=48, lookup=True) for p in prompts]
        hs += [eng.submit(p, max_tokens=48, lookup=True, temperature=0.9, top_k=5, seed=i)
               for i, p in enumerate(prompts)]
        outs = [h.result(timeout=300) for h in hs]
    drafted = sum(o.metrics.drafted_tokens for o in outs)
    accepted = sum(o.metrics.accepted_tokens for o in outs)
    assert drafted >= accepted > 0, (drafted, accepted)
    with LLM(path, threads=2, backend="cpu") as solo:
        assert [o.tokens for o in outs[:len(prompts)]] == [solo.generate(p, max_tokens=48).tokens for p in prompts]
        # sampled with lookup (top-k 5): every token, kept draft or drawn, is among the top 5 of the target's
        # logits at its position (a check against the wrong row would break this at once)
        for p, o in zip(prompts, outs[len(prompts):]):
            ids = solo.tokenize(p)
            logits = solo.logits(ids + o.tokens[:-1])
            for j, t in enumerate(o.tokens):
                row = logits[len(ids) - 1 + j]
                assert row[t] >= np.sort(row)[-5], (p, j)
    with pytest.raises(ValueError, match="logprobs"):
        with Engine(path, threads=2, backend="cpu", max_sequences=2) as eng:
            eng.submit("hello", max_tokens=4, lookup=True, logprobs=1)
