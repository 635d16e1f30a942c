"""minfer.LLM: generation, streaming, stop strings, chat with KV prefix reuse,
cancellation, concurrency, errors, metrics."""
import threading

import numpy as np
import pytest

import minfer
from conftest import real_model, synthetic_model
from minfer import engine
from minfer.generation import make_sampler


@pytest.fixture(scope="module")
def tiny():
    return minfer.LLM(str(synthetic_model("qwen2-tiny-q8_0")), n_ctx=256, threads=2)


def test_greedy_generate_equals_the_engine_loop(tiny):
    ids = tiny.tokenize("Hello world, this is")
    out = tiny.generate(ids, max_tokens=12)
    sess = engine.session(tiny.path, n_ctx=256, threads=2)
    expected = list(engine.greedy(sess, ids, 12))
    eog = [i for i, t in enumerate(expected) if t in tiny.tokenizer.special.eog]
    expected = expected[: eog[0]] if eog else expected
    assert out.tokens == expected
    assert out.text == tiny.detokenize(expected)
    m = out.metrics
    assert m.prompt_tokens == len(ids) and m.generated_tokens == len(expected)
    assert m.ttft_s > 0 and m.prefill_tps > 0 and m.stop_reason in ("length", "stop")
    if m.generated_tokens > 1:
        assert m.decode_tps > 0 and 0.0 <= m.decode_overhead < 1.0


class _CountingSession:
    """A Session that says its steps chain (as a CUDA session does) and counts its decode_greedy calls
    (everything else forwarded)."""

    chains = True

    def __init__(self, sess):
        self._sess, self.chain_calls = sess, 0

    def __getattr__(self, name):
        return getattr(self._sess, name)

    def decode_greedy(self, *args):
        self.chain_calls += 1
        return self._sess.decode_greedy(*args)


def test_greedy_chain_path_matches_the_sampler_path(tiny, monkeypatch):
    """Greedy generation on a device that chains steps takes its tokens from Session.decode_greedy, a chunk at a
    time; it gives the sampler path's tokens, text and stop reason, stop strings included (forced here on the
    CPU, whose decode_greedy is the step loop).  Sampling that is not a plain argmax keeps the sampler path."""
    ids = tiny.tokenize("Hello world, this is")
    ref = tiny.generate(ids, max_tokens=40)
    full = tiny.generate("One two three", max_tokens=30).text
    stop = full[3:6]
    ref_stop = tiny.generate("One two three", max_tokens=30, stop=[stop])
    proxy = _CountingSession(tiny._session)
    monkeypatch.setattr(tiny, "_session", proxy)
    monkeypatch.setattr(minfer.llm, "GREEDY_CHUNK", 3)
    out = tiny.generate(ids, max_tokens=40)
    assert (out.tokens, out.text, out.metrics.stop_reason) == (ref.tokens, ref.text, ref.metrics.stop_reason)
    assert proxy.chain_calls >= (len(out.tokens) - 1) // 3 > 0
    got = tiny.generate("One two three", max_tokens=30, stop=[stop])
    assert got.text == ref_stop.text == full[:full.find(stop)] and got.metrics.stop_reason == "stop"
    assert "".join(tiny.stream("One two three", max_tokens=30, stop=[stop])) == got.text
    n = proxy.chain_calls
    tiny.generate(ids, max_tokens=8, temperature=0.5, seed=1)
    tiny.generate(ids, max_tokens=8, repeat_penalty=1.1)
    tiny.generate(ids, max_tokens=8, logit_bias={5: 1.0})
    assert proxy.chain_calls == n


class _CountingEvals:
    """A Session that counts its eval and eval_best calls (everything else forwarded)."""

    def __init__(self, sess):
        self._sess, self.calls = sess, {"eval": 0, "eval_best": 0}

    def __getattr__(self, name):
        if name in self.calls:
            self.calls[name] += 1
        return getattr(self._sess, name)


def test_top_k_sampling_reads_the_best_and_draws_the_whole_rows_tokens(tiny, monkeypatch):
    """A top-k chain's steps take Session.eval_best (k values and ids back, not the vocabulary's logits) and
    draw the tokens its sampler draws from whole rows (Session.eval, Sampler.sample, the same seed); a chain
    with no top-k, or one past the most a device keeps, reads whole rows."""
    ids = tiny.tokenize("Once upon a time")
    params = dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, seed=3)
    proxy = _CountingEvals(tiny._live())
    monkeypatch.setattr(tiny, "_session", proxy)
    out = tiny.generate(ids, max_tokens=16, **params)
    assert proxy.calls["eval_best"] >= 1 and proxy.calls["eval"] == 0, proxy.calls
    sess = engine.session(tiny.path, n_ctx=256, threads=2)
    sampler = make_sampler(tiny.n_vocab, params, ids)
    logits, pos, expected = sess.eval(np.array(ids, np.int32), 0), len(ids), []
    while len(expected) < 16:
        tok = sampler.sample(logits[-1])
        if tok in tiny.tokenizer.special.eog:
            break
        sampler.accept(tok)
        expected.append(tok)
        logits, pos = sess.eval(np.array([tok], np.int32), pos), pos + 1
    assert out.tokens == expected
    tiny.generate(ids, max_tokens=4, temperature=0.9, seed=3)
    assert proxy.calls["eval"] >= 1
    n = proxy.calls["eval"]
    tiny.generate(ids, max_tokens=4, temperature=0.9, top_k=minfer._minfer.BatchRunner.best_max + 1, seed=3)
    assert proxy.calls["eval"] > n  # more best than a device keeps: whole rows


