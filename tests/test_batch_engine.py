"""The continuous-batching engine (minfer.batch.Engine) and LLM over it: the same tokens as one sequence at a
time (greedy and sampled), streaming, prefix caching, preemption, cancellation, 1,000 random requests, plans,
placement, errors, and LLM's calls from several threads batched.  The batch step under it: test_batch.py."""
import threading

import numpy as np
import pytest

import minfer
from conftest import synthetic_model
from minfer.batch import Engine

TINY = "qwen2-tiny-q8_0"


@pytest.fixture(scope="module")
def tiny_path():
    return str(synthetic_model(TINY))


@pytest.fixture(scope="module")
def tiny_alone(tiny_path):
    with minfer.LLM(tiny_path, n_ctx=256, threads=2) as llm:
        yield llm


def prompts_for(llm, n, rng, lo=1, hi=60):
    return [list(map(int, rng.integers(0, llm.n_vocab, size=int(rng.integers(lo, hi))))) for _ in range(n)]


def test_engine_greedy_equals_one_at_a_time(tiny_path, tiny_alone, rng):
    prompts = prompts_for(tiny_alone, 10, rng)
    expected = [tiny_alone.generate(p, max_tokens=20).tokens for p in prompts]
    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=4, step_tokens=64) as eng:
        outs = eng.generate_batch(prompts, max_tokens=20)
        assert eng.steps < sum(len(o.tokens) for o in outs)  # batched: fewer steps than tokens
        assert eng.pool.n_free == eng.pool.n_blocks
    assert [o.tokens for o in outs] == expected
    assert all(o.metrics.stop_reason in ("length", "stop") for o in outs)
    m = outs[0].metrics
    assert m.prompt_tokens == len(prompts[0]) and m.generated_tokens == len(outs[0].tokens)
    assert m.ttft_s > 0 and m.prefill_tps > 0


def test_streamed_text_is_the_result_and_the_single_stream_text(tiny_path, tiny_alone, rng):
    """Without stop strings the reader's thread turns the streamed ids into text; with them the engine does
    (a stop ends the sequence): either way the pieces join to the result's text and to LLM's single stream,
    characters split across tokens included (random ids of a byte-level vocabulary split many)."""
    prompts = prompts_for(tiny_alone, 4, rng)
    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=4) as eng:
        for stop in ((), ("zzz-never",)):
            alone = [tiny_alone.generate(p, max_tokens=24, stop=stop).text for p in prompts]
            handles = [eng.submit(p, max_tokens=24, stop=stop) for p in prompts]
            streamed = ["".join(h) for h in handles]
            assert streamed == [h.result().text for h in handles] == alone, stop
    assert any(t for t in alone)


def test_engine_sampling_is_reproducible_and_independent_of_the_batch(tiny_path, tiny_alone, rng):
    prompts = prompts_for(tiny_alone, 6, rng)
    params = dict(max_tokens=16, temperature=0.9, top_k=40, seed=11)
    with Engine(tiny_path, n_ctx=128, threads=2, max_sequences=6) as eng:
        together = [o.tokens for o in eng.generate_batch(prompts, **params)]
        one_by_one = [eng.submit(p, **params).result().tokens for p in prompts]
    assert together == one_by_one


def test_sampled_steps_read_each_rows_best_and_draw_the_single_streams_tokens(tiny_path, tiny_alone, rng):
    """Sequences that sample from a top-k take their steps' best logits only (step_best, not step's whole rows),
    greedy ones among them too, and draw the tokens each draws alone through LLM; a sequence without top_k,
    with logprobs, or with a top_k past best_max makes its steps read whole rows."""
    prompts = prompts_for(tiny_alone, 4, rng)
    sampled = dict(max_tokens=12, temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, seed=5)
    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=4) as eng:
        runner, calls = eng._runner, {"step": 0, "step_best": 0}

        class Counted:
            def __getattr__(self, name):
                if name in calls:
                    calls[name] += 1
                return getattr(runner, name)
        eng._runner = Counted()
        handles = [eng.submit(p, **sampled) for p in prompts[:3]] + [eng.submit(prompts[3], max_tokens=12)]
        outs = [h.result() for h in handles]
        assert calls["step_best"] >= 11 and calls["step"] == 0, calls
        eng.submit(prompts[0], max_tokens=3, temperature=0.9, seed=1).result()
        eng.submit(prompts[0], max_tokens=3, temperature=0.9, top_k=40, logprobs=2).result()
        eng.submit(prompts[0], max_tokens=3, temperature=0.9, top_k=runner.best_max + 1).result()
        assert calls["step"] >= 9, calls
    assert [o.tokens for o in outs[:3]] == [tiny_alone.generate(p, **sampled).tokens for p in prompts[:3]]
    assert outs[3].tokens == tiny_alone.generate(prompts[3], max_tokens=12).tokens


