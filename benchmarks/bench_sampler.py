"""Microbenchmarks of the sampler over a 152k-token vocabulary (pytest-benchmark): one row, and a batch
step's 64 rows (`sample_rows`, rows over the host's cores).

    pytest benchmarks/bench_sampler.py --benchmark-json=out.json

Logits: a model-like row (a bulk around -3, a few hundred tokens 5-20 above it) and a flat one (a random
model's, or a high temperature's), each with the sampling settings a chat server sends.
"""
import numpy as np
import pytest

import minfer._minfer as M

V = 151936
SETTINGS = {
    "temp0.7": dict(temperature=0.7),
    "temp0.7-top_p0.9": dict(temperature=0.7, top_p=0.9),
    "llama.cpp-defaults": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "temp0.7-min_p0.05": dict(temperature=0.7, min_p=0.05),
}


def rows(kind, n):
    rng = np.random.default_rng(0)
    if kind == "flat":
        return (rng.standard_normal((n, V)) * 0.25).astype(np.float32)
    x = (rng.standard_normal((n, V)) * 2.0 - 3.0).astype(np.float32)
    for r in x:
        r[rng.choice(V, 300, replace=False)] = rng.uniform(2.0, 17.0, 300)
    return x


@pytest.mark.parametrize("kind", ["model", "flat"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sample_one_row(benchmark, kind, setting):
    x = rows(kind, 1)[0]
    s = M.Sampler(V, seed=1, **SETTINGS[setting])
    benchmark(s.sample, x)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sample_rows_64(benchmark, setting):
    x = rows("model", 64)
    samplers = [M.Sampler(V, seed=i, **SETTINGS[setting]) for i in range(64)]
    benchmark(M.sample_rows, samplers, x)
