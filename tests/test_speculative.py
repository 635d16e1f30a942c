"""Speculative decoding with a draft model (minfer.draft) and the check of drafts (Sampler.verify): greedy output
token for token the output without it, sampled output distributed as without it, rejected drafts leaving no
trace in either model's cache, cancellation inside a speculative step, and drafts that cannot be trusted
refused at load."""
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import real_model, synthetic_model
from minfer import LLM, _minfer
from minfer.draft import DraftModel, VocabularyMismatch, check_vocabulary
from minfer.speculative import MAX_DRAFT, DraftLength, StepJudge
from minfer.tokenizer import Special


def chi2_critical(df: int) -> float:
    """The chi-square value exceeded with probability 1e-4 (Wilson-Hilferty): a correct sampler fails one
    seeded test in 10,000; the seeds are fixed, so the outcome is too."""
    z, c = 3.719, 2.0 / (9 * df)
    return df * (1 - c + z * c ** 0.5) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token outside the target's support was drawn"
    e = probs[keep] * n
    return float(((counts[keep] - e) ** 2 / e).sum())


def chain_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The sampler's chain in numpy: top-k by logit, softmax at the temperature, top-p over the sorted rest."""
    order = np.argsort(-logits, kind="stable")
    if top_k:
        order = order[:top_k]
    w = np.exp((logits[order] - logits[order].max()) / temperature)
    w /= w.sum()
    if top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(w), top_p)) + 1
        order, w = order[:cut], w[:cut] / w[:cut].sum()
    p = np.zeros(len(logits))
    p[order] = w
    return p


TARGET = np.array([2.0, 1.2, 0.3, 1.9, -0.5, 0.8, 1.5, -2.0], np.float32)
DRAFT = np.array([0.1, 2.5, 1.0, 0.5, 0.0, 1.4, -1.0, 0.7], np.float32)  # a proposal far from the target


@pytest.mark.parametrize("params", [dict(temperature=0.8, top_k=4), dict(temperature=1.3, top_p=0.9),
                                    dict(temperature=1.0)])
def test_verify_leaves_the_target_distribution(params):
    """Drafts drawn from q, kept or replaced by Sampler.verify: the tokens are distributed as the target's p
    (chi-square over 20,000 draws), while the drafts themselves are not (the test can tell the difference)."""
    p = chain_probs(TARGET.astype(np.float64), **params)
    draft = _minfer.Sampler(len(DRAFT), seed=7, **params)
    target = _minfer.Sampler(len(TARGET), seed=11, **params)
    n = 20000
    out, proposed = np.zeros(len(p)), np.zeros(len(p))
    kept = 0
    for _ in range(n):
        x, q = draft.sample_with_distribution(DRAFT)
        assert abs(sum(q.probs) - 1.0) < 1e-9 and x in q.ids
        t = target.verify(TARGET, x, q)
        out[t] += 1
        proposed[x] += 1
        kept += t == x
    df = int((p > 0).sum()) - 1
    assert chi_square(out, p) < chi2_critical(df), (out / n, p)
    assert 0 < kept < n
    with pytest.raises(AssertionError):  # the drafts unchecked: far from p
        assert chi_square(proposed, p) < chi2_critical(df)


def test_verify_of_a_deterministic_draft():
    """Prompt lookup's drafts have no q (a point mass): kept with probability p(draft), otherwise a token drawn
    from p without it; greedy keeps exactly the argmax."""
    p = chain_probs(TARGET.astype(np.float64), 0.9, top_k=6)
    target = _minfer.Sampler(len(TARGET), temperature=0.9, top_k=6, seed=3)
    counts = np.zeros(len(p))
    for _ in range(20000):
        counts[target.verify(TARGET, 1)] += 1
    assert chi_square(counts, p) < chi2_critical(5)
    greedy = _minfer.Sampler(len(TARGET))
    assert greedy.verify(TARGET, 0) == 0 and greedy.verify(TARGET, 3) == 0