def test_prefix_caching_skips_the_shared_prompt(tiny_path, tiny_alone, rng):
    system = list(map(int, rng.integers(0, tiny_alone.n_vocab, size=100)))
    tails = prompts_for(tiny_alone, 4, rng, 3, 10)
    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=4, block_size=16) as eng:
        first = eng.submit(system + tails[0], max_tokens=8).result()
        rest = [eng.submit(system + t, max_tokens=8) for t in tails[1:]]
        rest = [h.result() for h in rest]
    assert first.metrics.cached_tokens == 0
    assert all(r.metrics.cached_tokens == 96 for r in rest)  # six full blocks of 16
    assert [r.tokens for r in [first] + rest] == [tiny_alone.generate(system + t, max_tokens=8).tokens for t in tails]


def test_preemption_recomputes_and_gives_the_same_tokens(tiny_path, tiny_alone, rng):
    """A pool of 10 blocks of 16 for 4 sequences that each grow to ~70 tokens: some are preempted and
    resumed, and every sequence's greedy tokens are the ones it produces alone."""
    prompts = prompts_for(tiny_alone, 4, rng, 30, 40)
    expected = [tiny_alone.generate(p, max_tokens=40).tokens for p in prompts]
    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=4, kv_tokens=160, block_size=16) as eng:
        outs = eng.generate_batch(prompts, max_tokens=40)
        assert eng.preemptions > 0
        assert eng.pool.n_free == eng.pool.n_blocks
    assert [o.tokens for o in outs] == expected


def test_cancel_mid_batch(tiny_path, tiny_alone, rng):
    prompts = prompts_for(tiny_alone, 4, rng, 1, 40)  # room for 200 tokens in the context of 256
    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=4) as eng:
        hs = [eng.submit(p, max_tokens=200, logit_bias={t: -1e9 for t in tiny_alone.tokenizer.special.eog})
              for p in prompts]
        pieces = iter(hs[1])
        next(pieces)
        hs[1].cancel()
        list(pieces)  # the stream ends
        others = [h.result(timeout=60) for h in (hs[0], hs[2], hs[3])]
        assert hs[1].result().metrics.stop_reason == "cancelled"
        assert len(hs[1].result().tokens) < 200
        assert all(o.metrics.stop_reason == "length" and len(o.tokens) == 200 for o in others)
        assert eng.running == 0 and eng.pool.n_free == eng.pool.n_blocks


