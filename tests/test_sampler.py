"""The C++ sampler: greedy, temperature, top-k/top-p/min-p, penalties, logit
bias, seeding, and parameter validation."""
import numpy as np
import pytest

import minfer
from logit_metrics import best_of

S = minfer._minfer.Sampler


def softmax(x, t=1.0):
    e = np.exp((x - x.max()) / t)
    return e / e.sum()


def draws(s, logits, n=4000):
    return np.bincount([s.sample(logits) for _ in range(n)], minlength=len(logits))


def test_greedy_is_argmax_lowest_id_on_ties():
    s = S(5)
    assert s.sample(np.array([0, 3, 3, 1, -2], np.float32)) == 1
    assert S(5, top_k=1, temperature=5.0, seed=9).sample(np.array([0, 1, 7, 1, 0], np.float32)) == 2


def test_temperature_follows_softmax():
    logits = np.array([1.0, 0.5, 0.0, -1.0, 2.0], np.float32)
    for t in (0.5, 1.0, 2.0):
        freq = draws(S(5, temperature=t, seed=42), logits) / 4000
        assert np.abs(freq - softmax(logits.astype(np.float64), t)).max() < 0.03, (t, freq)


def test_same_seed_same_tokens():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    a = [S(1000, temperature=1.0, seed=7).sample(logits) for _ in range(1)]
    s1, s2, s3 = S(1000, temperature=1.0, seed=7), S(1000, temperature=1.0, seed=7), S(1000, temperature=1.0, seed=8)
    r1 = [s1.sample(logits) for _ in range(50)]
    assert r1 == [s2.sample(logits) for _ in range(50)]
    assert r1 != [s3.sample(logits) for _ in range(50)]
    s1.reset()
    assert [s1.sample(logits) for _ in range(50)] == r1 and a[0] == r1[0]


def test_top_k_top_p_min_p_cut_the_tail():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03])).astype(np.float32)
    assert set(np.flatnonzero(draws(S(5, temperature=1, top_k=2, seed=1), logits))) == {0, 1}
    # top_p 0.8: the smallest prefix with mass >= 0.8 is {0, 1, 2} (0.9)
    assert set(np.flatnonzero(draws(S(5, temperature=1, top_p=0.8, seed=1), logits))) == {0, 1, 2}
    # min_p 0.2: keep p >= 0.1
    assert set(np.flatnonzero(draws(S(5, temperature=1, min_p=0.2, seed=1), logits))) == {0, 1, 2}


def test_penalties_and_bias():
    logits = np.array([2.0, 1.9, -1.0], np.float32)
    s = S(3, repeat_penalty=1.5)
    assert s.sample(logits) == 0
    s.accept(0)  # 2.0 / 1.5 < 1.9
    assert s.sample(logits) == 1
    s = S(3, presence_penalty=0.5)
    s.accept(0)
    assert s.sample(logits) == 1
    s = S(3, frequency_penalty=0.05)
    s.accept(0)
    assert s.sample(logits) == 0  # one occurrence: 2.0 - 0.05 > 1.9
    s.accept(0); s.accept(0)
    assert s.sample(logits) == 1  # three: 2.0 - 0.15 < 1.9
    s = S(3, repeat_penalty=2.0, penalty_last_n=1)
    s.accept(0); s.accept(2)  # the window holds only the last token
    assert s.sample(logits) == 0
    assert S(3, logit_bias={2: 10.0}).sample(logits) == 2
    assert draws(S(3, temperature=1, logit_bias={0: -np.inf}, seed=3), logits)[0] == 0


