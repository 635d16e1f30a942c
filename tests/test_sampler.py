"""The C++ sampler: greedy, temperature, top-k/top-p/min-p, penalties, logit
bias, seeding, and parameter validation."""
import numpy as np
import pytest

import minfer

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