def test_verify_refuses_what_cannot_be_a_draft():
    s = _minfer.Sampler(len(TARGET), temperature=1.0, top_k=2, seed=1)
    _, q = _minfer.Sampler(len(DRAFT), temperature=1.0, top_k=2, seed=1).sample_with_distribution(DRAFT)
    missing = next(t for t in range(len(DRAFT)) if t not in q.ids)
    with pytest.raises(_minfer.MinferError, match="no probability in its proposal"):
        s.verify(TARGET, missing, q)
    with pytest.raises(_minfer.MinferError, match="out of range"):
        s.verify(TARGET, len(TARGET), None)


def test_top_token():
    x = np.array([0.0, 3.0, 1.0, 3.0], np.float32)
    tok, prob = _minfer.top_token(x)
    assert tok == 1 and prob == pytest.approx(np.exp(3.0) / np.exp(x.astype(np.float64)).sum())
    flat = np.zeros(1000, np.float32)
    assert _minfer.top_token(flat, 0.5)[1] < 0.5 and _minfer.top_token(flat)[1] == pytest.approx(1e-3)


def tiny(name):
    return str(synthetic_model(name))


def untimed(llm: LLM) -> LLM:
    """Drafting paused by rejections alone, not by measured time: the same drafts on a busy machine."""
    llm._lookup_policy = DraftLength(MAX_DRAFT, timed=False)
    if llm._draft is not None:
        llm._draft.policy = DraftLength(llm._draft.max_draft, timed=False)
    return llm


PROMPTS = ["def add(a, b):\n    return a + b\n", "one two three", "The quick brown fox", "x = [1, 2, 3, 4]\ny ="]


@pytest.mark.parametrize("draft", ["qwen2-tiny-f32", "qwen2-tiny-q4_0"])
def test_greedy_with_a_draft_is_the_plain_output(draft):
    """A quantized model drafting for its own q8_0 version (most drafts kept, some not) and with lookup first:
    the same tokens as without speculation, over several prompts, with both kept and rejected drafts."""
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny(draft), draft_p_min=0.0) as llm:
        untimed(llm)
        drafted = accepted = 0
        for prompt in PROMPTS:
            plain = llm.generate(prompt, max_tokens=48, draft=False)
            for lookup in (False, True):
                spec = llm.generate(prompt, max_tokens=48, lookup=lookup)
                assert spec.tokens == plain.tokens, (prompt, lookup)
                assert spec.metrics.stop_reason == plain.metrics.stop_reason
                drafted += spec.metrics.drafted_tokens
                accepted += spec.metrics.accepted_tokens
        assert drafted > accepted > 0, (drafted, accepted)


def test_greedy_with_the_real_pair(qwen15_path, qwen05_path):
    """qwen2.5-coder-1.5b with the 0.5B drafting: the tokens of plain greedy decoding."""
    with LLM(str(qwen15_path), threads=2, backend="cpu", draft_model=str(qwen05_path)) as llm:
        untimed(llm)
        accepted = 0
        for prompt in ["def quicksort(xs):\n", "# Read a CSV file and print the sum of its second column\n"]:
            plain = llm.generate(prompt, max_tokens=40, draft=False)
            spec = llm.generate(prompt, max_tokens=40)
            assert spec.tokens == plain.tokens, prompt
            accepted += spec.metrics.accepted_tokens
        assert accepted > 0


def test_sampling_with_a_draft_keeps_the_distribution():
    """Seeded samples of the first two tokens (top-k 3, temperature 1) with a draft, against the exact joint
    distribution computed from the target's logits: the second token comes from a verified draft."""
    prompt = "one two three"
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny("qwen2-tiny-q4_0"),
             draft_p_min=0.0) as llm:
        untimed(llm)
        ids = llm.tokenize(prompt)
        p1 = chain_probs(llm.logits(ids)[-1].astype(np.float64), 1.0, top_k=3)
        firsts = np.flatnonzero(p1)
        joint = {}
        for a in firsts:
            p2 = chain_probs(llm.logits(ids + [int(a)])[-1].astype(np.float64), 1.0, top_k=3)
            for b in np.flatnonzero(p2):
                joint[(int(a), int(b))] = p1[a] * p2[b]
        cells = sorted(joint)
        counts = np.zeros(len(cells))
        drafted = accepted = 0
        for seed in range(1500):
            out = llm.generate(ids, max_tokens=3, temperature=1.0, top_k=3, seed=seed)
            counts[cells.index(tuple(out.tokens[:2]))] += 1
            drafted += out.metrics.drafted_tokens
            accepted += out.metrics.accepted_tokens
        assert drafted > accepted > 0, (drafted, accepted)
        assert chi_square(counts, np.array([joint[c] for c in cells])) < chi2_critical(len(cells) - 1)