@pytest.mark.parametrize("kw,msg", [
    (dict(temperature=-0.1), "temperature must be >= 0"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k must be >= 0"), (dict(top_p=0.0), "top_p must be in"), (dict(top_p=1.1), "top_p"),
    (dict(min_p=-0.5), "min_p must be in"), (dict(repeat_penalty=0.0), "repeat_penalty must be > 0"),
    (dict(penalty_last_n=-2), "penalty_last_n"), (dict(logit_bias={10: 1.0}), "logit_bias token 10 is out of range"),
    (dict(presence_penalty=float("inf")), "presence_penalty must be finite"),
])
def test_invalid_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        S(10, **kw)


def test_nan_logits_are_an_error():
    with pytest.raises(minfer.MinferError, match="logit 1 is NaN"):
        S(3).sample(np.array([0, np.nan, 1], np.float32))
    with pytest.raises(minfer.MinferError, match="3 logits for a vocabulary of 4"):
        S(4).sample(np.zeros(3, np.float32))


@pytest.mark.parametrize("n", [1, 7, 31, 33, 49152, 151936])
def test_greedy_scan_at_vocabulary_sizes(n):
    """Greedy reads the logits in place with a vector scan (no copy, no bias): it must return numpy's
    argmax (the first maximum) wherever the maximum and its ties fall, the tail past the last full
    vector included, and name the first NaN wherever it sits."""
    rng = np.random.default_rng(n)
    s = S(n)
    for trial in range(20):
        x = rng.standard_normal(n).astype(np.float32)
        if trial % 4 == 1:
            x = np.round(x * 2) / 2  # many ties
        if trial % 4 == 2:
            x[rng.integers(0, n, size=min(n, 3))] = np.float32(x.max() + 1)  # tied maxima anywhere
        if trial % 4 == 3:
            x[:] = -np.inf
            x[rng.integers(0, n)] = 0.0
            if n > 1:
                x[rng.integers(0, n)] = -0.0  # equal to 0.0: the first of the two wins
        assert s.sample(x) == int(np.argmax(x)), (n, trial)
        x[-1] = x.max() + 1
        assert s.sample(x) == n - 1
    for where in sorted({0, n // 2, n - 1}):
        x = np.zeros(n, np.float32)
        x[where] = np.nan
        with pytest.raises(minfer.MinferError, match=f"logit {where} is NaN"):
            s.sample(x)


def test_greedy_with_bias_and_penalties_matches_reference():
    rng = np.random.default_rng(5)
    n = 5000
    x = rng.standard_normal(n).astype(np.float32)
    bias = {int(t): float(b) for t, b in zip(rng.integers(0, n, 20), rng.standard_normal(20) * 5)}
    s = S(n, logit_bias=bias, repeat_penalty=1.3)
    hist = [int(np.argmax(x))]
    s.accept(hist[0])
    ref = x.astype(np.float32).copy()
    for t, b in bias.items():
        ref[t] += np.float32(b)
    ref[hist[0]] = ref[hist[0]] / np.float32(1.3) if ref[hist[0]] > 0 else ref[hist[0]] * np.float32(1.3)
    assert s.sample(x) == int(np.argmax(ref))
    inf = np.zeros(n, np.float32)
    inf[3] = np.inf
    with pytest.raises(minfer.MinferError, match="logit 3 is NaN after its logit_bias"):
        S(n, logit_bias={3: float("-inf")}).sample(inf)


def test_sample_rows_is_each_sampler_in_turn():
    """A batch step's rows sampled in parallel (one sampler each) give the tokens the samplers give one call
    at a time; the shapes are checked."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((9, 1000)).astype(np.float32) * 3
    params = [dict(temperature=0.5 + 0.1 * i, top_k=(0, 40)[i % 2], top_p=(1.0, 0.9)[i % 3 == 0], seed=i) for i in range(9)]
    a = [S(1000, **p) for p in params]
    b = [S(1000, **p) for p in params]
    for _ in range(5):
        got = minfer._minfer.sample_rows(a, logits)
        assert list(got) == [s.sample(row) for s, row in zip(b, logits)]
    with pytest.raises(ValueError, match="len\\(samplers\\)"):
        minfer._minfer.sample_rows(a[:3], logits)
    with pytest.raises(minfer.MinferError, match="vocabulary of 1000"):  # raised in a worker, carried back
        minfer._minfer.sample_rows(a[:1], logits[:1, :5])


def vocabulary_logits(rng, n=151936):
    """A model-like logit row: a bulk around -3, a few hundred tokens spread 5-20 above it."""
    x = (rng.standard_normal(n) * 2.0 - 3.0).astype(np.float32)
    x[rng.choice(n, 300, replace=False)] = rng.uniform(2.0, 17.0, 300).astype(np.float32)
    return x


def distribution(s, logits):
    _, q = s.sample_with_distribution(logits)
    return np.asarray(q.ids), np.asarray(q.probs)


@pytest.mark.parametrize("t", [0.3, 0.7, 1.5])
def test_whole_vocabulary_softmax_is_float64_to_a_millionth(t):
    """The sampler's weights (its own f32 e^x, summed in double) against numpy's float64 softmax over a full
    vocabulary: every token a candidate, in id order, each probability within 1e-5 of the exact one relatively
    (an f32 exponent a = (x - max) / t is itself rounded to ~|a| x 6e-8: 2e-6 at |a| = 30)."""
    x = vocabulary_logits(np.random.default_rng(1))
    ids, probs = distribution(S(len(x), temperature=t, seed=1), x)
    assert np.array_equal(ids, np.arange(len(x)))
    ref = softmax(x.astype(np.float64), t)
    big = ref > 1e-30
    assert np.abs(probs[big] / ref[big] - 1).max() < 1e-5
    assert (probs[~big] < 1e-29).all()


def exact_cut(x, t, top_k=0, top_p=1.0, min_p=0.0):
    """The ids the chain keeps, computed in float64: top-k by logit (then id), then the shortest prefix with
    mass >= top_p, stopping at a probability below min_p x the largest."""
    order = np.lexsort((np.arange(len(x)), -x.astype(np.float64)))
    if top_k:
        order = order[:top_k]
    w = np.exp((x[order].astype(np.float64) - x.max()) / t)
    keep = len(order)
    if min_p:
        keep = max(1, int(np.argmax(w < min_p)) if (w < min_p).any() else keep)
    if top_p < 1:
        cum = np.cumsum(w[:keep])
        keep = min(keep, int(np.searchsorted(cum, top_p * w.sum())) + 1)
    return order[:keep], w


@pytest.mark.parametrize("kw", [dict(top_k=40), dict(top_k=300), dict(top_k=5000), dict(top_p=0.5), dict(top_p=0.95),
                                dict(top_p=0.999), dict(min_p=0.05), dict(min_p=1e-4), dict(top_k=100, top_p=0.9),
                                dict(top_p=0.9, min_p=0.01)])
@pytest.mark.parametrize("kind", ["model", "flat"])
def test_cuts_over_a_whole_vocabulary_match_float64(kw, kind):
    """Top-k, top-p and min-p over 152k logits keep exactly the tokens the float64 reference keeps, with its
    probabilities -- however far below the best logit the cut falls (the sampler looks only among the tokens
    above a threshold it lowers until the cut is inside), and over a flat distribution (a random model's, a
    high temperature's), where a cut keeps tens of thousands of tokens and is found without sorting them."""
    rng = np.random.default_rng(2)
    for t in (0.6, 1.2):
        x = vocabulary_logits(rng) if kind == "model" else (rng.standard_normal(151936) * 0.25).astype(np.float32)
        ids, probs = distribution(S(len(x), temperature=t, seed=3, **kw), x)
        want, w = exact_cut(x, t, **kw)
        ref = w[:len(want)] / w[:len(want)].sum()
        assert len(ids) == len(want) and np.array_equal(np.sort(ids), np.sort(want)), (t, len(ids), len(want))
        got = dict(zip(ids.tolist(), probs.tolist()))
        assert max(abs(got[i] - p) for i, p in zip(want.tolist(), ref.tolist())) < 1e-6


def test_draws_across_blocks_follow_the_softmax():
    """The draw over a whole vocabulary walks block sums, then the tokens of one block: four tokens in four
    different blocks (the rest at -60) are drawn as often as their softmax says."""
    n = 4100
    x = np.full(n, -60.0, np.float32)
    hot = [5, 1500, 3071, 4099]
    x[hot] = [1.0, 0.0, 2.0, 1.5]
    freq = draws(S(n, temperature=1.0, seed=11), x)[hot] / 4000
    assert np.abs(freq - softmax(x[hot].astype(np.float64))).max() < 0.03


def test_weights_have_the_same_bits_in_the_vector_body_and_the_scalar_tail():
    """The weights' loop runs vectors over most of the vocabulary and scalars over its last few tokens: a
    logit gives the same probability, to the bit, wherever it sits (so every vector width, and a platform
    without one, draws the same tokens for a seed)."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(1000 + 13) * 4).astype(np.float32)
    x[-13:] = x[100:113]
    _, probs = distribution(S(len(x), temperature=0.8, seed=1), x)
    assert np.array_equal(probs[-13:], probs[100:113])


@pytest.mark.parametrize("k", [1, 40, 1000])
def test_top_k_over_tied_logits_takes_the_lowest_ids(k):
    """Top-k over a vocabulary of few distinct logits (a flat or quantized distribution): the k best by logit,
    ties to the lowest id, as the float64 reference orders them."""
    x = np.random.default_rng(k).integers(0, 4, 151936).astype(np.float32)
    ids, _ = distribution(S(len(x), temperature=1.0, top_k=k, seed=1), x)
    want, _ = exact_cut(x, 1.0, top_k=k)
    assert np.array_equal(ids, want)


def test_best_needed_says_which_chains_read_only_the_best():
    V = 1000
    assert S(V).best_needed == 1  # greedy: the argmax
    assert S(V, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05).best_needed == 40
    for whole in (S(V, temperature=0.8), S(V, temperature=0.8, top_k=V), S(V, temperature=0.8, top_k=40, logit_bias={3: 1.0}),
                  S(V, temperature=0.8, top_k=40, repeat_penalty=1.1), S(V, temperature=0.8, top_k=40, presence_penalty=0.5),
                  S(V, logit_bias={3: -1.0}), S(V, frequency_penalty=0.2)):
        assert whole.best_needed == 0


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
                                    dict(temperature=1.3, top_k=5), dict(temperature=0.7, top_k=1),
                                    dict(temperature=1.0, top_k=200, top_p=0.5), dict(temperature=2.0, top_k=40, min_p=0.2)])
def test_sample_best_draws_what_the_whole_row_draws(params):
    """Two samplers with one seed, one given each row whole and one its best only (more of them than it needs:
    it takes its first top_k), draw the same tokens over rows with ties (rounded logits: the order among equal
    values is by id), -inf logits and spread ones."""
    rng = np.random.default_rng(3)
    V = 5000
    whole, best = S(V, seed=7, **params), S(V, seed=7, **params)
    k = best.best_needed
    assert k == params.get("top_k", 1)
    for i in range(150):
        row = (rng.standard_normal(V) * (0.3 if i % 4 == 0 else 3.0)).astype(np.float32)
        if i % 3 == 0:
            row = np.round(row)  # thousands of ties
        if i % 5 == 0:
            row[rng.integers(0, V, V // 2)] = -np.inf
        vals, ids = best_of(row, k + 3)
        assert whole.sample(row) == best.sample_best(vals, ids), i


def test_sample_best_refuses_too_few_candidates_and_whole_row_chains():
    vals, ids = best_of(np.arange(100, dtype=np.float32), 10)
    with pytest.raises(minfer.MinferError, match="the 40 best"):
        S(100, temperature=0.8, top_k=40).sample_best(vals, ids)
    with pytest.raises(minfer.MinferError, match="whole row"):
        S(100, temperature=0.8).sample_best(vals, ids)
    with pytest.raises(minfer.MinferError, match="out of range"):
        S(100).sample_best(vals, np.full(10, 100, np.int32))