def test_sampler_greedy_flag():
    assert minfer._minfer.Sampler(100).greedy
    assert minfer._minfer.Sampler(100, top_k=5, top_p=0.5).greedy  # cut-offs do nothing at temperature 0
    for kw in (dict(temperature=0.5), dict(repeat_penalty=1.1), dict(presence_penalty=0.1),
               dict(frequency_penalty=0.1), dict(logit_bias={3: -1.0})):
        assert not minfer._minfer.Sampler(100, **kw).greedy, kw


def test_stream_joins_to_generate(tiny):
    a = tiny.generate("The quick brown fox", max_tokens=20, temperature=0.9, seed=5)
    b = "".join(tiny.stream("The quick brown fox", max_tokens=20, temperature=0.9, seed=5))
    assert a.text == b and tiny.last_metrics.generated_tokens == a.metrics.generated_tokens


def test_stop_strings(tiny):
    full = tiny.generate("One two three", max_tokens=30).text
    assert len(full) > 6
    stop = full[3:6]
    out = tiny.generate("One two three", max_tokens=30, stop=[stop])
    assert out.text == full[: full.find(stop)] and out.metrics.stop_reason == "stop"
    assert "".join(tiny.stream("One two three", max_tokens=30, stop=[stop])) == out.text


def test_prefix_reuse_gives_the_same_answer():
    path = str(real_model("smollm2-135m"))
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    with minfer.LLM(path, threads=2) as llm:
        first = llm.chat(msgs, max_tokens=16)
        follow = msgs + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And of Spain?"}]
        second = llm.chat(follow, max_tokens=16)
        assert second.metrics.cached_tokens > 10, second.metrics
    with minfer.LLM(path, threads=2) as fresh:
        again = fresh.chat(follow, max_tokens=16)
        assert again.metrics.cached_tokens == 0
    assert again.tokens == second.tokens


def test_cancel_from_another_thread(tiny):
    pieces = []
    it = tiny.stream("Count forever:", max_tokens=200, temperature=1.0, seed=1)
    for piece in it:
        pieces.append(piece)
        if len(pieces) == 2:
            threading.Thread(target=tiny.cancel).start()
            threading.Event().wait(0.2)
    assert tiny.last_metrics.stop_reason == "cancelled"
    assert tiny.last_metrics.generated_tokens < 200
    assert tiny.generate("still works", max_tokens=3).metrics.generated_tokens >= 0


def test_many_threads_share_one_model(tiny):
    expected = tiny.generate("shared model", max_tokens=8).tokens
    results, errors = [], []

    def work():
        try:
            results.append(tiny.generate("shared model", max_tokens=8).tokens)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and results == [expected] * 6


def test_errors(tiny):
    with pytest.raises(minfer.ContextLengthError, match="the prompt has 300 tokens"):
        tiny.generate([5] * 300, max_tokens=4)
    with pytest.raises(ValueError, match="top_p must be in"):
        tiny.generate("x", top_p=2.0)
    with pytest.raises(TypeError, match="unknown sampling parameter"):
        tiny.generate("x", temprature=0.5)
    with pytest.raises(ValueError, match="the prompt is empty"):
        tiny.generate("", max_tokens=1)
    with pytest.raises(ValueError, match="token ids must be in"):
        tiny.generate([1, 10**9])
    with pytest.raises(ValueError, match="backend must be 'auto', 'cpu', 'cuda' or 'metal', got 'gpu'"):
        minfer.LLM(tiny.path, backend="gpu")
    if not minfer.cuda_info()["available"]:  # asking for a GPU that is not there is an error, not the CPU
        with pytest.raises(minfer.MinferError, match="device='cuda': .*(no|CUDA)"):
            minfer.LLM(tiny.path, backend="cuda")
    assert tiny.generate("x", max_tokens=0).text == ""


def test_logits_and_close():
    llm = minfer.LLM(str(synthetic_model("qwen2-tiny-f32")), n_ctx=64, threads=1)
    ids = llm.tokenize("abc def")
    lg = llm.logits(ids)
    assert lg.shape == (len(ids), llm.n_vocab)
    llm.close()
    with pytest.raises(minfer.MinferError, match="closed"):
        llm.generate("x")