def test_rejected_drafts_leave_no_trace():
    """After generations with rejected drafts, a call that reuses the cached prefix gives what a fresh model
    gives; the draft's own cache, rolled back to a shared prefix, proposes what a fresh draft proposes."""
    prompt = "x = [1, 2, 3, 4]\ny ="
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny("qwen2-tiny-q4_0"),
             draft_p_min=0.0) as llm, LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu") as fresh:
        untimed(llm)
        first = llm.generate(prompt, max_tokens=40)
        assert first.metrics.drafted_tokens > first.metrics.accepted_tokens
        follow = llm.tokenize(prompt) + first.tokens[:25] + llm.tokenize(" z")
        again = llm.generate(follow, max_tokens=24, draft=False)
        assert again.metrics.cached_tokens > len(llm.tokenize(prompt))
        assert again.tokens == fresh.generate(follow, max_tokens=24).tokens

    target = LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu")
    used = DraftModel(tiny("qwen2-tiny-q4_0"), target.tokenizer, "target", 256, 2, "cpu", "f16", p_min=0.0)
    new = DraftModel(tiny("qwen2-tiny-q4_0"), target.tokenizer, "target", 256, 2, "cpu", "f16", p_min=0.0)
    a = target.tokenize("one two three four five six")
    b = a[:3] + target.tokenize(" seven eight")
    used.run(a, None).propose(6)
    assert used.run(b, None).propose(6) == new.run(b, None).propose(6)
    target.close()


def test_cancel_inside_a_speculative_step():
    """cancel() between the tokens of a verified draft: the call stops there, and the next call (reusing the
    cache) gives what a fresh model gives."""
    prompt = "def add(a, b):\n    return a + b\n"
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny("qwen2-tiny-f32"),
             draft_p_min=0.0) as llm, LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu") as fresh:
        untimed(llm)
        pieces = []
        for piece in llm.stream(prompt, max_tokens=64):
            pieces.append(piece)
            if len(pieces) == 6:
                llm.cancel()
        m = llm.last_metrics
        assert m.stop_reason == "cancelled" and m.generated_tokens < 64 and m.drafted_tokens > 0
        assert llm.generate(prompt, max_tokens=20).tokens == fresh.generate(prompt, max_tokens=20).tokens


def test_a_draft_with_another_vocabulary_is_refused(smollm2_path):
    with pytest.raises(VocabularyMismatch, match="does not share the vocabulary"):
        LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=str(smollm2_path))


def test_vocabulary_check_names_the_difference():
    special = Special(frozenset({2}), 1, 2, False, False)
    a = SimpleNamespace(tokens=["<s>", "</s>", "a", "b"], special=special)
    with pytest.raises(VocabularyMismatch, match="token 3 is 'c' in the draft and 'b' in the target"):
        check_vocabulary(a, SimpleNamespace(tokens=["<s>", "</s>", "a", "c"], special=special), "t", "d")
    with pytest.raises(VocabularyMismatch, match="3 tokens against 4"):
        check_vocabulary(a, SimpleNamespace(tokens=["<s>", "</s>", "a"], special=special), "t", "d")
    other = Special(frozenset({2}), 1, 2, True, False)
    with pytest.raises(VocabularyMismatch, match="special add_bos is True in the draft and False"):
        check_vocabulary(a, SimpleNamespace(tokens=a.tokens, special=other), "t", "d")
    check_vocabulary(a, SimpleNamespace(tokens=list(a.tokens), special=special), "t", "d")


