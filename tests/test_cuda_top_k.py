"""The device top-k of a sampled batch step (cuda::top_k_rows: blocks of 4096 values each keep their k best,
then one block a row keeps the best of those) against numpy's ordering of each row: value descending, then id,
as the sampler's top_k orders them.  Needs an NVIDIA GPU."""
import numpy as np
import pytest

import minfer
from cuda_cases import M, _gpu  # noqa: F401 (fixture)
from logit_metrics import best_of

pytestmark = pytest.mark.gpu


def rows_of(kind, rows, n, rng):
    x = rng.standard_normal((rows, n)).astype(np.float32)
    if kind == "ties":  # a handful of values: thousands equal to the k-th, at every segment
        x = np.round(x * 1.5).astype(np.float32)
    elif kind == "equal":
        x[:] = 0.25
    elif kind == "signed zeros":  # -0 and +0 compare equal: ordered by id alone
        x = np.where(rng.random((rows, n)) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        x[:, ::97] = -1.0
    elif kind == "infinities":
        x[:, rng.integers(0, n, n // 2)] = -np.inf
        x[:, n // 2] = np.inf
    elif kind == "best last":  # the winners in the last, short segment
        x[:, -min(3, n):] = 100.0 + np.arange(min(3, n), dtype=np.float32)
    return x


@pytest.mark.parametrize("n", [152064, 4096, 4097, 1000, 2])
@pytest.mark.parametrize("kind", ["normal", "ties", "equal", "signed zeros", "infinities", "best last"])
def test_device_top_k_orders_as_the_sampler(n, kind, rng):
    rows = 64 if n == 152064 else 5
    x = rows_of(kind, rows, n, rng)
    for k in (1, 40, 256):
        if k >= n:
            continue
        vals, ids, nan, _ = M.cuda_top_k(x, k)
        want_vals, want_ids = best_of(x, k)
        assert not nan
        assert np.array_equal(ids, want_ids), (kind, n, k)
        assert np.array_equal(vals, want_vals), (kind, n, k)  # (-0 == +0)


def test_device_top_k_flags_nan_and_never_picks_it(rng):
    x = rng.standard_normal((3, 152064)).astype(np.float32)
    x[1, 777] = np.nan
    x[1, 778] = 50.0
    vals, ids, nan, _ = M.cuda_top_k(x, 40)
    assert nan and 777 not in ids[1] and ids[1, 0] == 778


def test_device_top_k_refuses_bad_k():
    x = np.zeros((2, 300), np.float32)
    for k in (0, 257, 300):
        with pytest.raises(minfer.MinferError, match="top-k: k ="):
            M.cuda_top_k(x, k)