def test_a_thousand_random_requests(tiny_path, rng):
    """1,000 requests of random lengths arriving at random times from 4 threads, some cancelled, over a
    pool small enough to preempt: every handle finishes, none is lost, all blocks come back."""
    with Engine(tiny_path, n_ctx=128, threads=2, max_sequences=16, kv_tokens=512, block_size=16,
                step_tokens=128) as eng:
        handles, lock = [], threading.Lock()
        seeds = rng.integers(0, 1 << 31, size=4)

        def client(seed):
            r = np.random.default_rng(int(seed))
            for _ in range(250):
                p = list(map(int, r.integers(0, eng.n_vocab, size=int(r.integers(1, 40)))))
                h = eng.submit(p, max_tokens=int(r.integers(1, 12)), temperature=float(r.random()), seed=int(r.integers(1 << 30)))
                if r.random() < 0.05:
                    h.cancel()
                with lock:
                    handles.append(h)
                if r.random() < 0.3:
                    threading.Event().wait(float(r.random()) * 0.01)
        threads = [threading.Thread(target=client, args=(s,)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [h.result(timeout=600) for h in handles]
        assert len(results) == 1000
        assert all(r.metrics.stop_reason in ("length", "stop", "cancelled") for r in results)
        assert all(0 < len(r.tokens) <= 11 or r.metrics.stop_reason != "length" for r in results)
        assert eng.running == 0 and eng.waiting == 0
        assert eng.pool.n_free == eng.pool.n_blocks and all(c == 0 for c in eng.pool.refs)


def test_engine_placement(tiny_path):
    """Engine.placement() names the backend of each op of a step, a prompt step's PickRows included; on the CPU
    every op is there and nothing warns (Metal: test_metal_mock's batch test)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eng = Engine(tiny_path, n_ctx=64, threads=2, max_sequences=2)
    try:
        place = eng.placement()
        assert {"MatMul", "KvStore", "Attn", "PickRows"} <= set(place), place
        assert all(v == ["cpu"] for v in place.values()), place
    finally:
        eng.close()


def test_engine_plans_every_step_shape_at_start(tiny_path):
    """The engine builds its plans when it starts (a decode and a mixed plan per power of two of sequences), so a
    long run of varied steps -- prompts of 1-100 tokens, 1-9 sequences at once -- builds none later: a server's
    memory does not creep up as rarer shapes come."""
    import random

    with Engine(tiny_path, n_ctx=256, threads=2, max_sequences=8) as eng:
        built = eng._runner.graph_builds
        assert built == 8  # sequence counts 1, 2, 4, 8
        rnd = random.Random(3)
        for wave in range(4):
            hs = [eng.submit(list(range(5, 5 + rnd.randint(1, 100))), max_tokens=rnd.randint(1, 12))
                  for _ in range(rnd.randint(1, 9))]
            for h in hs:
                h.result()
        assert eng._runner.graph_builds == built


def test_engine_errors_are_clear(tiny_path):
    with Engine(tiny_path, n_ctx=128, threads=2, max_sequences=2, kv_tokens=64, block_size=16) as eng:
        with pytest.raises(minfer.ContextLengthError, match="context of 128"):
            eng.submit(list(range(200)))
        with pytest.raises(minfer.ContextLengthError, match="the KV pool holds 64"):
            eng.submit(list(range(100)))
        with pytest.raises(TypeError, match="unknown sampling"):
            eng.submit("hi", temprature=1)
        with pytest.raises(ValueError, match="temperature"):
            eng.submit("hi", temperature=-1)
        with pytest.raises(ValueError, match="empty"):
            eng.submit([])
        # a sequence that outgrows the whole pool ends with "context" instead of waiting forever
        r = eng.submit(list(range(1, 40)), max_tokens=60, logit_bias={t: -1e9 for t in eng.tokenizer.special.eog}).result(60)
        assert r.metrics.stop_reason == "context"
    with pytest.raises(ValueError, match="max_sequences"):
        Engine(tiny_path, max_sequences=0)
    with pytest.raises(minfer.MinferError, match="closed"):
        eng.submit("hi")


def test_a_sequence_ends_at_its_context_or_its_token_count(tiny_path):
    with Engine(tiny_path, n_ctx=64, threads=2, max_sequences=2) as eng:
        bias = {t: -1e9 for t in eng.tokenizer.special.eog}
        ends = [eng.submit(list(range(1, 41)), max_tokens=n, logit_bias=bias).result(60) for n in (60, 24, 23)]
    # 40 prompt tokens in a context of 64 leave room for 24; where both limits fall on one token, max_tokens names it
    assert [(r.metrics.stop_reason, len(r.tokens)) for r in ends] == [("context", 24), ("length", 24), ("length", 23)]


def test_llm_calls_from_threads_run_batched(tiny_path, tiny_alone, rng):
    prompts = prompts_for(tiny_alone, 6, rng)
    expected = [tiny_alone.generate(p, max_tokens=16).tokens for p in prompts]
    with minfer.LLM(tiny_path, n_ctx=256, threads=2, max_sequences=6) as llm:
        got = [None] * len(prompts)
        streamed = [None] * len(prompts)

        def call(i):
            if i % 2:
                got[i] = llm.generate(prompts[i], max_tokens=16).tokens
            else:
                streamed[i] = "".join(llm.stream(prompts[i], max_tokens=16))
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert llm._engine.steps < sum(len(e) for e in expected)  # the calls shared steps
    for i, e in enumerate(expected):
        if i % 2:
            assert got[i] == e
        else:
            assert streamed[i] == tiny_alone.detokenize(e)


def test_llm_with_max_sequences_makes_no_session_until_asked(tiny_path, tiny_alone):
    """With max_sequences > 1 the engine holds the model (on a GPU, a session would be a second copy of the
    weights): the session appears only for logits(), whose results are the single-sequence ones."""
    with minfer.LLM(tiny_path, n_ctx=256, threads=2, max_sequences=4) as llm:
        assert llm._session is None and llm.n_ctx == 256
        llm.generate("hello", max_tokens=4)
        assert llm._session is None
        ids = llm.tokenize("hello there")
        assert np.array_equal(llm.logits(ids), tiny_alone.logits(ids))
    with pytest.raises(minfer.MinferError, match="closed"):
        llm.generate("hello")