def test_draft_settings_are_checked():
    with pytest.raises(ValueError, match="draft_p_min applies to one sequence at a time"):
        LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", max_sequences=2, draft_model=tiny("qwen2-tiny-f32"),
            draft_p_min=0.3)
    with pytest.raises(ValueError, match="max_draft"):
        LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny("qwen2-tiny-f32"), draft_max=0)
    with pytest.raises(ValueError, match="p_min"):
        LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny("qwen2-tiny-f32"), draft_p_min=2)


class ChainingSession:
    """A CPU session that says its greedy steps chain (as a GPU's do), counting decode_greedy's calls."""

    def __init__(self, session):
        self.session, self.chained = session, 0

    chains = True

    def decode_greedy(self, token, pos, steps):
        self.chained += 1
        return self.session.decode_greedy(token, pos, steps)

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_paused_drafting_takes_chained_steps():
    """Where decode chains on the device, the tokens between drafts (drafting paused after rejections) come
    from chained greedy steps, and the output is still the plain one."""
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", draft_model=tiny("llama-tiny-q8_0"),
             draft_p_min=0.0) as llm:
        untimed(llm)
        plain = llm.generate(PROMPTS[0], max_tokens=64, draft=False)
        llm._session = ChainingSession(llm._session)
        spec = llm.generate(PROMPTS[0], max_tokens=64)
        assert spec.tokens == plain.tokens
        assert llm._session.chained > 0 and spec.metrics.drafted_tokens > spec.metrics.accepted_tokens


def test_the_engine_wide_judge_rests_speculation_that_costs_more():
    """The batch engine's judge: a step with drafts slower per token than plain steps rests every sequence's
    drafting for 8, then 16 .. 64 steps; a step that pays ends the streak; two losing steps in a row of the
    draft model's drafts drop it (a rest spares it nothing)."""
    j = StepJudge()
    j.plain_step(0.008, 8)  # 1 ms a token
    assert not j.resting()
    assert not j.spec_step(0.016, 8, drafted_by_model=True)  # 2 ms a token: a loss, rest 8
    assert [j.resting() for _ in range(9)] == [True] * 8 + [False]
    assert j.spec_step(0.016, 8, drafted_by_model=True)  # the draft model's second loss in a row: drop it
    assert [j.resting() for _ in range(17)] == [True] * 16 + [False]
    assert not j.spec_step(0.016, 8, drafted_by_model=False)  # lookup's drafts: rests, never drops
    assert sum(j.resting() for _ in range(40)) == 32
    assert not j.spec_step(0.012, 16, drafted_by_model=True)  # 0.75 ms a token: pays, the streak ends
    assert not j.resting()
    assert not j.spec_step(0.016, 8, drafted_by_model=True)  # a loss after a win rests 8 again, no drop
    assert sum(j.resting() for _ in range(20)) == 8


def test_draft_length_pauses_where_speculation_does_not_pay():
    """The policy in measured seconds: a proposal that costs time and proposes nothing pauses drafting; from
    the second failure in a row the pause keeps a failed attempt's cost under 5 % of the plain steps after it;
    speculative steps slower per token than plain ones pause it; untimed, only rejections count."""
    p = DraftLength(7)
    p.nothing_proposed(0.5)  # no plain step measured yet: nothing to compare with
    assert p.paused() == 0
    p.plain_step(0.010)
    p.nothing_proposed(0.0001)  # cheap (prompt lookup without a match): no pause
    assert p.paused() == 0
    p.nothing_proposed(0.012)  # a draft model's step for nothing: first failure, 1 token
    assert p.paused() == 1
    p.skip_tokens(1)
    p.nothing_proposed(0.012)  # second in a row: 0.012 / (0.05 * 0.010) -> 25 tokens
    assert p.paused() == 25
    p.skip_tokens(25)
    p.verified(3, 3, 0.020)  # 4 tokens in 20 ms against 10 ms a token: pays, the failure streak ends
    assert p.paused() == 0 and p.length == 7
    p.verified(7, 1, 0.060)  # 2 tokens in 60 ms: 30 ms a token (moving average 12.5 ms > 10): slower
    assert p.paused() == 8
    q = DraftLength(7, timed=False)
    q.plain_step(0.010)
    q.nothing_proposed(0.5)
    q.verified(7, 1, 10.0)
    assert q.paused() == 0
    q.verified(2, 0, 10.0)
    assert q.paused() == 1


def test_the_batch_engine_drafts_for_every_sequence():
    """A draft model in the batch engine: every sequence's draft in shared steps of the draft, checked in its
    rows of the target's step.  Greedy sequences give their solo tokens, sampled ones (top-k 4) only tokens
    among the target's 4 likeliest, with prompt lookup first or not; every block of both pools comes back."""
    from minfer.batch import Engine

    prompts = PROMPTS + [p + " and" for p in PROMPTS]
    with Engine(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", max_sequences=8, block_size=16,
                draft_model=tiny("qwen2-tiny-q4_0")) as eng:
        hs = [eng.submit(p, max_tokens=40, lookup=i % 2 == 1) for i, p in enumerate(prompts)]
        hs += [eng.submit(p, max_tokens=40, temperature=0.9, top_k=4, seed=i) for i, p in enumerate(prompts)]
        outs = [h.result(timeout=300) for h in hs]
        assert eng._draft.steps > 0
        assert eng.pool.n_free == eng.pool.n_blocks and eng._draft.pool.n_free == eng._draft.pool.n_blocks
    drafted = sum(o.metrics.drafted_tokens for o in outs)
    accepted = sum(o.metrics.accepted_tokens for o in outs)
    assert drafted > accepted > 0, (drafted, accepted)
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu") as solo:
        assert [o.tokens for o in outs[:len(prompts)]] == [solo.generate(p, max_tokens=40).tokens for p in prompts]
        for p, o in zip(prompts, outs[len(prompts):]):
            ids = solo.tokenize(p)
            rows = solo.logits(ids + o.tokens[:-1])[len(ids) - 1:]
            assert all(row[t] >= np.sort(row)[-4] for row, t in zip(rows, o.tokens)), p
    with LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu", max_sequences=2,
             draft_model=tiny("qwen2-tiny-f32")) as llm:  # LLM(max_sequences=N) hands the draft to its engine
        out = llm.generate(PROMPTS[0], max_tokens=24)
        assert out.metrics.accepted_tokens > 0
        assert llm.generate(PROMPTS[0], max_tokens=24, draft=False).metrics.drafted_tokens == 0


def test_batch_draft_rolls_back_to_what_was_kept():
    """minfer.batch_draft for two sequences: each proposal is the draft model's own greedy continuation of the
    sequence (as a lone session computes it), also after a check kept part of the last draft and replaced the
    rest, the draft's rows past the kept tokens dropped."""
    from types import SimpleNamespace

    from minfer import engine
    from minfer.batch_draft import BatchDraft

    target = LLM(tiny("qwen2-tiny-q8_0"), threads=2, backend="cpu")
    bd = BatchDraft(tiny("qwen2-tiny-q4_0"), target.tokenizer, "target", 256, 2, "cpu", "f16", 1024, 16, 4)
    lone = engine.Session(engine.Model(tiny("qwen2-tiny-q4_0")), n_ctx=256, threads=2)

    def greedy(tokens, k):
        out = list(tokens)
        for _ in range(k):
            out.append(int(np.argmax(lone.eval(np.asarray(out, np.int32), 0)[-1])))
        return out[len(tokens):]

    reqs = [SimpleNamespace(all_tokens=target.tokenize(p), kv_draft=None) for p in ("one two three", PROMPTS[0])]
    for kept in (2, 0, 5):
        drafts = bd.propose([(r, 5) for r in reqs])
        for r, d in zip(reqs, drafts):
            assert d == greedy(r.all_tokens, 5)
            n = len(r.all_tokens)
            r.all_tokens = r.all_tokens + d[:kept] + [(d[min(kept, 4)] + 1) % 1000]
            bd.checked(r, n, kept)
    for r in reqs:
        bd.release(r.kv_draft)
    assert bd.pool.n_free == bd.pool.n_blocks
    target.close()
